"""An inference server's Prometheus text (vLLM's `/metrics`, or any server's) into the totals a
serving reading is computed from: the declared request counter, and the declared latency
histogram's (or summary's) `_sum` and `_count`, each summed over all its series (every model,
finish reason and label set the server exposes)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

# A serving endpoint answers a few hundred kilobytes; a larger body is not read (see the agent).
MAX_BODY_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True)
class ServingTotals:
    requests: float | None  # the traffic counter's total; None when the server does not expose it
    latency_sum: float | None  # seconds, over all requests so far
    latency_count: float | None


def serving_totals(text: str, traffic_metric: str | None, latency_metric: str | None) -> ServingTotals:
    """Totals of the declared metrics in one scrape. A counter may be declared with or without
    `_total`; the latency metric is the histogram's or summary's base name."""
    counter_names = set()
    if traffic_metric:
        base = traffic_metric.removesuffix("_total")
        counter_names = {base, f"{base}_total"}
    requests = latency_sum = latency_count = None
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            value = float(sample.value)
            if not math.isfinite(value):
                continue
            if sample.name in counter_names:
                requests = (requests or 0.0) + value
            elif latency_metric and sample.name == f"{latency_metric}_sum":
                latency_sum = (latency_sum or 0.0) + value
            elif latency_metric and sample.name == f"{latency_metric}_count":
                latency_count = (latency_count or 0.0) + value
    return ServingTotals(requests, latency_sum, latency_count)
