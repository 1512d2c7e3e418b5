"""Node objects as real GPU clusters report them, per provider flavour, for the fake API server.

Where each label comes from (names and value formats taken from the upstream sources):

- GPU Feature Discovery / GPU Operator: NVIDIA/k8s-device-plugin `internal/lm` (GFD lives there):
  `resource.go` baseLabeler -> `<resource>.product|count|replicas|sharing-strategy` where
  `<resource>` is `nvidia.com/gpu` or, under the MIG `mixed` strategy, `nvidia.com/mig-<profile>`;
  the product is the sanitised device name (spaces -> '-') with `-MIG-<profile>` for MIG devices and
  `-SHARED` appended when the resource is replicated (time-slicing/MPS) and NOT renamed (with
  `renameByDefault` the advertised resource becomes `nvidia.com/gpu.shared` and the product keeps
  its plain name); replicas 0 when sharing is disabled for the resource (MIG parents), else the
  configured replicas; sharing-strategy `none` | `time-slicing` | `mps`. `<resource>.memory` (MiB),
  `.family` (getArchFamily: ampere, ada-lovelace, hopper, blackwell...), `.compute.major|minor`;
  MIG devices add their attributes (`.memory`, `.multiprocessors`, `.slices.gi|ci`, `.engines.*`).
  `nvml.go`: `nvidia.com/cuda.driver.major|minor|rev`, `cuda.driver-version.*`, `cuda.runtime.*`,
  `nvidia.com/mig.capable`, `nvidia.com/mps.capable`, `nvidia.com/gpu.mode`; `mig-strategy.go`:
  `nvidia.com/mig.strategy` (single | mixed); `machine-type.go`: `nvidia.com/gpu.machine`;
  `timestamp.go`: `nvidia.com/gfd.timestamp`. GPU Operator: `nvidia.com/gpu.present=true`;
  MIG manager: `nvidia.com/mig.config` (e.g. `all-1g.10gb`) and `nvidia.com/mig.config.state`.
- EKS managed node groups: `eks.amazonaws.com/nodegroup`, `eks.amazonaws.com/capacityType`
  (ON_DEMAND | SPOT), `eks.amazonaws.com/nodegroup-image`, node names `ip-<a>-<b>-<c>-<d>.<region>.compute.internal`,
  providerID `aws:///<zone>/<instance-id>`. Karpenter: `karpenter.sh/nodepool`,
  `karpenter.sh/capacity-type` (on-demand | spot), `karpenter.sh/registered|initialized`,
  `karpenter.k8s.aws/instance-family|instance-gpu-name|instance-gpu-count|instance-gpu-manufacturer|instance-gpu-memory`.
- AKS: `kubernetes.azure.com/agentpool` and the legacy `agentpool`, `kubernetes.azure.com/mode`,
  `kubernetes.azure.com/cluster`, `kubernetes.azure.com/accelerator=nvidia`; spot pools carry
  `kubernetes.azure.com/scalesetpriority=spot` as label and NoSchedule taint; GPU pools commonly
  taint `sku=gpu:NoSchedule`; names `aks-<pool>-<8 digits>-vmss<6 base-36>`.
- GKE: `cloud.google.com/gke-nodepool`, `cloud.google.com/gke-accelerator` (e.g. nvidia-h100-80gb),
  `cloud.google.com/gke-gpu=true`, `cloud.google.com/gke-gpu-sharing-strategy` (time-sharing | mps),
  `cloud.google.com/gke-max-shared-clients-per-gpu`, `cloud.google.com/gke-gpu-partition-size`
  (MIG profile), `cloud.google.com/gke-spot`, `cloud.google.com/machine-family`; GPU nodes are
  tainted `nvidia.com/gpu=present:NoSchedule`; GKE's own device plugin advertises `nvidia.com/gpu`
  for whole GPUs, MIG partitions and time-shared/MPS GPUs alike (GFD labels only with the GPU Operator).
- OKE (Oracle docs "Supported Labels for Different Usecases"): `topology.kubernetes.io/zone` (the
  availability domain, e.g. US-ASHBURN-AD-1), `oci.oraclecloud.com/fault-domain` (FAULT-DOMAIN-1),
  `node.kubernetes.io/instance-type` with the shape (BM.GPU.H100.8); the node pool is the
  annotation `oci.oraclecloud.com/node-pool-id` (an OCID), not a label; node names are private IPs.

Allocatable is capacity minus the kubelet's reservations as each provider computes them (CPU:
6% of the first core, 1% of the second, 0.5% of the next two, 0.25% above four; memory per the
provider's table or formula) minus the 100Mi hard eviction threshold. OKE and on-prem (kubeadm)
nodes, whose reservations are the operator's kubelet configuration, get the same CPU ladder and
GKE's memory table. The MIG attribute values are
representative (A100/H100), not per-SKU exact.

Further sources (the inventory tests' named nodes in `presets.py`): GFD's
`docs/gpu-feature-discovery/README.md` and the GPU Operator's mig-mixed node-label sample; GKE "Run
GPUs in GKE Standard node pools" and "About GPU sharing strategies"; AKS `use-labels.md`; EKS managed
node group and Karpenter well-known labels.

Modules: `gpus` (GPU models, MIG profiles, GFD labels, advertised resources), `machines` (instance
types, reservations, `build_node`), `providers` (one builder per flavour, `EXAMPLES`), `presets` (the
named nodes the inventory and integration tests share).
"""

from tests.kubernetes.nodes.gpus import GPU_MODELS, MIG_PROFILES, GpuModel, GpuSetup, Sharing, arch_family
from tests.kubernetes.nodes.machines import INSTANCE_TYPES, Machine, build_node
from tests.kubernetes.nodes.providers import (
    EXAMPLES,
    aks_node,
    eks_karpenter_node,
    eks_managed_node,
    gke_node,
    oke_node,
    onprem_node,
)

__all__ = [
    "EXAMPLES",
    "GPU_MODELS",
    "INSTANCE_TYPES",
    "MIG_PROFILES",
    "GpuModel",
    "GpuSetup",
    "Machine",
    "Sharing",
    "aks_node",
    "arch_family",
    "build_node",
    "eks_karpenter_node",
    "eks_managed_node",
    "gke_node",
    "oke_node",
    "onprem_node",
]
