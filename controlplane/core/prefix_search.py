"""The shortest prefix of a release order after which a gang fits: a what-if that probes a
logarithmic number of prefixes, not every one.

A reservation asks which runs must end (in the order they are due) before a gang fits. Releasing
one run at a time and trying a placement after each costs one placement search per run: a large
gang on a busy cluster tried a thousand. Freeing capacity never takes a fit away (quota is not
touched: runs are released with `quota=False`), so the prefixes that fit are those from some
length on, and that length is found by doubling and then bisecting: about 2·log2(n) placement
searches and at most 2·n releases, on the real state inside checkpoints that are all rolled back.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

from controlplane.core.state import CycleState

Item = TypeVar("Item")
Found = TypeVar("Found")


def shortest_fitting_prefix(
    state: CycleState,
    items: Sequence[Item],
    release: Callable[[Item], object],
    probe: Callable[[], Found | None],
    all_first: bool = False,
) -> tuple[int, Found] | None:
    """The least n ≥ 1 such that `probe()` answers after `release`-ing `items[:n]`, with that
    answer; None when even all of them are not enough. The state is left as it was.

    `all_first`: probe with every item released before anything else, for a caller whose common
    answer is None (then one probe says so instead of log2(n))."""
    outer = state.checkpoint()
    try:
        if all_first:
            everything = state.checkpoint()
            try:
                for item in items:
                    release(item)
                enough = bool(items) and probe() is not None
            finally:
                state.rollback(everything)
            if not enough:
                return None
        released = 0  # items[:released] are released on the state now, and probing there failed
        size, found = 1, None
        while found is None:  # doubling: released = 0, 1, 2, 4, ... until a probe answers
            upto = min(len(items), max(size, released + 1))
            if upto <= released:
                return None
            answer = _probe_further(state, items[released:upto], release, probe)
            if answer is None:
                released, size = upto, size * 2
            else:
                found = (upto, answer)
        fits_at, answer = found
        while fits_at - released > 1:  # bisecting (released, fits_at]: the first is known to fail
            middle = (released + fits_at) // 2
            shorter = _probe_further(state, items[released:middle], release, probe)
            if shorter is None:
                released = middle
            else:
                fits_at, answer = middle, shorter
        return fits_at, answer
    finally:
        state.rollback(outer)


def _probe_further(
    state: CycleState, more: Sequence[Item], release: Callable[[Item], object], probe: Callable[[], Found | None]
) -> Found | None:
    """Release `more` on top of what is released and probe: on no answer they stay released (the
    search goes on from there), on an answer they are taken back."""
    batch = state.checkpoint()
    try:
        for item in more:
            release(item)
        answer = probe()
    except BaseException:
        state.rollback(batch)  # closes its checkpoint too: the caller's rollback then closes its own
        raise
    if answer is None:
        state.keep(batch)
    else:
        state.rollback(batch)
    return answer
