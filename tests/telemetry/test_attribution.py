"""GPU series reach the run whose pod holds the GPU: by the pod's `gpufleet.io/run` label (as
dcgm-exporter passes pod labels), else by the pod name gpufleet gives, attempt included; per pod
on MIG instances and on shared GPUs; only in gpufleet's namespaces.

The exposition below is what dcgm-exporter 4.5.3-4.8.2 renders (`internal/pkg/rendermetrics/
render_metrics.go`): `gpu, UUID, pci_bus_id, device, modelName[, GPU_I_PROFILE, GPU_I_ID],
Hostname`, then the metric's labels (CSV `label` rows and, with `--kubernetes-enable-pod-labels`,
the pod's labels with every character outside [a-zA-Z0-9_] turned into `_`,
`utils.SanitizeLabelName`), then the attributes `container, namespace, pod[, pod_uid][, vgpu]`;
Go templates range over maps in sorted key order. With `--kubernetes-virtual-gpus` each pod
sharing a GPU gets its own copy of the series with `vgpu` and without the pod labels
(`internal/pkg/transformation/kubernetes.go`).
"""

# Exposition lines are kept verbatim, however long: they are the fixture.
# ruff: noqa: E501

from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import replace

import nats
from click.testing import CliRunner

from adapters.dcgm.exposition import RUN_METRIC_LABEL, metric_label_name, parse_exposition, run_of_pod_name
from adapters.kubernetes.manifests import KubeSettings, build_run_manifests
from adapters.nats.server import NatsServerProcess
from adapters.nats.topology import TELEMETRY_STREAM, ensure_topology
from controlplane.agent.dcgm import AgentConfig, default_resolver
from controlplane.cli.main import main
from controlplane.domain.model import CPU, GPU, MEM
from controlplane.service.ports import PodOrder
from tests.gateway import inbound_gateway_thread
from tests.kubernetes.conftest import pools, training_order
from tests.telemetry.test_agent import Exporter

RUN_A = "run-0123456789abcdef0123-1"
RUN_B = "run-89abcdef012345678901-12"  # a retried gang: attempt 12
NOW = 1_700_000_000.0
H100 = 'gpu="{gpu}",UUID="GPU-5fd4e0b2-2c4b-1c7e-9a43-7d0c3b2f{gpu:04d}",pci_bus_id="00000000:{bus}:00.0",device="nvidia{gpu}",modelName="NVIDIA H100 80GB HBM3",Hostname="node-a"'


def pod_names(run_id: str, use_jobset: bool) -> list[str]:
    """The pod names the Job (or JobSet) controller gives gpufleet's pods of `run_id`."""
    order = replace(
        training_order(run_id=run_id),
        pods=tuple(PodOrder("worker", i, f"node-{i}", "h100", {CPU: 1000, MEM: 1000, GPU: 1}) for i in range(2)),
        min_available=2,
    )
    run = build_run_manifests(order, pools(), KubeSettings(use_jobset=use_jobset))
    names: list[str] = []
    for manifest in run.workloads:
        if use_jobset:
            names += [f"{manifest.name}-{r['name']}-0-0-x7k2p" for r in manifest.body["spec"]["replicatedJobs"]]
        else:
            names.append(f"{manifest.name}-0-q9zt4")
    return names


def test_the_metric_label_is_the_sanitised_pod_label() -> None:
    assert RUN_METRIC_LABEL == "gpufleet_io_run"
    assert metric_label_name("app.kubernetes.io/managed-by") == "app_kubernetes_io_managed_by"


def test_pod_label_attributes_whole_gpus_to_the_full_run_id() -> None:
    """`--kubernetes --kubernetes-enable-pod-labels --kubernetes-pod-label-allowlist-regex='^gpufleet\\.io/run$'`"""
    a = H100.format(gpu=0, bus="1A")
    b = H100.format(gpu=1, bus="1B")
    idle = H100.format(gpu=2, bus="1C")
    text = f"""\
# HELP DCGM_FI_PROF_GR_ENGINE_ACTIVE Ratio of time the graphics engine is active.
# TYPE DCGM_FI_PROF_GR_ENGINE_ACTIVE gauge
DCGM_FI_PROF_GR_ENGINE_ACTIVE{{{a},DCGM_FI_DRIVER_VERSION="570.124.06",gpufleet_io_run="{RUN_A}",container="main",namespace="gpufleet",pod="pretrain-worker-0"}} 0.930000
DCGM_FI_PROF_GR_ENGINE_ACTIVE{{{b},DCGM_FI_DRIVER_VERSION="570.124.06",gpufleet_io_run="{RUN_B}",container="main",namespace="gpufleet",pod="{pod_names(RUN_B, True)[0]}"}} 0.000000
DCGM_FI_PROF_GR_ENGINE_ACTIVE{{{idle},DCGM_FI_DRIVER_VERSION="570.124.06"}} 0.000000
# HELP DCGM_FI_DEV_FB_USED Framebuffer memory used (in MiB).
# TYPE DCGM_FI_DEV_FB_USED gauge
DCGM_FI_DEV_FB_USED{{{a},DCGM_FI_DRIVER_VERSION="570.124.06",gpufleet_io_run="{RUN_A}",container="main",namespace="gpufleet",pod="pretrain-worker-0"}} 61234
"""
    result = parse_exposition(text, "east", "fallback", default_resolver(None), NOW)
    by_gpu = {s.gpu_index: s for s in result.samples}
    # the label wins even where the pod name says nothing (a pod gpufleet did not name)
    assert by_gpu[0].run_id == RUN_A
    assert by_gpu[0].metrics == {"gr_engine_active": 0.93, "fb_used_mib": 61234.0}
    assert by_gpu[1].run_id == RUN_B
    assert by_gpu[2].run_id is None  # no pod holds it
    assert by_gpu[2].pod is None


