"""deploy/control-plane: each overlay renders (kubectl kustomize, or the Python renderer checked
against it), every object passes the API server's schemas (kubernetes-validate, strict; the
ServiceMonitors and the PrometheusRule the Prometheus Operator's CRDs), the base applies without the
Operator (its objects are an opt-in component), and what the manifests say agrees with gpufleet
itself: every container runs a real `gpufleet` command line, every `GPUFLEET_*` setting is one
Settings knows and validates, the leased components keep a standby, the shared state volume is
where the settings put the state dir, and selectors of Services, budgets, policies and
ServiceMonitors find the pods they mean."""

from __future__ import annotations

import functools
import subprocess
from pathlib import Path
from typing import Any

import click
import pytest
import yaml

from controlplane.bootstrap import COMPONENTS
from controlplane.cli.main import main
from controlplane.config import Settings
from tests.kubernetes import kustomize_lite
from tests.kubernetes.schemas import validate_object
from tests.kubernetes.test_member_deploy import KUBECTL, KUSTOMIZE_V5

ROOT = Path(__file__).resolve().parents[2]
CONTROL_PLANE = ROOT / "deploy" / "control-plane"
OVERLAYS = ("production", "small")
TARGETS = {"base": CONTROL_PLANE / "base", **{o: CONTROL_PLANE / "overlays" / o for o in OVERLAYS}}
DEPLOYMENTS = {f"gpufleet-{c}": c for c in ("api", "scheduler", "dispatcher", "ingest", "relay")}
LEASED = ("scheduler", "dispatcher", "relay")  # one works, the others stand by
# The metrics port of each worker is the observability work's setting (issue 14, deliverable 1);
# the workers' probes and ServiceMonitor use it.
METRICS_PORT = 9090
# The overlays that opt into components/monitoring (ServiceMonitors, PrometheusRule).
MONITORED = {"production"}
RULES = ROOT / "deploy" / "observability" / "prometheus" / "gpufleet-alerts.yaml"


@functools.cache
def _kubectl_kustomize(target: str) -> str:
    assert KUBECTL is not None
    return subprocess.run(
        [KUBECTL, "kustomize", str(TARGETS[target])], capture_output=True, text=True, check=True, timeout=60
    ).stdout


def render(target: str) -> list[dict[str, Any]]:
    if KUSTOMIZE_V5:
        return [doc for doc in yaml.safe_load_all(_kubectl_kustomize(target)) if doc]
    return kustomize_lite.render(TARGETS[target])


