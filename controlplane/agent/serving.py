"""The agent's serving scrape: each inference pod's declared metrics into per-run traffic and latency.

gpufleet puts an inference workload's `serving` block on its pods as the `gpufleet.io/serving`
annotation (adapters/kubernetes/pod_template.py). Each round the agent lists the running pods of
its namespaces that carry it (`pod_targets`), scrapes `http://<pod IP>:<port><path>`, and turns the
declared counter into a rate and the declared latency histogram into a mean over the interval, from
the difference with the previous scrape of the same pod. A run's pods add up: their request rates
are summed, their latencies weighted by requests. The readings ride in the DCGM batch message the
agent publishes anyway (`telemetry_wire.encode_batch`).

A pod scraped for the first time has no previous totals and gives no rate yet; a pod that cannot
be scraped gives nothing. Either way the run has no fresh reading, which the idle policy reads as
"traffic unknown" (exempt), never as zero traffic.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import httpx
from pydantic import ValidationError

from adapters.dcgm.exposition import RUN_LABEL
from adapters.prometheus.serving_scrape import MAX_BODY_BYTES, ServingTotals, serving_totals
from controlplane.service.serving import MAX_LATENCY_MS, MAX_RPS, ServingReading, ServingSpec

log = logging.getLogger(__name__)
SERVING_ANNOTATION = "gpufleet.io/serving"
# Pods scraped concurrently: a node runs a handful of inference servers, a cluster-wide agent more.
CONCURRENCY = 16


@dataclass(frozen=True)
class ServingTarget:
    run_id: str
    pod: str  # namespace/name: the previous totals are kept per pod
    url: str
    traffic_metric: str | None
    latency_metric: str | None


def pod_targets(pods: Iterable[Mapping[str, Any]], namespaces: Iterable[str]) -> list[ServingTarget]:
    """Targets from Kubernetes pod objects (as JSON): running pods in `namespaces` that carry a run
    label, a pod IP and a valid `gpufleet.io/serving` annotation. Anything else is skipped."""
    allowed = set(namespaces)
    out: list[ServingTarget] = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        status = pod.get("status") or {}
        namespace, name = meta.get("namespace"), meta.get("name")
        run = (meta.get("labels") or {}).get(RUN_LABEL)
        raw = (meta.get("annotations") or {}).get(SERVING_ANNOTATION)
        ip = status.get("podIP")
        if namespace not in allowed or not run or not raw or not ip or status.get("phase") != "Running":
            continue
        try:
            spec = ServingSpec.model_validate(json.loads(raw))
        except (ValueError, ValidationError) as exc:
            log.warning("pod %s/%s: serving annotation refused: %s", namespace, name, exc)
            continue
        host = f"[{ip}]" if ":" in ip else ip
        out.append(
            ServingTarget(
                run_id=str(run),
                pod=f"{namespace}/{name}",
                url=f"http://{host}:{spec.metrics_port}{spec.metrics_path}",
                traffic_metric=spec.traffic_metric,
                latency_metric=spec.latency_metric,
            )
        )
    return out


async def fetch_text(client: httpx.AsyncClient, url: str, timeout: float) -> str:
    """The body of one metrics endpoint, refusing one larger than MAX_BODY_BYTES."""
    async with client.stream("GET", url, timeout=timeout) as response:
        response.raise_for_status()
        chunks: list[bytes] = []
        size = 0
        async for chunk in response.aiter_bytes():
            size += len(chunk)
            if size > MAX_BODY_BYTES:
                raise ValueError(f"metrics body larger than {MAX_BODY_BYTES} bytes")
            chunks.append(chunk)
    return b"".join(chunks).decode("utf-8", errors="replace")


@dataclass
class _Seen:
    at: float
    totals: ServingTotals


class ServingScraper:
    """Scrapes serving targets and keeps each pod's previous totals, to turn counters into rates."""

    def __init__(self, timeout: float = 5.0) -> None:
        self.timeout = timeout
        self.previous: dict[str, _Seen] = {}
        self.failures = 0

    async def scrape(
        self, client: httpx.AsyncClient, targets: Sequence[ServingTarget], now: float
    ) -> list[ServingReading]:
        limit = asyncio.Semaphore(CONCURRENCY)

        async def one(target: ServingTarget) -> ServingTotals | None:
            async with limit:
                try:
                    text = await fetch_text(client, target.url, self.timeout)
                    return serving_totals(text, target.traffic_metric, target.latency_metric)
                except Exception as exc:
                    self.failures += 1
                    log.warning(
                        "serving scrape of %s (%s) failed: %s: %s", target.pod, target.url, type(exc).__name__, exc
                    )
                    return None

        results = await asyncio.gather(*(one(t) for t in targets))
        scraped = {t.pod: (t, r) for t, r in zip(targets, results, strict=True) if r is not None}
        readings = rates(self.previous, scraped, now)
        # Forget pods that are gone; keep the new totals for the next round.
        self.previous = {pod: _Seen(now, totals) for pod, (_, totals) in scraped.items()}
        return readings


