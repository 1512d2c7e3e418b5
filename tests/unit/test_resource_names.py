"""Which extended resource a pod asks for each GPU demand, and the overrides no node advertises,
with the NVIDIA device plugin's real names (whole GPUs, MIG strategy mixed and single, shared GPUs
renamed by `renameByDefault`)."""

from __future__ import annotations

from controlplane.domain.resource_names import ResourceOverrides, requested_resource, unadvertised
from controlplane.domain.sharing import SharingKind

WHOLE = {"gpu": "nvidia.com/gpu"}
MIG_MIXED = {"mig:1g.10gb": "nvidia.com/mig-1g.10gb", "mig:3g.40gb": "nvidia.com/mig-3g.40gb"}
RENAMED_SHARES = {"share": "nvidia.com/gpu.shared"}


def test_without_overrides_a_pod_asks_for_what_the_nodes_advertise_or_the_device_plugin_default() -> None:
    none = ResourceOverrides()
    assert requested_resource("gpu", SharingKind.EXCLUSIVE, WHOLE, none) == "nvidia.com/gpu"
    assert requested_resource("gpu", SharingKind.EXCLUSIVE, {}, none) == "nvidia.com/gpu"
    assert requested_resource("mig:3g.40gb", SharingKind.MIG, MIG_MIXED, none) == "nvidia.com/mig-3g.40gb"
    assert requested_resource("share", SharingKind.TIMESLICE, RENAMED_SHARES, none) == "nvidia.com/gpu.shared"
    assert requested_resource("share", SharingKind.EXCLUSIVE, {}, none) is None
    assert requested_resource("cpu", SharingKind.EXCLUSIVE, {}, none) is None
    for advertised, sharing in ((WHOLE, SharingKind.EXCLUSIVE), (MIG_MIXED, SharingKind.MIG)):
        assert unadvertised("p", sharing, advertised, none) == []


def test_an_override_no_node_advertises_is_named_with_what_they_do() -> None:
    assert unadvertised("a100", SharingKind.MIG, MIG_MIXED, ResourceOverrides(mig_strategy="single")) == [
        "pool a100's nodes advertise nvidia.com/mig-1g.10gb for mig:1g.10gb, but this cluster's settings make its "
        "pods ask for nvidia.com/gpu, which no node offers: they would stay Pending",
        "pool a100's nodes advertise nvidia.com/mig-3g.40gb for mig:3g.40gb, but this cluster's settings make its "
        "pods ask for nvidia.com/gpu, which no node offers: they would stay Pending",
    ]
    shared_only = ResourceOverrides(timeslice_resource="nvidia.com/gpu.shared")
    [problem] = unadvertised("l4", SharingKind.TIMESLICE, {"share": "nvidia.com/gpu"}, shared_only)
    assert "advertise nvidia.com/gpu for share" in problem
    assert "ask for nvidia.com/gpu.shared" in problem
    # The override that applies is the pool's kind's: an MPS override says nothing of time-slicing.
    assert unadvertised("l4", SharingKind.TIMESLICE, RENAMED_SHARES, ResourceOverrides(mps_resource="x.io/m")) == []
    # Nodes that advertise nothing gpufleet knows of cannot be checked.
    assert unadvertised("p", SharingKind.EXCLUSIVE, {}, ResourceOverrides(gpu_resource="x.io/gpu")) == []


def test_overrides_are_read_from_stored_settings_ignoring_what_is_not_a_name() -> None:
    stored = {"gpu_resource": "nvidia.com/gpu", "mig_strategy": None, "namespace": "ml", "mps_resource": ""}
    assert ResourceOverrides.of(stored) == ResourceOverrides(gpu_resource="nvidia.com/gpu")
