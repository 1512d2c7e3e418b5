"""Newer EC2 GPU families are known, and an unknown one with an NVIDIA AMI is an issue, not a CPU pool."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import botocore

from adapters.clouds.eks.instances import gpu_shape
from adapters.clouds.eks.provider import nodegroup_to_pool
from controlplane.service.node_pools import CLOUD_ISSUE, plan_node_pools


def _ec2_instance_types() -> set[str]:
    """The instance type names of the EC2 API model shipped with botocore."""
    path = Path(botocore.__file__).parent / "data" / "ec2" / "2016-11-15" / "service-2.json.gz"
    with gzip.open(path) as f:
        return set(json.load(f)["shapes"]["InstanceType"]["enum"])


def test_newer_gpu_families_are_real_ec2_instance_types_and_known() -> None:
    known = _ec2_instance_types()
    for name, model in [
        ("p6-b200.48xlarge", "B200"),
        ("p6-b300.48xlarge", "B300"),
        ("p6e-gb200.36xlarge", "GB200"),
        ("g6e.12xlarge", "L40S"),
        ("g7e.48xlarge", "RTX-PRO-6000"),
    ]:
        assert name in known
        shape = gpu_shape(name)
        assert shape is not None
        assert shape.gpu_model == model


def _nodegroup(instance_type: str) -> dict[str, object]:
    return {
        "nodegroupName": "next-gen",
        "instanceTypes": [instance_type],
        "amiType": "AL2023_x86_64_NVIDIA",
        "scalingConfig": {"minSize": 0, "maxSize": 2, "desiredSize": 0},
        "status": "ACTIVE",
    }


def test_unknown_family_with_an_nvidia_ami_is_reported() -> None:
    pool = nodegroup_to_pool(_nodegroup("p9.96xlarge"))
    assert pool.issues == ("instance types p9.96xlarge (AMI AL2023_x86_64_NVIDIA) are not in gpufleet's table",)
    plan = plan_node_pools([], [pool])
    assert plan.pools == ()
    assert plan.issues == (f"{CLOUD_ISSUE}pool next-gen: {pool.issues[0]}",)
