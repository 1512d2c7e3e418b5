"""How the scheduler reads its snapshot and the changes since a cursor (adapters/sql/snapshot_repo.py).

A leaf module of the ports: `ports.py` re-exports its names.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol

from controlplane.core.history import UsageInterval
from controlplane.core.snapshot import LiveRun, Snapshot
from controlplane.domain.model import Cluster, Node, QueueNode, Workload


@dataclass(frozen=True)
class ChangeCursor:
    """Where a reader of the snapshot's change log stands (adapters/sql/snapshot_changes.py).
    `seq`: the highest change read. On PostgreSQL (else None and empty), the read's snapshot:
    `horizon`, the oldest transaction still in flight for it (everything older was read);
    `unseen_from`, the first transaction id it could not see at all; `in_flight`, the transactions
    between the two it could not see. The next read takes exactly the changes of those."""

    seq: int
    horizon: int | None = None
    unseen_from: int | None = None
    in_flight: frozenset[int] = frozenset()


@dataclass(frozen=True)
class OwnChanges:
    """The changes one writing transaction logged, so that its writer can tell them from others'
    (the scheduler's own decision must not wake its next cycle). On PostgreSQL by the writer's
    transaction id (`txid`, which the log's triggers store); on SQLite, whose writers are
    serialised, by the range of `seq` the transaction took (`seqs`: after the first, up to the
    second)."""

    txid: int | None = None
    seqs: tuple[int, int] | None = None


@dataclass(frozen=True)
class SnapshotChanges:
    """What changed since a cursor, as current values: the snapshot cache merges them.

    `workload_ids`/`run_ids` were touched; of them, `pending` holds those queued now and `live_runs`
    those live now (a touched id in neither is gone from that part). `clusters`/`nodes` and
    `queue_tree` are the whole fleet or tree, given only when some of it changed. `usage` maps the
    touched runs that held capacity in the history window to their interval (None: no longer
    counts); with `usage_complete`, it is the whole window (the fleet changed, so every run's GPU
    equivalents may have). `classes_changed`: a priority class changed (the cache rebuilds)."""

    cursor: ChangeCursor
    workload_ids: frozenset[str] = frozenset()
    run_ids: frozenset[str] = frozenset()
    pending: tuple[Workload, ...] = ()
    live_runs: tuple[LiveRun, ...] = ()
    clusters: tuple[Cluster, ...] | None = None
    nodes: tuple[Node, ...] | None = None
    queue_tree: Mapping[str, QueueNode] | None = None
    classes_changed: bool = False
    usage: Mapping[str, UsageInterval | None] = field(default_factory=dict)
    usage_complete: bool = False
    last_rebalance_at: datetime | None = None
    last_rebalance_read: bool = False


class SnapshotReader(Protocol):
    def load(self, history_since: datetime | None = None, last_rebalance: bool = False) -> Snapshot:
        """The scheduling snapshot; with `history_since`, also the consumption of runs that ran
        since then (fair-share history); with `last_rebalance`, when a run last ended rebalanced
        (the rebalancing rate limit)."""
        ...

    def change_cursor(self) -> ChangeCursor:
        """The cursor of what this transaction sees: call it after `load` in the same unit of work,
        and `changes_since` it later reads every change `load` did not see."""
        ...

    def changes_since(
        self, cursor: ChangeCursor, history_since: datetime | None = None, last_rebalance: bool = False
    ) -> SnapshotChanges:
        """Everything `load` would read differently than at `cursor`, in one read transaction."""
        ...

    def latest_change(self) -> int:
        """The `seq` of the latest change logged: a cheap poll for "something changed since the
        cursor's seq". Only a hint (on PostgreSQL a change may commit after a later seq was seen);
        what changed is always read through `changes_since`."""
        ...

    def own_changes(self, seq_before: int) -> OwnChanges:
        """The changes this unit of work's transaction has logged: call it last before the
        commit, `seq_before` being `latest_change()` read first in the same transaction."""
        ...

    def changed_besides(self, seq: int, own: Sequence[OwnChanges]) -> bool:
        """Whether a change past `seq` was logged by a transaction other than those of `own`: the
        poll of `latest_change`, blind to the writer's own decisions. Also only a hint."""
        ...

    def stored_reasons(self) -> Mapping[str, tuple[str, str]]:
        """(reason, kind) of the pending reason stored per queued workload the scheduler has
        decided (the others have none; any reason decided for them differs): call beside `load`
        in the same unit of work, so the scheduler's first decision of a term writes only what
        differs."""
        ...

    def usage_by_run(self, since: datetime) -> Mapping[str, UsageInterval | None]:
        """`load`'s usage history per run id (the snapshot cache updates it run by run)."""
        ...

    def prune_changes(self, cursor: ChangeCursor, before: datetime) -> int:
        """Forget changes logged before `before` that `cursor` has read; returns how many."""
        ...
