"""Scenarios: a fleet, a queue tree and workloads over virtual time, run through the real core.

Pure: the caller reads the YAML file; this package validates the document, runs it on a
virtual clock and checks its expectations.
"""
