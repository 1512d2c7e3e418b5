"""Group commit for the submit route: the submits that arrive while one batch is being written go
together in the next (`submit_batch.submit_many`), each request still awaiting its own answer.

No timer decides a batch: a submit that finds no batch under way starts one at once (after letting
the submits already parsed in this turn of the event loop join it), and while a batch is in its
worker thread the next one collects whatever arrives, up to `max_items`. An idle server therefore
writes a lone submit as soon as it comes, and a busy one writes many per transaction and round trip.
At most `max_writers` batches are written at a time per process (each holds one database
connection); the event loop only queues and answers.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import anyio

from controlplane.service.submit_batch import Answer, SubmitItem
from controlplane.service.views import WorkloadView

BatchWriter = Callable[[Sequence[SubmitItem]], list[Answer]]


@dataclass
class _Waiting:
    items: list[tuple[SubmitItem, asyncio.Future[Answer]]] = field(default_factory=list)
    writers: int = 0


class SubmitBatcher:
    def __init__(self, write: BatchWriter, max_items: int = 64, max_writers: int = 2) -> None:
        self._write = write
        self.max_items = max_items
        self.max_writers = max_writers
        # Per event loop (a test client may run several one after another): futures belong to one.
        self._loops: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Waiting] = weakref.WeakKeyDictionary()
        self._draining: set[asyncio.Task[None]] = set()  # held, so a running drain is not collected

    async def submit(self, item: SubmitItem) -> tuple[WorkloadView, bool]:
        """This submit's answer: (workload view, created), or its own error raised."""
        loop = asyncio.get_running_loop()
        waiting = self._loops.setdefault(loop, _Waiting())
        answer: asyncio.Future[Answer] = loop.create_future()
        waiting.items.append((item, answer))
        if waiting.writers < self.max_writers:
            waiting.writers += 1
            task = loop.create_task(self._drain(waiting))
            self._draining.add(task)
            task.add_done_callback(self._draining.discard)
        result = await answer
        if isinstance(result, Exception):
            raise result
        return result

    async def _drain(self, waiting: _Waiting) -> None:
        try:
            await asyncio.sleep(0)  # submits already parsed in this turn of the loop join the batch
            while waiting.items:
                batch = waiting.items[: self.max_items]
                del waiting.items[: self.max_items]
                try:
                    # `max_writers` per loop bounds the threads (a limiter would belong to one loop).
                    answers = await anyio.to_thread.run_sync(self._write, [item for item, _ in batch])
                except Exception as exc:  # `submit_many` answers each submit; this is a bug's safety net
                    answers = [exc for _ in batch]
                for (_, future), result in zip(batch, answers, strict=True):
                    if not future.done():  # a request cancelled meanwhile has no one to answer
                        future.set_result(result)
        finally:
            waiting.writers -= 1
