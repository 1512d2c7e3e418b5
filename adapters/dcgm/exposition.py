"""dcgm-exporter's Prometheus text into `GpuSample`s: the fields gpufleet keeps, mapped to pods and runs.

Label spellings differ across exporter versions and flags, so each is read under every name it
has had: `Hostname` (released versions) and `hostname` (main since 2026-05), `UUID` and `uuid`
(`--use-old-namespace`), `pod`/`namespace`/`container` and their `pod_name`/`pod_namespace`/
`container_name` forms. MIG instances carry `GPU_I_PROFILE`/`GPU_I_ID`, and `UUID` stays the
parent GPU's. DCGM "blank" sentinels are dropped field by field, never turned into readings.

One sample per (host, GPU, MIG instance, pod): a MIG instance or a shared GPU held by several
pods is attributed per pod. For shared GPUs that takes `--kubernetes-virtual-gpus` on the
exporter (otherwise it names one pod per GPU); its per-pod copies carry `pod`/`namespace`/
`container` and `vgpu` but not the pod labels, so they are attributed by the pod name.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from controlplane.service.telemetry_wire import DCGM_FIELDS, GpuSample, is_blank

log = logging.getLogger(__name__)

RUN_LABEL = "gpufleet.io/run"


def metric_label_name(pod_label: str) -> str:
    """The metric label dcgm-exporter makes of a pod label (`utils.SanitizeLabelName`): every
    character that is not a letter, digit or underscore becomes `_`."""
    return re.sub(r"[^a-zA-Z0-9_]", "_", pod_label)


# With `--kubernetes-enable-pod-labels` (GPU Operator: `dcgmExporter.enablePodLabels`) every series
# of a GPU a pod holds carries the pod's labels under sanitised names: `gpufleet.io/run` (the full
# run id, attempt included) arrives as `gpufleet_io_run`.
RUN_METRIC_LABEL = metric_label_name(RUN_LABEL)
RUN_ID_MAX = 63  # a label value

# (namespace, pod) -> the run the pod belongs to, or None.
PodRunLookup = Callable[[str, str], str | None]
# (hostname, gpu index, MIG GPU-instance id or None) -> the run the scheduler assigned there, or None.
SlotRunLookup = Callable[[str, int, int | None], str | None]


def _label(labels: Mapping[str, str], *names: str) -> str | None:
    for name in names:
        value = labels.get(name)
        if value:  # exporters write "" for "no pod": treat it as absent
            return value
    return None


@dataclass
class RunResolver:
    """Which gpufleet run a GPU series belongs to.

    In order: the run id the pod's `gpufleet.io/run` label gives (through dcgm-exporter's pod
    labels), the pod lookup (gpufleet pods are named after their run), then the scheduler's node
    assignment (hostname + GPU) for series without a pod. A pod's label or name counts only in
    `namespaces` (None: any), so a pod elsewhere cannot bill its GPU to someone's run. A lookup
    that fails counts as "don't know", so a Kubernetes API hiccup never stops a scrape.
    """

    pod_run: PodRunLookup | None = None
    slot_run: SlotRunLookup | None = None
    namespaces: frozenset[str] | None = None

    def __call__(
        self,
        hostname: str,
        gpu: int,
        mig: int | None,
        namespace: str | None,
        pod: str | None,
        labelled_run: str | None = None,
    ) -> str | None:
        in_scope = namespace is not None and (self.namespaces is None or namespace in self.namespaces)
        if labelled_run and in_scope and len(labelled_run) <= RUN_ID_MAX:
            return labelled_run
        if self.pod_run is not None and in_scope and namespace and pod:
            run = self._safely(self.pod_run, namespace, pod)
            if run:
                return run
        if self.slot_run is not None:
            return self._safely(self.slot_run, hostname, gpu, mig) or None
        return None

    @staticmethod
    def _safely(lookup: Callable[..., str | None], *args: object) -> str | None:
        try:
            return lookup(*args)
        except Exception:
            log.warning("run lookup %r failed for %r; sample left unattributed", lookup, args, exc_info=True)
            return None


# gpufleet names every object of a run after the full run id (`run-<20 hex>-<attempt>`, see
# `adapters/kubernetes/manifests.py`), so its pods' names start with it: Job pods are
# `<run id>-<pod set>-<n>-<completion index>-<5 random>`, JobSet pods
# `<run id>-<replicatedJob>-<job index>-<completion index>-<5 random>`. The hex part has a fixed
# length and the attempt is the digits up to the next dash, so a pod set named with digits
# cannot be mistaken for the attempt.
_RUN_POD = re.compile(r"^(run-[0-9a-f]{20}-[0-9]+)-")


def run_of_pod_name(namespace: str, pod: str, namespaces: frozenset[str] = frozenset({"gpufleet"})) -> str | None:
    """The run a gpufleet pod belongs to, read from its name, in gpufleet's namespaces only."""
    if namespace not in namespaces:
        return None
    match = _RUN_POD.match(pod)
    return match.group(1) if match else None


