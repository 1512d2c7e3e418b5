"""The Grafana dashboard and the Prometheus alert rules under deploy/observability load and refer only
to what gpufleet exports: metric names, the labels they are matched or grouped on, and nothing else."""

from __future__ import annotations

import json
import re
import runpy
import shutil
import subprocess
from pathlib import Path
from typing import Any

import click
import markdown
import pytest
import yaml
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import dashboard as grafana

from controlplane.cli.main import main
from tests.observability import promql
from tests.observability.exported import Family, exported_families, series_names

ROOT = Path(__file__).resolve().parents[2]
OBSERVABILITY = ROOT / "deploy" / "observability"
DASHBOARD = OBSERVABILITY / "grafana" / "gpufleet.json"
RULES = OBSERVABILITY / "prometheus" / "gpufleet-alerts.yaml"
RUNBOOKS = ROOT / "docs" / "operations" / "runbooks.md"
PROMETHEUS_RULE = ROOT / "deploy" / "control-plane" / "components" / "monitoring" / "prometheus-rule.yaml"
DURATION = re.compile(r"^([0-9]+(ms|s|m|h|d|w|y))+$")


@pytest.fixture(scope="module")
def exported() -> dict[str, Family]:
    return series_names(exported_families())


def check_expression(expr: str, exported: dict[str, Family], where: str) -> promql.Usage:
    usage = promql.read(expr)
    assert usage.metrics, f"{where}: no metric in {expr!r}"
    known: set[str] = {"le"}
    for name, labels in usage.metrics.items():
        assert name in exported, f"{where}: {name} is not a metric gpufleet exports"
        unknown = labels - exported[name].labels
        assert not unknown, f"{where}: {name} has no label(s) {sorted(unknown)}"
        known |= exported[name].labels
    stray = usage.grouping - known
    assert not stray, f"{where}: grouping on {sorted(stray)}, which none of {sorted(usage.metrics)} has"
    return usage


# -- the reader itself --------------------------------------------------------------------------


def test_promql_reader_finds_metrics_labels_and_grouping() -> None:
    usage = promql.read(
        'histogram_quantile(0.95, sum by (le, phase) (rate(gpufleet_a_seconds_bucket{phase=~"snap(shot)?|x{1}"}[5m])))'
        " > on (phase) group_left () max without (instance) (gpufleet_b offset 5m) and 1e3 < bool time()"
    )
    assert usage.metrics == {"gpufleet_a_seconds_bucket": {"phase"}, "gpufleet_b": set()}
    assert usage.grouping == {"le", "phase", "instance"}
    assert promql.read("max_over_time(gpufleet_c[10m:1m])").metrics == {"gpufleet_c": set()}
    assert promql.read("label_values(gpufleet_d, queue)").metrics == {"gpufleet_d": {"queue"}}
    with pytest.raises(ValueError, match="without a metric name"):
        promql.read('sum({__name__=~"gpufleet_.*"})')


def test_unknown_metrics_and_labels_are_caught(exported: dict[str, Family]) -> None:
    with pytest.raises(AssertionError, match="not a metric gpufleet exports"):
        check_expression("sum(rate(gpufleet_made_up_total[5m]))", exported, "test")
    with pytest.raises(AssertionError, match="has no label"):
        check_expression('gpufleet_admissions_total{workload="w"}', exported, "test")
    with pytest.raises(AssertionError, match="grouping on"):
        check_expression("sum by (workload) (gpufleet_admissions_total)", exported, "test")
    with pytest.raises(AssertionError, match="not a metric"):
        check_expression("gpufleet_admissions", exported, "test")  # a counter is queried as ..._total


# -- dashboard ----------------------------------------------------------------------------------


def test_dashboard_is_the_generated_one() -> None:
    """The committed JSON is what Grafana's typed builders (grafana-foundation-sdk) build."""
    render = runpy.run_path(str(OBSERVABILITY / "dashboard.py"))["render"]
    assert render() == DASHBOARD.read_text(), "run python deploy/observability/dashboard.py"


