"""The scheduler that keeps its state across cycles: `IncrementalScheduler.decide`.

`schedule()` builds the fleet state from the snapshot every cycle: free capacity of every node,
the placement indexes over it, every live run held and charged to the quota ledger. At fleet
scale that rebuild, and the placement searches it throws away, are most of a cycle. This
scheduler builds the state once and then applies only what changed between consecutive
snapshots:

- runs that ended (or changed) give their capacity and quota back, runs that started take theirs;
- a change to clusters, pools, nodes or the queue tree (rare: inventory, cordons, quota edits)
  rebuilds the state, since the gpu-eq unit and every index may depend on it.

A cycle runs inside a checkpoint of that state (`state.py`'s journal) and is rolled back at its
end: its admissions and evictions reach the next snapshot as live runs started or ended, which
is how a fresh build would see them.

It also keeps the queue manager's parking (`parking.py`, `Parking` below): every pending gang
belongs to a class that is either parked, with the reason it waits and the changes that would
wake it, or a candidate. A cycle asks the parking question again only for classes a change woke
(usage on their queue chain) and for new classes, and decides in order only the
candidates: queue heads, new and woken gangs, not the deep backlog parked behind a limit.

Placement answers are parked too, by the placement search (`placement/search.py`): it remembers
every shape's answer until a node of a pool that answer read changes. Since the capacity now
outlives the cycle, a gang that found no room is not searched again until capacity of a pool it
could use changed: a run there ended, a node there was added or uncordoned.

Eviction trials keep what they read of the live runs alone (each queue's runs in the victim order,
the runs a preemption or reclaim may take, per cluster: `victim_memo.py`) until a run of a queue
they read changes (`CycleState.queue_versions`).

`decide` returns the admissions and evictions, and of the pending reasons only those that changed
since its previous decision (a delta: `pending_reasons()` is the whole set). It is the one-shot
answer by construction, and a property test checks it: for any sequence of snapshots, what
`decide` admits and evicts and the reasons it keeps are what `schedule()` gives on each of them.
Snapshots are compared by identity first (a snapshot cache that keeps unchanged rows as the
same objects makes the comparison a pointer check), then by value.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field, replace
from datetime import datetime

from controlplane.core.cycle import Cycle
from controlplane.core.decision import BehindHeads, Decision, PendingReason, ReservationNote, Why
from controlplane.core.fragmentation import KeptMix
from controlplane.core.parking import (
    CANDIDATE,
    Parked,
    ParkingClass,
    QueueSplit,
    class_of,
    park,
    queue_order,
    split_queue,
)
from controlplane.core.schedule import decision_of, quarantine_queues, schedule
from controlplane.core.snapshot import LiveRun, Policy, Snapshot
from controlplane.core.state import CycleState, live_key
from controlplane.domain.model import Workload

# The kept state's memos (placement answers per gang shape, the shapes of gangs seen, scores)
# only grow while it lives: it is rebuilt after this many cycles, which bounds them by what that
# many cycles can see (at one cycle a second, a rebuild every ten minutes or so).
REBUILD_AFTER_CYCLES = 600


@dataclass
class _Kept:
    """The snapshot the kept state matches, and that state."""

    snapshot: Snapshot
    state: CycleState  # its `live` lists the runs it holds, by live key
    cycles: int = 0


@dataclass(frozen=True)
class SyncStats:
    """What the last `decide` had to do to bring its state up to date (for benches and logs)."""

    rebuilt: bool
    runs_released: int
    runs_added: int
    classes_checked: int = 0  # parking classes asked again (woken or new)
    candidates: int = 0  # gangs decided in order (the rest stayed parked)


class IncrementalScheduler:
    """`schedule()` with the fleet state kept from one call to the next. Not thread-safe: one per
    scheduler process (and leadership term)."""

    def __init__(self) -> None:
        self._kept: _Kept | None = None
        self.parking = Parking()
        self._policy: Policy | None = None  # the policy the parking answers were given under
        self._parked: _Parked | None = None  # `park`'s outcome, until `decide` on its snapshot
        self._mix = KeptMix()  # the expected next pod, from the oldest pending gangs
        self.last_sync = SyncStats(rebuilt=True, runs_released=0, runs_added=0)

    def reset(self) -> None:
        """Forget the kept state: the next call rebuilds it (a new leadership term, an error)."""
        self._kept = None
        self._parked = None
        self.parking = Parking()

    def pending_reasons(self) -> dict[str, PendingReason]:
        """Every pending gang's reason as of the last decision (what `schedule()` lists)."""
        return self.parking.reasons()

    def park(self, snapshot: Snapshot, policy: Policy) -> tuple[PendingReason, ...]:
        """The first part of `decide`: bring the kept state and the parking up to date with the
        snapshot and pick the candidates. Returns the reasons, among those that changed, of the
        gangs parking leaves pending (behind their queue's heads, blocked among them, parked for
        good): the ordered pass cannot change them, so a caller may store them at once, and a new
        gang behind its queue's heads learns so without waiting for that pass. `decide` on the same
        snapshot and policy then returns only the rest of the decision."""
        usable, held = quarantine_queues(snapshot)
        try:
            state = self._sync(usable, policy)
            if self.last_sync.rebuilt or policy != self._policy:
                self.parking = Parking()  # every answer is asked again
                self._policy = policy
            candidates = self.parking.refresh(usable, state, policy)
            told = self.parking.settle_parked(candidates)
        except Exception:
            self.reset()
            raise
        self._parked = _Parked(snapshot, policy, usable, held, state, candidates)
        return told

    def decide(self, snapshot: Snapshot, policy: Policy, now: datetime) -> Decision:
        parked = self._parked
        early: tuple[PendingReason, ...] = ()
        if parked is None or parked.snapshot is not snapshot or parked.policy != policy:
            early = self.park(snapshot, policy)
            parked = self._parked
            assert parked is not None
        self._parked = None
        state = parked.state
        mark = state.checkpoint()
        try:
            cycle = Cycle(parked.usable, policy, now, state, candidates=parked.candidates, mix_of=self._mix.of)
            failure = cycle.run()
        except Exception:
            self._kept = None
            raise
        finally:
            if self._kept is not None:
                state.rollback(mark)
        if failure is not None:
            # A gang raised: the one-shot path sets it aside and starts over on fresh state. The
            # kept state is not trusted after that (the journal may not hold a half-made change).
            self.reset()
            full = schedule(snapshot, policy, now)
            self.parking.kept = {p.workload_id: (p.why, p.reservation) for p in full.pending}
            return full
        decision = decision_of(cycle, parked.usable, parked.held, {})
        self.last_sync = replace(
            self.last_sync, classes_checked=self.parking.last_checked, candidates=len(parked.candidates)
        )
        return replace(decision, pending=early + self.parking.settle(decision))

    def _sync(self, snapshot: Snapshot, policy: Policy) -> CycleState:
        kept = self._kept
        if kept is None or kept.cycles >= REBUILD_AFTER_CYCLES or not _same_fleet(kept.snapshot, snapshot):
            state = CycleState(snapshot, policy)
            self._kept = _Kept(snapshot, state)
            self.last_sync = SyncStats(rebuilt=True, runs_released=0, runs_added=len(snapshot.live_runs))
            return state
        state, before = kept.state, kept.state.live
        now_runs: dict[str, LiveRun] = {}
        added: list[LiveRun] = []
        for run in snapshot.live_runs:
            key = live_key(run)
            now_runs[key] = run
            old = before.get(key)
            if old is None or (old is not run and old != run):
                added.append(run)
        changed = {live_key(run) for run in added}
        released = [run for key, run in before.items() if key not in now_runs or key in changed]
        state.release_live(released)
        state.hold_live(added)
        # The live runs in the snapshot's order, as a fresh build lists them.
        state.relist_live(snapshot.live_runs)
        kept.snapshot = snapshot
        kept.cycles += 1
        self.last_sync = SyncStats(rebuilt=False, runs_released=len(released), runs_added=len(added))
        return state