class SlotAssignments:
    """The node-assignment fallback, from a JSON file `{"<hostname>/<gpu>[/<GPU_I_ID>]": "<run id>"}`.

    Whoever knows the assignments (an operator, a sidecar) rewrites the file; it is re-read when
    its modification time changes. A missing or broken file means "no assignments" (logged).
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._stamp: int | None = None
        self._table: dict[str, str] = {}

    def _refresh(self) -> None:
        try:
            stamp = os.stat(self.path).st_mtime_ns
        except OSError:
            self._stamp, self._table = None, {}
            return
        if stamp == self._stamp:
            return
        self._stamp = stamp
        try:
            loaded = json.loads(self.path.read_text())
        except (OSError, ValueError) as exc:
            log.warning("assignments file %s unreadable (%s); ignoring it", self.path, exc)
            self._table = {}
            return
        if not isinstance(loaded, dict) or not all(isinstance(v, str) for v in loaded.values()):
            log.warning("assignments file %s is not an object of run ids; ignoring it", self.path)
            self._table = {}
            return
        self._table = {str(k): v for k, v in loaded.items()}

    def __call__(self, hostname: str, gpu: int, mig: int | None) -> str | None:
        self._refresh()
        if mig is not None:
            exact = self._table.get(f"{hostname}/{gpu}/{mig}")
            if exact:
                return exact
        # A run that holds the whole GPU holds every MIG instance on it.
        return self._table.get(f"{hostname}/{gpu}") or None


@dataclass
class ScrapeResult:
    samples: list[GpuSample]
    series: int = 0  # series of the fields gpufleet keeps
    blanks: int = 0  # readings dropped as DCGM sentinels or non-numbers
    unidentified: int = 0  # series without a GPU UUID or index
    ignored: dict[str, int] = field(default_factory=dict)  # other metric families, by name


@dataclass
class _Series:
    """The readings of one GPU (or MIG instance) for one pod, gathered across metric families."""

    gpu: int
    profile: str | None
    container: str | None
    labelled_run: str | None  # the pod's gpufleet.io/run label, when the exporter passes pod labels
    timestamp: float | None = None
    metrics: dict[str, float] = field(default_factory=dict)


def parse_exposition(text: str, cluster: str, default_node: str, resolve: RunResolver, now: float) -> ScrapeResult:
    """Samples of one scrape: one per (host, GPU, MIG instance, pod), readings keyed by `Metric`.

    `now` (unix seconds) stamps series without their own timestamp, which is all of them with
    dcgm-exporter's defaults. Raises ValueError if the text is not Prometheus exposition.
    """
    result = ScrapeResult(samples=[])
    groups: dict[tuple[str, str, int | None, str | None, str | None], _Series] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            metric = DCGM_FIELDS.get(sample.name)
            if metric is None:
                result.ignored[sample.name] = result.ignored.get(sample.name, 0) + 1
                continue
            result.series += 1
            labels = sample.labels
            uuid = _label(labels, "UUID", "uuid")
            try:
                gpu = int(labels["gpu"])
                mig_text = _label(labels, "GPU_I_ID")
                mig = None if mig_text is None else int(mig_text)
            except (KeyError, ValueError):
                uuid = None
            if uuid is None or gpu < 0 or (mig is not None and mig < 0):
                result.unidentified += 1
                continue
            value = float(sample.value)
            if not math.isfinite(value) or value < 0 or is_blank(value):
                result.blanks += 1
                continue
            host = _label(labels, "Hostname", "hostname") or default_node
            namespace = _label(labels, "namespace", "pod_namespace")
            pod = _label(labels, "pod", "pod_name")
            key = (host, uuid, mig, namespace, pod)
            series = groups.get(key)
            if series is None:
                series = groups[key] = _Series(
                    gpu,
                    _label(labels, "GPU_I_PROFILE"),
                    _label(labels, "container", "container_name"),
                    _label(labels, RUN_METRIC_LABEL),
                )
            series.metrics[metric.value] = value
            if sample.timestamp is not None:
                stamp = float(sample.timestamp)
                series.timestamp = stamp if series.timestamp is None else max(stamp, series.timestamp)
    for (host, uuid, mig, namespace, pod), series in groups.items():
        result.samples.append(
            GpuSample(
                cluster=cluster,
                node=host,
                gpu_uuid=uuid,
                gpu_index=series.gpu,
                timestamp=now if series.timestamp is None else series.timestamp,
                metrics=series.metrics,
                run_id=resolve(host, series.gpu, mig, namespace, pod, series.labelled_run),
                mig_profile=series.profile,
                mig_instance=mig,
                pod=pod,
                namespace=namespace,
                container=series.container,
            )
        )
    return result
