"""Audit findings in words: a title, the evidence and the fix of each, for people.

Beside `wording.py` (pending reasons and evictions), the other place typed decisions become
sentences; the core's findings (`controlplane.core.audit`) carry only rule ids, objects and figures.
"""

from __future__ import annotations

from dataclasses import asdict
from datetime import datetime
from typing import Any

from controlplane.core.audit import Finding, Rule
from controlplane.core.audit.findings import (
    AllocationUnused,
    ClassPolicy,
    Evidence,
    GangMissing,
    IdleReclaimed,
    IdleRun,
    LatencyMissed,
    NoGuarantee,
    NoLimit,
    NonGpuPods,
    NoTelemetry,
    PoolUntainted,
    SharedInference,
    SharedProduction,
    TimeslicePoolOpen,
    TrafficUnknown,
    Unmeasured,
)

TITLES: dict[Rule, str] = {
    Rule.GPU_POOL_UNTAINTED: "GPU pool without a GPU taint",
    Rule.NON_GPU_PODS_ON_GPU_NODES: "pods that use no GPU run on GPU nodes",
    Rule.TIMESLICE_SHARED_PRODUCTION: "inference or production work of several teams on time-sliced GPUs",
    Rule.SHARED_INFERENCE_NOT_MIG: "multi-tenant inference on shared GPUs while MIG is available",
    Rule.TIMESLICE_POOL_OPEN_TO_ALL: "time-sliced pool open to every team in a fleet with MIG",
    Rule.TEAM_WITHOUT_LIMIT: "team without a limit",
    Rule.QUEUE_WITHOUT_LIMIT: "queue without a limit",
    Rule.CLASS_WITHOUT_PREEMPTION_POLICY: "priority class without a preemption policy",
    Rule.FLEET_WITHOUT_GUARANTEE: "no queue has a guarantee",
    Rule.TRAINING_WITHOUT_GANG: "multi-pod training on a cluster without gang scheduling",
    Rule.CLUSTER_WITHOUT_TELEMETRY: "cluster without DCGM telemetry",
    Rule.RUN_UNMEASURED: "run not measured",
    Rule.ALLOCATION_UNUSED: "team uses far less than it is allocated",
    Rule.IDLE_RUN: "run holds idle GPUs",
    Rule.IDLE_RECLAIMED: "workload's idle GPUs were reclaimed",
    Rule.INFERENCE_TRAFFIC_UNKNOWN: "inference whose traffic the idle policy cannot read",
    Rule.LATENCY_OBJECTIVE_MISSED: "inference above its latency objective",
}


def _names(finding: Finding, kind: str) -> str:
    return ", ".join(o.name for o in finding.objects if o.kind == kind)


def _shown(items: tuple[str, ...], total: int) -> str:
    text = ", ".join(items)
    return text + (f" and {total - len(items)} more" if total > len(items) else "")


