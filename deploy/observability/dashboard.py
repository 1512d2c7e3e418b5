"""Writes grafana/gpufleet.json, the Grafana dashboard of gpufleet (`python deploy/observability/dashboard.py`).

The dashboard is code so that its panels stay few, consistent and reviewable; the JSON beside it is
what Grafana imports (or a provisioning sidecar loads), and a test keeps the two equal and checks
every query against the metrics gpufleet exports.

Every API replica exports the same SQL gauges (`gpufleet_pending_gangs`, quota, leases, ...), so
queries over them take `max by (...)` first: one value per series whatever the number of replicas.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

OUT = Path(__file__).parent / "grafana" / "gpufleet.json"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
WIDTH = 24


class Layout:
    def __init__(self) -> None:
        self.panels: list[dict[str, Any]] = []
        self.x = 0
        self.y = 0
        self.row_height = 0

    def _next_id(self) -> int:
        return len(self.panels) + 1

    def row(self, title: str) -> None:
        self._newline()
        self.panels.append(
            {
                "type": "row",
                "title": title,
                "id": self._next_id(),
                "collapsed": False,
                "gridPos": {"x": 0, "y": self.y, "w": WIDTH, "h": 1},
                "panels": [],
            }
        )
        self.y += 1

    def _newline(self) -> None:
        if self.x:
            self.y += self.row_height
        self.x, self.row_height = 0, 0

    def panel(
        self,
        kind: str,
        title: str,
        targets: list[tuple[str, str]],
        unit: str = "short",
        w: int = 8,
        h: int = 8,
        description: str = "",
        stack: bool = False,
    ) -> None:
        if self.x + w > WIDTH:
            self._newline()
        panel: dict[str, Any] = {
            "type": kind,
            "title": title,
            "id": self._next_id(),
            "datasource": DATASOURCE,
            "gridPos": {"x": self.x, "y": self.y, "w": w, "h": h},
            "targets": [
                {"refId": chr(ord("A") + i), "datasource": DATASOURCE, "expr": expr, "legendFormat": legend}
                for i, (expr, legend) in enumerate(targets)
            ],
            "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
            "options": {},
        }
        if description:
            panel["description"] = description
        if kind == "timeseries":
            panel["fieldConfig"]["defaults"]["custom"] = {"stacking": {"mode": "normal" if stack else "none"}}
            panel["options"] = {"legend": {"displayMode": "list", "placement": "bottom", "showLegend": True}}
        self.panels.append(panel)
        self.x += w
        self.row_height = max(self.row_height, h)


def quantile(q: float, metric: str, by: str = "", window: str = "10m") -> str:
    group = f"le, {by}" if by else "le"
    return f"histogram_quantile({q}, sum by ({group}) (rate({metric}_bucket[{window}])))"


CAPACITY = 'max by (cluster, gpu_model) (gpufleet_cluster_gpus{cluster=~"$cluster"})'
ALLOCATED = 'max by (cluster, gpu_model) (gpufleet_cluster_allocated_gpus{cluster=~"$cluster"})'
QUEUE = 'queue=~"$queue"'


def build() -> dict[str, Any]:
    d = Layout()
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
    return {
        "uid": "gpufleet-overview",
        "title": "gpufleet",
        "description": "Fleet, queues, scheduler, event path, anti-hoarding and utilization of gpufleet",
        "tags": ["gpufleet", "gpu"],
        "editable": True,
        "graphTooltip": 1,
        "schemaVersion": 39,
        "version": 1,
        "refresh": "30s",
        "timezone": "utc",
        "time": {"from": "now-6h", "to": "now"},
        "annotations": {"list": []},
        "links": [],
        "templating": {
            "list": [
                {
                    "name": "datasource",
                    "label": "Prometheus",
                    "type": "datasource",
                    "query": "prometheus",
                    "current": {},
                    "hide": 0,
                },
                _variable("cluster", "label_values(gpufleet_cluster_gpus, cluster)"),
                _variable("queue", "label_values(gpufleet_pending_gangs, queue)"),
            ]
        },
        "panels": d.panels,
    }


def slo_row(d: Layout) -> None:
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


def _variable(name: str, query: str) -> dict[str, Any]:
    return {
        "name": name,
        "label": name,
        "type": "query",
        "datasource": DATASOURCE,
        "query": {"query": query, "refId": f"{name}-values"},
        "definition": query,
        "includeAll": True,
        "allValue": ".*",
        "multi": True,
        "refresh": 2,
        "current": {},
        "hide": 0,
    }


def render() -> str:
    return json.dumps(build(), indent=2) + "\n"


if __name__ == "__main__":
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(render())
    print(f"wrote {OUT}")
