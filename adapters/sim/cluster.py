"""Simulated clusters: they accept runs like a Kubernetes API would, start the pods after a short
delay, run them for the workload's `duration_seconds`, and report pod status over NATS like an
in-cluster agent. State is kept in a JSON file so a cluster outlives a control-plane crash.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from controlplane.service.ports import RunOrder

log = logging.getLogger(__name__)
Publish = Callable[[str, bytes, str], Awaitable[None]]


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

    def phase(self, now: float) -> str:
        if now < self.start_at:
            return "Pending"
        if self.end_at is None or now < self.end_at:
            return "Running"
        return "Failed" if self.fail else "Succeeded"


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

    def __post_init__(self) -> None:
        if self.state_file is not None and self.state_file.exists():
            data = json.loads(self.state_file.read_text())
            self.created = data.get("created", 0)
            for raw in data["runs"]:
                raw["pods"] = [tuple(p) for p in raw["pods"]]
                self.runs[raw["run_id"]] = SimRun(**raw)

    def _persist(self) -> None:
        if self.state_file is None:
            return
        self.state_file.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps({"created": self.created, "runs": [asdict(r) for r in self.runs.values()]}))
        os.replace(tmp, self.state_file)  # atomic: a crash leaves the old or the new state

    async def apply(self, order: RunOrder) -> bool:
        if order.run_id in self.runs:
            return False  # AlreadyExists: the objects carry deterministic names
        now = self.clock()
        start = now + self.start_delay
        sim = order.container.get("sim", {}) if isinstance(order.container.get("sim"), dict) else {}
        duration = order.duration_seconds
        self.runs[order.run_id] = SimRun(
            run_id=order.run_id,
            epoch=order.epoch,
            pods=[(p.pod_set, p.index, p.node) for p in order.pods],
            start_at=start,
            end_at=None if duration is None else start + duration,
            fail=bool(sim.get("fail", False)),
        )
        self.created += 1
        self._persist()
        return True

    async def delete(self, run_id: str) -> bool:
        if self.runs.pop(run_id, None) is None:
            return False
        self._persist()
        return True

    async def list_owned(self) -> set[str]:
        return set(self.runs)

    async def tick(self) -> int:
        """Report every run whose phase changed (or is due for a resync). Returns reports sent."""
        now = self.clock()
        sent = 0
        for run in list(self.runs.values()):
            phase = run.phase(now)
            if phase == run.reported and now - run.last_report_at < self.resync_seconds:
                continue
            pods = [
                {"pod_set": s, "index": i, "phase": phase, "message": "simulated failure" if phase == "Failed" else ""}
                for s, i, _ in run.pods
            ]
            body = json.dumps({"run_id": run.run_id, "epoch": run.epoch, "pods": pods}).encode()
            msg_id = f"{self.name}:{run.run_id}:{phase}:{run.reports}"
            try:
                await self.publish(f"{self.prefix}.cluster.{self.name}.pods", body, msg_id)
            except Exception as exc:  # NATS down: report again on the next tick
                log.warning("sim %s: report for %s failed: %s", self.name, run.run_id, exc)
                break
            run.reported, run.last_report_at, run.reports = phase, now, run.reports + 1
            sent += 1
        if sent:
            self._persist()
        return sent
