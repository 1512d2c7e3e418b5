"""Rules about the work the fleet runs: tenants sharing time-sliced or shared GPUs, distributed
training without a gang mechanism, unmeasured runs, allocation far above use, idle runs."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Collection
from datetime import datetime

from controlplane.core.audit.facts import AuditFacts, AuditThresholds, PoolFact, RunFact
from controlplane.core.audit.findings import (
    AllocationUnused,
    Finding,
    Fix,
    GangMissing,
    IdleReclaimed,
    IdleRun,
    ObjectRef,
    Rule,
    Severity,
    SharedInference,
    SharedProduction,
    Unmeasured,
    team_of,
)
from controlplane.core.audit.rules_fleet import MAX_SAMPLE
from controlplane.domain.sharing import SharingKind

INFERENCE = "inference"
TRAINING = "training"
IDLE_STAGES = {"notify": Severity.WARNING, "deprioritize": Severity.WARNING, "reclaim": Severity.HIGH}


def _teams_on(facts: AuditFacts, pool: PoolFact, wanted: Callable[[RunFact], bool]) -> dict[str, list[RunFact]]:
    by_team: dict[str, list[RunFact]] = defaultdict(list)
    for run in facts.runs:
        if run.live and pool.key in run.pools and wanted(run):
            by_team[run.team].append(run)
    return by_team


def shared_production(facts: AuditFacts) -> list[Finding]:
    """Inference or production-priority (non-preemptible) work of more than one team on one
    time-sliced pool: one tenant's memory use or fault takes the others down. One finding per team
    involved, naming only that team and counting the others."""
    found = []
    for pool in facts.pools:
        if pool.sharing.kind is not SharingKind.TIMESLICE:
            continue
        by_team = _teams_on(facts, pool, lambda r: r.kind == INFERENCE or not r.preemptible)
        if len(by_team) < 2:
            continue
        for team, runs in sorted(by_team.items()):
            found.append(
                Finding(
                    Rule.TIMESLICE_SHARED_PRODUCTION,
                    Severity.HIGH,
                    (ObjectRef("pool", pool.key), ObjectRef("team", team)),
                    SharedProduction(
                        sharing=str(pool.sharing),
                        runs=len(runs),
                        inference=sum(r.kind == INFERENCE for r in runs),
                        production=sum(not r.preemptible for r in runs),
                        other_teams=len(by_team) - 1,
                    ),
                    Fix.ISOLATE_SHARED_WORK,
                    team_of(team),
                )
            )
    return found


def shared_inference_without_mig(facts: AuditFacts) -> list[Finding]:
    """Inference of more than one team on shared (time-sliced or MPS) GPUs while the fleet has a
    MIG pool, which would give each tenant its own memory and fault domain."""
    mig = facts.mig_pools()
    if not mig:
        return []
    found = []
    for pool in facts.pools:
        if not pool.sharing.shared:
            continue
        by_team = _teams_on(facts, pool, lambda r: r.kind == INFERENCE)
        if len(by_team) < 2:
            continue
        for team, runs in sorted(by_team.items()):
            found.append(
                Finding(
                    Rule.SHARED_INFERENCE_NOT_MIG,
                    Severity.WARNING,
                    (ObjectRef("pool", pool.key), ObjectRef("team", team)),
                    SharedInference(
                        sharing=str(pool.sharing), runs=len(runs), other_teams=len(by_team) - 1, mig_pools=len(mig)
                    ),
                    Fix.MOVE_INFERENCE_TO_MIG,
                    team_of(team),
                )
            )
    return found


def training_without_gang(facts: AuditFacts) -> list[Finding]:
    """Multi-pod training (live, or created within the lookback) on a real cluster whose `gang` is
    `none`: kube-scheduler may start some workers and leave the rest Pending while they hold GPUs."""
    no_gang = {c.name: c for c in facts.clusters if not c.starts_gangs_whole}
    by_key: dict[tuple[str, str], list[RunFact]] = defaultdict(list)
    for run in facts.runs:
        if run.cluster in no_gang and run.kind == TRAINING and run.pods > 1:
            by_key[(run.cluster, run.team)].append(run)
    found = []
    for (cluster, team), runs in sorted(by_key.items()):
        names = tuple(sorted({r.workload for r in runs}))[:MAX_SAMPLE]
        found.append(
            Finding(
                Rule.TRAINING_WITHOUT_GANG,
                Severity.HIGH,
                (ObjectRef("cluster", cluster), ObjectRef("team", team)),
                GangMissing(
                    gang=no_gang[cluster].gang, runs=len(runs), largest_pods=max(r.pods for r in runs), sample=names
                ),
                Fix.ENABLE_GANG,
                team_of(team),
            )
        )
    return found


def unmeasured_runs(facts: AuditFacts, now: datetime, silent_clusters: Collection[str]) -> list[Finding]:
    """A running run measured less recently than its idle policy's `stale_seconds` (or never since
    it started) is unknown to the idle policy: it could hoard GPUs unseen. Clusters already found
    without telemetry are one finding, not one per run."""
    found = []
    for run in facts.runs:
        if not run.running or run.started_at is None or run.cluster in silent_clusters:
            continue
        since = max(run.last_window_end or run.started_at, run.started_at)
        unmeasured = (now - since).total_seconds()
        if unmeasured <= run.stale_seconds:
            continue
        found.append(
            Finding(
                Rule.RUN_UNMEASURED,
                Severity.WARNING,
                (ObjectRef("run", run.run_id), ObjectRef("team", run.team)),
                Unmeasured(
                    workload=run.workload,
                    unmeasured_seconds=round(unmeasured, 3),
                    limit_seconds=run.stale_seconds,
                    gpu_eq=run.gpu_eq,
                ),
                Fix.DEPLOY_TELEMETRY,
                team_of(run.team),
            )
        )
    return found


def allocation_unused(facts: AuditFacts, thresholds: AuditThresholds) -> list[Finding]:
    """The allocation-vs-use mistake: a team whose measured GPU-hours were mostly not used. The
    ratio is used / measured (the utilization report's efficiency): unmeasured allocation is left
    to the telemetry rules, so missing data neither hides nor invents waste."""
    found = []
    for use in facts.team_use:
        if use.measured_gpu_hours < thresholds.min_measured_gpu_hours or use.measured_gpu_hours <= 0:
            continue
        utilization = use.used_gpu_hours / use.measured_gpu_hours
        if utilization >= thresholds.min_utilization:
            continue
        wasted = use.measured_gpu_hours - use.used_gpu_hours
        found.append(
            Finding(
                Rule.ALLOCATION_UNUSED,
                Severity.HIGH if utilization < thresholds.high_utilization else Severity.WARNING,
                (ObjectRef("team", use.team),),
                AllocationUnused(
                    lookback_hours=thresholds.lookback_hours,
                    allocated_gpu_hours=round(use.allocated_gpu_hours, 6),
                    measured_gpu_hours=round(use.measured_gpu_hours, 6),
                    used_gpu_hours=round(use.used_gpu_hours, 6),
                    utilization=round(utilization, 6),
                    min_utilization=thresholds.min_utilization,
                    wasted_gpu_hours=round(wasted, 6),
                    cost_at_stake=round(wasted * use.price_per_gpu_hour, 2),
                ),
                Fix.RIGHT_SIZE,
                team_of(use.team),
            )
        )
    return found


def idle_runs(facts: AuditFacts) -> list[Finding]:
    """Live runs the idle policy marks (notify, deprioritize, reclaim): the hoarders of the moment."""
    return [
        Finding(
            Rule.IDLE_RUN,
            IDLE_STAGES[run.idle_stage],
            (ObjectRef("run", run.run_id), ObjectRef("team", run.team)),
            IdleRun(workload=run.workload, stage=run.idle_stage, idle_windows=run.idle_windows, gpu_eq=run.gpu_eq),
            Fix.RELEASE_IDLE_GPUS,
            team_of(run.team),
        )
        for run in facts.runs
        if run.live and run.idle_stage in IDLE_STAGES
    ]


def idle_reclaimed(facts: AuditFacts, thresholds: AuditThresholds) -> list[Finding]:
    """Workloads whose runs the idle policy reclaimed within the lookback: they held GPUs they did
    not use while another gang waited (the hoarder, also after its GPUs were taken back). One
    finding per workload, however often it was reclaimed."""
    by_workload: dict[tuple[str, str], list[RunFact]] = defaultdict(list)
    for run in facts.runs:
        if run.reclaimed_idle_at is not None:
            by_workload[(run.team, run.workload)].append(run)
    found = []
    for (team, workload), runs in sorted(by_workload.items()):
        last = max(runs, key=lambda r: (r.reclaimed_idle_at or r.created_at, r.run_id))
        assert last.reclaimed_idle_at is not None
        found.append(
            Finding(
                Rule.IDLE_RECLAIMED,
                Severity.WARNING,
                (ObjectRef("workload", workload), ObjectRef("team", team)),
                IdleReclaimed(
                    workload=workload,
                    reclaims=len(runs),
                    gpu_eq=last.gpu_eq,
                    last_reclaimed_at=last.reclaimed_idle_at,
                    lookback_hours=thresholds.lookback_hours,
                ),
                Fix.RELEASE_IDLE_GPUS,
                team_of(team),
            )
        )
    return found
