"""The policies the queueing simulator compares, by name: the core-driven ones and the peers."""

from __future__ import annotations

from collections.abc import Callable

from controlplane.tracesim.queueing.core_scheduler import CORE_POLICIES, CoreLimits, CoreScheduler
from controlplane.tracesim.queueing.inputs import Fleet
from controlplane.tracesim.queueing.peers.armada import ArmadaScheduler
from controlplane.tracesim.queueing.peers.kueue import KueueScheduler
from controlplane.tracesim.queueing.peers.slurm import SlurmScheduler
from controlplane.tracesim.queueing.peers.volcano import VolcanoScheduler
from controlplane.tracesim.queueing.scheduler import SimScheduler

_PEERS: dict[str, Callable[[Fleet], SimScheduler]] = {
    "kueue": KueueScheduler,
    "volcano": VolcanoScheduler,
    "armada": ArmadaScheduler,
    "slurm": SlurmScheduler,
}

# Study order: the two baselines, the peers, gpufleet last.
POLICY_NAMES: tuple[str, ...] = ("fifo", "priority", *_PEERS, "gpufleet")
assert set(POLICY_NAMES) == set(CORE_POLICIES) | set(_PEERS)


def make_scheduler(name: str, fleet: Fleet, limits: CoreLimits) -> SimScheduler:
    if name in CORE_POLICIES:
        return CoreScheduler(name, limits)
    if name in _PEERS:
        return _PEERS[name](fleet)
    raise ValueError(f"unknown policy {name!r}; choose from {', '.join(POLICY_NAMES)}")


def parse_policies(text: str) -> list[str]:
    """`all`, or names separated by commas (duplicates dropped, order kept)."""
    names = [part.strip() for part in text.split(",") if part.strip()]
    if not names:
        raise ValueError("name at least one policy")
    if "all" in names:
        return list(POLICY_NAMES)
    unknown = [n for n in names if n not in POLICY_NAMES]
    if unknown:
        raise ValueError(f"unknown policy {unknown[0]!r}; choose from {', '.join(POLICY_NAMES)} or all")
    return list(dict.fromkeys(names))
