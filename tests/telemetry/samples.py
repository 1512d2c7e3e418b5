"""Real dcgm-exporter output (from the ecosystem reference, section 1.4), plus variants built from it."""

# Exposition lines are kept verbatim, however long: they are the fixture.
# ruff: noqa: E501

from __future__ import annotations

# NVIDIA/cloud-native-docs gpu-telemetry/dcgm-exporter.rst: A100 with MIG, older exporter (no
# modelName/pci_bus_id). The last line is MIG instance 13 of the same GPU.
A100_MIG = """\
DCGM_FI_DEV_FB_USED{gpu="0",UUID="GPU-34319582-d595-d1c7-d1d2-179bcfa61660",device="nvidia0",Hostname="ub20-a100-k8s"} 4845
DCGM_FI_PROF_GR_ENGINE_ACTIVE{gpu="0",UUID="GPU-34319582-d595-d1c7-d1d2-179bcfa61660",device="nvidia0",Hostname="ub20-a100-k8s"} 0.995630
DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{gpu="0",UUID="GPU-34319582-d595-d1c7-d1d2-179bcfa61660",device="nvidia0",Hostname="ub20-a100-k8s"} 0.929260
DCGM_FI_PROF_PCIE_RX_BYTES{gpu="0",UUID="GPU-34319582-d595-d1c7-d1d2-179bcfa61660",device="nvidia0",Hostname="ub20-a100-k8s"} 97863601
DCGM_FI_PROF_GR_ENGINE_ACTIVE{gpu="0",UUID="GPU-34319582-d595-d1c7-d1d2-179bcfa61660",device="nvidia0",GPU_I_PROFILE="1g.5gb",GPU_I_ID="13",Hostname="ub20-a100-k8s"} 0.995687
"""

# NVIDIA/dcgm-exporter issue #512: H100 MIG instance with pod attribution and a `label` field.
H100_MIG_POD = """\
DCGM_FI_PROF_GR_ENGINE_ACTIVE{gpu="0",UUID="GPU-58e8f5ea-13cc-013a-d88f-2bcf5ae8bc77",pci_bus_id="00000000:1A:00.0",device="nvidia0",modelName="NVIDIA H100 80GB HBM3",GPU_I_PROFILE="1g.10gb",GPU_I_ID="7",Hostname="gsrh100-074",DCGM_FI_DRIVER_VERSION="535.129.03",container="kserve-container",namespace="model-playground-stg",pod="text-embedding-predictor-00008-deployment-57946f6c67-vdtjl"} 0.000000
"""

# NVIDIA/DCGM issue #226: L40S, whole GPU, pod-attributed.
L40S_POD = """\
DCGM_FI_PROF_GR_ENGINE_ACTIVE{gpu="0",UUID="GPU-585834da-79ca-0599-5140-4ffdb131ae93",pci_bus_id="00000000:4E:00.0",device="nvidia0",modelName="NVIDIA L40S",Hostname="l40s.example.com",container="tensorflow",namespace="redacted",pod="tensorflow-0"} 0.000000
"""

# A current-format scrape of one whole GPU with HELP/TYPE lines and DCGM blank sentinels:
# MEMORY_TEMP as in dcgm-exporter's README (BLANK+2 = NOT_SUPPORTED), POWER_USAGE as the fp64
# blank, FB_FREE as the int64 blank; plus an XID with its err_code/err_msg labels.
L40S_FULL = """\
# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).
# TYPE DCGM_FI_DEV_GPU_UTIL gauge
DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-585834da-79ca-0599-5140-4ffdb131ae93",pci_bus_id="00000000:4E:00.0",device="nvidia0",modelName="NVIDIA L40S",Hostname="l40s.example.com",container="tensorflow",namespace="redacted",pod="tensorflow-0"} 100
# HELP DCGM_FI_DEV_MEMORY_TEMP Memory temperature (in C).
# TYPE DCGM_FI_DEV_MEMORY_TEMP gauge
DCGM_FI_DEV_MEMORY_TEMP{gpu="0",UUID="GPU-585834da-79ca-0599-5140-4ffdb131ae93",pci_bus_id="00000000:4E:00.0",device="nvidia0",modelName="NVIDIA L40S",Hostname="l40s.example.com",container="tensorflow",namespace="redacted",pod="tensorflow-0"} 9223372036854775794
# HELP DCGM_FI_DEV_POWER_USAGE Power draw (in W).
# TYPE DCGM_FI_DEV_POWER_USAGE gauge
DCGM_FI_DEV_POWER_USAGE{gpu="0",UUID="GPU-585834da-79ca-0599-5140-4ffdb131ae93",pci_bus_id="00000000:4E:00.0",device="nvidia0",modelName="NVIDIA L40S",Hostname="l40s.example.com",container="tensorflow",namespace="redacted",pod="tensorflow-0"} 140737488355328.000000
# HELP DCGM_FI_DEV_FB_FREE Framebuffer memory free (in MiB).
# TYPE DCGM_FI_DEV_FB_FREE gauge
DCGM_FI_DEV_FB_FREE{gpu="0",UUID="GPU-585834da-79ca-0599-5140-4ffdb131ae93",pci_bus_id="00000000:4E:00.0",device="nvidia0",modelName="NVIDIA L40S",Hostname="l40s.example.com",container="tensorflow",namespace="redacted",pod="tensorflow-0"} 9223372036854775794
# HELP DCGM_FI_DEV_FB_USED Framebuffer memory used (in MiB).
# TYPE DCGM_FI_DEV_FB_USED gauge
DCGM_FI_DEV_FB_USED{gpu="0",UUID="GPU-585834da-79ca-0599-5140-4ffdb131ae93",pci_bus_id="00000000:4E:00.0",device="nvidia0",modelName="NVIDIA L40S",Hostname="l40s.example.com",container="tensorflow",namespace="redacted",pod="tensorflow-0"} 31000
# HELP DCGM_FI_DEV_XID_ERRORS Value of the last XID error encountered.
# TYPE DCGM_FI_DEV_XID_ERRORS gauge
DCGM_FI_DEV_XID_ERRORS{gpu="0",UUID="GPU-585834da-79ca-0599-5140-4ffdb131ae93",pci_bus_id="00000000:4E:00.0",device="nvidia0",modelName="NVIDIA L40S",Hostname="l40s.example.com",container="tensorflow",namespace="redacted",pod="tensorflow-0",err_code="79",err_msg="GPU has fallen off the bus"} 79
# HELP DCGM_FI_PROF_GR_ENGINE_ACTIVE Ratio of time the graphics engine is active.
# TYPE DCGM_FI_PROF_GR_ENGINE_ACTIVE gauge
DCGM_FI_PROF_GR_ENGINE_ACTIVE{gpu="0",UUID="GPU-585834da-79ca-0599-5140-4ffdb131ae93",pci_bus_id="00000000:4E:00.0",device="nvidia0",modelName="NVIDIA L40S",Hostname="l40s.example.com",container="tensorflow",namespace="redacted",pod="tensorflow-0"} 0.000000
"""


def with_lowercase_hostname(text: str) -> str:
    """What dcgm-exporter main (since 2026-05, PR #655) prints: `hostname` instead of `Hostname`."""
    return text.replace('Hostname="', 'hostname="')


def with_old_namespace(text: str) -> str:
    """`--use-old-namespace`: `uuid`, `pod_name`, `pod_namespace`, `container_name`."""
    return (
        text.replace('UUID="', 'uuid="')
        .replace(',pod="', ',pod_name="')
        .replace(',namespace="', ',pod_namespace="')
        .replace(',container="', ',container_name="')
    )
