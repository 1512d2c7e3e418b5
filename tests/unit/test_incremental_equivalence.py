"""The incremental scheduler decides exactly what the one-shot `schedule()` decides.

Hypothesis drives random event sequences through one long-lived `IncrementalScheduler`: each
cycle's admissions become live runs and its evictions send their gangs back to the queue (as the
live scheduler applies a decision), and between cycles runs end, gangs arrive or are cancelled,
runs are marked idle, nodes are cordoned or uncordoned, quotas change and time passes. After
every event the decision of the kept state must equal `schedule()` on the same snapshot: the
one-shot entry point is the oracle. The kept state's decision lists only the reasons that changed;
the reasons it keeps (`pending_reasons`) must be every reason the oracle gives, so a parked gang
that the oracle would admit, or would give another reason, fails the property (and a wake rule
taken away is caught: see the last test).
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controlplane.core import incremental
from controlplane.core.decision import PendingReason
from controlplane.core.incremental import IncrementalScheduler, SyncStats, same_decision
from controlplane.core.parking import Parked, ParkingClass, park
from controlplane.core.reservation import Reservations, RoomKey
from controlplane.core.schedule import schedule
from controlplane.core.snapshot import Decision, LiveRun, PendingDelta, Policy, Snapshot
from controlplane.core.state import CycleState
from controlplane.domain.model import Cluster, Node, PodAssignment, QueueNode, Quota, Workload
from tests.unit.builders import (
    NOW,
    gpus,
    live_run_of,
    make_cluster,
    make_nodes,
    make_pool,
    make_snapshot,
    make_workload,
)
from tests.unit.test_schedule_properties import PROPERTY_SETTINGS, QUEUES, fleets, queue_trees, workloads

POLICIES = (
    Policy(),
    Policy(fair_share=False),
    Policy(rebalance=True, rebalance_interval_seconds=0.0),
    Policy(max_reservations=1, disruption_budget=1),
    # Few heads: most gangs of a queue wait behind them, and the split of a queue (candidates,
    # blocked heads, the rest behind) moves as gangs arrive, are admitted and limits fill.
    Policy(heads_per_queue=1),
    Policy(heads_per_queue=2, disruption_budget=1),
)
EVENTS = ("finish", "arrive", "cancel", "idle", "cordon", "quota", "guarantee", "nothing")


def _apply(snapshot: Snapshot, decision: Decision, waiting: dict[str, Workload], step: int) -> Snapshot:
    """What the next snapshot holds once the live scheduler applied `decision`."""
    by_id = {w.id: w for w in snapshot.pending}
    evicted = {e.run_id for e in decision.evictions}
    live = [r for r in snapshot.live_runs if r.run_id not in evicted]
    for eviction in decision.evictions:
        workload = waiting[eviction.workload_id]
        by_id[workload.id] = workload  # requeued
    for admission in decision.admissions:
        run = live_run_of(admission, by_id.pop(admission.workload_id))
        live.append(replace(run, run_id=f"{admission.workload_id}-r{step}", admitted_at=NOW))
    return replace(snapshot, pending=tuple(by_id.values()), live_runs=tuple(live))


HISTORIES = (
    fleets(),
    queue_trees(),
    workloads("w", 0),
    st.sampled_from(POLICIES),
    st.lists(st.tuples(st.sampled_from(EVENTS), st.integers(0, 1000), workloads("n", 50)), min_size=1, max_size=6),
)


@given(*HISTORIES)
@PROPERTY_SETTINGS
def test_every_decision_of_the_kept_state_equals_the_one_shot_decision(
    fleet: tuple[tuple[Cluster, ...], tuple[Node, ...]],
    tree: dict[str, QueueNode],
    first: list[Workload],
    policy: Policy,
    events: list[tuple[str, int, list[Workload]]],
) -> None:
    clusters, nodes = fleet
    scheduler = IncrementalScheduler()
    snapshot = make_snapshot(clusters, nodes, first, tree=tree)
    waiting = {w.id: w for w in first}  # every workload ever submitted, for requeues
    now = NOW
    stored: dict[str, PendingReason] = {}  # the reasons told so far, as the live scheduler stores them
    for step, (event, pick, arrivals) in enumerate(events):
        # Every other cycle parks first, as the live scheduler does (it stores those reasons at once).
        early = scheduler.park(snapshot, policy) if step % 2 == 0 else ()
        decision = scheduler.decide(snapshot, policy, now)
        where = f"step {step}, events {[e[0] for e in events[:step]]}"
        one_shot = schedule(snapshot, policy, now)
        _same(decision, scheduler, one_shot, where)
        _told_in_parts(stored, early, decision, snapshot, one_shot, where)
        before = snapshot
        snapshot = _apply(snapshot, decision, waiting, step)
        snapshot, now = _event(snapshot, event, pick, [replace(w, id=f"{w.id}s{step}") for w in arrivals], now)
        # Told what changed, as the live snapshot cache tells it, or left to find it by comparing.
        snapshot = _with_delta(before, snapshot) if step % 2 else replace(snapshot, pending_delta=None)
        waiting.update({w.id: w for w in snapshot.pending})
    last = scheduler.decide(snapshot, policy, now)
    _same(last, scheduler, schedule(snapshot, policy, now), "last step")


def _told_in_parts(
    stored: dict[str, PendingReason],
    early: tuple[PendingReason, ...],
    decision: Decision,
    snapshot: Snapshot,
    one_shot: Decision,
    where: str,
) -> None:
    """The reasons `park` told and those `decide` told after it never name the same gang (what was
    stored early holds), and, applied to what was told before, they are every reason of the
    one-shot decision."""
    assert not {p.workload_id for p in early} & {p.workload_id for p in decision.pending}, where
    stored.update((p.workload_id, p) for p in (*early, *decision.pending))
    waiting = {w.id for w in snapshot.pending} - {a.workload_id for a in decision.admissions}
    assert {gang: p for gang, p in stored.items() if gang in waiting} == {p.workload_id: p for p in one_shot.pending}, (
        where
    )


def _with_delta(before: Snapshot, after: Snapshot) -> Snapshot:
    """`after` carrying how its pending gangs differ from `before`'s (the snapshot cache's delta)."""
    old = {w.id: w for w in before.pending}
    new = {w.id: w for w in after.pending}
    changed = tuple(w for w in after.pending if old.get(w.id) is not w)
    delta = PendingDelta(before.pending, changed, frozenset(old.keys() - new.keys()))
    return replace(after, pending_delta=delta)


def _same(kept: Decision, scheduler: IncrementalScheduler, one_shot: Decision, where: str) -> None:
    """Equal decisions, or a failure that shows where they part."""
    reasons = scheduler.pending_reasons()
    if same_decision(one_shot, kept, reasons):
        return
    lines = [where]
    for name in ("admissions", "evictions"):
        mine, theirs = getattr(kept, name), getattr(one_shot, name)
        for i, (a, b) in enumerate(zip(mine, theirs, strict=False)):
            if a != b:
                lines.append(f"{name}[{i}]: kept {a}\n  one-shot {b}")
                break
        if len(mine) != len(theirs):
            lines.append(f"{name}: kept {len(mine)}, one-shot {len(theirs)}")
    theirs_by_id = {p.workload_id: p for p in one_shot.pending}
    for gang in sorted(reasons.keys() | theirs_by_id.keys()):
        if reasons.get(gang) != theirs_by_id.get(gang):
            lines.append(f"reason of {gang}: kept {reasons.get(gang)}\n  one-shot {theirs_by_id.get(gang)}")
            break
    lines.append(f"stats: kept {kept.stats}, one-shot {one_shot.stats}")
    raise AssertionError("\n".join(lines))


def _event(
    snapshot: Snapshot, event: str, pick: int, arrivals: list[Workload], now: datetime
) -> tuple[Snapshot, datetime]:
    live = list(snapshot.live_runs)
    if event == "finish" and live:
        del live[pick % len(live)]
        return replace(snapshot, live_runs=tuple(live)), now
    if event == "arrive":
        return replace(snapshot, pending=snapshot.pending + tuple(arrivals)), now
    if event == "cancel" and snapshot.pending:
        pending = list(snapshot.pending)
        del pending[pick % len(pending)]
        return replace(snapshot, pending=tuple(pending)), now
    if event == "idle" and live:
        i = pick % len(live)
        live[i] = _marked_idle(live[i])
        return replace(snapshot, live_runs=tuple(live)), now
    if event == "cordon" and snapshot.nodes:
        nodes = list(snapshot.nodes)
        i = pick % len(nodes)
        nodes[i] = replace(nodes[i], schedulable=not nodes[i].schedulable)
        return replace(snapshot, nodes=tuple(nodes)), now
    if event in ("quota", "guarantee"):
        tree = dict(snapshot.queue_tree)
        queue = QUEUES[pick % len(QUEUES)]
        amount = Quota({"gpu-eq": float(pick % 9)})
        if event == "quota":
            tree[queue] = replace(tree[queue], limit=amount)
        else:
            tree[queue] = replace(tree[queue], guaranteed=amount)
        return replace(snapshot, queue_tree=tree), now
    return snapshot, now + timedelta(seconds=pick)


def _marked_idle(run: LiveRun) -> LiveRun:
    return replace(run, idle=True, idle_reclaimable=not run.idle_reclaimable)


def test_the_kept_state_is_synced_by_delta_and_rebuilt_when_the_fleet_changes_or_it_grew_old(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pool = make_pool("p", "c", gpus_per_node=8)
    nodes = make_nodes(pool, 2)
    first = [make_workload(f"w{i}", gpus(4)) for i in range(3)]
    snapshot = make_snapshot([make_cluster("c", pool)], nodes, first)
    scheduler = IncrementalScheduler()
    decision = scheduler.decide(snapshot, Policy(), NOW)
    assert scheduler.last_sync.rebuilt
    assert len(decision.admissions) == 3
    snapshot = _apply(snapshot, decision, {w.id: w for w in first}, 0)
    _same(scheduler.decide(snapshot, Policy(), NOW), scheduler, schedule(snapshot, Policy(), NOW), "second")
    assert scheduler.last_sync == SyncStats(rebuilt=False, runs_released=0, runs_added=3)
    ended = replace(snapshot, live_runs=snapshot.live_runs[1:])
    _same(scheduler.decide(ended, Policy(), NOW), scheduler, schedule(ended, Policy(), NOW), "ended")
    assert scheduler.last_sync == SyncStats(rebuilt=False, runs_released=1, runs_added=0)
    cordoned = replace(ended, nodes=(replace(nodes[0], schedulable=False), nodes[1]))
    _same(scheduler.decide(cordoned, Policy(), NOW), scheduler, schedule(cordoned, Policy(), NOW), "cordoned")
    assert scheduler.last_sync.rebuilt
    monkeypatch.setattr(incremental, "REBUILD_AFTER_CYCLES", 2)
    rebuilt = []
    for _ in range(3):
        scheduler.decide(cordoned, Policy(), NOW)
        rebuilt.append(scheduler.last_sync.rebuilt)
    assert rebuilt == [False, False, True]
    scheduler.reset()
    scheduler.decide(cordoned, Policy(), NOW)
    assert scheduler.last_sync.rebuilt


def _without_drop_wakes(state: CycleState, policy: Policy, gang: ParkingClass) -> Parked:
    """`park` with one wake rule taken away: a parked class is not woken when usage where its
    limit blocks drops (a run of its queue ends, say)."""
    return replace(park(state, policy, gang), watch_drop=())


def test_the_property_catches_a_missing_wake_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    pool = make_pool("p", "c", gpus_per_node=8)
    tree = {"q": QueueNode("q", "q", None, limit=Quota({"gpu-eq": 8.0}))}
    running = make_workload("running", gpus(8), queue="q")
    # Two gangs blocked by q's limit: the front one is decided in order, the other is parked behind it.
    waiting = [make_workload(f"waiting{i}", gpus(4), queue="q", seq=1 + i) for i in range(2)]
    snapshot = make_snapshot([make_cluster("c", pool)], make_nodes(pool, 2), [running, *waiting], tree=tree)
    monkeypatch.setattr(incremental, "park", _without_drop_wakes)
    scheduler = IncrementalScheduler()
    first = scheduler.decide(snapshot, Policy(), NOW)
    _same(first, scheduler, schedule(snapshot, Policy(), NOW), "first")  # running admitted
    after = _apply(snapshot, first, {w.id: w for w in (running, *waiting)}, 0)
    _same(scheduler.decide(after, Policy(), NOW), scheduler, schedule(after, Policy(), NOW), "second")
    ended = replace(after, live_runs=())  # usage on q drops: both fit its limit again
    with pytest.raises(AssertionError, match="admissions"):
        _same(scheduler.decide(ended, Policy(), NOW), scheduler, schedule(ended, Policy(), NOW), "ended")
    # and the property's own check, over a history of its events, catches it as well
    first = [running, *waiting]
    history = test_every_decision_of_the_kept_state_equals_the_one_shot_decision.hypothesis.inner_test
    with pytest.raises(AssertionError, match="admissions"):
        history((snapshot.clusters, snapshot.nodes), tree, first, Policy(), [("nothing", 0, []), ("finish", 0, [])])


def _without_candidate_wakes(state: CycleState, policy: Policy, gang: ParkingClass) -> Parked:
    """`park` with the wake rule of classes not blocked taken away: usage rising where a limit
    stands never wakes them."""
    answer = park(state, policy, gang)
    return replace(answer, watch_any=()) if answer.why is None else answer


@pytest.mark.parametrize("broken", [False, True])
def test_a_class_not_blocked_is_asked_again_when_usage_rises_under_its_limit(
    monkeypatch: pytest.MonkeyPatch, broken: bool
) -> None:
    """q1 may hold 8 GPUs. `wide` (8 GPUs, ahead in q1's order) and `narrow` (4) are both let
    through at first; with one head per queue, `narrow` waits behind `wide`. Then a 4-GPU run of
    q1 starts: `wide` is blocked by the limit and no longer takes the head's place, so `narrow`
    is decided and admitted. Without the wake rule the kept state keeps `wide` let through and
    `narrow` behind it, and the property says so."""
    if broken:
        monkeypatch.setattr(incremental, "park", _without_candidate_wakes)
    pool = make_pool("p", "c", gpus_per_node=8)
    tree = {
        "q1": QueueNode("q1", "q1", None, limit=Quota({"gpu-eq": 8.0})),
        "q2": QueueNode("q2", "q2", None),
    }
    policy = Policy(heads_per_queue=1)
    wide = make_workload("wide", gpus(8), queue="q1", priority=1, seq=1)
    narrow = make_workload("narrow", gpus(4), queue="q1", seq=2)
    busy = replace(_run("busy", "p-n0", 8, 0), queue_id="q2")
    half = _run("half", "p-n1", 4, 5)  # of higher priority than `wide`: never its victim
    nodes = make_nodes(pool, 2)
    full = make_snapshot(
        [make_cluster("c", pool)], nodes, [wide, narrow], tree=tree, live=[busy, replace(half, queue_id="q2")]
    )
    scheduler = IncrementalScheduler()
    _same(scheduler.decide(full, policy, NOW), scheduler, schedule(full, policy, NOW), "q1 empty")
    rising = replace(full, live_runs=(busy, half))  # the 4-GPU run is q1's now
    kept, one_shot = scheduler.decide(rising, policy, NOW), schedule(rising, policy, NOW)
    assert [a.workload_id for a in one_shot.admissions] == ["narrow"]
    if broken:
        with pytest.raises(AssertionError, match="admissions"):
            _same(kept, scheduler, one_shot, "q1 at 4")
    else:
        _same(kept, scheduler, one_shot, "q1 at 4")


def _run(name: str, node: str, gpu_count: int, priority: int) -> LiveRun:
    demand = {"cpu": 1000, "mem": 4096, "gpu": gpu_count}
    return LiveRun(name, "q1", "c", priority, (PodAssignment("worker", 0, node, demand),), run_id=f"{name}-r")


def test_a_capacity_miss_is_remembered_only_while_the_cluster_is_as_it_was(monkeypatch: pytest.MonkeyPatch) -> None:
    """A preemption trial that found no room on a cluster's capacity is not made again while
    that capacity is unchanged (`CycleState.capacity_misses`), and is made again once a run
    there ends. Without the cluster's stamp moving, the kept state would not see the room."""
    pool = make_pool("p", "c", gpus_per_node=8)
    nodes = make_nodes(pool, 2)
    gang = make_workload("gang", gpus(8), priority=50)
    # p-n0 is full with work the gang may not preempt; on p-n1 a low-priority run it may preempt
    # shares the node with one it may not: releasing the first leaves 4 GPUs, not 8.
    high, low, other = _run("high", "p-n0", 8, 100), _run("low", "p-n1", 4, 0), _run("other", "p-n1", 4, 100)
    full = make_snapshot([make_cluster("c", pool)], nodes, [gang], live=[high, low, other])
    ended = replace(full, live_runs=(high, low))  # `other` ended: preempting `low` makes room now

    scheduler = IncrementalScheduler()
    before = scheduler.decide(full, Policy(), NOW)
    _same(before, scheduler, schedule(full, Policy(), NOW), "full")
    assert not before.admissions
    assert not before.evictions
    after = scheduler.decide(ended, Policy(), NOW)
    _same(after, scheduler, schedule(ended, Policy(), NOW), "ended")
    assert [a.workload_id for a in after.admissions] == ["gang"]
    assert [e.workload_id for e in after.evictions] == ["low"]
    # With the stamp frozen, the miss outlives the change and the kept state decides wrong.
    monkeypatch.setattr(CycleState, "_stamp", lambda self, cluster_id, change: None)
    frozen = IncrementalScheduler()
    frozen.decide(full, Policy(), NOW)
    assert not frozen.decide(ended, Policy(), NOW).admissions


@pytest.mark.parametrize("broken", [False, True])
def test_a_reservation_s_room_is_worked_out_again_when_its_cluster_s_capacity_changes(
    monkeypatch: pytest.MonkeyPatch, broken: bool
) -> None:
    """How many runs must end before a shape has room on a cluster is kept under the cluster's
    stamp and those runs (`CycleState.room_after`). `gang` (two pods of 8 GPUs) waits first for
    `soon` and `late` to end; then `endless` (not in the due order: it never ends and may not be
    evicted) ends and frees p-n2, so `soon` alone is enough: the same runs, another capacity.
    Without the stamp in the key, the kept state would still hold the nodes for `late`."""
    if broken:
        real = Reservations._room_key

        def without_stamp(
            self: Reservations, workload: Workload, cluster: Cluster, runs: list[LiveRun], first: bool
        ) -> RoomKey:
            key = real(self, workload, cluster, runs, first)
            return key[:3] + key[4:]

        monkeypatch.setattr(Reservations, "_room_key", without_stamp)
    pool = make_pool("p", "c", gpus_per_node=8)
    nodes = make_nodes(pool, 3)
    gang = make_workload("gang", gpus(8, 2), priority=100)

    def due(run: LiveRun, minutes: int) -> LiveRun:
        return replace(run, admitted_at=NOW, max_runtime_seconds=minutes * 60, preemptible=False)

    soon, late = due(_run("soon", "p-n0", 8, 100), 10), due(_run("late", "p-n1", 8, 100), 20)
    endless = replace(_run("endless", "p-n2", 4, 100), preemptible=False)
    full = make_snapshot([make_cluster("c", pool)], nodes, [gang], live=[soon, late, endless])
    freed = replace(full, live_runs=(soon, late))

    scheduler = IncrementalScheduler()
    first = scheduler.decide(full, Policy(), NOW)
    _same(first, scheduler, schedule(full, Policy(), NOW), "full")
    assert scheduler.pending_reasons()["gang"].reservation.due == NOW + timedelta(minutes=20)
    second = scheduler.decide(freed, Policy(), NOW)
    expected = NOW + timedelta(minutes=10)
    if broken:
        assert scheduler.pending_reasons()["gang"].reservation.due != expected
        return
    _same(second, scheduler, schedule(freed, Policy(), NOW), "freed")
    assert scheduler.pending_reasons()["gang"].reservation.due == expected


@pytest.mark.parametrize("broken", [False, True])
def test_victims_kept_across_cycles_are_worked_out_again_when_their_queue_s_runs_change(
    monkeypatch: pytest.MonkeyPatch, broken: bool
) -> None:
    """The runs a gang may preempt are kept with the state while its queue's runs stay
    (`victim_memo.py`). `big` (two pods of 8 GPUs) may preempt `a` alone at first, too little; then `b`
    ends and `c`, of low priority too, starts on its node: preempting `a` and `c` makes room.
    Without the queue's version moving, the kept state would still offer `a` alone."""
    if broken:
        monkeypatch.setattr(CycleState, "_bump_queue", lambda self, queue_id: None)
    pool = make_pool("p", "c", gpus_per_node=8)
    nodes = make_nodes(pool, 2)
    big = make_workload("big", gpus(8, replicas=2), queue="q1", priority=5)
    a, b, c = _run("a", "p-n0", 8, 1), _run("b", "p-n1", 8, 10), _run("c", "p-n1", 8, 1)
    before = make_snapshot([make_cluster("c", pool)], nodes, [big], live=[a, b])
    after = replace(before, live_runs=(a, c))
    scheduler = IncrementalScheduler()
    first = scheduler.decide(before, Policy(), NOW)
    _same(first, scheduler, schedule(before, Policy(), NOW), "b holds its node")
    assert not first.admissions
    kept, one_shot = scheduler.decide(after, Policy(), NOW), schedule(after, Policy(), NOW)
    assert [a.workload_id for a in one_shot.admissions] == ["big"]
    assert sorted(e.workload_id for e in one_shot.evictions) == ["a", "c"]
    if broken:
        with pytest.raises(AssertionError, match="admissions"):
            _same(kept, scheduler, one_shot, "c in b's place")
    else:
        _same(kept, scheduler, one_shot, "c in b's place")
