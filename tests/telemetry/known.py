"""Register the clusters and runs a telemetry test talks about: ingest refuses samples of others."""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from adapters.sql.tables import ClusterRow, PriorityClassRow, QueueRow, RunRow, TeamRow, WorkloadRow
from controlplane.bootstrap import Wiring

T = datetime(2026, 1, 1, tzinfo=UTC)


def register(wiring: Wiring, cluster: str, *run_ids: str) -> None:
    """A cluster named `cluster` and, on it, one admitted run per id (idempotent)."""
    with Session(wiring.engine) as s, s.begin():
        cluster_id = s.scalar(select(ClusterRow.id).where(ClusterRow.name == cluster))
        if cluster_id is None:
            cluster_id = f"c-{cluster}"
            s.add(ClusterRow(id=cluster_id, name=cluster, provider="sim", created_at=T))
            s.flush()
        if s.get(PriorityClassRow, "telemetry-test") is None:
            s.add(PriorityClassRow(name="telemetry-test", value=0))
            s.add(TeamRow(id="t-telemetry", name="telemetry-team", created_at=T))
            s.flush()
            s.add(QueueRow(id="q-telemetry", name="telemetry-queue", team_id="t-telemetry", created_at=T))
            s.flush()
        for run_id in run_ids:
            if s.get(RunRow, run_id) is not None:
                continue
            s.add(
                WorkloadRow(
                    id=f"w-{run_id}",
                    team_id="t-telemetry",
                    queue_id="q-telemetry",
                    name=run_id[:63],
                    priority_class="telemetry-test",
                    priority=0,
                    kind="training",
                    min_available=1,
                    state="running",
                    created_seq=0,
                    created_at=T,
                    updated_at=T,
                )
            )
            s.flush()
            s.add(
                RunRow(
                    id=run_id,
                    workload_id=f"w-{run_id}",
                    attempt=1,
                    cluster_id=cluster_id,
                    epoch=1,
                    state="running",
                    created_at=T,
                )
            )
