"""The change log under concurrent transactions on PostgreSQL, and its coverage of the schema.

The classic hole: transaction A takes change seq n, B takes n+1 and commits, a reader sees n+1 and
moves past it, then A commits. A reader keyed on "seq > last seen" never sees A's change; the
snapshot cache's transaction horizon must."""

from __future__ import annotations

import importlib

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, select, text

from adapters.sql.tables import Base, NodeRow, SnapshotChangeRow, WorkloadRow
from controlplane.bootstrap import Wiring, utc_now
from controlplane.service.ports import PendingRecord
from controlplane.service.snapshot_cache import SnapshotCache
from tests.integration.fleet import Tenant, gang

# Columns no scheduling snapshot reads: their writes are deliberately not logged.
IGNORED = {
    "workloads": {
        "container", "labels", "idempotency_key", "request_fingerprint", "reason", "version",
        "created_at", "updated_at", "finished_at",
        "serving",  # the inference signal declaration (0011): written once at submit, never read by the scheduler
    },
    "runs": {"attempt", "epoch", "dispatch_state", "message", "dispatched_at"},
    "idle_findings": {
        "workload_id", "cluster", "idle_windows", "reason", "evidence", "action", "stage_since", "updated_at",
    },
    "clusters": {
        "created_at", "account", "cloud_cluster", "resource_group", "cloud_cluster_id", "kube_settings",
        "kubeconfig_ref", "sync_state", "sync_error", "synced_at", "pool_issues", "pool_prices",
    },
    "node_pools": {
        "min_size", "max_size", "instance_type", "cloud_pool_id", "scale_target", "scale_requested_at", "idle_since",
    },
}  # fmt: skip
# Tables no scheduling snapshot reads at all, so not watched: `pending_reasons` (0014) holds the
# scheduler's own output, written every cycle; logging it would make the next refresh re-read the
# gangs it just decided. A queued gang's state change, which deletes its row, is logged on
# `workloads`.
UNWATCHED = {"pending_reasons"}


@pytest.fixture
def database_url(empty_postgresql: str) -> str:
    return empty_postgresql


def test_every_column_of_a_watched_table_is_watched_or_deliberately_ignored() -> None:
    migration = importlib.import_module("migrations.versions.0009_change_cursor")
    # Later migrations that watch more columns of a table: the head's triggers.
    lent_to = importlib.import_module("migrations.versions.0016_runs_lent_to")
    head = {**migration.WATCHED, "runs": (lent_to.LOGGED, lent_to.RUNS_COLUMNS)}
    for table, (_, watched) in head.items():
        columns = {c.name for c in Base.metadata.tables[table].columns}
        if watched is None:
            continue  # every update is logged
        assert set(watched) | IGNORED.get(table, set()) == columns, table
        assert not set(watched) & IGNORED.get(table, set()), table
    assert set(Base.metadata.tables) >= UNWATCHED
    assert not UNWATCHED & set(migration.WATCHED)


def test_writing_pending_reasons_logs_no_snapshot_change(wiring: Wiring, client: TestClient, tenant: Tenant) -> None:
    r = client.post("/v1/workloads", json=gang("waits", tenant.queue), headers=tenant.headers)
    assert r.status_code == 201, r.text
    workload_id = r.json()["id"]
    with wiring.uow() as uow:
        before = uow.snapshots.latest_change()
        record = PendingRecord(workload_id, "no-fit: nothing free", "no-fit", {"kind": "no-fit"})
        assert uow.workloads.record_pending([record]) == 1
        uow.commit()
    with wiring.uow() as uow:
        assert uow.snapshots.latest_change() == before


def test_a_change_committed_after_a_later_one_was_read_is_still_seen(
    wiring: Wiring, client: TestClient, tenant: Tenant
) -> None:
    r = client.post("/v1/workloads", json=gang("slow", tenant.queue), headers=tenant.headers)
    assert r.status_code == 201, r.text
    workload_id = r.json()["id"]
    cache = SnapshotCache()
    before = cache.refresh(wiring.uow, 1, utc_now())
    [queued] = before.pending
    assert queued.priority == 100
    node_id = before.nodes[0].id
    engine = create_engine(wiring.settings.database_url.replace("postgresql://", "postgresql+psycopg://"))
    try:
        with engine.connect() as a, engine.connect() as b:
            ta = a.begin()
            a.execute(text("UPDATE workloads SET priority = 500 WHERE id = :id"), {"id": workload_id})
            tb = b.begin()
            b.execute(text("UPDATE nodes SET schedulable = false WHERE id = :id"), {"id": node_id})
            seq_a = a.scalar(
                select(SnapshotChangeRow.seq)
                .where(SnapshotChangeRow.key == workload_id)
                .order_by(SnapshotChangeRow.seq.desc())
            )
            seq_b = b.scalar(
                select(SnapshotChangeRow.seq)
                .where(SnapshotChangeRow.key == node_id)
                .order_by(SnapshotChangeRow.seq.desc())
            )
            assert seq_a is not None
            assert seq_b is not None
            assert seq_a < seq_b
            tb.commit()
            middle = cache.refresh(wiring.uow, 1, utc_now())
            assert not next(n for n in middle.nodes if n.id == node_id).schedulable  # B's change
            assert middle.pending[0] is queued  # A's is not committed yet
            with wiring.uow() as uow:
                assert uow.snapshots.change_cursor().seq >= seq_b > seq_a  # a "seq > last read" reader skips A
            ta.commit()
        after = cache.refresh(wiring.uow, 1, utc_now())
        assert [w.priority for w in after.pending] == [500]
        assert after.nodes == middle.nodes
        assert all(x is y for x, y in zip(after.nodes, middle.nodes, strict=True))
        assert cache.rebuilds == 1
        with wiring.uow() as uow:
            assert after.pending == uow.snapshots.load().pending
    finally:
        engine.dispose()


