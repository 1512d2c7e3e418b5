"""DCGM-like readings for simulated pods: what dcgm-exporter would report for the GPUs they hold.

A workload picks its utilization profile in its container spec, `container: {sim: {utilization:
...}}`:

- `busy` (default): SM activity around 75 %, the GPU drawing most of its power;
- `idle`: the job holds its GPUs (memory stays allocated) but computes nothing;
- `idle_after:<seconds>`: busy for that long after its pods start, then idle (the hoarder);
- `bursty` or `bursty:<seconds>`: alternates busy and idle phases of that length (default 30 s).

Readings carry small noise from a seeded generator, so a simulation replays the same way.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from controlplane.service.telemetry_wire import GpuSample, Metric

DEFAULT_PROFILE = "busy"
DEFAULT_BURST_SECONDS = 30.0
NAMESPACE = "gpufleet"
# A device a pod holds: GPU index on its node, MIG profile and instance id (None for whole GPUs).
Device = tuple[int, str | None, int | None]
# Share slots per physical GPU when the sharing factor is unknown to the simulator.
SHARE_SLOTS_PER_GPU = 4
MIG_INSTANCES_PER_GPU = 7


class InvalidProfile(ValueError):
    """The workload's `sim.utilization` is not a profile the simulator knows."""


@dataclass(frozen=True)
class Profile:
    kind: str  # busy | idle | idle_after | bursty
    seconds: float = 0.0

    def busy(self, running_for: float) -> bool:
        if self.kind == "busy":
            return True
        if self.kind == "idle":
            return False
        if self.kind == "idle_after":
            return running_for < self.seconds
        return int(max(running_for, 0.0) // self.seconds) % 2 == 0  # bursty: busy phase first


def parse_profile(value: Any) -> Profile:
    """`busy` | `idle` | `idle_after:<seconds>` | `bursty[:<seconds>]`; None means busy."""
    if value is None:
        return Profile(DEFAULT_PROFILE)
    if not isinstance(value, str):
        raise InvalidProfile(f"sim.utilization must be a string, not {type(value).__name__}")
    kind, _, arg = value.strip().partition(":")
    if kind in ("busy", "idle") and not arg:
        return Profile(kind)
    if kind in ("idle_after", "bursty"):
        if not arg and kind == "bursty":
            return Profile(kind, DEFAULT_BURST_SECONDS)
        try:
            seconds = float(arg)
        except ValueError:
            raise InvalidProfile(f"sim.utilization {value!r}: expected {kind}:<seconds>") from None
        if not (seconds >= 0 and (kind == "idle_after" or seconds > 0)):
            raise InvalidProfile(f"sim.utilization {value!r}: seconds out of range")
        return Profile(kind, seconds)
    raise InvalidProfile(f"sim.utilization {value!r}: expected busy, idle, idle_after:<s> or bursty[:<s>]")


def profile_of(container: Mapping[str, Any]) -> str:
    """The workload's profile text (checked), `busy` when it names none or an invalid one."""
    sim = container.get("sim")
    raw = sim.get("utilization") if isinstance(sim, Mapping) else None
    try:
        parse_profile(raw)
    except InvalidProfile:
        return DEFAULT_PROFILE
    return DEFAULT_PROFILE if raw is None else str(raw)


def allocate_devices(demand: Mapping[str, int], taken: set[Device]) -> list[Device]:
    """The devices a pod with this demand gets on a node where `taken` are in use: the lowest free
    GPU indices, MIG instance ids, or share slots. Updates `taken`."""
    out: list[Device] = []

    def first_free(make: Any) -> Device:
        n = 0
        while make(n) in taken:
            n += 1
        device: Device = make(n)
        taken.add(device)
        return device

    for _ in range(int(demand.get("gpu", 0))):
        out.append(first_free(lambda n: (n, None, None)))
    for key, count in sorted(demand.items()):
        if key.startswith("mig:"):
            profile = key[4:]
            for _ in range(int(count)):
                out.append(first_free(lambda n, p=profile: (n // MIG_INSTANCES_PER_GPU, p, n)))
    if demand.get("share"):
        # One device: the physical GPU the time slice runs on (dcgm-exporter sees the GPU).
        out.append(first_free(lambda n: (n // SHARE_SLOTS_PER_GPU, "share", n)))
    return out


def gpu_uuid(cluster: str, node: str, index: int) -> str:
    return f"GPU-{uuid.uuid5(uuid.NAMESPACE_URL, f'gpufleet-sim/{cluster}/{node}/{index}')}"


def reading(busy: bool, rng: random.Random) -> dict[str, float]:
    """One scrape of one device: activity ratios, GPU_UTIL in percent, memory and power."""

    def jitter(value: float, spread: float, low: float = 0.0, high: float = 1.0) -> float:
        return round(min(high, max(low, value + rng.uniform(-spread, spread))), 6)

    if busy:
        sm = jitter(0.75, 0.08)
        return {
            Metric.SM_ACTIVE: sm,
            Metric.GR_ENGINE_ACTIVE: jitter(min(1.0, sm + 0.1), 0.03),
            Metric.TENSOR_ACTIVE: jitter(sm * 0.6, 0.05),
            Metric.GPU_UTIL: jitter(97.0, 3.0, 0.0, 100.0),
            Metric.FB_USED: jitter(62_000.0, 1_500.0, 0.0, 1e6),
            Metric.POWER: jitter(520.0, 40.0, 0.0, 1e4),
        }
    # Hoarding: the model stays in memory, nothing runs on the SMs.
    return {
        Metric.SM_ACTIVE: jitter(0.004, 0.004),
        Metric.GR_ENGINE_ACTIVE: jitter(0.006, 0.005),
        Metric.TENSOR_ACTIVE: 0.0,
        Metric.GPU_UTIL: jitter(0.5, 0.5, 0.0, 100.0),
        Metric.FB_USED: jitter(31_000.0, 200.0, 0.0, 1e6),
        Metric.POWER: jitter(72.0, 4.0, 0.0, 1e4),
    }


def pod_samples(
    cluster: str,
    node: str,
    run_id: str,
    pod: str,
    devices: list[Device],
    busy: bool,
    now: float,
    rng: random.Random,
) -> list[GpuSample]:
    out = []
    for index, mig_profile, instance in devices:
        shared = mig_profile == "share"
        out.append(
            GpuSample(
                cluster=cluster,
                node=node,
                gpu_uuid=gpu_uuid(cluster, node, index),
                gpu_index=index,
                timestamp=now,
                metrics=reading(busy, rng),
                run_id=run_id,
                mig_profile=None if shared else mig_profile,
                mig_instance=None if shared else instance,
                pod=pod,
                namespace=NAMESPACE,
                container="main",
            )
        )
    return out
