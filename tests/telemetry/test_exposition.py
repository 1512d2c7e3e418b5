"""dcgm-exporter text into GpuSamples: real output, MIG, blanks, label spellings, run attribution."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from adapters.dcgm.exposition import RunResolver, ScrapeResult, SlotAssignments, parse_exposition, run_of_pod_name
from adapters.kubernetes.manifest_model import job_name
from controlplane.service.telemetry_wire import DCGM_FIELDS
from tests.telemetry import samples

NOW = 1_767_600_000.0
A100 = "GPU-34319582-d595-d1c7-d1d2-179bcfa61660"
L40S = "GPU-585834da-79ca-0599-5140-4ffdb131ae93"


def _parse(text: str, resolver: RunResolver | None = None, node: str = "fallback-node") -> ScrapeResult:
    return parse_exposition(text, "c1", node, resolver or RunResolver(), NOW)


def test_a100_mig_sample_gives_the_whole_gpu_and_its_mig_instance() -> None:
    result = _parse(samples.A100_MIG)
    by_mig = {s.mig_instance: s for s in result.samples}
    assert set(by_mig) == {None, 13}
    whole, mig = by_mig[None], by_mig[13]
    assert (whole.cluster, whole.node, whole.gpu_uuid, whole.gpu_index) == ("c1", "ub20-a100-k8s", A100, 0)
    assert whole.metrics == {"fb_used_mib": 4845.0, "gr_engine_active": 0.99563, "tensor_active": 0.92926}
    assert whole.mig_profile is None
    # MIG series keep the parent GPU's UUID; the instance is told apart by GPU_I_ID.
    assert (mig.gpu_uuid, mig.mig_profile, mig.metrics) == (A100, "1g.5gb", {"gr_engine_active": 0.995687})
    assert mig.gpu_key == f"c1/ub20-a100-k8s/{A100}/mig13"
    assert whole.gpu_key == f"c1/ub20-a100-k8s/{A100}"
    assert {s.timestamp for s in result.samples} == {NOW}
    assert result.ignored == {"DCGM_FI_PROF_PCIE_RX_BYTES": 1}
    assert all(s.run_id is None and s.pod is None for s in result.samples)


def test_h100_mig_instance_is_attributed_to_its_pod() -> None:
    [sample] = _parse(samples.H100_MIG_POD).samples
    assert (sample.node, sample.gpu_index, sample.mig_profile, sample.mig_instance) == ("gsrh100-074", 0, "1g.10gb", 7)
    assert sample.pod == "text-embedding-predictor-00008-deployment-57946f6c67-vdtjl"
    assert (sample.namespace, sample.container) == ("model-playground-stg", "kserve-container")
    # An idle MIG instance reads 0.0, which is a reading, not a missing value.
    assert sample.metrics == {"gr_engine_active": 0.0}


def test_blank_sentinels_are_dropped_field_by_field() -> None:
    result = _parse(samples.L40S_FULL)
    [sample] = result.samples
    # POWER_USAGE (fp64 blank) and FB_FREE (int64 blank) are gone; MEMORY_TEMP is not a kept field.
    assert sample.metrics == {"gpu_util": 100.0, "fb_used_mib": 31000.0, "xid": 79.0, "gr_engine_active": 0.0}
    assert result.blanks == 2
    assert result.ignored == {"DCGM_FI_DEV_MEMORY_TEMP": 1}


@pytest.mark.parametrize(
    "variant",
    [lambda t: t, samples.with_lowercase_hostname, samples.with_old_namespace],
    ids=["Hostname", "hostname", "old-namespace"],
)
def test_label_spellings_of_every_exporter_version_parse_the_same(variant) -> None:  # type: ignore[no-untyped-def]
    [sample] = _parse(variant(samples.L40S_FULL)).samples
    assert (sample.node, sample.gpu_uuid, sample.pod, sample.namespace, sample.container) == (
        "l40s.example.com",
        L40S,
        "tensorflow-0",
        "redacted",
        "tensorflow",
    )


def test_series_without_host_label_use_the_agents_node_name() -> None:
    text = samples.L40S_POD.replace(',Hostname="l40s.example.com"', "")
    [sample] = _parse(text, node="node-from-downward-api").samples
    assert sample.node == "node-from-downward-api"


def test_series_without_gpu_identity_are_counted_not_guessed() -> None:
    text = samples.L40S_POD.replace(f'UUID="{L40S}",', "") + samples.L40S_POD.replace('gpu="0",', 'gpu="x",')
    result = _parse(text)
    assert result.samples == []
    assert result.unidentified == 2


def test_explicit_exposition_timestamps_win_over_the_scrape_time() -> None:
    text = samples.L40S_POD.replace("} 0.000000", "} 0.25 1767599990000")
    [sample] = _parse(text).samples
    assert sample.timestamp == 1_767_599_990.0


def test_text_that_is_not_exposition_raises() -> None:
    with pytest.raises(ValueError):  # noqa: PT011 - the parser's own message varies by version
        _parse('DCGM_FI_DEV_GPU_UTIL{gpu="0" 12\n')


# --- pod -> run attribution --------------------------------------------------------------------


def test_the_pods_run_label_wins_over_the_node_assignment() -> None:
    resolver = RunResolver(
        pod_run=lambda ns, pod: "run-from-label" if (ns, pod) == ("redacted", "tensorflow-0") else None,
        slot_run=lambda host, gpu, mig: "run-from-assignment",
    )
    [sample] = _parse(samples.L40S_POD, resolver).samples
    assert sample.run_id == "run-from-label"


def test_the_node_assignment_is_the_fallback_when_the_pod_names_no_run() -> None:
    seen: list[tuple[str, int, int | None]] = []

    def slot(host: str, gpu: int, mig: int | None) -> str | None:
        seen.append((host, gpu, mig))
        return "run-from-assignment"

    resolver = RunResolver(pod_run=lambda ns, pod: None, slot_run=slot)
    [sample] = _parse(samples.H100_MIG_POD, resolver).samples
    assert sample.run_id == "run-from-assignment"
    assert seen == [("gsrh100-074", 0, 7)]


def test_series_without_a_pod_skip_the_pod_lookup() -> None:
    asked: list[str] = []

    def pod_run(ns: str, pod: str) -> str | None:
        asked.append(pod)
        return "never"

    resolver = RunResolver(pod_run=pod_run, slot_run=lambda host, gpu, mig: f"run-{host}-{gpu}-{mig}")
    runs = {s.mig_instance: s.run_id for s in _parse(samples.A100_MIG, resolver).samples}
    assert runs == {None: "run-ub20-a100-k8s-0-None", 13: "run-ub20-a100-k8s-0-13"}
    assert asked == []


def test_a_failing_lookup_leaves_the_sample_unattributed_instead_of_failing_the_scrape() -> None:
    def broken(ns: str, pod: str) -> str | None:
        raise ConnectionError("kubernetes API unreachable")

    [sample] = _parse(samples.L40S_POD, RunResolver(pod_run=broken)).samples
    assert sample.run_id is None


def test_no_lookups_means_no_attribution() -> None:
    assert [s.run_id for s in _parse(samples.L40S_POD).samples] == [None]


def test_assignment_file_maps_gpus_and_mig_instances_and_follows_rewrites(tmp_path: Path) -> None:
    path = tmp_path / "assignments.json"
    lookup = SlotAssignments(path)
    assert lookup("ub20-a100-k8s", 0, None) is None  # no file yet: no assignments
    path.write_text(json.dumps({"ub20-a100-k8s/0": "run-whole", "ub20-a100-k8s/0/13": "run-slice"}))
    assert lookup("ub20-a100-k8s", 0, None) == "run-whole"
    assert lookup("ub20-a100-k8s", 0, 13) == "run-slice"
    assert lookup("ub20-a100-k8s", 0, 9) == "run-whole"  # the holder of the GPU holds its instances
    assert lookup("ub20-a100-k8s", 1, None) is None
    path.write_text(json.dumps({"ub20-a100-k8s/0": "run-next"}))
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))  # make the rewrite visible
    assert lookup("ub20-a100-k8s", 0, 13) == "run-next"


def test_a_broken_assignment_file_is_ignored(tmp_path: Path) -> None:
    path = tmp_path / "assignments.json"
    path.write_text("{not json")
    assert SlotAssignments(path)("h", 0, None) is None
    path.write_text(json.dumps({"h/0": 5}))
    assert SlotAssignments(path)("h", 0, None) is None


def test_shipped_counters_csv_lists_exactly_the_fields_gpufleet_reads() -> None:
    csv = Path(__file__).resolve().parents[2] / "deploy" / "dcgm-exporter" / "gpufleet-counters.csv"
    lines = [line for line in csv.read_text().splitlines() if line.strip() and not line.startswith("#")]
    # dcgm-exporter's rule: every line has exactly two commas (field, type, help).
    assert all(line.count(",") == 2 for line in lines)
    rows = [[part.strip() for part in line.split(",")] for line in lines]
    assert {field for field, _, _ in rows} == set(DCGM_FIELDS)
    assert {kind for _, kind, _ in rows} == {"gauge"}
    assert all(help_text for _, _, help_text in rows)


def test_gpufleet_pods_name_their_run_and_other_pods_do_not() -> None:
    run_id = "run-0123456789abcdef0123-2"  # run ids carry the attempt
    pod = f"{job_name(run_id, 'workers', 0)}-3-x7k2p"
    assert run_of_pod_name("gpufleet", pod) == run_id
    assert run_of_pod_name("default", pod) is None  # not a gpufleet namespace
    assert run_of_pod_name("gpufleet", "jupyter-alice-0") is None
    assert run_of_pod_name("ml", pod, frozenset({"ml"})) == run_id
