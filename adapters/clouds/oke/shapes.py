"""OCI GPU compute shapes. OKE reports only `node_shape`; GPUs, OCPUs and memory are the shape's
(OCI compute shape pages; `oci.core.ComputeClient.list_shapes` returns the same as `Shape.gpus`).
An x86 OCPU is two vCPUs. Memory is GB as OCI states it, which OCI means as GiB.
"""

from __future__ import annotations

from adapters.clouds.shapes import GpuShape


def _shape(model: str, gpus: int, ocpus: int, memory_gb: int) -> GpuShape:
    return GpuShape(model, gpus, ocpus * 2, memory_gb)


_SHAPES: dict[str, GpuShape] = {
    "BM.GPU.H100.8": _shape("H100-80GB", 8, 112, 2048),
    "BM.GPU.H200.8": _shape("H200-141GB", 8, 112, 3072),
    "BM.GPU.A100-v2.8": _shape("A100-80GB", 8, 128, 2048),
    "BM.GPU4.8": _shape("A100-40GB", 8, 64, 2048),
    "BM.GPU.L40S.4": _shape("L40S", 4, 112, 1024),
    "BM.GPU.L40S-NC.4": _shape("L40S", 4, 112, 1024),
    "BM.GPU.A10.4": _shape("A10", 4, 64, 1024),
    "VM.GPU.A10.1": _shape("A10", 1, 15, 240),
    "VM.GPU.A10.2": _shape("A10", 2, 30, 480),
    "BM.GPU3.8": _shape("V100-16GB", 8, 52, 768),
    "VM.GPU3.1": _shape("V100-16GB", 1, 6, 90),
    "VM.GPU3.2": _shape("V100-16GB", 2, 12, 180),
    "VM.GPU3.4": _shape("V100-16GB", 4, 24, 360),
    "BM.GPU2.2": _shape("P100-16GB", 2, 28, 192),
    "VM.GPU2.1": _shape("P100-16GB", 1, 12, 72),
}


def gpu_shape(node_shape: str) -> GpuShape | None:
    return _SHAPES.get(node_shape)


def is_gpu_shape(node_shape: str) -> bool:
    return ".GPU" in node_shape