def _delta(current: float | None, before: float | None) -> float | None:
    """A counter's increase; a counter that went down was reset (the server restarted) and counts
    from zero, as Prometheus' rate() takes it."""
    if current is None or before is None:
        return None
    return current - before if current >= before else current


@dataclass
class _RunRate:
    rps: float | None = None  # summed over the run's pods that expose the traffic counter
    latency_sum: float = 0.0  # seconds, over the requests of the interval
    latency_count: float = 0.0


def rates(
    previous: Mapping[str, _Seen], scraped: Mapping[str, tuple[ServingTarget, ServingTotals]], now: float
) -> list[ServingReading]:
    """Per run: the summed request rate of its pods and their request-weighted mean latency since
    the previous scrape. Pods without a previous scrape give nothing yet."""
    per_run: dict[str, _RunRate] = {}
    for pod, (target, totals) in scraped.items():
        seen = previous.get(pod)
        if seen is None or now <= seen.at:
            continue
        acc = per_run.setdefault(target.run_id, _RunRate())
        requests = _delta(totals.requests, seen.totals.requests)
        if requests is not None:
            acc.rps = (acc.rps or 0.0) + requests / (now - seen.at)
        latency_sum = _delta(totals.latency_sum, seen.totals.latency_sum)
        latency_count = _delta(totals.latency_count, seen.totals.latency_count)
        if latency_sum is not None and latency_count:
            acc.latency_sum += latency_sum
            acc.latency_count += latency_count
    at = datetime.fromtimestamp(now, UTC)
    out = []
    for run, acc in sorted(per_run.items()):
        if acc.rps is None and not acc.latency_count:
            continue  # neither declared metric was found: no reading, so the traffic stays unknown
        latency = 1000.0 * acc.latency_sum / acc.latency_count if acc.latency_count else None
        out.append(
            ServingReading(
                run,
                at,
                None if acc.rps is None else min(acc.rps, MAX_RPS),
                None if latency is None else min(max(latency, 0.0), MAX_LATENCY_MS),
            )
        )
    return out


# Lists the pods of one namespace as Kubernetes JSON objects (blocking; run in a thread).
PodLister = Callable[[str], list[dict[str, Any]]]


@dataclass(frozen=True)
class ServingRound:
    """What the agent needs to add serving readings to a round: where the targets come from, and
    the scraper that remembers the previous totals."""

    targets: Callable[[], Awaitable[list[ServingTarget]]]
    scraper: ServingScraper

    async def readings(self, client: httpx.AsyncClient, now: float) -> list[ServingReading]:
        try:
            targets = await self.targets()
        except Exception as exc:
            # Listing failed: no readings this round (traffic unknown), the DCGM samples still go.
            log.warning("serving targets not listed: %s: %s", type(exc).__name__, exc)
            return []
        return await self.scraper.scrape(client, targets, now)


def lister_targets(list_pods: PodLister, namespaces: Sequence[str]) -> Callable[[], Awaitable[list[ServingTarget]]]:
    """A target source over a pod lister: every namespace listed in a worker thread each round."""

    async def targets() -> list[ServingTarget]:
        pods: list[dict[str, Any]] = []
        for namespace in namespaces:
            pods.extend(await asyncio.to_thread(list_pods, namespace))
        return pod_targets(pods, namespaces)

    return targets