@dataclass
class _Parked:
    """What `IncrementalScheduler.park` worked out for one snapshot, for `decide` on it."""

    snapshot: Snapshot
    policy: Policy
    usable: Snapshot  # without the gangs of quarantined queues
    held: list[tuple[Workload, Why]]  # those gangs, with their reason
    state: CycleState
    candidates: list[Workload]


def same_decision(full: Decision, delta: Decision, reasons: dict[str, PendingReason]) -> bool:
    """Whether `IncrementalScheduler.decide` (its `delta` decision and the `reasons` it kept after
    it) decided what `schedule()` decided (`full`)."""
    return (
        full.admissions == delta.admissions
        and full.evictions == delta.evictions
        and {p.workload_id: p for p in full.pending} == reasons
    )


def _same_fleet(before: Snapshot, after: Snapshot) -> bool:
    """Whether the state built for `before` serves `after` once live runs are synced: the same
    clusters (with their pools), nodes and queue tree."""
    return before.clusters == after.clusters and before.nodes == after.nodes and before.queue_tree == after.queue_tree


@dataclass
class _Class:
    """The gangs of one parking class, its answer and its front gang (None: not worked out)."""

    answer: Parked
    members: dict[str, Workload] = field(default_factory=dict)
    ordered: list[Workload] | None = None  # members in their queue's order, once worked out

    def in_order(self) -> list[Workload]:
        if self.ordered is None:
            self.ordered = sorted(self.members.values(), key=queue_order)
        return self.ordered


