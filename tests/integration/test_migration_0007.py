"""Migration 0007 backfills a run's end cause and a queued workload's reason kind from the message
prefixes written before it, on PostgreSQL and SQLite, and its downgrade drops the columns again."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from alembic import command
from sqlalchemy import Engine, MetaData, select, text

from adapters.sql.migrate import alembic_config
from tests.integration.migration_db import database_at, engine_of, filled_row, seed_queue_tree

RUNS = {  # run id -> (state, message, expected end cause)
    "r-idle": ("preempted", "reclaimed-idle: the idle policy found this run's GPUs idle and ...", "reclaimed-idle"),
    "r-rebalanced": ("preempted", "rebalanced: queue a runs above its fair share and ...", "rebalanced"),
    "r-reclaimed": ("preempted", "reclaimed: queue a takes back its guarantee from ...", "reclaimed"),
    "r-preempted": ("preempted", "preempted: workload w (priority 10) needs the capacity ...", "preempted"),
    "r-node-lost": ("preempted", "node-lost: node n1 left cluster c", "node-lost"),
    "r-start": ("preempted", "gang-start-timeout: pods not all running 90s after dispatch to c", "gang-start-timeout"),
    "r-dispatch": ("preempted", "dispatch-timeout: cluster c did not take the run 90s after", "dispatch-timeout"),
    "r-undispatchable": ("failed", "cannot dispatch to c: bad manifest", "dispatch-failed"),
    "r-pod-failed": ("failed", "pod main-0 failed: OOMKilled", "failed"),
    "r-succeeded": ("succeeded", "all pods succeeded", "succeeded"),
    "r-cancelled": ("cancelled", "cancelled by user", "cancelled"),
    "r-running": ("running", "1 pods running", ""),
}
QUEUED = {  # workload id -> (reason, expected kind)
    "w-nofit": ("no-fit: needs 2 pods placed at once in one cluster; no cluster has room for any", "no-fit"),
    "w-fair": ("fair-share: queue a (share 0.100) waits its turn; queues ordered ahead ...", "fair-share"),
    "w-limit": ("quota: q1 limit is 4 gpu-eq, 4 in use, this gang needs 1", "quota-limit"),
    "w-borrow": ("quota: a may borrow at most 8 gpu-eq above its guarantee", "quota-borrowing"),
    "w-nonpre": ("quota: non-preemptible work runs only within its queue's guarantee", "quota-guarantee"),
    "w-lent": ("quota: the rest of the free gpu-eq is guarantee other queues do not lend", "quota-not-lent"),
    "w-unusable": ("quota: unusable limit gpu-eq=inf on q1; its gangs wait ...", "quota-unusable"),
    "w-error": ("error: scheduling this gang raised ValueError: boom; ...", "error"),
    "w-skipped": ("error: not considered this cycle: 3 gangs failed ...", "not-considered"),
    "w-new": ("", ""),
}


@pytest.fixture(params=["sqlite", "postgresql"])
def url_at_0006(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    with database_at("0006", request.param, tmp_path) as url:
        yield url


def _seed(engine: Engine) -> None:
    meta = MetaData()
    meta.reflect(engine)
    t = meta.tables
    with engine.begin() as conn:
        seed_queue_tree(conn, t)
        conn.execute(t["clusters"].insert(), [filled_row(t["clusters"], id="cl", name="cl")])
        workloads = [(wid, "queued", reason) for wid, (reason, _) in QUEUED.items()]
        workloads += [(f"w-{rid}", "queued", "") for rid in RUNS]
        conn.execute(
            t["workloads"].insert(),
            [
                filled_row(
                    t["workloads"],
                    id=wid,
                    name=wid,
                    state=state,
                    reason=reason,
                    team_id="te",
                    queue_id="qu",
                    priority_class="pc",
                    created_seq=seq,
                    idempotency_key=None,
                )
                for seq, (wid, state, reason) in enumerate(workloads)
            ],
        )
        conn.execute(
            t["runs"].insert(),
            [
                filled_row(
                    t["runs"],
                    id=rid,
                    workload_id=f"w-{rid}",
                    attempt=1,
                    cluster_id="cl",
                    state=state,
                    message=message,
                    dispatch_state="removed",
                )
                for rid, (state, message, _) in RUNS.items()
            ],
        )


def test_upgrade_backfills_end_causes_and_reason_kinds_then_downgrade_drops_them(url_at_0006: str) -> None:
    engine = engine_of(url_at_0006)
    _seed(engine)
    command.upgrade(alembic_config(url_at_0006), "0007")
    with engine.connect() as conn:
        causes = dict(conn.execute(text("SELECT id, end_cause FROM runs")).all())
        kinds = dict(conn.execute(text("SELECT id, reason_kind FROM workloads")).all())
        details = set(conn.execute(text("SELECT reason_detail FROM workloads")).scalars().all())
    assert causes == {rid: cause for rid, (_, _, cause) in RUNS.items()}
    assert {wid: kinds[wid] for wid in QUEUED} == {wid: kind for wid, (_, kind) in QUEUED.items()}
    assert details == {None}  # fields are written by the next cycle that decides them

    command.downgrade(alembic_config(url_at_0006), "0006")
    meta = MetaData()
    meta.reflect(engine)
    assert "end_cause" not in meta.tables["runs"].columns
    assert {"reason_kind", "reason_detail"}.isdisjoint(meta.tables["workloads"].columns.keys())
    with engine.connect() as conn:
        assert conn.execute(select(meta.tables["runs"].c.id)).scalars().all()  # rows kept
    engine.dispose()
