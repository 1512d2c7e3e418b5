"""Weighted max-min fair shares by water-filling: the rule both the peers' deserved shares
(`peers/`) and the study's demand-aware fairness (`metrics.py`) read."""

from __future__ import annotations

from collections.abc import Mapping


def shares_by_weight(weights: Mapping[str, float], demand: Mapping[str, float], total: float) -> dict[str, float]:
    """Water-filling: `total` split in proportion to weight, no queue above its demand, what a
    capped queue leaves going to the others (weight 0 gets nothing)."""
    share = dict.fromkeys(weights, 0.0)
    open_queues = {q for q, w in weights.items() if w > 0 and demand.get(q, 0.0) > 0}
    left = total
    while open_queues and left > 1e-9:
        weight_sum = sum(weights[q] for q in open_queues)
        capped = {q for q in open_queues if demand[q] - share[q] <= left * weights[q] / weight_sum}
        if not capped:
            for q in open_queues:
                share[q] += left * weights[q] / weight_sum
            break
        for q in capped:
            left -= demand[q] - share[q]
            share[q] = demand[q]
        open_queues -= capped
    return share
