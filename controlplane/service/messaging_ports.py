"""The transactional outbox and the inbox, as the service layer sees them (adapters/sql/messaging_repo.py).

A leaf module of the ports: `ports.py` re-exports its names.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol


@dataclass(frozen=True)
class OutboxEvent:
    """An event as the outbox keeps it: `seq` orders the outbox (a live feed resumes after one)."""

    seq: int
    subject: str
    payload: str
    created_at: datetime


class Undeliverable(Exception):
    """The broker will never take this message as it is (larger than it accepts, refused as
    malformed): retrying cannot help. An `EventPublisher` raises it; anything else it raises may be
    transient and is retried."""


class DeadLetters(Protocol):
    async def dead_letter(self, subject: str, payload: bytes, msg_id: str, reason: str) -> None:
        """Keep an undeliverable message where operators look (bounded: an excerpt when large)."""
        ...


class Outbox(Protocol):
    def add(self, subject: str, event_id: str, payload: str, now: datetime) -> None: ...
    def add_many(self, events: Sequence[tuple[str, str, str]], now: datetime) -> None:
        """`add` of each (subject, event id, payload), in this order, in one statement."""
        ...

    def unpublished(self, limit: int) -> list[tuple[str, str, str]]: ...
    def mark_published(self, event_ids: Sequence[str], now: datetime) -> None: ...
    def oldest_unpublished(self) -> datetime | None:
        """When the oldest event still waiting for the relay was written, or None."""
        ...

    def record_failure(self, event_id: str, error: str) -> None: ...
    def mark_dead_lettered(self, event_id: str, reason: str, now: datetime) -> None:
        """The event will never be published: it leaves the queue (as if published) with the reason."""
        ...

    def prune(self, published_before: datetime) -> int: ...
    def recent(self, subject_prefixes: Sequence[str], after_seq: int, limit: int) -> list[OutboxEvent]:
        """The newest `limit` events (newest first) whose subject starts with one of the prefixes
        and whose `seq` is above `after_seq`: the dashboard's live feed, published or not."""
        ...


class Inbox(Protocol):
    def first_time(self, consumer: str, msg_id: str, now: datetime) -> bool: ...
    def first_times(self, consumer: str, msg_ids: Sequence[str], now: datetime) -> set[str]:
        """`first_time` for many distinct ids in one statement: those seen for the first time."""
        ...

    def prune(self, processed_before: datetime) -> int: ...
