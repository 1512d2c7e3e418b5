"""The scheduling policy read from settings: `heads_per_queue` is bounded with a sentence."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from controlplane.config import MAX_HEADS_PER_QUEUE, Settings


@pytest.mark.parametrize("heads", [0, -3, MAX_HEADS_PER_QUEUE + 1])
def test_heads_per_queue_out_of_bounds_is_refused_with_a_sentence(heads: int) -> None:
    with pytest.raises(ValidationError, match=f"heads_per_queue must be between 1 and {MAX_HEADS_PER_QUEUE}"):
        Settings(policy={"heads_per_queue": heads})


@pytest.mark.parametrize("value", ["many", 2.5, float("nan"), float("inf")])
def test_heads_per_queue_must_be_a_whole_number(value: object) -> None:
    with pytest.raises(ValidationError):
        Settings(policy={"heads_per_queue": value})


def test_heads_per_queue_within_bounds_reaches_the_scheduling_policy() -> None:
    assert Settings(policy={"heads_per_queue": 4}).scheduling_policy().heads_per_queue == 4
    assert Settings().scheduling_policy().heads_per_queue == 16
