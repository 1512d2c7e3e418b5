"""The dashboard's read models from plain views and gauges: GPUs per model and sharing mode,
and a queue tree's bars (borrowed is use above the guarantee, on the keys the quota names)."""

from __future__ import annotations

from datetime import UTC, datetime

from controlplane.service.dashboard import fleet, queues
from controlplane.service.metrics import ClusterGpus, FleetGauges, QueueQuota
from controlplane.service.views import ClusterView, PoolView, TreeNodeView

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def _pool(name: str, model: str, sharing: str, nodes: int, per_node: int) -> PoolView:
    return PoolView(name, name, model, per_node, 1000, 1000, sharing, [], {}, 1.0, False, nodes)


def _gauges(gpus: tuple[ClusterGpus, ...] = (), quotas: tuple[QueueQuota, ...] = (), **pending: int) -> FleetGauges:
    return FleetGauges(
        pending={(queue.replace("_", "-"), "quota-limit"): n for queue, n in pending.items()},
        workloads={},
        quotas=quotas,
        gpus=gpus,
        idle_findings={},
        idle_gpus={},
        sm_active={},
        measured_gpus={},
        cluster_sync_errors={},
        outbox_backlog=0,
        outbox_oldest_seconds=0.0,
        leases=(),
    )


def test_fleet_splits_gpus_by_model_and_names_mixed_sharing_modes() -> None:
    clusters = [
        ClusterView(
            "c1",
            "east",
            "eks",
            "us-east-1",
            NOW,
            [_pool("a", "A100", "exclusive", 2, 8), _pool("b", "A100", "mig:all-balanced", 1, 8)],
        ),
        ClusterView("c2", "west", "gke", "us-west1", NOW, [_pool("l4", "L4", "timeslice:4", 2, 4)]),
    ]
    gauges = _gauges((ClusterGpus("east", "A100", 24, 10.5), ClusterGpus("west", "L4", 4, 0.25)))
    page = fleet(clusters, gauges)
    east, west = page.clusters
    assert [(g.gpu_model, g.sharing, g.capacity, g.used, g.free) for g in east.gpus] == [
        ("A100", "mixed: exclusive + mig:all-balanced", 24, 10.5, 13.5)
    ]
    # capacity is what the gauges count (schedulable nodes): 4 of the pool's 8 GPUs here
    assert [(g.capacity, g.used, g.free) for g in west.gpus] == [(4, 0.25, 3.75)]
    assert [p.gpus for p in west.pools] == [8]
    assert [(g.gpu_model, g.sharing) for g in page.by_model] == [
        ("A100", "mixed: exclusive + mig:all-balanced"),
        ("L4", "timeslice:4"),
    ]
    assert (page.capacity, page.used) == (28, 10.75)


def _node(name: str, parent: str | None, weight: float = 1.0, **quota: dict[str, float]) -> TreeNodeView:
    return TreeNodeView(
        name, name, parent, quota.get("guaranteed", {}), quota.get("limit", {}), weight, NOW, parent=parent
    )


def test_queue_bars_borrowed_is_use_above_guarantee_and_teams_sum_their_queues() -> None:
    teams = [_node("llm", None, 3.0, limit={"gpu-eq": 64}), _node("cv", None, 1.0)]
    queue_nodes = [
        _node("llm-train", "llm", 1.0, guaranteed={"gpu-eq": 8}, limit={"gpu-eq": 32, "H100": 16}),
        _node("llm-serve", "llm", 3.0),
        _node("cv-train", "cv"),
    ]
    quotas = (
        QueueQuota("llm-train", "llm", used={"gpu-eq": 12, "H100": 12}),
        QueueQuota("llm-serve", "llm", used={"gpu-eq": 2.5, "L4": 2.5}),
    )
    lines = queues(teams, queue_nodes, _gauges(quotas=quotas, llm_train=2, cv_train=1))
    by_name = {line.name: line for line in lines}
    assert [line.name for line in lines] == ["cv", "cv-train", "llm", "llm-serve", "llm-train"]
    train = by_name["llm-train"]
    assert [(b.key, b.guaranteed, b.used, b.borrowed, b.limit) for b in train.bars] == [
        ("gpu-eq", 8, 12, 4, 32),
        ("H100", 0, 12, 12, 16),
    ]
    # a model no quota names is not a bar: its use is not borrowing of it
    assert [b.key for b in by_name["llm-serve"].bars] == ["gpu-eq"]
    llm = by_name["llm"]
    assert [(b.key, b.used, b.borrowed, b.limit) for b in llm.bars] == [("gpu-eq", 14.5, 14.5, 64)]
    assert (llm.pending, llm.weight_share) == (2, 0.75)
    assert (train.weight_share, by_name["llm-serve"].weight_share) == (0.25, 0.75)
    assert by_name["cv"].pending == 1
    assert by_name["cv-train"].bars[0].limit is None


def test_a_team_sees_its_own_lines_with_its_share_of_all_teams_weights() -> None:
    teams = [_node("llm", None, 3.0), _node("cv", None, 1.0)]
    lines = queues(teams, [_node("cv-train", "cv")], _gauges(), only="cv")
    assert [(line.name, line.weight_share) for line in lines] == [("cv", 0.25), ("cv-train", 1.0)]
