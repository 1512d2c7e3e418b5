"""Workloads, pod sets and their runs in SQL (the views of workloads are read in `workload_views`)."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Table, case, delete, func, insert, literal, select, update
from sqlalchemy.orm import Session

from adapters.sql.insert_or_skip import insert_or_skip
from adapters.sql.pending_reasons import write_pending
from adapters.sql.row_locks import lock_workloads
from adapters.sql.tables import (
    PendingReasonRow,
    PodSetRow,
    QueueRow,
    RunAssignmentRow,
    RunRow,
    TeamRow,
    WorkloadRow,
)
from adapters.sql.workload_views import SqlWorkloadViews
from controlplane.core.decision import Admission
from controlplane.domain.model import PodSet, Workload, WorkloadState
from controlplane.service.errors import DuplicateKey
from controlplane.service.ports import QUEUED_REASON, NewWorkload, PendingRecord, WorkloadHead

LIVE = ("admitted", "dispatching", "running")
CHUNK = 500  # ids per IN list
_EVENT_KEYS = ("workload_id", "name", "team", "queue", "state", "reason", "priority_class", "version")


class SqlWorkloadRepository(SqlWorkloadViews):
    def __init__(self, session: Session) -> None:
        self.s = session

    def add(
        self,
        workload: Workload,
        *,
        container: Mapping[str, Any],
        labels: Mapping[str, str],
        idempotency_key: str | None,
        fingerprint: str,
        now: datetime,
        serving: Mapping[str, Any] | None = None,
    ) -> None:
        new = NewWorkload(workload, container, labels, idempotency_key, fingerprint, serving)
        if not self.add_many([new], now):
            raise DuplicateKey(f"idempotency key {idempotency_key!r} was used before")

    def add_many(self, new: Sequence[NewWorkload], now: datetime) -> set[str]:
        # Core inserts, not ORM objects: the rows are only written here (a submit that reads its
        # workload back builds the view from what it wrote), so the unit of work's bookkeeping is
        # pure cost. An idempotency key used before is skipped by the insert itself (no savepoint).
        if not new:
            return set()
        statement = insert_or_skip(self.s, WorkloadRow.__table__, ("team_id", "idempotency_key"))
        if len(new) == 1:
            added = set(self.s.scalars(statement.returning(WorkloadRow.id), [_workload_row(new[0], now)]))
        else:
            # Many rows: an executemany of the one-row statement (prepared once, pipelined), then the
            # ids that went in. (With RETURNING the rows become one statement of thirty parameters a
            # row, which the driver parses afresh every time: slower than the extra query.)
            self.s.execute(statement, [_workload_row(n, now) for n in new])
            ids = [n.workload.id for n in new]
            added = set(self.s.scalars(select(WorkloadRow.id).where(WorkloadRow.id.in_(ids))))
        pod_sets = [
            pod_set_row(n.workload.id, i, p)
            for n in new
            if n.workload.id in added
            for i, p in enumerate(n.workload.pod_sets)
        ]
        if pod_sets:
            self.s.execute(insert(PodSetRow.__table__), pod_sets)  # type: ignore[arg-type]
        return added

    def by_idempotency_key(self, team_id: str, key: str) -> tuple[str, str] | None:
        row = self.s.execute(
            select(WorkloadRow.id, WorkloadRow.request_fingerprint).where(
                WorkloadRow.team_id == team_id, WorkloadRow.idempotency_key == key
            )
        ).first()
        return (row[0], row[1]) if row else None

    def head(self, workload_id: str) -> WorkloadHead | None:
        row = self.s.execute(
            select(WorkloadRow.id, WorkloadRow.team_id, QueueRow.name, WorkloadRow.state, WorkloadRow.version)
            .join(QueueRow, QueueRow.id == WorkloadRow.queue_id)
            .where(WorkloadRow.id == workload_id)
        ).first()
        if row is None:
            return None
        live = self.s.scalar(select(RunRow.id).where(RunRow.workload_id == workload_id, RunRow.state.in_(LIVE)))
        return WorkloadHead(row[0], row[1], row[2], row[3], row[4], live)

    def lock(self, workload_ids: Collection[str] = (), of_runs: Collection[str] = ()) -> None:
        lock_workloads(self.s, workload_ids, of_runs)

    def set_state(
        self, workload_id: str, from_states: Sequence[str], to_state: str, reason: str, now: datetime
    ) -> bool:
        return workload_id in self.set_states([(workload_id, to_state, reason)], from_states, now)

    def set_states(
        self, changes: Sequence[tuple[str, str, str]], from_states: Sequence[str], now: datetime
    ) -> set[str]:
        if not changes:
            return set()
        ids = [workload_id for workload_id, _, _ in changes]
        lock_workloads(self.s, ids)
        terminal = [workload_id for workload_id, to_state, _ in changes if WorkloadState(to_state).terminal]
        moved = self.s.execute(
            update(WorkloadRow)
            .where(WorkloadRow.id.in_(ids), WorkloadRow.state.in_(list(from_states)))
            .values(
                state=case({workload_id: to_state for workload_id, to_state, _ in changes}, value=WorkloadRow.id),
                reason=case({workload_id: reason for workload_id, _, reason in changes}, value=WorkloadRow.id),
                updated_at=now,
                version=WorkloadRow.version + 1,
                finished_at=case(
                    (WorkloadRow.id.in_(terminal), literal(now, WorkloadRow.finished_at.type)),
                    else_=WorkloadRow.finished_at,
                )
                if terminal
                else WorkloadRow.finished_at,
            )
            .returning(WorkloadRow.id)
            .execution_options(synchronize_session=False)
        )
        moved_ids = set(moved.scalars())
        if moved_ids and WorkloadState.QUEUED in from_states:
            # A pending reason describes only the queued gang the scheduler decided on; it goes with
            # the state (a gang requeued later shows this transition's text until decided again).
            # Only a queued workload can have one (the writer checks), hence the condition.
            self.s.execute(
                delete(PendingReasonRow)
                .where(PendingReasonRow.workload_id.in_(moved_ids))
                .execution_options(synchronize_session=False)
            )
        return moved_ids

    def admit_all(self, admissions: Sequence[Admission], epoch: int, now: datetime) -> dict[str, str]:
        admitted: dict[str, str] = {}
        workloads: Table = WorkloadRow.__table__  # type: ignore[assignment]
        lock_workloads(self.s, [a.workload_id for a in admissions])  # all at once: one order across chunks
        for start in range(0, len(admissions), CHUNK):  # bounded IN lists, however many a cycle admits
            chunk = admissions[start : start + CHUNK]
            ids = [a.workload_id for a in chunk]
            moved = set(
                self.s.execute(
                    update(workloads)
                    .where(workloads.c.id.in_(ids), workloads.c.state == WorkloadState.QUEUED.value)
                    .values(
                        state=WorkloadState.ADMITTED.value,
                        reason="admitted",
                        updated_at=now,
                        version=workloads.c.version + 1,
                    )
                    .returning(workloads.c.id)
                ).scalars()
            )
            if not moved:
                continue
            # Admitted: their pending reasons go (set-based, as the update above).
            self.s.execute(
                delete(PendingReasonRow)
                .where(PendingReasonRow.workload_id.in_(moved))
                .execution_options(synchronize_session=False)
            )
            attempts = dict(
                self.s.execute(
                    select(RunRow.workload_id, func.max(RunRow.attempt))
                    .where(RunRow.workload_id.in_(moved))
                    .group_by(RunRow.workload_id)
                ).all()
            )
            runs: list[dict[str, Any]] = []
            assignments: list[dict[str, Any]] = []
            for admission in chunk:
                if admission.workload_id not in moved:
                    continue  # cancelled since the snapshot was read
                attempt = (attempts.get(admission.workload_id) or 0) + 1
                run_id = f"run-{admission.workload_id[3:]}-{attempt}"
                runs.append(
                    {
                        "id": run_id,
                        "workload_id": admission.workload_id,
                        "attempt": attempt,
                        "cluster_id": admission.cluster_id,
                        "epoch": epoch,
                        "state": "admitted",
                        "dispatch_state": "pending",
                        "message": "",
                        "end_cause": "",
                        "lent_to": admission.lent_to,
                        "created_at": now,
                    }
                )
                assignments.extend(
                    {
                        "run_id": run_id,
                        "ordinal": i,
                        "pod_set": a.pod_set,
                        "pod_index": a.index,
                        "node_id": a.node_id,
                        "demand": dict(a.demand),
                    }
                    for i, a in enumerate(admission.assignments)
                )
            self.s.execute(insert(RunRow.__table__), runs)  # type: ignore[arg-type]
            if assignments:
                self.s.execute(insert(RunAssignmentRow.__table__), assignments)  # type: ignore[arg-type]
            admitted.update(
                self.s.execute(
                    select(WorkloadRow.id, QueueRow.name)
                    .join(QueueRow, QueueRow.id == WorkloadRow.queue_id)
                    .where(WorkloadRow.id.in_(moved))
                ).all()
            )
        return {a.workload_id: admitted[a.workload_id] for a in admissions if a.workload_id in admitted}

    def submitted_at(self, workload_ids: Collection[str]) -> dict[str, datetime]:
        ids = list(workload_ids)
        found: dict[str, datetime] = {}
        for start in range(0, len(ids), CHUNK):  # bounded IN lists, however many a cycle admits
            chunk = ids[start : start + CHUNK]
            for workload_id, created_at in self.s.execute(
                select(WorkloadRow.id, WorkloadRow.created_at).where(WorkloadRow.id.in_(chunk))
            ):
                found[workload_id] = created_at
        return found

    def record_pending(self, reasons: Sequence[PendingRecord]) -> int:
        return write_pending(self.s, reasons)

    def _event_query(self) -> Any:
        return (
            select(
                WorkloadRow.id,
                WorkloadRow.name,
                TeamRow.name,
                QueueRow.name,
                WorkloadRow.state,
                WorkloadRow.reason,
                WorkloadRow.priority_class,
                WorkloadRow.version,
            )
            .join(TeamRow, TeamRow.id == WorkloadRow.team_id)
            .join(QueueRow, QueueRow.id == WorkloadRow.queue_id)
        )

    def event_data(self, workload_id: str) -> dict[str, Any]:
        row = self.s.execute(self._event_query().where(WorkloadRow.id == workload_id)).one()
        return dict(zip(_EVENT_KEYS, row, strict=True))

    def event_data_many(self, workload_ids: Collection[str]) -> dict[str, dict[str, Any]]:
        ids = list(workload_ids)
        found: dict[str, dict[str, Any]] = {}
        for start in range(0, len(ids), CHUNK):
            for row in self.s.execute(self._event_query().where(WorkloadRow.id.in_(ids[start : start + CHUNK]))):
                found[row[0]] = dict(zip(_EVENT_KEYS, row, strict=True))
        return found


def _workload_row(new: NewWorkload, now: datetime) -> dict[str, Any]:
    workload = new.workload
    return {
        "id": workload.id,
        "team_id": workload.team_id,
        "queue_id": workload.queue_id,
        "name": workload.name,
        "priority_class": workload.priority_class,
        "priority": workload.priority,
        "kind": str(workload.kind),
        "requires_isolation": workload.requires_isolation,
        "min_available": workload.min_available,
        "tolerations": [
            {"key": t.key, "operator": t.operator, "value": t.value, "effect": t.effect} for t in workload.tolerations
        ],
        "duration_seconds": workload.duration_seconds,
        "max_runtime_seconds": workload.max_runtime_seconds,
        "spot": workload.spot,
        "same_pool": workload.same_pool,
        "container": dict(new.container),
        "labels": dict(new.labels),
        # None is SQL NULL here: the column is JSON(none_as_null=True), so every row has the key.
        "serving": None if new.serving is None else dict(new.serving),
        "idempotency_key": new.idempotency_key,
        "request_fingerprint": new.fingerprint,
        "state": WorkloadState.QUEUED.value,
        "reason": QUEUED_REASON,
        "version": 1,
        "created_seq": workload.created_seq,
        "created_at": now,
        "updated_at": now,
        "finished_at": None,
    }


def pod_set_row(workload_id: str, ordinal: int, p: PodSet) -> dict[str, Any]:
    """The `pod_sets` row of a gang's pod set (also the bench's bulk seeding writes these)."""
    return {
        "workload_id": workload_id,
        "ordinal": ordinal,
        "name": p.name,
        "replicas": p.replicas,
        "gpus": p.gpus,
        "mig_profile": p.mig_profile,
        "gpu_fraction": p.gpu_fraction,
        "cpu_millis": p.cpu_millis,
        "memory_mib": p.memory_mib,
        "gpu_models": list(p.gpu_models),
        "min_replicas": p.min_replicas,
    }
