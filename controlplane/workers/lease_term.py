"""A process's term under a named lease (`LeaseTerm`) and the holder ids the loops lead with.

Separate from the loops because the scheduler, dispatcher and relay loops all hold their
lease through it."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import uuid

from controlplane.service.metrics import NO_METRICS, Metrics
from controlplane.service.ports import UnitOfWorkFactory
from controlplane.service.scheduling import (
    acquire_leadership,
    release_leadership,
    renew_leadership,
)
from controlplane.workers.loops import Clock

log = logging.getLogger(__name__)


def holder_id(component: str) -> str:
    return f"{component}@{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class LeaseTerm:
    """This process's term under a named lease. Once acquired, a background task renews it every
    third of its TTL for as long as the term lasts, so a cycle (or dispatch pass) longer than the
    TTL keeps its lease and a standby never takes a lease that is being worked. The term ends when a
    renewal finds another holder's epoch (deposed) or when `lose`/`release` is called. Renewal only
    narrows overlap: every scheduling write still checks the epoch in its own transaction."""

    def __init__(
        self,
        uow_factory: UnitOfWorkFactory,
        lease: str,
        holder: str,
        clock: Clock,
        ttl: float,
        metrics: Metrics = NO_METRICS,
    ) -> None:
        self.uow_factory, self.lease, self.holder, self.clock, self.ttl = uow_factory, lease, holder, clock, ttl
        self.metrics = metrics
        self.epoch: int | None = None
        self._renewer: asyncio.Task[None] | None = None
        self._standing_by = False

    async def ensure(self) -> int | None:
        """The current epoch, acquiring the lease if it is free; None while another holder has it."""
        if self.epoch is not None and self._renewer is not None and self._renewer.done():
            self.epoch = None  # the renewer found us deposed
        if self.epoch is None:
            self.epoch = await asyncio.to_thread(
                acquire_leadership, self.uow_factory, self.holder, self.clock(), self.ttl, self.lease
            )
            if self.epoch is not None:
                log.info("%s leads %s with epoch %d", self.holder, self.lease, self.epoch, extra={"epoch": self.epoch})
                self.metrics.lease(self.lease, self.epoch)
                self._renewer = asyncio.create_task(self._renew(self.epoch), name=f"{self.lease}-lease")
                self._standing_by = False
            elif not self._standing_by:
                log.info("%s stands by: another holder has the %s lease", self.holder, self.lease)
                self._standing_by = True
        return self.epoch

    async def _renew(self, epoch: int) -> None:
        while True:
            await asyncio.sleep(self.ttl / 3)
            try:
                renewed = await asyncio.to_thread(
                    renew_leadership, self.uow_factory, self.holder, epoch, self.clock(), self.ttl, self.lease
                )
            except Exception as exc:  # database unreachable: keep trying; the epoch check fences writes
                log.warning("%s could not renew its %s lease: %s", self.holder, self.lease, exc)
                continue
            if not renewed:
                log.warning("%s lost its %s lease (epoch %d)", self.holder, self.lease, epoch, extra={"epoch": epoch})
                self.metrics.lease(self.lease, None)
                return
            self.metrics.lease(self.lease, epoch)

    def lose(self) -> None:
        if self._renewer is not None:
            self._renewer.cancel()
        if self.epoch is not None:
            self.metrics.lease(self.lease, None)
        self._renewer, self.epoch = None, None

    async def release(self) -> None:
        epoch = self.epoch
        self.lose()
        if epoch is not None:
            with contextlib.suppress(Exception):
                await asyncio.to_thread(release_leadership, self.uow_factory, self.holder, epoch, self.lease)
