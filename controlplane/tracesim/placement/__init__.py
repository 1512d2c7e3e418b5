"""The FGD placement experiment (ATC'23) on the Alibaba openb trace: `gpufleet dev sim placement`."""
