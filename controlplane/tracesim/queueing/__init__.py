"""Discrete-event queueing simulation of the real scheduling core: `gpufleet dev sim run|generate|study`."""
