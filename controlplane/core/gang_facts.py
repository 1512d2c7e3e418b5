"""What the cycle asks about a gang again and again, worked out once per gang.

A gang's shape (what placement depends on), its least gpu-eq and the GPU models it may use are
pure functions of the gang and of the state's unit and capacity. The cycle asks them for every
pending gang in every cycle (ordering, the verdict memo, quota checks): at 100,000 pending,
hashing pod sets and summing demands was a third of a cycle. Gangs are remembered by identity, so
a state kept across cycles (with a snapshot cache that keeps unchanged workloads as the same
objects) answers them once per gang, not once per cycle.
"""

from __future__ import annotations

from controlplane.core.gpu_eq import GpuEqUnit
from controlplane.domain.model import GPU_EQ, Workload

Shape = tuple[object, ...]


def shape_of(workload: Workload) -> Shape:
    """What placement depends on: gangs of one shape fit or fail alike on the same capacity."""
    return (
        workload.pod_sets,
        workload.min_available,
        workload.requires_isolation,
        workload.tolerations,
        workload.spot,
        workload.same_pool,
    )


# A shape interned to a small number: memo keys built for every pending gang in every cycle hash
# an int instead of a tuple of pod-set dataclasses.
ShapeId = int


class GangFacts:
    """Memo of `shape_id`, `least` and `allowed_models` per gang (by identity)."""

    def __init__(self, unit: GpuEqUnit, models: frozenset[str]) -> None:
        self.unit = unit
        self.models = models  # the fleet's GPU models
        self._ids: dict[Shape, ShapeId] = {}
        self._least: list[int] = []  # shape id -> its least units
        # id(workload) -> [workload, shape id, least units, allowed models or None]; the workload
        # is kept so its id is not reused while remembered
        self._facts: dict[int, list[object]] = {}

    def _of(self, workload: Workload) -> list[object]:
        found = self._facts.get(id(workload))
        if found is None or found[0] is not workload:
            shape = shape_of(workload)
            shape_id = self._ids.get(shape)
            if shape_id is None:  # least reads only pod sets and min_available: one per shape
                least = self.unit.least(workload)  # may raise (a gang the cycle sets aside): first
                shape_id = self._ids[shape] = len(self._least)
                self._least.append(least)
            found = self._facts[id(workload)] = [workload, shape_id, self._least[shape_id], None]
        return found

    def shape_id(self, workload: Workload) -> ShapeId:
        """Equal for gangs of one shape (`shape_of`), different otherwise."""
        found = self._of(workload)[1]
        assert isinstance(found, int)
        return found

    def least(self, workload: Workload) -> int:
        """`GpuEqUnit.least`: a lower bound of the units its cheapest `min_available` pods hold."""
        found = self._of(workload)[2]
        assert isinstance(found, int)
        return found

    def allowed_models(self, workload: Workload) -> tuple[str, ...]:
        """The fleet's GPU models every GPU pod set of the gang accepts (all of them when none
        narrows; `(gpu-eq,)` when the fleet has none)."""
        entry = self._of(workload)
        found = entry[3]
        if found is None:
            models = set(self.models)
            for pod_set in workload.pod_sets:
                if pod_set.gpu_models and pod_set.gpu_eq_per_pod():
                    models &= set(pod_set.gpu_models)
            found = entry[3] = tuple(sorted(models)) or (GPU_EQ,)
        assert isinstance(found, tuple)
        return found
