"""deploy/helm: both charts pass the real `helm lint --strict` (.ci/run installs helm; see
scripts/install-helm), and what the real `helm template` renders is checked, not a renderer of ours:

- with default values each chart renders exactly the objects of its Kustomize twin (the control
  plane: deploy/control-plane/base, and the monitoring component when its toggles are on; a member
  cluster: deploy/member/overlays/<gang>), once Helm's own labels and hook annotations are set
  aside. So every check of tests/kubernetes/test_control_plane_deploy.py and test_member_deploy.py
  (real gpufleet commands and settings, selectors, network policies, RBAC against the calls the
  control plane makes) holds for the charts too;
- values reach the objects they name, and every object of every value set passes the API
  server's schemas (kubernetes-validate, strict, and the vendored Prometheus Operator CRDs);
- values.schema.json is valid JSON Schema that the shipped values.yaml satisfies, and Helm itself
  refuses values it does not allow, naming the value.
"""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from controlplane.config import Settings
from tests.kubernetes import test_control_plane_deploy as control_plane
from tests.kubernetes import test_member_deploy as member
from tests.kubernetes.schemas import validate_object

ROOT = Path(__file__).resolve().parents[2]
CHARTS = ROOT / "deploy" / "helm"
CONTROL_PLANE = CHARTS / "gpufleet"
MEMBER = CHARTS / "gpufleet-member"
HELM = shutil.which("helm")
RULES = ROOT / "deploy" / "observability" / "prometheus" / "gpufleet-alerts.yaml"
# Labels Helm charts carry by convention and Kustomize has no notion of.
HELM_LABELS = {
    "app.kubernetes.io/managed-by",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
    "helm.sh/chart",
}
MONITORING_ON = ["--set", "monitoring.serviceMonitors.enabled=true", "--set", "monitoring.prometheusRule.enabled=true"]

pytestmark = pytest.mark.skipif(
    HELM is None, reason="helm is not installed (scripts/install-helm installs the upstream binary)"
)


def helm(*args: str) -> subprocess.CompletedProcess[str]:
    assert HELM is not None
    return subprocess.run([HELM, *args], capture_output=True, text=True, check=False, timeout=60)


