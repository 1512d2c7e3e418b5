"""Models of peer schedulers (Kueue, Volcano, Armada, Slurm) for the queueing simulator, each
written from its project's documentation (docs/simulator.md names the pages and what was left
out). Pure: no I/O."""
