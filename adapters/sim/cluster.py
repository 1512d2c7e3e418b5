"""Simulated clusters: they accept runs like a Kubernetes API would, start the pods after a short
delay, run them for the workload's `duration_seconds`, and report pod status over NATS like an
in-cluster agent. State is kept in a JSON file so a cluster outlives a control-plane crash.

The file *is* the cluster, as an API server is for a real one: every operation reads it, and
changes it, under an exclusive lock. Two dispatcher processes that both drive the cluster for a
moment (a deposed leader that has not yet noticed, beside its successor) therefore see one truth
and never write back a stale copy that forgets a run the other created. Every write raises the
file's `generation` (its first field): an operation that finds the generation it last read or wrote
skips parsing the file again, so a burst of applies costs one write each, not a read and a write of
every run the cluster holds.

The cluster reacts to events, not to a fixed tick: `next_due` says when it next has something to
report (pods starting or ending, a resync, a telemetry batch, an inventory), and `on_change` is
called when a run is created or deleted, so its driver (`SimFleet`) sleeps until then and a pod
report goes out when the pods change phase, not up to a tick later.

Every `telemetry_interval` seconds a cluster also publishes one DCGM sample batch for the GPUs
(MIG instances, shared GPUs) its running pods hold, shaped by each workload's utilization
profile (see `adapters.sim.telemetry`), as `gpufleet agent` would. While the file
`telemetry_switch` exists the cluster's telemetry is withheld, as if its agent were down.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import logging
import math
import os
import random
import re
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from adapters.sim.telemetry import Device, allocate_devices, parse_profile, pod_samples, profile_of
from controlplane.service.inventory import InventoryNode, InventoryReport, inventory_msg_id, inventory_subject
from controlplane.service.ports import RunOrder
from controlplane.service.serving import MAX_LATENCY_MS, MAX_RPS, ServingReading
from controlplane.service.telemetry_wire import GpuSample, encode_batch, telemetry_subject

log = logging.getLogger(__name__)
Publish = Callable[[str, bytes, str], Awaitable[None]]
RETRY_SECONDS = 0.2  # a report that could not be sent is tried again this long after
_GENERATION = re.compile(rb'^\{"generation": (\d+),')


@dataclass
class SimRun:
    run_id: str
    epoch: int
    pods: list[tuple[str, int, str]]  # pod set, index, node
    start_at: float
    end_at: float | None
    fail: bool = False
    reported: str = ""
    reports: int = 0
    last_report_at: float = 0.0
    utilization: str = "busy"  # the workload's `sim.utilization` profile
    devices: list[list[Device]] = field(default_factory=list)  # per pod, as `pods`
    # The serving signal an inference server would expose (`sim.traffic_rps`, `sim.latency_ms`):
    # published beside the DCGM samples, as the agent publishes what it scrapes.
    traffic_rps: float | None = None
    latency_ms: float | None = None

    def phase(self, now: float) -> str:
        if now < self.start_at:
            return "Pending"
        if self.end_at is None or now < self.end_at:
            return "Running"
        return "Failed" if self.fail else "Succeeded"

    def next_change(self, now: float) -> float:
        """When its phase next changes (inf: never)."""
        if now < self.start_at:
            return self.start_at
        if self.end_at is not None and now < self.end_at:
            return self.end_at
        return math.inf


def serving_value(sim: dict[str, Any], key: str) -> float | None:
    """`sim.traffic_rps` / `sim.latency_ms` of a workload's container: a number in range, else none."""
    value = sim.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    bound = MAX_RPS if key == "traffic_rps" else MAX_LATENCY_MS
    return float(value) if 0 <= value <= bound else None


