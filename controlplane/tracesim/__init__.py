"""Trace-driven simulation: replay real GPU traces through the real scheduling core on a virtual clock."""