def evidence_text(finding: Finding) -> str:
    match finding.evidence:
        case PoolUntainted(gpus=gpus, taints=()):
            return f"pool {_names(finding, 'pool')} ({gpus} GPUs) has no taint at all"
        case PoolUntainted(gpus=gpus, taints=taints):
            return (
                f"pool {_names(finding, 'pool')} ({gpus} GPUs) has only {', '.join(taints)}, "
                "none NoSchedule or NoExecute"
            )
        case NonGpuPods(nodes=nodes, pods=pods, sample=sample):
            return f"{pods} pod(s) asking for no GPU on {nodes} GPU node(s) of {_names(finding, 'pool')}: " + _shown(
                sample, pods
            )
        case SharedProduction(sharing=sharing, runs=runs, inference=inference, production=production, other_teams=n):
            return (
                f"team {_names(finding, 'team')} runs {runs} run(s) ({inference} inference, {production} production) "
                f"on {_names(finding, 'pool')} ({sharing}), shared with {n} other team(s)' inference or "
                "production work"
            )
        case SharedInference(sharing=sharing, runs=runs, other_teams=n, mig_pools=mig):
            return (
                f"team {_names(finding, 'team')} serves {runs} inference run(s) on {_names(finding, 'pool')} "
                f"({sharing}) beside {n} other team(s)' inference, while the fleet has {mig} MIG pool(s)"
            )
        case TimeslicePoolOpen(sharing=sharing, teams=teams, mig_pools=mig):
            return f"{_names(finding, 'pool')} ({sharing}) is open to all {teams} teams; MIG pools: {', '.join(mig)}"
        case NoLimit(level=level, bounded_by=""):
            return f"{level} {_names(finding, level)} has no limit, and nothing above it bounds it"
        case NoLimit(level=level, bounded_by=above):
            return f"{level} {_names(finding, level)} has no limit of its own (its {above} has one)"
        case ClassPolicy(value=value, min_runtime_seconds=_):
            return (
                f"priority class {_names(finding, 'priority-class')} (value {value}) is preemptible with no "
                "min_runtime_seconds: its gangs may be evicted the moment they start"
            )
        case NoGuarantee(queues=queues):
            return f"none of the {queues} queue(s), their teams or cohorts has a guarantee"
        case GangMissing(gang=gang, runs=runs, largest_pods=pods, sample=sample):
            return (
                f"team {_names(finding, 'team')} ran {runs} multi-pod training run(s) (up to {pods} pods) on "
                f"cluster {_names(finding, 'cluster')} (gang: {gang}): " + _shown(sample, runs)
            )
        case NoTelemetry(running_runs=runs, last_window_at=None, stale_seconds=stale):
            return (
                f"cluster {_names(finding, 'cluster')} has {runs} running run(s) and never sent a telemetry window "
                f"for them (stale after {stale:g} s)"
            )
        case NoTelemetry(running_runs=runs, last_window_at=last, stale_seconds=stale):
            return (
                f"cluster {_names(finding, 'cluster')} has {runs} running run(s); its newest telemetry window ended "
                f"{_when(last)}, more than {stale:g} s ago"
            )
        case Unmeasured(workload=workload, unmeasured_seconds=seconds, limit_seconds=limit, gpu_eq=eq):
            return (
                f"run {_names(finding, 'run')} of {workload} ({eq:g} GPUs) has not been measured for {seconds:.0f} s "
                f"(the idle policy trusts {limit:g} s)"
            )
        case AllocationUnused() as a:
            return (
                f"team {_names(finding, 'team')} over {a.lookback_hours:g} h: {a.allocated_gpu_hours:.2f} GPU-hours "
                f"allocated, {a.measured_gpu_hours:.2f} measured, {a.used_gpu_hours:.2f} used ({a.utilization:.0%}, "
                f"below {a.min_utilization:.0%}): {a.wasted_gpu_hours:.2f} GPU-hours and {a.cost_at_stake:.2f} at stake"
            )
        case IdleRun(workload=workload, stage=stage, idle_windows=windows, gpu_eq=eq):
            return (
                f"run {_names(finding, 'run')} of {workload} (team {_names(finding, 'team')}, {eq:g} GPUs) has been "
                f"idle for {windows} window(s): stage {stage}"
            )
        case IdleReclaimed(workload=workload, reclaims=n, gpu_eq=eq, last_reclaimed_at=last, lookback_hours=hours):
            return (
                f"workload {workload} (team {_names(finding, 'team')}) held {eq:g} GPUs idle while another gang "
                f"waited: reclaimed {n} time(s) in the last {hours:g} h, last at {last.isoformat()}"
            )
        case TrafficUnknown(workload=workload, declared=False):
            return (
                f"run {_names(finding, 'run')} of {workload} (team {_names(finding, 'team')}) declares no traffic "
                "metric, so the idle policy never judges it idle"
            )
        case TrafficUnknown(workload=workload, last_reading_at=last, stale_seconds=stale):
            return (
                f"run {_names(finding, 'run')} of {workload} (team {_names(finding, 'team')}) declares a traffic "
                f"metric but its newest reading is from {_when(last)} (stale after {stale:g} s)"
            )
        case LatencyMissed(workload=workload, latency_ms=ms, objective_ms=objective, shared_pools=shared):
            where = f", on shared GPUs of {', '.join(shared)}" if shared else ""
            return (
                f"run {_names(finding, 'run')} of {workload} (team {_names(finding, 'team')}) answers in "
                f"{ms:.0f} ms against an objective of {objective:g} ms{where}"
            )
    raise AssertionError(f"no wording for {finding.evidence!r}")  # pragma: no cover - every evidence type is matched


