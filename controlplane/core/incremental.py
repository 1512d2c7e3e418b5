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

Parking comes from the placement search (`placement/search.py`): it remembers every shape's
answer until a node of a pool that answer read changes. Since the capacity now outlives the
cycle, a gang that found no room is not searched again in the next cycle (nor the one after)
until capacity of a pool it could use changed: a run there ended, a node there was added or
uncordoned. Quota and ordering rules are re-checked each cycle from the ledger, which is cheap.

The answer is the one-shot answer by construction, and a property test checks it: for any
sequence of snapshots, `decide` returns what `schedule()` returns on each of them.
Snapshots are compared by identity first (a snapshot cache that keeps unchanged rows as the
same objects makes the comparison a pointer check), then by value.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from controlplane.core.cycle import Cycle
from controlplane.core.decision import Decision
from controlplane.core.schedule import decision_of, quarantine_queues, schedule
from controlplane.core.snapshot import LiveRun, Policy, Snapshot
from controlplane.core.state import CycleState, live_key

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


class IncrementalScheduler:
    """`schedule()` with the fleet state kept from one call to the next. Not thread-safe: one per
    scheduler process (and leadership term)."""

    def __init__(self) -> None:
        self._kept: _Kept | None = None
        self.last_sync = SyncStats(rebuilt=True, runs_released=0, runs_added=0)

    def reset(self) -> None:
        """Forget the kept state: the next call rebuilds it (a new leadership term, an error)."""
        self._kept = None

    def decide(self, snapshot: Snapshot, policy: Policy, now: datetime) -> Decision:
        usable, held = quarantine_queues(snapshot)
        try:
            state = self._sync(usable, policy)
        except Exception:
            self._kept = None
            raise
        mark = state.checkpoint()
        try:
            cycle = Cycle(usable, policy, now, state)
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
            self._kept = None
            return schedule(snapshot, policy, now)
        return decision_of(cycle, usable, held, {})

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


def _same_fleet(before: Snapshot, after: Snapshot) -> bool:
    """Whether the state built for `before` serves `after` once live runs are synced: the same
    clusters (with their pools), nodes and queue tree."""
    return before.clusters == after.clusters and before.nodes == after.nodes and before.queue_tree == after.queue_tree