def template(chart: Path, namespace: str, *args: str) -> list[dict[str, Any]]:
    result = helm("template", "gpufleet", str(chart), "--namespace", namespace, *args)
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def keyed(objects: list[dict[str, Any]]) -> dict[tuple[str, str, str], dict[str, Any]]:
    return {(o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"]): o for o in objects}


def without_helm_labels(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = copy.deepcopy(objects)
    for obj in out:
        labels = obj["metadata"]["labels"]
        assert set(labels) >= HELM_LABELS, f"{obj['kind']}/{obj['metadata']['name']} lacks Helm's labels"
        obj["metadata"]["labels"] = {k: v for k, v in labels.items() if k not in HELM_LABELS}
    return out


def control_plane_default(*args: str) -> list[dict[str, Any]]:
    """The control-plane chart's render, Helm's labels and the migration hook set aside (checked here)."""
    objects = without_helm_labels(template(CONTROL_PLANE, "gpufleet-system", *args))
    job = control_plane.find(objects, "Job", "gpufleet-migrate")
    # After install, and before each upgrade: the new image's schema is in place before its pods roll,
    # and the previous Job (whose pod template cannot change) is deleted first.
    assert job["metadata"].pop("annotations") == {
        "helm.sh/hook": "post-install,pre-upgrade",
        "helm.sh/hook-delete-policy": "before-hook-creation",
    }
    config = control_plane.find(objects, "ConfigMap", "gpufleet-config")["data"]
    config["GPUFLEET_API_TRUSTED_HOSTS"] = _hosts(config["GPUFLEET_API_TRUSTED_HOSTS"])
    return objects


def _hosts(value: str) -> list[str]:
    """GPUFLEET_API_TRUSTED_HOSTS as Settings reads it (the base folds its list over two lines)."""
    return list(Settings(database_url="postgresql://x@y/z", api_trusted_hosts=value).api_trusted_hosts)


# -- lint and values schema ---------------------------------------------------------------------


@pytest.mark.parametrize(("chart", "args"), [(CONTROL_PLANE, []), (MEMBER, ["--set", "cluster=east"])])
def test_helm_lint_strict_passes(chart: Path, args: list[str]) -> None:
    result = helm("lint", "--strict", str(chart), *args)
    assert result.returncode == 0, result.stdout + result.stderr
    chart_yaml = yaml.safe_load((chart / "Chart.yaml").read_text())
    assert chart_yaml["apiVersion"] == "v2"
    assert chart_yaml["appVersion"] == "0.1.0"  # the image gpufleet builds (pyproject.toml)


def test_a_packaged_chart_carries_the_linked_files(tmp_path: Path) -> None:
    """files/ links to the one rule file and the one counters file; `helm package` stores their contents."""
    result = helm("package", str(CONTROL_PLANE), str(MEMBER), "--destination", str(tmp_path))
    assert result.returncode == 0, result.stderr
    packaged = template(tmp_path / "gpufleet-0.1.0.tgz", "gpufleet-system", *MONITORING_ON)
    rule = control_plane.find(packaged, "PrometheusRule", "gpufleet")
    assert rule["spec"]["groups"] == yaml.safe_load(RULES.read_text())["groups"]
    member_objects = template(tmp_path / "gpufleet-member-0.1.0.tgz", "gpufleet", "--set", "cluster=east")
    counters = member.find(member_objects, "ConfigMap", "gpufleet-dcgm-counters")
    assert counters["data"] == {"dcgm-metrics.csv": (ROOT / "deploy/dcgm-exporter/gpufleet-counters.csv").read_text()}


@pytest.mark.parametrize("chart", [CONTROL_PLANE, MEMBER])
def test_the_values_schema_is_json_schema_and_the_shipped_values_satisfy_it(chart: Path) -> None:
    schema = json.loads((chart / "values.schema.json").read_text())
    jsonschema.Draft7Validator.check_schema(schema)
    jsonschema.Draft7Validator(schema).validate(yaml.safe_load((chart / "values.yaml").read_text()))


@pytest.mark.parametrize(
    ("chart", "args", "message"),
    [
        (CONTROL_PLANE, ["--set", "components.api.replicas=-1"], "/components/api/replicas"),
        (CONTROL_PLANE, ["--set", "nats.url=http://nats:4222"], "/nats/url"),
        (CONTROL_PLANE, ["--set", "nats.replicas=7"], "/nats/replicas"),
        (CONTROL_PLANE, ["--set", "extraConfig.SCHEDULER_INTERVAL=2"], "'SCHEDULER_INTERVAL' does not match pattern"),
        (CONTROL_PLANE, ["--set", "components.sheduler.replicas=1"], "/components"),
        (CONTROL_PLANE, ["--set", "monitoring.runbookPageUrl=javascript:alert(1)"], "/monitoring/runbookPageUrl"),
        (MEMBER, ["--set", "cluster=east", "--set", "gang=slurm"], "/gang"),
        (MEMBER, ["--set", "cluster=East_1"], "/cluster"),
        (MEMBER, [], "cluster: this cluster's name in gpufleet"),
    ],
)
def test_helm_refuses_values_the_chart_does_not_allow(chart: Path, args: list[str], message: str) -> None:
    result = helm("template", "gpufleet", str(chart), *args)
    assert result.returncode != 0, f"{args} rendered"
    assert message in result.stderr, result.stderr


# -- the control plane --------------------------------------------------------------------------


def test_the_control_plane_chart_renders_the_kustomize_base() -> None:
    base = [o for o in control_plane.render("base") if o["kind"] != "Namespace"]  # --create-namespace
    config = control_plane.find(base, "ConfigMap", "gpufleet-config")["data"]
    config["GPUFLEET_API_TRUSTED_HOSTS"] = _hosts(config["GPUFLEET_API_TRUSTED_HOSTS"])
    assert keyed(control_plane_default()) == keyed(base)


def test_the_monitoring_toggles_render_the_monitoring_component() -> None:
    production = control_plane.render("production")
    component = [o for o in production if o["apiVersion"].startswith("monitoring.coreos.com/")]
    assert len(component) == 3
    rendered = control_plane_default(*MONITORING_ON)
    assert keyed([o for o in rendered if o["apiVersion"].startswith("monitoring.coreos.com/")]) == keyed(component)
    rule = control_plane.find(rendered, "PrometheusRule", "gpufleet")
    assert rule["spec"]["groups"] == yaml.safe_load(RULES.read_text())["groups"]  # one source, unchanged
    # each toggle alone
    only_rule = template(CONTROL_PLANE, "gpufleet-system", "--set", "monitoring.prometheusRule.enabled=true")
    assert [o["kind"] for o in only_rule if o["apiVersion"].startswith("monitoring.")] == ["PrometheusRule"]


def test_the_runbook_page_url_points_every_alert_at_the_published_runbooks() -> None:
    page = "https://docs.example.org/operations/runbooks/"
    rendered = template(CONTROL_PLANE, "ops", *MONITORING_ON, "--set", f"monitoring.runbookPageUrl={page}")
    rule = control_plane.find(rendered, "PrometheusRule", "gpufleet")
    alerts = [r for group in rule["spec"]["groups"] for r in group["rules"]]
    assert alerts
    for alert in alerts:
        assert alert["annotations"]["runbook_url"] == f"{page}#{alert['alert'].lower()}"


VALUE_SETS: dict[str, list[str]] = {
    "defaults": [],
    "monitored": [*MONITORING_ON, "--set", "monitoring.serviceMonitors.labels.release=kube-prometheus-stack"],
    "small": [
        *[a for c in control_plane.DEPLOYMENTS.values() for a in ("--set", f"components.{c}.replicas=1")],
        "--set",
        "nats.replicas=1",
        "--set",
        "networkPolicies.enabled=false",
    ],
    "customised": [
        "--set",
        "image.repository=registry.example.org/gpufleet",
        "--set",
        "image.tag=0.1.0",
        "--set",
        "image.pullPolicy=IfNotPresent",
        "--set",
        "database.secretName=pg-url",
        "--set",
        "database.secretKey=dsn",
        "--set",
        "nats.url=nats://nats-0.nats:4222\\,nats://nats-1.nats:4222",  # --set splits at unescaped commas
        "--set",
        "nats.secretName=nats-users",
        "--set",
        "state.storageClassName=efs",
        "--set",
        "components.scheduler.resources.limits.memory=8Gi",
        "--set",
        "api.extraTrustedHosts={gpufleet.example.org}",
        "--set",
        "api.trustedProxies={10.0.0.0/8}",
        "--set-string",
        "extraConfig.GPUFLEET_SCHEDULER_INTERVAL=2",
    ],
}


@pytest.mark.parametrize("values", sorted(VALUE_SETS))
def test_every_object_of_every_value_set_passes_the_schemas_and_gpufleet_accepts_the_settings(values: str) -> None:
    objects = template(CONTROL_PLANE, "gpufleet-system", *VALUE_SETS[values])
    for obj in objects:
        validate_object(obj)
    config = control_plane.find(objects, "ConfigMap", "gpufleet-config")["data"]
    settings = Settings(
        **{k.removeprefix("GPUFLEET_").lower(): v for k, v in config.items()},
        database_url="postgresql://gpufleet@postgres:5432/gpufleet",
    )
    templates = control_plane.pod_templates(objects)
    for pod in templates.values():
        [container] = pod["spec"]["containers"]
        control_plane._command(container["args"])  # a real gpufleet command line
    if values == "small":
        assert settings.nats_replicas == 1
        assert {o["spec"]["replicas"] for o in objects if o["kind"] == "Deployment"} == {1}
        assert not [o for o in objects if o["kind"] == "NetworkPolicy"]
    if values == "monitored":
        monitors = [o for o in objects if o["kind"] == "ServiceMonitor"]
        assert len(monitors) == 2
        assert all(m["metadata"]["labels"]["release"] == "kube-prometheus-stack" for m in monitors)
    if values == "customised":
        for name, pod in templates.items():
            [container] = pod["spec"]["containers"]
            assert container["image"] == "registry.example.org/gpufleet:0.1.0", name
            assert container["imagePullPolicy"] == "IfNotPresent", name
            env = {e["name"]: e for e in container.get("env", [])}
            assert env["GPUFLEET_DATABASE_URL"]["valueFrom"]["secretKeyRef"] == {"name": "pg-url", "key": "dsn"}
            secrets = {v["secret"]["secretName"] for v in pod["spec"]["volumes"] if "secret" in v}
            assert secrets <= {"nats-users"}, name
        scheduler = templates["gpufleet-scheduler"]["spec"]["containers"][0]
        assert scheduler["resources"]["limits"]["memory"] == "8Gi"
        claim = control_plane.find(objects, "PersistentVolumeClaim", "gpufleet-state")
        assert claim["spec"]["storageClassName"] == "efs"
        assert settings.nats_url == "nats://nats-0.nats:4222,nats://nats-1.nats:4222"
        assert settings.scheduler_interval == 2
        assert "gpufleet.example.org" in settings.api_trusted_hosts
        assert settings.api_trusted_proxies == ["10.0.0.0/8"]


def test_the_trusted_hosts_follow_the_release_namespace() -> None:
    """Installed in another namespace, the API still answers the names its Service is reached by."""
    config = control_plane.find(template(CONTROL_PLANE, "ops"), "ConfigMap", "gpufleet-config")["data"]
    hosts = _hosts(config["GPUFLEET_API_TRUSTED_HOSTS"])
    assert {"gpufleet-api", "gpufleet-api.ops.svc", "gpufleet-api.ops.svc.cluster.local", "localhost"} <= set(hosts)
    assert not [h for h in hosts if "gpufleet-system" in h]


# -- member clusters ----------------------------------------------------------------------------


GANGS = {"none": "none", "volcano": "volcano", "coscheduling": "coscheduling", "kueue": "kueue", "jobset": "jobset"}


@pytest.mark.parametrize("gang", sorted(GANGS))
def test_the_member_chart_renders_the_kustomize_overlay_of_its_gang(gang: str) -> None:
    overlay = [o for o in member.render(GANGS[gang]) if o["kind"] != "Namespace"]
    member.find(overlay, "ConfigMap", "gpufleet-agent")["data"]["cluster"] = "east"
    rendered = without_helm_labels(template(MEMBER, "gpufleet", "--set", "cluster=east", "--set", f"gang={gang}"))
    for obj in rendered:
        validate_object(obj)
    assert keyed(rendered) == keyed(overlay)


def test_member_values_reach_their_objects(tmp_path: Path) -> None:
    values = {
        "cluster": "aks-west",
        "workloadNamespaces": ["ml", "ml-batch"],
        "dcgmExporter": {"namespace": "monitoring", "selector": {"app.kubernetes.io/name": "dcgm-exporter"}},
        "controller": {"tokenSecret": False},
    }
    (tmp_path / "values.yaml").write_text(yaml.safe_dump(values))
    objects = template(MEMBER, "ml", "--values", str(tmp_path / "values.yaml"))
    for obj in objects:
        validate_object(obj)
    config = member.find(objects, "ConfigMap", "gpufleet-agent")["data"]
    assert config["cluster"] == "aks-west"
    assert config["namespaces"] == "ml ml-batch"
    assert config["dcgm-url"] == "http://gpufleet-dcgm-exporter.monitoring.svc:9400/metrics"
    service = member.find(objects, "Service", "gpufleet-dcgm-exporter")
    assert service["metadata"]["namespace"] == "monitoring"
    assert service["spec"]["selector"] == {"app.kubernetes.io/name": "dcgm-exporter"}
    assert not [o for o in objects if o["kind"] == "Secret"]
    binding = member.find(objects, "ClusterRoleBinding", "gpufleet-controller")
    assert {"kind": "ServiceAccount", "name": "gpufleet-controller", "namespace": "ml"} in binding["subjects"]