def _when(value: datetime | None) -> str:
    return value.isoformat() if value is not None else "never"


def fix_text(finding: Finding) -> str:
    match finding.rule:
        case Rule.GPU_POOL_UNTAINTED:
            return "taint the pool's nodes, e.g. nvidia.com/gpu=present:NoSchedule; gpufleet tolerates it for its gangs"
        case Rule.NON_GPU_PODS_ON_GPU_NODES:
            return "taint the GPU nodes (NoSchedule) and remove the tolerations or node selectors that bring these pods"
        case Rule.TIMESLICE_SHARED_PRODUCTION:
            return (
                "run inference and production work on MIG or whole GPUs "
                "(requires_isolation: true, the default for inference)"
            )
        case Rule.SHARED_INFERENCE_NOT_MIG:
            return "serve from MIG slices (mig_profile) so each tenant has its own memory and fault domain"
        case Rule.TIMESLICE_POOL_OPEN_TO_ALL:
            return (
                "give the pool's GPU model a limit of 0 to the teams that should not share it "
                "(`gpufleet team update NAME --limit MODEL=0`), or turn it into MIG"
            )
        case Rule.TEAM_WITHOUT_LIMIT | Rule.QUEUE_WITHOUT_LIMIT:
            return (
                "set a limit: `gpufleet team update NAME --limit gpu-eq=N` (or `gpufleet queue update`; "
                "PATCH /v1/teams/{name} or /v1/queues/{name} with limit: {gpu-eq: N})"
            )
        case Rule.CLASS_WITHOUT_PREEMPTION_POLICY:
            return (
                "set min_runtime_seconds (e.g. 600) so a started gang is safe for a while, or make the class "
                "non-preemptible (`gpufleet priority-class apply NAME --value V --min-runtime 600` or "
                "`--not-preemptible`)"
            )
        case Rule.FLEET_WITHOUT_GUARANTEE:
            return (
                "guarantee each team (or its main queue) a share, so borrowed GPUs can be reclaimed "
                "(`gpufleet team update NAME --guaranteed gpu-eq=N`)"
            )
        case Rule.TRAINING_WITHOUT_GANG:
            return (
                "set the cluster's kubernetes.gang to kueue, volcano or coscheduling "
                "(`gpufleet cluster update NAME -f FILE`, FILE holding `kubernetes: {gang: kueue}`)"
            )
        case Rule.CLUSTER_WITHOUT_TELEMETRY | Rule.RUN_UNMEASURED:
            return "deploy dcgm-exporter and `gpufleet agent` on the cluster (see deploy/dcgm-exporter)"
        case Rule.ALLOCATION_UNUSED:
            return "ask for fewer GPUs, share them (MIG), or let the idle policy reclaim them sooner"
        case Rule.IDLE_RUN:
            return (
                "stop or scale down the idle run (`gpufleet workload cancel ID`); the idle policy reclaims it "
                "when another gang waits"
            )
        case Rule.IDLE_RECLAIMED:
            return "release GPUs when the work pauses (end the run, checkpoint and resubmit), or size it to its use"
        case Rule.INFERENCE_TRAFFIC_UNKNOWN:
            return (
                "declare serving.traffic_metric (e.g. vllm:request_success_total) and run `gpufleet agent "
                "--serving-pods node` so the idle policy can see an unused server"
            )
        case Rule.LATENCY_OBJECTIVE_MISSED:
            return "move it off shared GPUs (MIG or whole GPUs), or add replicas"
    raise AssertionError(f"no fix for {finding.rule}")  # pragma: no cover - every rule is matched


def evidence_fields(evidence: Evidence) -> dict[str, Any]:
    """The evidence's typed figures, as JSON values."""
    return {
        k: (v.isoformat() if isinstance(v, datetime) else list(v) if isinstance(v, tuple) else v)
        for k, v in asdict(evidence).items()
    }