@dataclass
class SimCluster:
    """Implements the dispatcher's `ClusterDriver` protocol for one simulated cluster."""

    name: str
    publish: Publish
    prefix: str = "gpufleet"
    state_file: Path | None = None
    start_delay: float = 1.0
    resync_seconds: float = 15.0
    clock: Callable[[], float] = time.time
    runs: dict[str, SimRun] = field(default_factory=dict)
    created: int = 0  # objects actually created (not AlreadyExists), for tests and stats
    telemetry_interval: float | None = None  # seconds between DCGM batches; None: no telemetry
    telemetry_switch: Path | None = None  # while this file exists, telemetry is withheld
    seed: int = 0
    batches: int = 0  # telemetry batches published, for tests and stats
    known_nodes: set[str] = field(default_factory=set)  # nodes runs were placed on, for the inventory
    inventories: int = 0  # inventory reports published, for tests and stats
    on_change: Callable[[], None] | None = None  # told when a run is created or deleted
    _next_telemetry: float = field(default=0.0, init=False, repr=False)
    _next_inventory: float = field(default=0.0, init=False, repr=False)
    _rng: random.Random = field(default_factory=random.Random, init=False, repr=False)
    _generation: int = field(default=-1, init=False, repr=False)  # of the state `runs` holds; -1: none read
    _text: str = field(default="", init=False, repr=False)  # that state as the file holds it
    _retry_at: float = field(default=0.0, init=False, repr=False)  # after a report failed (NATS down)

    def __post_init__(self) -> None:
        self._rng = random.Random(f"{self.seed}:{self.name}")
        with self._shared_state(write=False):
            pass  # load what the file holds now

    @contextlib.contextmanager
    def _shared_state(self, write: bool = True) -> Iterator[None]:
        """Hold the cluster's lock, with `runs` and `created` as the file has them; what the block
        changes is written back (atomically) before the lock is let go (a block that only reads says
        `write=False`). The critical sections are a JSON read and write, so the (blocking) lock is
        held for milliseconds."""
        if self.state_file is None:
            yield
            return
        self.state_file.parent.mkdir(parents=True, exist_ok=True)
        lock_path = self.state_file.with_suffix(".lock")
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            if self._file_generation() != self._generation or self._generation < 0:
                self._load()
            yield
            after = self._dump(self._generation + 1) if write else self._text
            if after.split(",", 1)[1] != self._text.split(",", 1)[1]:  # beside the generation
                tmp = self.state_file.with_suffix(".tmp")
                tmp.write_text(after)
                os.replace(tmp, self.state_file)  # atomic: a crash leaves the old or the new state
                self._generation, self._text = self._generation + 1, after
        except BaseException:
            self._generation = -1  # what `runs` holds may be half changed: read the file next time
            raise
        finally:
            os.close(fd)  # closing the descriptor releases the lock

    def _file_generation(self) -> int | None:
        assert self.state_file is not None
        try:
            with self.state_file.open("rb") as f:
                found = _GENERATION.match(f.read(40))
        except FileNotFoundError:
            return 0
        return int(found.group(1)) if found else None

    def _load(self) -> None:
        assert self.state_file is not None
        self.runs = {}
        self._generation, self._text = 0, self._dump(0)
        if not self.state_file.exists():
            return
        self._text = self.state_file.read_text()
        data = json.loads(self._text)
        self._generation = int(data.get("generation", 0))
        self.created = data.get("created", 0)
        for raw in data["runs"]:
            raw["pods"] = [tuple(p) for p in raw["pods"]]
            raw["devices"] = [[tuple(d) for d in pod] for pod in raw.get("devices", [])]
            self.runs[raw["run_id"]] = SimRun(**raw)
        self.known_nodes.update(node for run in self.runs.values() for _, _, node in run.pods)

    def _dump(self, generation: int) -> str:
        runs = [asdict(r) for r in self.runs.values()]
        return json.dumps({"generation": generation, "created": self.created, "runs": runs})

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change()

    def next_due(self) -> float:
        """When (on `clock`) this cluster next has something to report, as of the state last read."""
        now = self.clock()
        due = [self._next_inventory if self.known_nodes else math.inf]
        if self.telemetry_interval:
            due.append(self._next_telemetry)
        for run in self.runs.values():
            if run.phase(now) != run.reported:
                return max(now, self._retry_at)  # a report is owed (one that could not be sent, say)
            due.append(min(run.next_change(now), run.last_report_at + self.resync_seconds))
        return min(due)

    async def apply(self, order: RunOrder) -> bool:
        with self._shared_state():
            if order.run_id in self.runs:
                return False  # AlreadyExists: the objects carry deterministic names
            now = self.clock()
            start = now + self.start_delay
            sim = order.container.get("sim", {}) if isinstance(order.container.get("sim"), dict) else {}
            duration = order.duration_seconds
            taken: dict[str, set[Device]] = {}
            for other in self.runs.values():
                for (_, _, node), devices in zip(other.pods, other.devices, strict=False):
                    taken.setdefault(node, set()).update(devices)
            self.runs[order.run_id] = SimRun(
                run_id=order.run_id,
                epoch=order.epoch,
                pods=[(p.pod_set, p.index, p.node) for p in order.pods],
                start_at=start,
                end_at=None if duration is None else start + duration,
                fail=bool(sim.get("fail", False)),
                utilization=profile_of(order.container),
                devices=[allocate_devices(p.demand, taken.setdefault(p.node, set())) for p in order.pods],
                traffic_rps=serving_value(sim, "traffic_rps"),
                latency_ms=serving_value(sim, "latency_ms"),
            )
            self.known_nodes.update(p.node for p in order.pods)
            self.created += 1
        self._changed()
        return True

    async def delete(self, run_id: str) -> bool:
        with self._shared_state():
            deleted = self.runs.pop(run_id, None) is not None
        if deleted:
            self._changed()
        return deleted

    async def list_owned(self) -> set[str]:
        with self._shared_state(write=False):
            return set(self.runs)

    async def tick(self) -> int:
        """Report every run whose phase changed (or is due for a resync). Returns reports sent."""
        now = self.clock()
        with self._shared_state(write=False):
            due = [
                (run.run_id, run.epoch, run.pods, run.phase(now), run.reports)
                for run in self.runs.values()
                if run.phase(now) != run.reported or now - run.last_report_at >= self.resync_seconds
            ]
        subject = f"{self.prefix}.cluster.{self.name}.pods"

        async def report(
            run_id: str, epoch: int, run_pods: list[tuple[str, int, str]], phase: str, reports: int
        ) -> None:
            pods = [
                {"pod_set": s, "index": i, "phase": phase, "message": "simulated failure" if phase == "Failed" else ""}
                for s, i, _ in run_pods
            ]
            body = json.dumps({"run_id": run_id, "epoch": epoch, "pods": pods}).encode()
            await self.publish(subject, body, f"{self.name}:{run_id}:{phase}:{reports}")

        # The reports are published together (each waits for its acknowledgement), as the agents of
        # a real cluster's nodes would send theirs; one that fails is sent again on the next tick.
        outcomes = await asyncio.gather(
            *(report(*run) for run in due),
            return_exceptions=True,
        )
        sent: list[tuple[str, str, int]] = []
        for (run_id, _, _, phase, reports), outcome in zip(due, outcomes, strict=True):
            if isinstance(outcome, BaseException):
                log.warning("sim %s: report for %s failed: %s", self.name, run_id, outcome)
                self._retry_at = now + RETRY_SECONDS
            else:
                sent.append((run_id, phase, reports))
        if sent:
            with self._shared_state():
                for run_id, phase, reports in sent:
                    run = self.runs.get(run_id)
                    # Another process driving this cluster may have sent the same report (same id) meanwhile.
                    if run is not None and run.reports == reports:
                        run.reported, run.last_report_at, run.reports = phase, now, reports + 1
        return len(sent)

    async def emit_inventory(self) -> bool:
        """Every `resync_seconds`, report the nodes this cluster knows of (those its runs were placed
        on) as ready and schedulable; pool and GPU details are unknown here and left empty."""
        now = self.clock()
        if now < self._next_inventory or not self.known_nodes:
            return False
        observed_at = datetime.fromtimestamp(now, UTC)
        report = InventoryReport(
            observed_at=observed_at,
            nodes=[InventoryNode(name=n, schedulable=True, ready=True) for n in sorted(self.known_nodes)],
        )
        try:
            await self.publish(
                inventory_subject(self.prefix, self.name),
                report.model_dump_json().encode(),
                inventory_msg_id(self.name, observed_at),
            )
        except Exception as exc:  # NATS down: try again on the next tick
            log.warning("sim %s: inventory report failed: %s", self.name, exc)
            return False
        self._next_inventory = now + self.resync_seconds
        self.inventories += 1
        return True

    def serving(self, now: float) -> list[ServingReading]:
        """The serving reading of each running run that has a simulated traffic signal."""
        with self._shared_state(write=False):
            runs = list(self.runs.values())
        at = datetime.fromtimestamp(now, UTC)
        return [
            ServingReading(run.run_id, at, run.traffic_rps, run.latency_ms)
            for run in runs
            if run.phase(now) == "Running" and (run.traffic_rps is not None or run.latency_ms is not None)
        ]

    def samples(self, now: float) -> list[GpuSample]:
        """One DCGM reading per device that a running pod holds, attributed to its run."""
        with self._shared_state(write=False):
            runs = list(self.runs.values())
        out: list[GpuSample] = []
        for run in runs:
            if run.phase(now) != "Running":
                continue
            busy = parse_profile(run.utilization).busy(now - run.start_at)
            for (pod_set, index, node), devices in zip(run.pods, run.devices, strict=False):
                pod = f"{run.run_id}-{pod_set}-{index}"
                out.extend(pod_samples(self.name, node, run.run_id, pod, devices, busy, now, self._rng))
        return out

    async def emit_telemetry(self) -> int:
        """Publish this cluster's batch if one is due; returns the samples published. Telemetry is
        lossy, like the agent's: a batch that cannot be published is dropped."""
        if not self.telemetry_interval:
            return 0
        now = self.clock()
        if now < self._next_telemetry:
            return 0
        # Fixed cadence; after a stall, start again from now rather than catch up in a burst.
        self._next_telemetry = max(self._next_telemetry + self.telemetry_interval, now + self.telemetry_interval / 2)
        if self.telemetry_switch is not None and self.telemetry_switch.exists():
            return 0
        samples = self.samples(now)
        serving = self.serving(now)
        if not samples and not serving:
            return 0
        msg_id = f"sim-dcgm:{self.name}:{int(now * 1000)}"
        try:
            payload = encode_batch(self.name, samples, serving)
            await self.publish(telemetry_subject(self.prefix, self.name), payload, msg_id)
        except Exception as exc:
            log.warning("sim %s: telemetry batch dropped: %s", self.name, exc)
            return 0
        self.batches += 1
        return len(samples)
