"""Migration 0014 moves the pending reasons of queued workloads into `pending_reasons` and drops
`workloads.reason_kind` and `reason_detail`, on PostgreSQL and SQLite; its downgrade brings them
back with the reasons in place (and keeps every row of the tables around `workloads`)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from alembic import command
from sqlalchemy import Engine, MetaData, func, select, text

from adapters.sql.engine import make_engine
from adapters.sql.migrate import alembic_config
from tests.integration.migration_db import database_at, filled_row, reflected, seed_queue_tree, workload_row

WORKLOADS = {  # workload id -> (state, reason, reason kind, reason detail)
    "w-nofit": ("queued", "no-fit: needs 2 pods", "no-fit", {"kind": "no-fit", "pods": 2}),
    "w-quota": ("queued", "quota: q1 limit is 4 gpu-eq ünïcode", "quota-limit", {"kind": "quota-limit", "limit": 4.0}),
    "w-nodetail": ("queued", "fair-share: waits its turn", "fair-share", None),
    "w-new": ("queued", "waiting for the next cycle", "", None),
    "w-requeued": ("queued", "preempted: workload u (priority 1000) needs the capacity", "", None),
    "w-running": ("running", "admitted", "", None),
    "w-cancelled": ("cancelled", "cancelled by user", "", None),
}
# What 0014 moves: queued workloads with a kind.
MOVED = {wid: (reason, kind, detail) for wid, (state, reason, kind, detail) in WORKLOADS.items() if kind}


@pytest.fixture(params=["sqlite", "postgresql"])
def url_at_0013(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    with database_at("0013", request.param, tmp_path) as url:
        yield url


def _seed(engine: Engine) -> None:
    t = reflected(engine)
    with engine.begin() as conn:
        seed_queue_tree(conn, t)
        conn.execute(t["clusters"].insert(), [filled_row(t["clusters"], id="cl", name="cl")])
        conn.execute(
            t["workloads"].insert(),
            [
                workload_row(
                    t["workloads"], wid, seq, state=state, reason=reason, reason_kind=kind, reason_detail=detail
                )
                for seq, (wid, (state, reason, kind, detail)) in enumerate(WORKLOADS.items())
            ],
        )
        conn.execute(
            t["pod_sets"].insert(),
            [filled_row(t["pod_sets"], workload_id=wid, ordinal=0, name="main", mig_profile=None) for wid in WORKLOADS],
        )
        conn.execute(
            t["runs"].insert(),
            [
                filled_row(
                    t["runs"], id="r-running", workload_id="w-running", attempt=1, cluster_id="cl", state="running"
                )
            ],
        )


def _counts(engine: Engine) -> dict[str, Any]:
    with engine.connect() as conn:
        return {
            table: conn.scalar(text(f"SELECT count(*) FROM {table}")) for table in ("workloads", "pod_sets", "runs")
        }


def test_upgrade_moves_the_pending_reasons_and_downgrade_brings_them_back(url_at_0013: str) -> None:
    engine = make_engine(url_at_0013)  # on SQLite with foreign keys enforced, as migrations run
    _seed(engine)
    counts = _counts(engine)
    config = alembic_config(url_at_0013)
    try:
        command.upgrade(config, "0014")
        meta = MetaData()
        meta.reflect(engine)
        assert {"reason_kind", "reason_detail"}.isdisjoint(meta.tables["workloads"].columns.keys())
        pending = meta.tables["pending_reasons"]
        with engine.connect() as conn:
            moved = {row[0]: tuple(row[1:]) for row in conn.execute(select(pending))}
            reasons = dict(conn.execute(text("SELECT id, reason FROM workloads")).all())
        assert moved == MOVED
        # The workloads keep their own reason (before 0014 it was also the pending one).
        assert reasons == {wid: reason for wid, (_, reason, _, _) in WORKLOADS.items()}
        assert _counts(engine) == counts  # nothing cascaded away

        with engine.begin() as conn:  # the foreign key cascades a workload's delete to its row
            conn.execute(text("DELETE FROM pod_sets WHERE workload_id = 'w-nodetail'"))
            conn.execute(text("DELETE FROM workloads WHERE id = 'w-nodetail'"))
            assert conn.scalar(select(func.count()).select_from(pending)) == len(MOVED) - 1
            conn.execute(pending.update().where(pending.c.workload_id == "w-nofit").values(reason="no-fit: newer"))

        command.downgrade(config, "0013")
        meta = MetaData()
        meta.reflect(engine)
        assert "pending_reasons" not in meta.tables
        workloads = meta.tables["workloads"]
        with engine.connect() as conn:
            back = {
                row[0]: tuple(row[1:])
                for row in conn.execute(
                    select(
                        workloads.c.id,
                        workloads.c.state,
                        workloads.c.reason,
                        workloads.c.reason_kind,
                        workloads.c.reason_detail,
                    )
                )
            }
        expected = {wid: w for wid, w in WORKLOADS.items() if wid != "w-nodetail"}
        expected["w-nofit"] = ("queued", "no-fit: newer", "no-fit", {"kind": "no-fit", "pods": 2})
        assert back == expected
        command.upgrade(config, "head")  # and up again
    finally:
        engine.dispose()
