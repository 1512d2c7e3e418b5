"""What eviction trials work out from the live runs alone, kept with the fleet state across cycles.

A full fleet's queue heads ask for the same victims cycle after cycle: each queue's runs in the
victim order, the runs a kind may take, those runs per cluster and the units they hold. All of
that depends only on the runs themselves (when no minimum runtime can protect a run, which would
make it depend on the time too), so it is kept until a run of a queue it read starts, ends,
changes or is evicted: the state bumps that queue's version (`CycleState.queue_versions`).

Derived answers (a list's runs per cluster, its units per queue, its first runs) are kept per
list, by identity: no list is ever changed once made, and every answer is a function of the list's
runs alone, so an answer found for the same list object holds, even after an eviction (the lists
that held the victim are replaced by new ones, never edited). They only grow while lists are
replaced, so they are dropped past a bound.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any, TypeVar

from controlplane.core.snapshot import LiveRun

# Past this many answers per kind the identity-keyed memos start over (a kept state is rebuilt
# every few hundred cycles anyway; this bounds a busy fleet's churn in between).
DERIVED_LIMIT = 20_000

Runs = list[LiveRun]
T = TypeVar("T")


class VictimMemo:
    def __init__(self) -> None:
        # (what the list is of) -> (the versions of the queues it read, the list)
        self.lists: dict[Hashable, tuple[tuple[int, ...], Runs]] = {}
        self.order_keys: dict[str, tuple[LiveRun, tuple[bool, int, float, str, str]]] = {}
        self._derived: dict[tuple[int, Hashable], tuple[Runs, object]] = {}
        self._merged: dict[tuple[int, int], tuple[Runs, Runs, Runs]] = {}

    def order_keys_for(self, live_runs: int) -> dict[str, tuple[LiveRun, tuple[bool, int, float, str, str]]]:
        """The victim order keys per run (by live key), started over once runs long gone make up
        most of them."""
        if len(self.order_keys) > 2 * live_runs + DERIVED_LIMIT:
            self.order_keys = {}
        return self.order_keys

    def kept_list(self, key: Hashable, versions: tuple[int, ...]) -> Runs | None:
        found = self.lists.get(key)
        return found[1] if found is not None and found[0] == versions else None

    def keep_list(self, key: Hashable, versions: tuple[int, ...], runs: Runs) -> None:
        if len(self.lists) >= DERIVED_LIMIT:
            self.lists = {}
        self.lists[key] = (versions, runs)

    def derived(self, runs: Runs, what: Hashable, work_out: Callable[[Runs], T]) -> T:
        """`work_out(runs)`, remembered for this very list object."""
        key = (id(runs), what)
        found = self._derived.get(key)
        if found is not None and found[0] is runs:
            return found[1]  # type: ignore[return-value]
        value = work_out(runs)
        if len(self._derived) >= DERIVED_LIMIT:
            self._derived = {}
        self._derived[key] = (runs, value)
        return value

    def merged(self, first: Runs, second: Runs, order: Callable[[LiveRun], Any]) -> Runs:
        """The runs of both lists in `order`, remembered for these very list objects."""
        key = (id(first), id(second))
        found = self._merged.get(key)
        if found is not None and found[0] is first and found[1] is second:
            return found[2]
        runs = sorted(first + second, key=order)
        if len(self._merged) >= DERIVED_LIMIT:
            self._merged = {}
        self._merged[key] = (first, second, runs)
        return runs