def test_a_rolled_back_change_and_a_deleted_row_leave_the_cache_right(
    wiring: Wiring, client: TestClient, tenant: Tenant
) -> None:
    ids = [
        client.post("/v1/workloads", json=gang(f"g{i}", tenant.queue), headers=tenant.headers).json()["id"]
        for i in range(3)
    ]
    cache = SnapshotCache()
    first = cache.refresh(wiring.uow, 1, utc_now())
    assert [w.id for w in first.pending] == ids
    with wiring.uow() as uow:
        uow.session.execute(text("UPDATE workloads SET priority = 7"))  # type: ignore[attr-defined]
        uow.session.rollback()  # type: ignore[attr-defined]
    with wiring.uow() as uow:  # a delete (the cascade takes its pod sets): the log keeps the key
        uow.session.query(WorkloadRow).filter(WorkloadRow.id == ids[1]).delete()  # type: ignore[attr-defined]
        uow.session.query(NodeRow).filter(NodeRow.id == first.nodes[-1].id).delete()  # type: ignore[attr-defined]
        uow.commit()
    second = cache.refresh(wiring.uow, 1, utc_now())
    assert [w.id for w in second.pending] == [ids[0], ids[2]]
    assert second.pending[0] is first.pending[0]
    assert second.pending[1] is first.pending[2]
    assert second.nodes == first.nodes[:-1]
    assert all(x is y for x, y in zip(second.nodes, first.nodes, strict=False))
    assert cache.rebuilds == 1


def test_a_long_transaction_elsewhere_on_the_server_neither_widens_the_read_nor_rebuilds(
    wiring: Wiring, client: TestClient, tenant: Tenant, admin: dict[str, str]
) -> None:
    """Transaction ids and snapshots are server-wide: a transaction held open in another database
    (a report, a benchmark, a stuck session) is in flight for every reader. The cursor takes only
    what its last read could not see, so a change committed before that read (here a priority
    class, which rebuilds the cache when read) is never read again, however old the held one."""
    url = wiring.settings.database_url.replace("postgresql://", "postgresql+psycopg://")
    other_database = create_engine(url.rsplit("/", 1)[0] + "/postgres")
    try:
        with other_database.connect() as elsewhere:
            held = elsewhere.execute(text("SELECT pg_current_xact_id()::text::bigint")).scalar_one()
            r = client.post("/v1/priority-classes", json={"name": "spare", "value": 10}, headers=admin)
            assert r.status_code == 201, r.text
            ids = [
                client.post("/v1/workloads", json=gang(f"g{i}", tenant.queue), headers=tenant.headers).json()["id"]
                for i in range(2)
            ]
            cache = SnapshotCache()
            first = cache.refresh(wiring.uow, 1, utc_now())
            assert [w.id for w in first.pending] == ids
            with wiring.uow() as uow:
                assert uow.snapshots.change_cursor().horizon == held  # X  # the server's oldest in flight
                uow.session.execute(  # type: ignore[attr-defined]
                    text("UPDATE workloads SET priority = 9 WHERE id = :id"), {"id": ids[1]}
                )
                uow.commit()
            with wiring.uow() as uow:
                changes = uow.snapshots.changes_since(cache._cursor)  # type: ignore[arg-type]
            assert changes.workload_ids == {ids[1]}  # only what the last read could not see
            assert not changes.classes_changed
            second = cache.refresh(wiring.uow, 1, utc_now())
            assert cache.rebuilds == 1
            assert second.pending[0] is first.pending[0]
            assert [w.priority for w in second.pending if w.id == ids[1]] == [9]
            elsewhere.rollback()
    finally:
        other_database.dispose()
