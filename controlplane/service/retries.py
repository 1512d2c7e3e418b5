"""Running a transaction again when the database aborted it to settle a conflict with another.

With one lock order for every writer of workloads and runs (adapters/sql/row_locks.py) PostgreSQL
has no deadlock to break between them; this is the backstop for what the order does not cover (a
future writer, another table) and for serialization failures. The retry is immediate: the
transaction that won already holds what this one waits for, and the retry queues behind it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from controlplane.service.errors import StoreUnavailable, TransactionConflict
from controlplane.service.metrics import NO_METRICS, Metrics, Writer, retry_cause

T = TypeVar("T")

# Attempts in all: a third conflict in a row is not a race but a pattern, and goes to the caller.
CONFLICT_ATTEMPTS = 3


def retrying(
    writer: Writer, work: Callable[[], T], metrics: Metrics = NO_METRICS, attempts: int = CONFLICT_ATTEMPTS
) -> T:
    """`work()`, which runs whole transactions (each rolled back when it raises), run again at once
    when the database aborted one to settle a conflict (`TransactionConflict`), at most `attempts`
    times in all; each retry is counted. The last conflict, and any other error, goes to the caller
    (whose own retry, if it has one, counts it)."""
    attempt = 1
    while True:
        try:
            return work()
        except TransactionConflict as exc:
            if attempt >= attempts:
                raise
            metrics.db_retry(writer, retry_cause(exc))
            attempt += 1


def count_store_retry(metrics: Metrics, writer: Writer, exc: BaseException) -> None:
    """Count a failed pass that its loop runs again later, when the database is what failed."""
    if isinstance(exc, StoreUnavailable):
        metrics.db_retry(writer, retry_cause(exc))
