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
            for item in items:
                release(item)
            enough = bool(items) and probe() is not None
            state.rollback(everything)
            if not enough:
                return None
        released = 0  # items[:released] are released on the state now, and probing there failed
        size, found = 1, None
        while found is None:  # doubling: released = 0, 1, 2, 4, ... until a probe answers
            upto = min(len(items), max(size, released + 1))
            if upto <= released:
                return None
            batch = state.checkpoint()
            for item in items[released:upto]:
                release(item)
            answer = probe()
            if answer is None:
                state.keep(batch)
                released = upto
                size *= 2
            else:
                state.rollback(batch)
                found = (upto, answer)
        fits_at, answer = found
        while fits_at - released > 1:  # bisecting (released, fits_at]: the first is known to fail
            middle = (released + fits_at) // 2
            batch = state.checkpoint()
            for item in items[released:middle]:
                release(item)
            shorter = probe()
            if shorter is None:
                state.keep(batch)
                released = middle
            else:
                state.rollback(batch)
                fits_at, answer = middle, shorter
        return fits_at, answer
    finally:
        state.rollback(outer)
