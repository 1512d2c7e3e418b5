"""Partial admission: the largest pod-set counts that fit, every pod set at least at its minimum.

A pod set may say the gang can start with fewer of its replicas (`PodSet.min_replicas`, Kueue's
`minCount`): a launcher 1 of 1 and workers at least 2 of 4, say. The rule, modelled on Kueue's
`PodSetReducer`:

1. the full counts are tried first, all pods required;
2. otherwise the minimum counts are tried: when even they do not fit, the gang waits (two attempts
   for a gang that waits, the common case in a busy fleet), and the reason is that attempt's miss;
3. otherwise a shrink budget b in 1..D (D = the sum over pod sets of replicas - minimum) is spread
   over the pod sets in proportion to what each may give up, count_i = replicas_i -
   floor(delta_i * b / D) (b = D is every minimum), and a binary search finds the smallest budget
   that fits, as Kueue does (it takes fit to be monotone in the counts: fewer pods never need more
   room; best fit is greedy, so a count skipped by that assumption is possible but rare);
4. when that shrank two or more pod sets, what it cut needlessly is given back, first pod set to
   last (newer Kueue's `giveBack`): each grows to the largest count that still fits, a later one
   seeing only what the earlier ones left.

Classic Kueue lets one pod set per Workload have a `minCount`; gpufleet allows any number, which is
what the proportional shrink and the give-back are for. Fit here is capacity (nodes, pools, one
cluster); quota is checked afterwards on the chosen placement (`fit.Fitter.place`), dropping pods
of the last pod set still above its minimum until the queue's rules pass, so quota is charged for
the pods placed. Every attempt is all-or-nothing at its counts (`at_counts`). The counts admitted are fixed for the
run: it never grows back towards its full counts (Kueue's partial admission does not either); the
gang's `min_available` is the sum of the minimums (what its cluster's gang object requires).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from functools import lru_cache
from typing import TypeVar

from controlplane.domain.model import Workload

Counts = tuple[int, ...]
Answer = TypeVar("Answer")


def full_counts(workload: Workload) -> Counts:
    return tuple(ps.replicas for ps in workload.pod_sets)


def minimum_counts(workload: Workload) -> Counts:
    return tuple(ps.least for ps in workload.pod_sets)


@lru_cache(maxsize=4096)
def at_counts(workload: Workload, counts: Counts) -> Workload:
    """The gang with exactly `counts` pods per pod set, every one of them required.

    Remembered, so asking again for the same gang and counts gives the very same object: the
    placement search remembers answers per workload object and per gang shape.
    """
    pod_sets = tuple(
        replace(ps, replicas=count, min_replicas=None) for ps, count in zip(workload.pod_sets, counts, strict=True)
    )
    return replace(workload, pod_sets=pod_sets, min_available=sum(counts))


def largest_fit(workload: Workload, attempt: Callable[[Workload], Answer], fitted: Callable[[Answer], bool]) -> Answer:
    """`attempt`'s answer for the gang at the largest counts that fit (see the module's rule), or
    its answer at the minimum counts when even those do not fit. A gang no pod set of which may
    shrink is asked once, as it is."""
    if not workload.reducible:
        return attempt(workload)
    answers: dict[Counts, Answer] = {}

    def probe(counts: Counts) -> tuple[bool, Answer]:
        found = answers.get(counts)
        if found is None:
            found = answers[counts] = attempt(at_counts(workload, counts))
        return fitted(found), found

    full = full_counts(workload)
    ok, answer = probe(full)
    if ok:
        return answer
    least = minimum_counts(workload)
    ok, answer = probe(least)
    if not ok:
        return answer
    deltas = [f - m for f, m in zip(full, least, strict=True)]
    total = sum(deltas)

    def shrunk(budget: int) -> Counts:
        return tuple(f - d * budget // total for f, d in zip(full, deltas, strict=True))

    # The smallest budget that fits: budget `total` (the minimums) does, budget 0 (full) does not.
    low, high = 1, total
    best, best_answer = least, answer
    while low < high:
        middle = (low + high) // 2
        ok, found = probe(shrunk(middle))
        if ok:
            high, best, best_answer = middle, shrunk(middle), found
        else:
            low = middle + 1
    return _give_back(full, best, best_answer, probe)


def _give_back(full: Counts, counts: Counts, answer: Answer, probe: Callable[[Counts], tuple[bool, Answer]]) -> Answer:
    """Grow back, first pod set to last, what the proportional shrink cut more than it had to."""
    if sum(1 for c, f in zip(counts, full, strict=True) if c < f) < 2:
        return answer  # growing the only shrunk set means a budget the search already refused
    current = list(counts)
    for i, wanted in enumerate(full):
        if current[i] == wanted:
            continue
        ok, found = probe((*current[:i], wanted, *current[i + 1 :]))
        if ok:  # the common case, settled in one attempt
            current[i], answer = wanted, found
            continue
        low, high = current[i] + 1, wanted - 1  # the largest count in [low, high] that fits, if any
        while low <= high:
            middle = (low + high + 1) // 2
            trial = (*current[:i], middle, *current[i + 1 :])
            ok, found = probe(trial)
            if ok:
                current[i], answer = middle, found
                low = middle + 1
            else:
                high = middle - 1
    return answer
