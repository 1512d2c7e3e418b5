"""What gpufleet exports: a registry as a process builds it, every port method called once and the
SQL-gauge collector fed a full `FleetGauges`, read back through prometheus_client's parser."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from prometheus_client.parser import text_string_to_metric_families

from adapters.prometheus import FleetCollector, PrometheusMetrics, exposition, new_registry
from docsgen.metrics_reference import SampleGauges, exercise_every_method

SERIES_SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"), "summary": ("_count", "_sum")}


@dataclass(frozen=True)
class Family:
    name: str
    type: str
    labels: frozenset[str]


def exported_families() -> dict[str, Family]:
    """Every family a process exports, each with a sample (docsgen's reference page is built from
    the same exercise, so the page and these checks cannot disagree)."""
    registry = new_registry()
    exercise_every_method(PrometheusMetrics(registry))
    registry.register(FleetCollector(SampleGauges(), lambda: datetime.now(UTC)))
    body, _ = exposition(registry)
    families: dict[str, Family] = {}
    for family in text_string_to_metric_families(body.decode()):
        assert family.samples, f"{family.name} was not exercised: its labels are unknown"
        labels = frozenset(label for s in family.samples for label in s.labels if label != "le")
        families[family.name] = Family(family.name, family.type, labels)
    return families


def series_names(families: dict[str, Family]) -> dict[str, Family]:
    """Every name a query may use: gauges by name, counters with `_total`, histograms' `_bucket`,
    `_count` and `_sum` (with `le` on the buckets)."""
    names: dict[str, Family] = {}
    for family in families.values():
        suffixes = SERIES_SUFFIXES.get(family.type, ("",))
        for suffix in suffixes:
            labels = family.labels | ({"le"} if suffix == "_bucket" else set())
            names[family.name + suffix] = Family(family.name, family.type, frozenset(labels))
    return names