def test_dashboard_is_grafanas_model_and_lays_out_its_panels() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    # Decoded into the SDK's dashboard model (generated from Grafana's schema) and encoded again, it
    # comes back unchanged: no field Grafana's model does not have, none of the wrong type.
    decoded = grafana.Dashboard.from_json(dashboard)
    assert json.loads(json.dumps(decoded, cls=JSONEncoder)) == dashboard
    # What no schema says: ids unique, panels inside the 24-column grid and not overlapping.
    panels = dashboard["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    cells: set[tuple[int, int]] = set()
    for panel in panels:
        pos = panel["gridPos"]
        assert pos["x"] + pos["w"] <= 24, panel["title"]
        area = {(x, y) for x in range(pos["x"], pos["x"] + pos["w"]) for y in range(pos["y"], pos["y"] + pos["h"])}
        assert not area & cells, f"{panel['title']} overlaps another panel"
        cells |= area
    rows = [p["title"] for p in panels if p["type"] == "row"]
    for wanted in ("Fleet", "Queues", "Scheduler", "Event path", "Anti-hoarding", "Utilization"):
        assert any(r.startswith(wanted) for r in rows), wanted
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    used = set(re.findall(r"\$\{?(\w+)", json.dumps(panels)))
    assert used <= variables, used - variables


def test_every_dashboard_query_uses_exported_metrics(exported: dict[str, Family]) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    seen: set[str] = set()
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            usage = check_expression(target["expr"], exported, panel["title"])
            seen |= {exported[m].name for m in usage.metrics}
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            check_expression(variable["query"]["query"], exported, f"variable {variable['name']}")
    # DCGM activity beside allocation, and each area the issue names, has its panel.
    for name in (
        "gpufleet_gpu_activity_ratio",
        "gpufleet_cluster_allocated_gpus",
        "gpufleet_scheduler_cycle_phase_seconds",
        "gpufleet_pending_gangs",
        "gpufleet_queue_used_gpus",
        "gpufleet_outbox_backlog_events",
        "gpufleet_ingest_lag_seconds",
        "gpufleet_idle_gpus",
        "gpufleet_lease_epoch",
        "gpufleet_cloud_calls",
    ):
        assert name in seen, name


# -- alert rules --------------------------------------------------------------------------------


def _rules() -> list[dict[str, Any]]:
    document = yaml.safe_load(RULES.read_text())
    assert set(document) == {"groups"}
    rules: list[dict[str, Any]] = []
    for group in document["groups"]:
        assert set(group) <= {"name", "interval", "rules"}
        assert group["name"]
        rules.extend(group["rules"])
    return rules


def test_alert_rules_are_well_formed_and_refer_to_exported_metrics(exported: dict[str, Family]) -> None:
    rules = _rules()
    names = [r["alert"] for r in rules]
    assert len(names) == len(set(names))
    for rule in rules:
        assert set(rule) <= {"alert", "expr", "for", "labels", "annotations", "keep_firing_for"}, rule["alert"]
        assert re.fullmatch(r"Gpufleet[A-Za-z]+", rule["alert"])
        assert DURATION.match(str(rule["for"])), rule["alert"]
        assert rule["labels"]["severity"] in ("critical", "warning")
        assert rule["annotations"]["summary"]
        assert rule["annotations"]["runbook_url"], rule["alert"]
        check_expression(str(rule["expr"]), exported, rule["alert"])
    for wanted in (
        "GpufleetLeaderLost",
        "GpufleetSchedulingCycleSlow",
        "GpufleetOutboxBacklogGrowing",
        "GpufleetConsumerStuck",
        "GpufleetClusterUnreachable",
        "GpufleetGpusIdle",
    ):
        assert wanted in names


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed (apt-get install prometheus)")
def test_promtool_accepts_the_rules() -> None:
    result = subprocess.run(["promtool", "check", "rules", str(RULES)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed (apt-get install prometheus)")
def test_promtool_parses_every_dashboard_query(tmp_path: Path) -> None:
    """Each query of the dashboard as a recording rule: promtool's parser is Prometheus's own."""
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    rules = [{"record": f"gpufleet:dashboard_query_{i}", "expr": e} for i, e in enumerate(exprs)]
    path = tmp_path / "queries.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    result = subprocess.run(["promtool", "check", "rules", str(path)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{len(exprs)} rules found" in result.stdout


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed (apt-get install prometheus)")
def test_alerts_fire_on_the_series_they_watch() -> None:
    """The rule unit tests beside the rules (synthetic series in, expected alerts out)."""
    tests = RULES.with_name("gpufleet-alerts.test.yaml")
    result = subprocess.run(["promtool", "test", "rules", str(tests)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def _runbook_sections() -> dict[str, str]:
    """Section anchor -> text, with the anchors Python-Markdown's toc extension gives the headings
    (what mkdocs renders the page with), not a slug rule of our own."""
    text = RUNBOOKS.read_text()
    md = markdown.Markdown(extensions=["toc"])
    md.convert(text)
    [page] = md.toc_tokens  # set by the toc extension
    headings = [(h["id"], h["name"]) for h in page["children"]]
    sections: dict[str, str] = {}
    for i, (anchor, name) in enumerate(headings):
        start = text.index(f"## {name}\n")
        end = text.index(f"## {headings[i + 1][1]}\n") if i + 1 < len(headings) else len(text)
        sections[anchor] = text[start:end]
    return sections


def test_every_alert_links_its_runbook_and_every_runbook_an_alert() -> None:
    sections = _runbook_sections()
    linked = set()
    for rule in _rules():
        url = rule["annotations"]["runbook_url"]
        page, _, anchor = url.partition("#")
        assert page == "docs/operations/runbooks.md", rule["alert"]
        assert anchor in sections, f"{rule['alert']}: no section #{anchor} in {RUNBOOKS.name}"
        assert sections[anchor].startswith(f"## {rule['alert']}\n"), rule["alert"]
        for part in ("**Meaning.**", "**Impact.**", "**Diagnose.**", "**Fix.**"):
            assert part in sections[anchor], f"the runbook of {rule['alert']} has no {part}"
        linked.add(anchor)
    assert set(sections) == linked, f"runbooks of no alert: {sorted(set(sections) - linked)}"
    # an in-page link (one runbook pointing at another) lands on a section too
    for target in re.findall(r"\]\(#([^)]+)\)", RUNBOOKS.read_text()):
        assert target in sections, target


def test_the_prometheus_rule_is_generated_from_the_rules_file() -> None:
    """One source of truth: the PrometheusRule of the monitoring component is the rule file that
    promtool tests, wrapped (deploy/observability/prometheus_rule.py)."""
    render = runpy.run_path(str(OBSERVABILITY / "prometheus_rule.py"))["render"]
    assert render() == PROMETHEUS_RULE.read_text(), "run python deploy/observability/prometheus_rule.py"
    rule = yaml.safe_load(PROMETHEUS_RULE.read_text())
    assert rule["spec"]["groups"] == yaml.safe_load(RULES.read_text())["groups"]


def test_the_runbooks_name_real_commands_options_and_metrics(exported: dict[str, Family]) -> None:
    """A runbook is read during an incident: every `gpufleet ...` command line it gives must be one
    the CLI has (with the options it shows), every metric one gpufleet exports."""
    text = RUNBOOKS.read_text()
    commands = re.findall(r"`gpufleet ([^`]+)`", text)
    assert len(commands) >= 10
    for line in commands:
        words = [w for w in line.split() if not w.startswith("<")]
        command: click.Command = main
        ctx = click.Context(main, info_name="gpufleet")
        while isinstance(command, click.Group) and words and not words[0].startswith("-"):
            sub = command.get_command(ctx, words[0])
            assert sub is not None, f"`gpufleet {line}`: no command {words[0]!r}"
            command, words = sub, words[1:]
            ctx = click.Context(command, info_name=command.name, parent=ctx)
        options = {opt for param in command.params for opt in param.opts}
        unknown = [w for w in words if w.startswith("-") and w not in options]
        assert not unknown, f"`gpufleet {line}`: no option {unknown}"
    metrics = set(re.findall(r"\bgpufleet_[a-z_]+[a-z]", text))
    assert metrics
    known = set(exported) | {family.name for family in exported.values()}  # series, or a histogram's family
    assert not metrics - known, f"not metrics gpufleet exports: {sorted(metrics - known)}"
