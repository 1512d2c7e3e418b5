"""The submit batcher (api/group_commit.py): concurrent submits go in one batch, each awaits its own
answer, and nothing is left unanswered when the writer itself fails."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest

from controlplane.api.group_commit import SubmitBatcher
from controlplane.service.commands import SubmitWorkload
from controlplane.service.errors import Conflict
from controlplane.service.submit_batch import Answer, SubmitItem
from controlplane.service.views import Principal

WHO = Principal("tok", "team", "team-1")


def _item(name: str) -> SubmitItem:
    body = {"name": name, "queue": "q", "pod_sets": [{"name": "w", "replicas": 1, "gpus": 1}]}
    return SubmitItem(WHO, SubmitWorkload.model_validate(body))


class Writer:
    def __init__(self, fail: bool = False) -> None:
        self.batches: list[list[str]] = []
        self.fail = fail

    def __call__(self, items: Sequence[SubmitItem]) -> list[Answer]:
        names = [item.request.name for item in items]
        self.batches.append(names)
        if self.fail:
            raise RuntimeError("the writer broke")
        view: Any = object()
        return [Conflict(f"{name} refused") if name.startswith("bad") else (view, True) for name in names]


async def test_submits_that_arrive_together_share_a_batch_and_get_their_own_answers() -> None:
    writer = Writer()
    batcher = SubmitBatcher(writer, max_items=64, max_writers=2)
    names = [f"g{i}" for i in range(10)] + ["bad-1"]
    results = await asyncio.gather(*(batcher.submit(_item(n)) for n in names), return_exceptions=True)
    assert writer.batches == [names]
    assert [isinstance(r, tuple) for r in results] == [True] * 10 + [False]
    assert isinstance(results[-1], Conflict)
    assert str(results[-1]) == "bad-1 refused"


async def test_a_batch_holds_at_most_max_items() -> None:
    writer = Writer()
    batcher = SubmitBatcher(writer, max_items=4, max_writers=1)
    await asyncio.gather(*(batcher.submit(_item(f"g{i}")) for i in range(10)))
    assert [len(b) for b in writer.batches] == [4, 4, 2]


async def test_submits_arriving_while_a_batch_is_written_go_in_the_next() -> None:
    writer = Writer()
    batcher = SubmitBatcher(writer, max_items=64, max_writers=1)
    first = asyncio.ensure_future(batcher.submit(_item("first")))
    await asyncio.sleep(0)
    await asyncio.sleep(0)  # the first batch is in its worker thread now
    later = [asyncio.ensure_future(batcher.submit(_item(f"later{i}"))) for i in range(3)]
    await asyncio.gather(first, *later)
    assert writer.batches == [["first"], ["later0", "later1", "later2"]]


async def test_a_failing_writer_answers_every_waiting_submit_with_its_error() -> None:
    batcher = SubmitBatcher(Writer(fail=True))
    results = await asyncio.gather(*(batcher.submit(_item(f"g{i}")) for i in range(3)), return_exceptions=True)
    assert [str(r) for r in results] == ["the writer broke"] * 3
    with pytest.raises(RuntimeError):  # and the next submit is not stuck behind them
        await batcher.submit(_item("next"))