def find(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    [obj] = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    return obj


def pod_templates(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o["spec"]["template"] for o in objects if o["kind"] in ("Deployment", "Job")}


def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    assert set(selector) <= {"matchLabels"}, selector  # the manifests use matchLabels only
    return all(labels.get(k) == v for k, v in (selector.get("matchLabels") or {}).items())


@pytest.mark.skipif(not KUSTOMIZE_V5, reason="kubectl with kustomize v5 (kubectl 1.27+) is not installed")
@pytest.mark.parametrize("target", sorted(TARGETS))
def test_the_python_renderer_matches_kubectl_kustomize(target: str) -> None:
    def keyed(objects: list[dict[str, Any]]) -> dict[tuple[str, str, str], dict[str, Any]]:
        return {(o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"]): o for o in objects}

    real = keyed([doc for doc in yaml.safe_load_all(_kubectl_kustomize(target)) if doc])
    assert keyed(kustomize_lite.render(TARGETS[target])) == real


MONITORING_OBJECTS = ["ServiceMonitor/gpufleet-api", "ServiceMonitor/gpufleet-workers", "PrometheusRule/gpufleet"]


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_every_object_passes_the_schemas(target: str) -> None:
    objects = render(target)
    for obj in objects:
        validate_object(obj)
    kinds = sorted(f"{o['kind']}/{o['metadata']['name']}" for o in objects)
    assert kinds == sorted(
        [
            "Namespace/gpufleet-system",
            "ConfigMap/gpufleet-config",
            "ServiceAccount/gpufleet-control-plane",
            "PersistentVolumeClaim/gpufleet-state",
            "Job/gpufleet-migrate",
            "Service/gpufleet-api",
            "Service/gpufleet-workers",
            "NetworkPolicy/gpufleet-default-deny",
            "NetworkPolicy/gpufleet-egress",
            "NetworkPolicy/gpufleet-dispatcher-egress",
            "NetworkPolicy/gpufleet-api-ingress",
            "NetworkPolicy/gpufleet-metrics-ingress",
            *(f"Deployment/{name}" for name in DEPLOYMENTS),
            *(f"PodDisruptionBudget/{name}" for name in DEPLOYMENTS),
            *(MONITORING_OBJECTS if target in MONITORED else []),
        ]
    )
    assert all(o["metadata"]["labels"]["app.kubernetes.io/part-of"] == "gpufleet" for o in objects)
    assert all(o["metadata"].get("namespace") == "gpufleet-system" for o in objects if o["kind"] != "Namespace")
    # Credentials are referenced, never shipped: the Secrets are created by the operator.
    assert not [o for o in objects if o["kind"] == "Secret"]


def _command(args: list[str]) -> tuple[str, click.Context]:
    """Parse a container's args as the image's entrypoint (`gpufleet`) would: unknown commands,
    options or component names fail here, and so does a deprecated flat name (every control-plane
    container runs `gpufleet server ...`)."""
    ctx = click.Context(main, info_name="gpufleet")
    assert args[0] == "server", f"{args} does not run a `gpufleet server` command"
    group = main.get_command(ctx, "server")
    assert isinstance(group, click.Group)
    group_ctx = click.Context(group, info_name="server", parent=ctx)
    command = group.get_command(group_ctx, args[1])
    assert command is not None, f"gpufleet server has no command {args[1]!r}"
    return args[1], command.make_context(args[1], list(args[2:]), parent=group_ctx)


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_every_container_runs_a_real_gpufleet_command_with_valid_settings(target: str) -> None:
    objects = render(target)
    config = find(objects, "ConfigMap", "gpufleet-config")["data"]
    assert all(key.startswith("GPUFLEET_") for key in config)
    unknown = {k.removeprefix("GPUFLEET_").lower() for k in config} - set(Settings.model_fields)
    assert not unknown, f"settings gpufleet does not know: {unknown}"
    secrets = {"database_url": "postgresql://gpufleet@postgres:5432/gpufleet", "nats_secrets_file": "/x"}
    values = {k.removeprefix("GPUFLEET_").lower(): v for k, v in config.items()}
    settings = Settings(**values, **secrets)
    assert int(values["metrics_port"]) == METRICS_PORT
    assert settings.metrics_host == "0.0.0.0"
    # the API answers the names its Service is reached by (any other Host gets a 400)
    assert {"gpufleet-api", "gpufleet-api.gpufleet-system.svc", "localhost"} <= set(settings.api_trusted_hosts)
    assert settings.api_trusted_proxies == []

    commands: dict[str, str] = {}
    for name, template in pod_templates(objects).items():
        [container] = template["spec"]["containers"]
        command, ctx = _command(container["args"])
        commands[name] = command
        if command == "serve":
            assert ctx.params["host"] == "0.0.0.0"
            assert ctx.params["port"] == 8080
        env = {e["name"]: e for e in container.get("env", [])}
        assert env["GPUFLEET_DATABASE_URL"]["valueFrom"]["secretKeyRef"] == {"name": "gpufleet-database", "key": "url"}
        assert container["envFrom"] == [{"configMapRef": {"name": "gpufleet-config"}}]
        if command != "init":  # everything that talks to NATS connects as the control plane's user
            assert env["GPUFLEET_NATS_SECRETS_FILE"]["value"] == "/var/run/gpufleet/nats/secrets.json"
            mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
            volume = mounts["/var/run/gpufleet/nats"]["name"]
            volumes = {v["name"]: v for v in template["spec"]["volumes"]}
            assert volumes[volume]["secret"]["secretName"] == "gpufleet-nats"
    assert commands == {
        "gpufleet-migrate": "init",
        "gpufleet-api": "serve",
        **{f"gpufleet-{c}": c for c in COMPONENTS if c != "api"},
    }
    assert settings.nats_replicas == (1 if target == "small" else 3)


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_pods_run_unprivileged_on_a_read_only_root_with_resources(target: str) -> None:
    for name, template in pod_templates(render(target)).items():
        spec = template["spec"]
        assert spec["automountServiceAccountToken"] is False, name
        assert spec["securityContext"]["runAsNonRoot"] is True, name
        assert spec["securityContext"]["runAsUser"] == 10001, name  # the image's user (deploy/Dockerfile)
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}, name
        [container] = spec["containers"]
        assert container["image"] == "gpufleet:latest", name
        security = container["securityContext"]
        assert security["readOnlyRootFilesystem"] is True, name
        assert security["allowPrivilegeEscalation"] is False, name
        assert security["capabilities"]["drop"] == ["ALL"], name
        assert {"cpu", "memory"} <= set(container["resources"]["requests"]), name
        assert "memory" in container["resources"]["limits"], name
        assert "/tmp" in {m["mountPath"] for m in container["volumeMounts"]}, name  # writable scratch


def test_the_overlays_size_the_components() -> None:
    def replicas(target: str) -> dict[str, int]:
        return {
            DEPLOYMENTS[o["metadata"]["name"]]: o["spec"]["replicas"]
            for o in render(target)
            if o["kind"] == "Deployment"
        }

    assert replicas("base") == {"api": 2, "scheduler": 2, "dispatcher": 2, "ingest": 2, "relay": 2}
    assert replicas("production") == {"api": 3, "scheduler": 2, "dispatcher": 2, "ingest": 3, "relay": 2}
    assert replicas("small") == dict.fromkeys(DEPLOYMENTS.values(), 1)

    def memory(target: str, component: str) -> str:
        template = pod_templates(render(target))[f"gpufleet-{component}"]
        return str(template["spec"]["containers"][0]["resources"]["limits"]["memory"])

    assert [memory(t, "scheduler") for t in ("small", "base", "production")] == ["1Gi", "2Gi", "4Gi"]


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_probes_budgets_and_services_find_their_pods(target: str) -> None:
    objects = render(target)
    templates = pod_templates(objects)
    deployments = [o for o in objects if o["kind"] == "Deployment"]
    for deployment in deployments:
        name = deployment["metadata"]["name"]
        labels = templates[name]["metadata"]["labels"]
        assert selects(deployment["spec"]["selector"], labels), name
        others = [d for d in deployments if d is not deployment]
        assert not [
            d
            for d in others
            if selects(deployment["spec"]["selector"], templates[d["metadata"]["name"]]["metadata"]["labels"])
        ]
        budget = find(objects, "PodDisruptionBudget", name)
        assert budget["spec"]["selector"] == deployment["spec"]["selector"], name
        assert budget["spec"]["maxUnavailable"] == 1, name
        [container] = templates[name]["spec"]["containers"]
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        assert "livenessProbe" in container, name
        if DEPLOYMENTS[name] == "api":
            assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
            assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
            assert ports == {"http": 8080}
        else:
            assert container["livenessProbe"]["tcpSocket"] == {"port": "metrics"}
            assert ports == {"metrics": METRICS_PORT}
        if DEPLOYMENTS[name] in LEASED and target != "small":
            # a leader and a standby; a rollout starts the new pod before stopping an old one
            assert deployment["spec"]["replicas"] == 2, name
            assert deployment["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}

    api = find(objects, "Service", "gpufleet-api")
    backends = [
        n for n, t in templates.items() if selects({"matchLabels": api["spec"]["selector"]}, t["metadata"]["labels"])
    ]
    assert backends == ["gpufleet-api"]
    workers = find(objects, "Service", "gpufleet-workers")
    scraped = {
        n
        for n, t in templates.items()
        if selects({"matchLabels": workers["spec"]["selector"]}, t["metadata"]["labels"])
    }
    assert scraped == {f"gpufleet-{c}" for c in ("scheduler", "dispatcher", "ingest", "relay")}
    assert workers["spec"]["ports"] == [
        {"name": "metrics", "port": METRICS_PORT, "targetPort": "metrics", "protocol": "TCP"}
    ]
    if target not in MONITORED:
        return
    for monitor, service, port in (("gpufleet-api", api, "http"), ("gpufleet-workers", workers, "metrics")):
        spec = find(objects, "ServiceMonitor", monitor)["spec"]
        assert selects(spec["selector"], service["metadata"]["labels"]), monitor
        others = [s for s in objects if s["kind"] == "Service" and s is not service]
        assert not [s for s in others if selects(spec["selector"], s["metadata"]["labels"])], monitor
        assert [e["port"] for e in spec["endpoints"]] == [port]
        assert {p["name"] for p in service["spec"]["ports"]} >= {port}
        # every /metrics wants a bearer token of role metrics: the monitors send one from a Secret
        [endpoint] = spec["endpoints"]
        assert endpoint["authorization"] == {
            "type": "Bearer",
            "credentials": {"name": "gpufleet-metrics-token", "key": "token"},
        }, monitor


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_the_state_volume_is_shared_where_the_settings_put_the_state_dir(target: str) -> None:
    """The API writes kubeconfigs of `kubernetes` clusters into the state dir and the dispatcher
    reads them there: both mount the one ReadWriteMany claim at GPUFLEET_STATE_DIR."""
    objects = render(target)
    state_dir = find(objects, "ConfigMap", "gpufleet-config")["data"]["GPUFLEET_STATE_DIR"]
    claim = find(objects, "PersistentVolumeClaim", "gpufleet-state")
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    mounting = set()
    for name, template in pod_templates(objects).items():
        volumes = {v["name"]: v for v in template["spec"]["volumes"]}
        [container] = template["spec"]["containers"]
        for mount in container["volumeMounts"]:
            claim_ref = volumes[mount["name"]].get("persistentVolumeClaim")
            if claim_ref:
                assert claim_ref["claimName"] == "gpufleet-state"
                assert mount["mountPath"] == state_dir
                mounting.add(name)
    assert mounting == {"gpufleet-api", "gpufleet-dispatcher"}


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_network_policies_allow_what_gpufleet_uses_and_nothing_else(target: str) -> None:
    objects = render(target)
    policies = [o for o in objects if o["kind"] == "NetworkPolicy"]
    templates = pod_templates(objects)
    deny = find(objects, "NetworkPolicy", "gpufleet-default-deny")["spec"]
    assert deny == {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}

    def allowed(pod: str, direction: str) -> set[tuple[str, int]]:
        labels = templates[pod]["metadata"]["labels"]
        out: set[tuple[str, int]] = set()
        for policy in policies:
            spec = policy["spec"]
            if direction in spec.get("policyTypes", []) and selects(spec["podSelector"], labels):
                for rule in spec.get(direction.lower(), []):
                    out |= {(p["protocol"], p["port"]) for p in rule.get("ports", [])}
        return out

    base_egress = {("UDP", 53), ("TCP", 53), ("TCP", 5432), ("TCP", 4222)}
    for pod in templates:
        want = base_egress | ({("TCP", 443), ("TCP", 6443)} if pod == "gpufleet-dispatcher" else set())
        assert allowed(pod, "Egress") == want, pod
        ingress = allowed(pod, "Ingress")
        if pod == "gpufleet-api":
            assert ingress == {("TCP", 8080)}
        elif pod == "gpufleet-migrate":
            assert ingress == set()
        else:
            assert ingress == {("TCP", METRICS_PORT)}, pod


def test_the_migration_job_migrates_once_and_cleans_up() -> None:
    job = find(render("base"), "Job", "gpufleet-migrate")
    assert job["spec"]["template"]["spec"]["restartPolicy"] == "OnFailure"
    assert job["spec"]["ttlSecondsAfterFinished"] > 0
    [container] = job["spec"]["template"]["spec"]["containers"]
    assert container["args"] == ["server", "init"]  # migrate + default priority classes; no token written anywhere


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_the_prometheus_operator_is_needed_only_by_overlays_that_opt_in(target: str) -> None:
    """A kind the cluster does not know fails `kubectl apply` whole: base and small must carry none of
    the Operator's kinds; production's PrometheusRule holds exactly the rules promtool tests."""
    objects = render(target)
    operator_kinds = [o for o in objects if o["apiVersion"].startswith("monitoring.coreos.com/")]
    if target not in MONITORED:
        assert operator_kinds == []
        return
    rule = find(objects, "PrometheusRule", "gpufleet")
    assert rule["spec"]["groups"] == yaml.safe_load(RULES.read_text())["groups"]
    assert rule["metadata"]["labels"]["app.kubernetes.io/part-of"] == "gpufleet"