def test_all_pod_labels_without_an_allowlist_still_find_the_run() -> None:
    """`--kubernetes-enable-pod-labels` alone: every label of the Job's pod, sanitised and sorted."""
    pod = pod_names(RUN_A, False)[0]
    job = pod.rsplit("-", 2)[0]
    labels = (
        f'DCGM_FI_DRIVER_VERSION="570.124.06",app_kubernetes_io_managed_by="gpufleet",'
        f'batch_kubernetes_io_controller_uid="0b6c1f3e-7f1e-4a55-9d1c-2f8e5c1d9a10",batch_kubernetes_io_job_completion_index="0",'
        f'batch_kubernetes_io_job_name="{job}",controller_uid="0b6c1f3e-7f1e-4a55-9d1c-2f8e5c1d9a10",gpufleet_io_attempt="1",'
        f'gpufleet_io_epoch="3",gpufleet_io_pod_set="worker",gpufleet_io_run="{RUN_A}",gpufleet_io_workload="wl-42",'
        f'job_name="{job}",project="llama"'
    )
    text = f'DCGM_FI_DEV_GPU_UTIL{{{H100.format(gpu=0, bus="1A")},{labels},container="main",namespace="gpufleet",pod="{pod}"}} 97\n'
    [sample] = parse_exposition(text, "east", "fallback", default_resolver(None), NOW).samples
    assert sample.run_id == RUN_A
    assert sample.pod == pod


def test_mig_instances_of_one_gpu_are_attributed_per_pod() -> None:
    gpu = 'gpu="0",UUID="GPU-58e8f5ea-13cc-013a-d88f-2bcf5ae8bc77",pci_bus_id="00000000:1A:00.0",device="nvidia0",modelName="NVIDIA H100 80GB HBM3"'
    text = f"""\
DCGM_FI_PROF_GR_ENGINE_ACTIVE{{{gpu},GPU_I_PROFILE="3g.40gb",GPU_I_ID="1",Hostname="node-a",gpufleet_io_run="{RUN_A}",container="main",namespace="gpufleet",pod="{pod_names(RUN_A, False)[0]}"}} 0.810000
DCGM_FI_PROF_GR_ENGINE_ACTIVE{{{gpu},GPU_I_PROFILE="1g.10gb",GPU_I_ID="9",Hostname="node-a",gpufleet_io_run="{RUN_B}",container="main",namespace="gpufleet",pod="{pod_names(RUN_B, False)[0]}"}} 0.000000
DCGM_FI_PROF_GR_ENGINE_ACTIVE{{{gpu},GPU_I_PROFILE="1g.10gb",GPU_I_ID="10",Hostname="node-a"}} 0.000000
"""
    samples = parse_exposition(text, "east", "fallback", default_resolver(None), NOW).samples
    by_instance = {s.mig_instance: s for s in samples}
    assert by_instance[1].run_id == RUN_A
    assert by_instance[1].mig_profile == "3g.40gb"
    assert by_instance[9].run_id == RUN_B
    assert by_instance[10].run_id is None


