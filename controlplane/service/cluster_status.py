"""Folding pod status reported by clusters into run and workload state (monotonic, idempotent)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from pydantic import Field

from controlplane.domain.limits import MAX_MESSAGE_BYTES, MAX_PODS_PER_GANG
from controlplane.domain.model import WorkloadState
from controlplane.service.constraints import Strict
from controlplane.service.ports import UnitOfWork
from controlplane.service.workloads import emit

POD_PHASES = ("Pending", "Running", "Succeeded", "Failed", "Unknown")


class PodStatus(Strict):
    pod_set: str = Field(max_length=63)
    index: int = Field(ge=0)
    phase: str = Field(pattern="^(Pending|Running|Succeeded|Failed|Unknown)$")
    message: str = Field(default="", max_length=500)


class PodReport(Strict):
    """What an agent (or a simulated cluster) says about the pods of one run."""

    run_id: str = Field(min_length=1, max_length=40)
    epoch: int = Field(ge=0)
    pods: list[PodStatus] = Field(max_length=MAX_PODS_PER_GANG)

    def encode(self, max_bytes: int = MAX_MESSAGE_BYTES) -> bytes:
        """The report as one NATS message of at most `max_bytes`: when the pods' messages make it
        larger, they are shortened (those of failed pods last), so a report for the largest gang
        gpufleet accepts always fits; phases, which decide the run's state, are never dropped."""
        data = self.model_dump_json().encode()
        if len(data) <= max_bytes:
            return data
        bare = self.model_copy(update={"pods": [p.model_copy(update={"message": ""}) for p in self.pods]})
        room = max_bytes - len(bare.model_dump_json().encode()) - 64
        pods: list[PodStatus] = []
        # Failed pods first: their message says why the gang failed; then the rest in order.
        for pod in sorted(self.pods, key=lambda p: p.phase != "Failed"):
            # At most 4 bytes per character in UTF-8, and escapes can double that: budget 8.
            keep = max(0, min(len(pod.message), room // 8))
            pods.append(pod.model_copy(update={"message": pod.message[:keep]}))
            room -= 8 * keep
        order = {(p.pod_set, p.index): i for i, p in enumerate(self.pods)}
        pods.sort(key=lambda p: order[(p.pod_set, p.index)])
        return self.model_copy(update={"pods": pods}).model_dump_json().encode()


def _verdict(pods: Sequence[PodStatus], min_available: int, pod_count: int = 0) -> tuple[str, str] | None:
    """(run state, message) the pods justify, or None while nothing changes. Succeeded needs every
    pod the run was admitted with (`pod_count`, at least `min_available`): an elastic gang's extra
    pods may still run, and their capacity is not free until they end."""
    failed = [p for p in pods if p.phase == "Failed"]
    if failed:
        first = failed[0]
        return "failed", f"pod {first.pod_set}-{first.index} failed: {first.message or 'no message'}"
    succeeded = {(p.pod_set, p.index) for p in pods if p.phase == "Succeeded"}
    if pods and len(succeeded) >= max(min_available, pod_count) and len(succeeded) == len(pods):
        return "succeeded", "all pods succeeded"
    if len([p for p in pods if p.phase in ("Running", "Succeeded")]) >= min_available:
        return "running", f"{min_available} pods running"
    return None


@dataclass(frozen=True)
class RunStarted:
    """A run that reached running in this transaction (for the time-to-running metric)."""

    queue: str
    submitted_at: datetime | None


def apply_pod_report(
    uow: UnitOfWork,
    cluster: str,
    report: PodReport,
    prefix: str,
    now: datetime,
    started: list[RunStarted] | None = None,
) -> str:
    """Returns what happened, for logs and tests. Runs that reach running are added to `started`."""
    run = uow.runs.status(report.run_id)
    if run is None:
        return "unknown run"
    verdict = _verdict(report.pods, run.min_available, run.pod_count)
    if verdict is None:
        return "no change"
    state, message = verdict
    if state == "running":
        began = _start(uow, run.run_id, run.workload_id, run.queue, cluster, message, prefix, now)
        if began and started is not None:
            started.append(RunStarted(run.queue, uow.workloads.submitted_at([run.workload_id]).get(run.workload_id)))
        return "running" if began else "no change"
    if state == "succeeded":
        # Pods that ran and finished between two reports (or around a fault) are first seen
        # succeeded: the run did run, so it passes through `running` (event and started_at) first.
        _start(uow, run.run_id, run.workload_id, run.queue, cluster, "pods seen succeeded", prefix, now)
    if not uow.runs.set_state(run.run_id, ("admitted", "dispatching", "running"), state, message, now):
        return "no change"
    target = WorkloadState.SUCCEEDED if state == "succeeded" else WorkloadState.FAILED
    uow.workloads.set_state(
        run.workload_id,
        (WorkloadState.ADMITTED, WorkloadState.DISPATCHING, WorkloadState.RUNNING),
        target,
        message,
        now,
    )
    emit(uow, prefix, run.queue, str(target), run.workload_id, now, run_id=run.run_id, cluster=cluster, message=message)
    return str(target)


def _start(
    uow: UnitOfWork, run_id: str, workload_id: str, queue: str, cluster: str, message: str, prefix: str, now: datetime
) -> bool:
    """Move a dispatched run and its workload to running and announce it; False if it was not pending."""
    if not uow.runs.set_state(run_id, ("admitted", "dispatching"), "running", message, now):
        return False
    uow.workloads.set_state(
        workload_id, (WorkloadState.ADMITTED, WorkloadState.DISPATCHING), WorkloadState.RUNNING, message, now
    )
    emit(uow, prefix, queue, "running", workload_id, now, run_id=run_id, cluster=cluster)
    return True
