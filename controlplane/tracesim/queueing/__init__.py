"""Discrete-event queueing simulation of the real scheduling core: `gpufleet sim run|generate|study`."""