def test_shared_gpu_with_virtual_gpus_is_attributed_per_pod_by_name() -> None:
    """`--kubernetes-virtual-gpus` (time-slicing or MPS): one copy per pod, `vgpu` set, no pod labels."""
    l4 = 'gpu="0",UUID="GPU-0f3c7c1e-5b7e-44a2-b9a5-1d2f3e4a5b6c",pci_bus_id="00000000:00:04.0",device="nvidia0",modelName="NVIDIA L4",Hostname="node-l4"'
    pod_a = pod_names(RUN_A, False)[0]
    pod_b = pod_names(RUN_B, True)[1]
    text = f"""\
# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).
# TYPE DCGM_FI_DEV_GPU_UTIL gauge
DCGM_FI_DEV_GPU_UTIL{{{l4},DCGM_FI_DRIVER_VERSION="570.124.06",container="main",namespace="gpufleet",pod="{pod_a}",vgpu="0"}} 64
DCGM_FI_DEV_GPU_UTIL{{{l4},DCGM_FI_DRIVER_VERSION="570.124.06",container="main",namespace="gpufleet",pod="{pod_b}",vgpu="1"}} 64
DCGM_FI_DEV_GPU_UTIL{{{l4},DCGM_FI_DRIVER_VERSION="570.124.06",container="notebook",namespace="jupyter",pod="alice-0",vgpu="2"}} 64
"""
    samples = parse_exposition(text, "east", "fallback", default_resolver(None), NOW).samples
    assert {s.pod: s.run_id for s in samples} == {pod_a: RUN_A, pod_b: RUN_B, "alice-0": None}


def test_pod_names_keep_the_attempt_for_jobs_and_jobsets() -> None:
    for run_id in (RUN_A, RUN_B):
        for use_jobset in (False, True):
            for pod in pod_names(run_id, use_jobset):
                assert run_of_pod_name("gpufleet", pod) == run_id
    # a pod set named with digits cannot be read as part of the attempt
    assert run_of_pod_name("gpufleet", f"{RUN_B}-7-0-3-abcde") == RUN_B


def test_only_gpufleets_namespaces_count() -> None:
    """A pod elsewhere carrying the label (or a gpufleet-like name) cannot bill its GPU to a run."""

    def line(namespace: str) -> str:
        return (
            f'DCGM_FI_DEV_GPU_UTIL{{{H100.format(gpu=0, bus="1A")},gpufleet_io_run="{RUN_A}",'
            f'container="main",namespace="{namespace}",pod="{pod_names(RUN_A, False)[0]}"}} 97\n'
        )

    [elsewhere] = parse_exposition(line("default"), "east", "f", default_resolver(None), NOW).samples
    assert elsewhere.run_id is None
    ml = default_resolver(None, frozenset({"ml-batch", "gpufleet"}))
    [mine] = parse_exposition(line("ml-batch"), "east", "f", ml, NOW).samples
    assert mine.run_id == RUN_A


def test_agent_namespaces_are_validated() -> None:
    assert AgentConfig(cluster="east", dcgm_url="http://x", namespaces=("ml", "gpufleet")).namespaces == (
        "ml",
        "gpufleet",
    )
    for bad in ((), ("Not_A_Namespace",)):
        try:
            AgentConfig(cluster="east", dcgm_url="http://x", namespaces=bad)
        except ValueError:
            continue
        raise AssertionError(f"namespaces {bad!r} accepted")


def test_agent_command_takes_its_namespaces_from_flags_or_the_environment(running_nats: NatsServerProcess) -> None:
    """`gpufleet agent` end to end: scrape, attribute in the configured namespaces, publish."""
    labelled = f'DCGM_FI_DEV_GPU_UTIL{{{H100.format(gpu=0, bus="1A")},gpufleet_io_run="{RUN_A}",container="main",namespace="ml",pod="any"}} 97\n'
    named = f'DCGM_FI_DEV_GPU_UTIL{{{H100.format(gpu=1, bus="1B")},container="main",namespace="ml",pod="{pod_names(RUN_B, True)[0]}"}} 97\n'
    exporter = Exporter(labelled + named)

    async def streams() -> None:
        nc = await nats.connect(running_nats.url)
        with contextlib.suppress(nats.js.errors.NotFoundError):
            await nc.jetstream().delete_stream(TELEMETRY_STREAM)
        await ensure_topology(nc.jetstream(), "nstest")
        await nc.close()

    try:
        asyncio.run(streams())
        with inbound_gateway_thread(running_nats.url, "nstest"):
            args = ["agent", "--cluster", "west", "--dcgm-url", exporter.url, "--nats-url", running_nats.url]
            args += ["--prefix", "nstest", "--once"]

            def attributed(extra: list[str], env: dict[str, str]) -> int:
                result = CliRunner().invoke(main, args + extra, env=env)
                assert result.exit_code == 0, result.output
                count: int = json.loads(result.output.strip().splitlines()[-1])["attributed"]
                return count

            assert attributed([], {}) == 0  # default namespace gpufleet: pods in `ml` are not gpufleet's
            assert attributed(["--namespace", "ml"], {}) == 2
            assert attributed([], {"GPUFLEET_AGENT_NAMESPACES": "other ml"}) == 2
            refused = CliRunner().invoke(main, [*args, "--namespace", "Not_Valid"])
            assert refused.exit_code != 0
            assert "not a Kubernetes namespace name" in refused.output
    finally:
        exporter.close()