class Parking:
    """The parking answers per class, kept across cycles, and every pending gang's reason.

    `refresh` brings the classes up to date with a snapshot's pending gangs, asks `park` again for
    the classes a change woke, and returns the candidates; `settle` takes the cycle's decision and
    returns the reasons that changed. Usage is compared with what it was at the previous cycle's
    start: a class's answer read that state, so it holds while nothing it watches changed."""

    def __init__(self) -> None:
        self.classes: dict[ParkingClass, _Class] = {}
        self.class_of_gang: dict[str, tuple[Workload, ParkingClass]] = {}
        self.pending: tuple[Workload, ...] | None = None
        self.usage_seen: dict[str, dict[str, int]] = {}
        self.versions_seen: dict[str, int] = {}
        # queue id -> ids of its gangs that are not behind its heads this cycle (candidates, and
        # blocked gangs among its first heads); every other gang of the queue is behind them.
        self.fronts: dict[str, set[str]] = {}
        self.front_parked: dict[str, Why] = {}  # blocked gangs among their queue's heads: the reason
        self.behind_of: dict[str, BehindHeads] = {}  # queue id -> the reason of the gangs behind
        self.kept: dict[str, tuple[Why, ReservationNote | None]] = {}  # workload id -> its reason
        self.to_tell: dict[str, None] = {}  # gangs whose reason may have changed this cycle
        # Each queue's split as the last cycle worked it out, and the queues whose classes have
        # changed since (a gang joined or left, an answer moved): only those are split again.
        self.splits: dict[str, QueueSplit[Workload]] = {}
        self.dirty: set[str] = set()
        self.last_checked = 0

    def reasons(self) -> dict[str, PendingReason]:
        return {gang: PendingReason(gang, why, note) for gang, (why, note) in self.kept.items()}

    def refresh(self, snapshot: Snapshot, state: CycleState, policy: Policy) -> list[Workload]:
        """The candidates of this cycle, after waking what changed and parking what arrived: the
        rule of `split_queue`, worked out from each queue's first gangs only (a deep backlog's
        reason, behind the heads, does not move while its class's block comes and goes)."""
        self._sync_pending(snapshot, state)
        woken = self._woken(state)  # new classes among them: they start as candidates
        self.last_checked = len(woken)
        for gang in woken:
            entry = self.classes[gang]
            answer = park(state, policy, gang)
            if (answer.for_good or entry.answer.for_good) and answer.why != entry.answer.why:
                self.to_tell.update(dict.fromkeys(entry.members))  # parked for good, or no longer
            if answer != entry.answer:
                self.dirty.add(gang.queue_id)
            entry.answer = answer
        self._see(state)
        per_queue: dict[str, list[_Class]] = {}
        for gang, entry in self.classes.items():
            if not entry.answer.for_good:
                per_queue.setdefault(gang.queue_id, []).append(entry)
        heads = policy.heads_per_queue
        tree = state.ledger.tree
        candidates: list[Workload] = []
        fronts: dict[str, set[str]] = {}
        self.front_parked = {}
        splits: dict[str, QueueSplit[Workload]] = {}
        for queue_id, entries in per_queue.items():
            split = self.splits.get(queue_id)
            if split is None or queue_id in self.dirty:
                split = split_queue(self._front_gangs(entries, heads), heads)
            splits[queue_id] = split
            candidates.extend(split.candidates)
            self.front_parked.update((workload.id, why) for workload, why in split.parked)
            fronts[queue_id] = {w.id for w in split.candidates} | {w.id for w, _ in split.parked}
        self.splits, self.dirty = splits, set()
        for queue_id, members in self.fronts.items():
            now = fronts.get(queue_id, set())
            self.to_tell.update((gang_id, None) for gang_id in members - now if gang_id in self.class_of_gang)
        self.fronts = fronts
        self.behind_of = {
            queue_id: BehindHeads(tree[queue_id].name if queue_id in tree else queue_id, heads)
            for queue_id in per_queue
        }
        return candidates

    def _front_gangs(self, entries: list[_Class], heads: int) -> list[tuple[Workload, Parked]]:
        """The gangs of one queue (its classes not parked for good) that `split_queue` does not
        send behind, with their answers, in the queue's order: its first `heads`, the first
        `heads` the limits let through, and the front blocked gang that may ask. Split alone,
        they split as they do among all the queue's gangs (every gang ahead of one of them is
        among them), so a deep backlog is never walked."""
        first = heapq.merge(*(entry.in_order() for entry in entries), key=queue_order)
        through = heapq.merge(*(entry.in_order() for entry in entries if entry.answer.why is None), key=queue_order)
        chosen = {w.id: w for w in itertools.chain(itertools.islice(first, heads), itertools.islice(through, heads))}
        askers = [entry.in_order()[0] for entry in entries if entry.answer.why is not None and entry.answer.may_ask]
        if askers:
            front = min(askers, key=queue_order)
            chosen[front.id] = front
        classes, class_of_gang = self.classes, self.class_of_gang
        return [(w, classes[class_of_gang[w.id][1]].answer) for w in sorted(chosen.values(), key=queue_order)]

    def _sync_pending(self, snapshot: Snapshot, state: CycleState) -> None:
        """Bring the classes' members up to date with the pending gangs: from the snapshot's delta
        when it was made against the gangs kept here, else by comparing every gang."""
        pending, delta = snapshot.pending, snapshot.pending_delta
        if pending is self.pending:
            return
        if delta is not None and delta.base is self.pending:
            for gang_id in delta.removed:
                found = self.class_of_gang.get(gang_id)
                if found is not None:
                    self._leave(gang_id, found[1])
            for workload in delta.changed:
                self._join(workload, state)
        if delta is None or delta.base is not self.pending or len(self.class_of_gang) != len(pending):
            # No delta, one made against other gangs, or one that does not add up (a snapshot
            # copied with its predecessor's delta): compare every gang.
            known = self.class_of_gang
            present: set[str] = set()
            for workload in pending:
                present.add(workload.id)
                self._join(workload, state)
            if len(known) != len(present):
                for gone in [gang_id for gang_id in known if gang_id not in present]:
                    self._leave(gone, known[gone][1])
        self.pending = pending

    def _join(self, workload: Workload, state: CycleState) -> None:
        """Put the gang in its class. A class seen for the first time starts as a candidate, so the
        next `_woken` asks it (and its gangs are told if it parks)."""
        found = self.class_of_gang.get(workload.id)
        if found is not None:
            if found[0] is workload or found[0] == workload:
                return
            self._leave(workload.id, found[1])
        gang = class_of(state, workload)
        entry = self.classes.get(gang)
        if entry is None:
            entry = self.classes[gang] = _Class(CANDIDATE)
        else:
            entry.ordered = None
        entry.members[workload.id] = workload
        self.class_of_gang[workload.id] = (workload, gang)
        self.dirty.add(gang.queue_id)
        self.to_tell[workload.id] = None  # its reason is worked out at `settle` unless decided

    def _leave(self, gang_id: str, gang: ParkingClass) -> None:
        del self.class_of_gang[gang_id]
        self.kept.pop(gang_id, None)
        self.to_tell.pop(gang_id, None)
        entry = self.classes[gang]
        del entry.members[gang_id]
        entry.ordered = None
        self.dirty.add(gang.queue_id)
        if not entry.members:
            del self.classes[gang]

    def _woken(self, state: CycleState) -> list[ParkingClass]:
        """Classes not asked yet, and classes (parked or not) whose watched usage changed since
        the previous cycle's start."""
        ledger = state.ledger
        # A version moves with every charge, trials rolled back included: what counts is usage
        # that is not what it was.
        seen = self.usage_seen
        changed = {
            node
            for node, version in ledger.versions.items()
            if self.versions_seen.get(node) != version and ledger.usage.get(node, {}) != seen.get(node, {})
        }
        changed.update(node for node in self.versions_seen if node not in ledger.versions)
        woken: list[ParkingClass] = []
        for gang, entry in self.classes.items():
            answer = entry.answer
            if answer is CANDIDATE or (
                changed
                and (
                    any(node in changed for node in answer.watch_any)
                    or any(
                        ledger.used(node, key) < self.usage_seen.get(node, {}).get(key, 0)
                        for node, key in answer.watch_drop
                        if node in changed
                    )
                )
            ):
                woken.append(gang)
        return woken

    def _see(self, state: CycleState) -> None:
        ledger = state.ledger
        for node, version in ledger.versions.items():
            if self.versions_seen.get(node) != version:
                self.versions_seen[node] = version
                self.usage_seen[node] = dict(ledger.usage.get(node, {}))

    def settle_parked(self, candidates: list[Workload]) -> tuple[PendingReason, ...]:
        """Keep the reasons of the gangs this cycle leaves parked (blocked among their queue's
        heads, behind them, parked for good); those that differ from what was kept. What is left
        to tell is the candidates' (`settle`)."""
        told: list[PendingReason] = []
        for gang_id, why in self.front_parked.items():
            self._tell(told, gang_id, why, None)
        deciding = {workload.id for workload in candidates}
        for gang_id in [gang_id for gang_id in self.to_tell if gang_id not in deciding]:
            found = self.class_of_gang.get(gang_id)
            if found is None:
                del self.to_tell[gang_id]
                continue
            answer = self.classes[found[1]].answer
            why = answer.why if answer.why is not None and answer.for_good else self.behind_of[found[1].queue_id]
            self._tell(told, gang_id, why, None)
        return tuple(told)

    def settle(self, decision: Decision) -> tuple[PendingReason, ...]:
        """Keep the decision's reasons (after `settle_parked`); those that differ from what was
        kept (a delta)."""
        told: list[PendingReason] = []
        for reason in decision.pending:
            self._tell(told, reason.workload_id, reason.why, reason.reservation)
        for admission in decision.admissions:
            self.kept.pop(admission.workload_id, None)
            self.to_tell.pop(admission.workload_id, None)
        self.to_tell = {}  # every candidate was admitted or left pending with a reason
        return tuple(told)

    def _tell(self, told: list[PendingReason], gang_id: str, why: Why, note: ReservationNote | None) -> None:
        self.to_tell.pop(gang_id, None)
        if self.kept.get(gang_id) != (why, note):
            self.kept[gang_id] = (why, note)
            told.append(PendingReason(gang_id, why, note))
