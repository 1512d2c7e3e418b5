"""Synthetic fleets and workloads for benchmarking the scheduling core (pure: no clock, no I/O)."""
