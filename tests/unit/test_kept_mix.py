"""The kept workload mix (`KeptMix`) is `workload_mix` of the same window, whatever windows came
before it: gangs leave, join, and come back re-read."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from controlplane.core.fragmentation import KeptMix, WorkloadMix, workload_mix
from controlplane.domain.model import Workload
from tests.unit.builders import gpus, make_workload
from tests.unit.test_schedule_properties import PROPERTY_SETTINGS, workloads


def _pods(mix: WorkloadMix | None) -> object:
    return None if mix is None else mix.pods


@given(workloads("w", 0), st.lists(st.lists(st.integers(0, 5), max_size=6), min_size=1, max_size=6))
@PROPERTY_SETTINGS
def test_the_kept_mix_is_the_mix_of_each_window(gangs: list[Workload], windows: list[list[int]]) -> None:
    kept = KeptMix()
    for step, picks in enumerate(windows):
        chosen = {pick % len(gangs): None for pick in picks} if gangs else {}
        # Every other window re-reads its gangs (equal, not the same objects).
        window = [replace(gangs[i]) if step % 2 else gangs[i] for i in chosen]
        assert _pods(kept.of(window)) == _pods(workload_mix(window))


def test_a_window_that_did_not_change_keeps_its_mix_object() -> None:
    gangs = [make_workload(f"w{i}", gpus(i % 3 + 1, 2), seq=i) for i in range(6)]
    kept = KeptMix()
    first = kept.of(gangs)
    assert kept.of(list(gangs)) is first
