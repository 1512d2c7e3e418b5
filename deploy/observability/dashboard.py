"""Writes grafana/gpufleet.json, the Grafana dashboard of gpufleet (`python deploy/observability/dashboard.py`).

The dashboard is code, written with Grafana's own typed builders (grafana-foundation-sdk: the
dashboard, panel, query and variable types generated from Grafana's schemas), so that its panels stay
few, consistent and reviewable and a wrong field is a type error, not a dashboard Grafana silently
repairs. The JSON beside it is what Grafana imports (or a provisioning sidecar loads); a test keeps
the two equal and checks every query against the metrics gpufleet exports.

Every API replica exports the same SQL gauges (`gpufleet_pending_gangs`, quota, leases, ...), so
queries over them take `max by (...)` first: one value per series whatever the number of replicas.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

from grafana_foundation_sdk.builders import common as common_builders
from grafana_foundation_sdk.builders import dashboard as dashboard_builders
from grafana_foundation_sdk.builders import prometheus, stat, table, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common, dashboard

OUT = Path(__file__).parent / "grafana" / "gpufleet.json"
DATASOURCE = dashboard.DataSourceRef(type_val="prometheus", uid="${datasource}")
STACKED, UNSTACKED = common.StackingMode.NORMAL, common.StackingMode.NONE
PanelKind = Literal["timeseries", "stat", "table"]
PanelBuilder = timeseries.Panel | stat.Panel | table.Panel


class Board:
    """The dashboard being built: rows with panels under them, laid out left to right by the SDK
    (each row's widths add up to the grid's 24 columns), ids numbered in order."""

    def __init__(self) -> None:
        self.builder = (
            dashboard_builders.Dashboard("gpufleet")
            .uid("gpufleet-overview")
            .description("Fleet, queues, scheduler, event path, anti-hoarding and utilization of gpufleet")
            .tags(["gpufleet", "gpu"])
            .editable()
            .tooltip(dashboard.DashboardCursorSync.CROSSHAIR)
            .refresh("30s")
            .timezone("utc")
            .time("now-6h", "now")
            .with_variable(dashboard_builders.DatasourceVariable("datasource").label("Prometheus").type("prometheus"))
            .with_variable(_variable("cluster", "label_values(gpufleet_cluster_gpus, cluster)"))
            .with_variable(_variable("queue", "label_values(gpufleet_pending_gangs, queue)"))
        )
        self.last_id = 0

    def _next_id(self) -> int:
        self.last_id += 1
        return self.last_id

    def row(self, title: str) -> None:
        self.builder.with_row(dashboard_builders.Row(title).id(self._next_id()).collapsed(False))

    def panel(
        self,
        kind: PanelKind,
        title: str,
        targets: list[tuple[str, str]],
        unit: str = "short",
        w: int = 8,
        h: int = 8,
        description: str = "",
        stack: bool = False,
    ) -> None:
        panel: PanelBuilder
        if kind == "timeseries":
            panel = (
                timeseries.Panel()
                .stacking(common_builders.StackingConfig().mode(STACKED if stack else UNSTACKED))
                .legend(
                    common_builders.VizLegendOptions()
                    .display_mode(common.LegendDisplayMode.LIST)
                    .placement(common.LegendPlacement.BOTTOM)
                    .show_legend(True)
                )
            )
        elif kind == "stat":
            panel = stat.Panel()
        else:
            panel = table.Panel()
        panel = panel.id(self._next_id()).title(title).datasource(DATASOURCE).unit(unit).span(w).height(h)
        if description:
            panel = panel.description(description)
        for i, (expr, legend) in enumerate(targets):
            panel = panel.with_target(
                prometheus.Dataquery().ref_id(chr(ord("A") + i)).datasource(DATASOURCE).expr(expr).legend_format(legend)
            )
        self.builder.with_panel(panel)

    def build(self) -> dashboard.Dashboard:
        return self.builder.build()


def quantile(q: float, metric: str, by: str = "", window: str = "10m") -> str:
    group = f"le, {by}" if by else "le"
    return f"histogram_quantile({q}, sum by ({group}) (rate({metric}_bucket[{window}])))"


CAPACITY = 'max by (cluster, gpu_model) (gpufleet_cluster_gpus{cluster=~"$cluster"})'
ALLOCATED = 'max by (cluster, gpu_model) (gpufleet_cluster_allocated_gpus{cluster=~"$cluster"})'
QUEUE = 'queue=~"$queue"'


def build() -> dashboard.Dashboard:
    d = Board()
    d.row("Fleet")
    d.panel(
        "timeseries",
        "GPUs: capacity and allocated, by cluster",
        [
            (f"sum by (cluster) ({CAPACITY})", "{{cluster}} capacity"),
            (f"sum by (cluster) ({ALLOCATED})", "{{cluster}} allocated"),
        ],
        w=12,
    )
    d.panel(
        "stat",
        "Allocated share of the fleet",
        [(f"sum({ALLOCATED}) / sum({CAPACITY})", "allocated")],
        "percentunit",
        w=4,
    )
    d.panel("stat", "Free GPUs", [(f"sum({CAPACITY}) - sum({ALLOCATED})", "free")], w=4)
    d.panel(
        "stat",
        "Clusters whose sync fails",
        [('sum(max by (cluster) (gpufleet_cluster_sync_error{cluster=~"$cluster"}))', "failing")],
        w=4,
    )
    d.panel(
        "timeseries",
        "Unfinished workloads by state",
        [(f"sum by (state) (max by (queue, state) (gpufleet_workloads{{{QUEUE}}}))", "{{state}}")],
        w=12,
        stack=True,
    )
    d.panel(
        "timeseries",
        "Cluster call failures",
        [
            (
                'sum by (cluster, operation, kind) (rate(gpufleet_dispatch_failures_total{cluster=~"$cluster"}[5m]))',
                "{{cluster}} {{operation}} {{kind}}",
            )
        ],
        "ops",
        w=12,
    )

    d.row("Queues")
    d.panel(
        "timeseries",
        "Pending gangs by queue and reason",
        [(f"max by (queue, reason) (gpufleet_pending_gangs{{{QUEUE}}})", "{{queue}} {{reason}}")],
        w=12,
        stack=True,
    )
    d.panel(
        "timeseries",
        "Quota (gpu-eq): used, guaranteed, limit",
        [
            (f'max by (queue) (gpufleet_queue_used_gpus{{{QUEUE}, resource="gpu-eq"}})', "{{queue}} used"),
            (f'max by (queue) (gpufleet_queue_guaranteed_gpus{{{QUEUE}, resource="gpu-eq"}})', "{{queue}} guaranteed"),
            (f'max by (queue) (gpufleet_queue_limit_gpus{{{QUEUE}, resource="gpu-eq"}})', "{{queue}} limit"),
        ],
        w=12,
    )
    d.panel(
        "timeseries",
        "Admissions",
        [(f"sum by (queue) (rate(gpufleet_admissions_total{{{QUEUE}}}[5m]))", "{{queue}}")],
        "ops",
    )
    d.panel(
        "timeseries",
        "Submit to admission / to running (p50, p95)",
        [
            (quantile(0.5, "gpufleet_submit_to_admission_seconds"), "admission p50"),
            (quantile(0.95, "gpufleet_submit_to_admission_seconds"), "admission p95"),
            (quantile(0.5, "gpufleet_submit_to_running_seconds"), "running p50"),
            (quantile(0.95, "gpufleet_submit_to_running_seconds"), "running p95"),
        ],
        "s",
    )
    d.panel(
        "timeseries",
        "Evictions by kind",
        [("sum by (kind) (rate(gpufleet_evictions_total[5m]))", "{{kind}}")],
        "ops",
        stack=True,
    )

    d.row("Scheduler")
    d.panel(
        "timeseries",
        "Cycle duration by phase (p95)",
        [(quantile(0.95, "gpufleet_scheduler_cycle_phase_seconds", "phase", "5m"), "{{phase}}")],
        "s",
        w=12,
        stack=True,
    )
    d.panel(
        "timeseries",
        "Cycles per second and cycle p95",
        [
            ("sum(rate(gpufleet_scheduler_cycle_seconds_count[5m]))", "cycles/s"),
            (quantile(0.95, "gpufleet_scheduler_cycle_seconds", "", "5m"), "p95 s"),
        ],
        w=12,
    )
    d.panel(
        "stat",
        "Lease epochs",
        [("max by (lease) (gpufleet_lease_epoch)", "{{lease}}")],
        w=8,
    )
    d.panel(
        "stat",
        "Lease expires in",
        [("max by (lease) (gpufleet_lease_expires_in_seconds)", "{{lease}}")],
        "s",
        w=8,
        description="Negative: nobody holds the lease (no leader).",
    )
    d.panel(
        "stat",
        "Since the last committed cycle",
        [("time() - max(gpufleet_scheduler_last_cycle_timestamp_seconds)", "seconds")],
        "s",
        w=8,
    )

    d.row("Event path")
    d.panel(
        "timeseries",
        "Outbox backlog and relay lag",
        [
            ("max(gpufleet_outbox_backlog_events)", "unpublished events"),
            ("max(gpufleet_outbox_oldest_unpublished_age_seconds)", "oldest unpublished (s)"),
        ],
    )
    d.panel(
        "timeseries",
        "Relay",
        [
            ("sum(rate(gpufleet_outbox_published_events_total[5m]))", "published/s"),
            ("sum(rate(gpufleet_outbox_publish_failures_total[5m]))", "failed passes/s"),
        ],
        "ops",
    )
    d.panel(
        "timeseries",
        "Dispatch latency (p95) by cluster",
        [(quantile(0.95, "gpufleet_dispatch_duration_seconds", "cluster", "5m"), "{{cluster}}")],
        "s",
    )
    d.panel(
        "timeseries",
        "Inbound messages by consumer and outcome",
        [("sum by (consumer, outcome) (rate(gpufleet_ingest_messages_total[5m]))", "{{consumer}} {{outcome}}")],
        "ops",
    )
    d.panel(
        "timeseries",
        "Ingest lag (p95) by consumer",
        [(quantile(0.95, "gpufleet_ingest_lag_seconds", "consumer", "5m"), "{{consumer}}")],
        "s",
    )
    d.panel(
        "timeseries",
        "Consumer backlog at the broker",
        [
            ("max by (consumer) (gpufleet_consumer_pending_messages)", "{{consumer}} pending"),
            ("max by (consumer) (gpufleet_consumer_ack_pending_messages)", "{{consumer}} unacked"),
        ],
    )
    d.panel(
        "timeseries",
        "Telemetry",
        [
            ("sum(rate(gpufleet_telemetry_samples_total[5m]))", "samples/s"),
            ("sum(rate(gpufleet_telemetry_windows_written_total[5m]))", "windows/s"),
            ("sum(rate(gpufleet_telemetry_batches_total[5m]))", "batches/s"),
        ],
        w=12,
    )
    d.panel(
        "timeseries",
        "Cloud calls by provider and outcome",
        [
            ("sum by (provider, outcome) (rate(gpufleet_cloud_calls_total[5m]))", "{{provider}} {{outcome}}"),
            (quantile(0.95, "gpufleet_cloud_call_duration_seconds", "provider", "15m"), "{{provider}} p95 s"),
        ],
        w=12,
    )

    d.panel(
        "timeseries",
        "API requests by route and status",
        [('sum by (route, code) (rate(gpufleet_api_requests_total{route!="/metrics"}[5m]))', "{{route}} {{code}}")],
        "reqps",
        w=12,
    )
    d.panel(
        "timeseries",
        "API latency (p95) by route",
        [(quantile(0.95, "gpufleet_api_request_duration_seconds", "route", "5m"), "{{route}}")],
        "s",
        w=12,
    )

    d.row("Anti-hoarding")
    d.panel(
        "timeseries",
        "Idle GPUs by stage and team",
        [('max by (stage, team) (gpufleet_idle_gpus{stage!="none"})', "{{team}} {{stage}}")],
        w=12,
        stack=True,
    )
    d.panel(
        "timeseries",
        "Idle findings by stage",
        [("sum by (stage) (max by (stage, team) (gpufleet_idle_findings))", "{{stage}}")],
        w=6,
        stack=True,
    )
    d.panel(
        "stat",
        "Idle reclaims (24 h)",
        [('sum(increase(gpufleet_evictions_total{kind="idle"}[24h]))', "reclaimed")],
        w=6,
    )

    d.row("Utilization: DCGM activity beside allocation")
    d.panel(
        "timeseries",
        "Allocated vs. effectively used, by cluster",
        [
            (f"sum by (cluster) ({ALLOCATED}) / sum by (cluster) ({CAPACITY})", "{{cluster}} allocated"),
            ('max by (cluster) (gpufleet_gpu_activity_ratio{cluster=~"$cluster"})', "{{cluster}} DCGM activity"),
        ],
        "percentunit",
        w=12,
        description="Allocated: share of GPUs held by runs. DCGM activity: mean SM activity of the GPUs held "
        "by runs, over their recent telemetry windows. A wide gap means allocated GPUs that do little.",
    )
    d.panel(
        "timeseries",
        "GPUs doing work vs. GPUs allocated",
        [
            (f"sum by (cluster) ({ALLOCATED})", "{{cluster}} allocated"),
            (
                f"sum by (cluster) ({ALLOCATED}) * on (cluster) "
                'max by (cluster) (gpufleet_gpu_activity_ratio{cluster=~"$cluster"})',
                "{{cluster}} effective",
            ),
            ('max by (cluster) (gpufleet_measured_gpus{cluster=~"$cluster"})', "{{cluster}} measured"),
        ],
        w=12,
    )
    slo_row(d)
    return d.build()


def slo_row(d: Board) -> None:
    """Effective utilization per team and run, idle and unmeasured GPUs, waits, inference latency."""
    d.row("SLO: effective utilization, waits, inference latency")
    d.panel(
        "timeseries",
        "Team effective utilization (last hour)",
        [("max by (team) (gpufleet_team_effective_utilization_ratio)", "{{team}}")],
        "percentunit",
        w=12,
        description="Used / measured GPU-hours of the team's runs over the last hour, the utilization report's "
        "efficiency. Far below 1 while the team holds many GPUs: allocation is not use.",
    )
    d.panel(
        "timeseries",
        "Team GPUs: allocated now vs. effectively used (last hour)",
        [
            ("max by (team) (gpufleet_team_allocated_gpus)", "{{team}} allocated"),
            (
                "max by (team) (gpufleet_team_used_gpu_hours)",
                "{{team}} effectively used (GPU-hours in the last hour = mean GPUs)",
            ),
        ],
        w=12,
    )
    d.panel(
        "table",
        "Lowest-utilization runs",
        [
            (
                "bottomk(15, max by (run, workload, team, queue, cluster) "
                '(gpufleet_run_effective_utilization_ratio{cluster=~"$cluster", queue=~"$queue"}))',
                "{{workload}} ({{team}})",
            )
        ],
        "percentunit",
        w=12,
        description="Activity mean of each live run's latest telemetry window; the exporter keeps the "
        "lowest-utilization runs only (metrics_max_run_series).",
    )
    d.panel(
        "timeseries",
        "Idle GPUs (notify or beyond) and unmeasured GPUs",
        [
            (
                'sum by (team) (max by (cluster, team) (gpufleet_idle_notified_gpus{cluster=~"$cluster"}))',
                "{{team}} idle",
            ),
            ('max by (cluster) (gpufleet_unmeasured_gpus{cluster=~"$cluster"})', "{{cluster}} unmeasured"),
        ],
        w=12,
    )
    d.panel(
        "timeseries",
        "Pending wait now, by queue (p50, p95, oldest)",
        [
            (f'max by (queue) (gpufleet_queue_pending_wait_seconds{{{QUEUE}, quantile="0.5"}})', "{{queue}} p50"),
            (f'max by (queue) (gpufleet_queue_pending_wait_seconds{{{QUEUE}, quantile="0.95"}})', "{{queue}} p95"),
            (f"max by (queue) (gpufleet_queue_oldest_pending_seconds{{{QUEUE}}})", "{{queue}} oldest"),
        ],
        "s",
        w=12,
    )
    d.panel(
        "timeseries",
        "Inference latency vs. objective",
        [
            ("max by (workload, team) (gpufleet_run_latency_seconds)", "{{workload}} latency"),
            ("max by (workload, team) (gpufleet_run_latency_objective_seconds)", "{{workload}} objective"),
            ("max by (workload, team) (gpufleet_run_requests_per_second)", "{{workload}} req/s"),
        ],
        "s",
        w=12,
        description="Latest reading of each inference run's declared serving signal (mean latency over the "
        "agent's scrape interval) beside its declared objective.",
    )


def _variable(name: str, query: str) -> dashboard_builders.QueryVariable:
    return (
        dashboard_builders.QueryVariable(name)
        .label(name)
        .datasource(DATASOURCE)
        .query({"query": query, "refId": f"{name}-values"})
        .include_all(True)
        .all_value(".*")
        .multi(True)
        .refresh(dashboard.VariableRefresh.ON_TIME_RANGE_CHANGED)
    )


def render() -> str:
    return json.dumps(build(), cls=JSONEncoder, indent=2) + "\n"


if __name__ == "__main__":
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(render())
    print(f"wrote {OUT}")
