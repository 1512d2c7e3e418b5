"""Pod status read back from a Kubernetes cluster.

`PodStatusWatcher` keeps a list+watch on gpufleet's pods (label `app.kubernetes.io/managed-by=
gpufleet`) and hands one `PodReport` per run to an async callback whenever what the run's pods
say changes; the caller publishes it on `<prefix>.cluster.<cluster>.pods`. Folding reports into
run state is idempotent and monotonic, so sending a report twice, or again after a re-list, is
harmless; losing one is not, which is why a report whose callback failed is sent again
`retry_seconds` later.

The blocking watch runs in a worker thread that forwards events to the event loop; `stop()`
closes its connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from adapters.kubernetes.api_client import json_body
from adapters.kubernetes.manifest_model import (
    COMPLETION_INDEX,
    LABEL_EPOCH,
    LABEL_POD_SET,
    LABEL_RUN,
    OWNED_SELECTOR,
    core_pod_index,
)
from controlplane.service.cluster_status import POD_PHASES, PodReport, PodStatus

log = logging.getLogger(__name__)

ReportSink = Callable[[PodReport], Awaitable[None]]
MESSAGE_MAX = 500
GONE = 410
TICK_SECONDS = 0.5  # how often a quiet watch checks for stop() and for reports to deliver again


@dataclass(frozen=True)
class PodKey:
    run_id: str
    epoch: int
    pod_set: str
    index: int


def pod_status(pod: Mapping[str, Any]) -> tuple[PodKey, PodStatus] | None:
    """What one pod (as the API returns it, a dict) says, or None when it is not a gpufleet pod."""
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    run_id = labels.get(LABEL_RUN)
    pod_set = labels.get(LABEL_POD_SET)
    # Kubernetes 1.28+ sets the completion index as a label too; older clusters only annotate it.
    raw_index = annotations.get(COMPLETION_INDEX, labels.get(COMPLETION_INDEX))
    if not run_id or not pod_set or raw_index is None:
        return None
    try:
        completion = int(raw_index)
        epoch = int(labels.get(LABEL_EPOCH, "0"))
    except ValueError:
        return None
    index = core_pod_index(annotations, completion)
    if index is None:
        return None
    status = pod.get("status") or {}
    phase = status.get("phase") or "Pending"
    if phase not in POD_PHASES:
        phase = "Unknown"
    message = _message(pod.get("metadata", {}).get("name", ""), status, phase)
    return PodKey(run_id, epoch, pod_set, index), PodStatus(
        pod_set=pod_set, index=index, phase=phase, message=message[:MESSAGE_MAX]
    )


def _message(name: str, status: Mapping[str, Any], phase: str) -> str:
    """The most useful short reason: a failed container's exit, else the pod's own message."""
    parts: list[str] = []
    if status.get("reason"):
        parts.append(str(status["reason"]))
    if status.get("message"):
        parts.append(str(status["message"]))
    if phase == "Failed":
        for cs in status.get("containerStatuses") or []:
            term = (cs.get("state") or {}).get("terminated") or {}
            if term and term.get("exitCode", 0) != 0:
                detail = f"container {cs.get('name')} exited {term.get('exitCode')}"
                if term.get("reason"):
                    detail += f" ({term['reason']})"
                if term.get("message"):
                    detail += f": {term['message']}"
                parts.append(detail)
    elif phase == "Pending":
        for cond in status.get("conditions") or []:
            if cond.get("type") == "PodScheduled" and cond.get("status") == "False" and cond.get("message"):
                parts.append(str(cond["message"]))
        for cs in status.get("containerStatuses") or []:
            waiting = (cs.get("state") or {}).get("waiting") or {}
            if waiting.get("reason") and waiting["reason"] != "ContainerCreating":
                parts.append(f"container {cs.get('name')}: {waiting['reason']}")
    text = "; ".join(parts)
    return f"{name}: {text}" if text and name else text


def reports_from_pods(pods: Iterable[Mapping[str, Any]]) -> list[PodReport]:
    """Group pods into one report per (run, epoch), newest pod winning per (pod set, index)."""
    latest: dict[PodKey, tuple[str, PodStatus]] = {}
    for pod in pods:
        parsed = pod_status(pod)
        if parsed is None:
            continue
        key, status = parsed
        created = str((pod.get("metadata") or {}).get("creationTimestamp") or "")
        if key not in latest or created >= latest[key][0]:
            latest[key] = (created, status)
    return _group({k: s for k, (_, s) in latest.items()})


def _group(statuses: Mapping[PodKey, PodStatus]) -> list[PodReport]:
    runs: dict[tuple[str, int], list[PodStatus]] = {}
    for key in sorted(statuses, key=lambda k: (k.run_id, k.epoch, k.pod_set, k.index)):
        runs.setdefault((key.run_id, key.epoch), []).append(statuses[key])
    return [PodReport(run_id=run_id, epoch=epoch, pods=pods) for (run_id, epoch), pods in runs.items()]


@dataclass
class _Tracked:
    """What the watcher knows of one pod; `deleted` marks a pod the API no longer has."""

    key: PodKey
    name: str
    status: PodStatus
    created: str
    deleted: bool = False

    @property
    def run(self) -> tuple[str, int]:
        return (self.key.run_id, self.key.epoch)


@dataclass
class PodStatusWatcher:
    """List+watch gpufleet pods in one namespace and report them per run."""

    configuration: client.Configuration
    namespace: str
    sink: ReportSink
    watch_timeout_seconds: int = 300  # the server ends each watch after this; we resume from its rv
    retry_seconds: float = 2.0
    reports_sent: int = 0
    relists: int = 0
    _pods: dict[str, _Tracked] = field(default_factory=dict, init=False)  # by pod uid
    _sent: dict[tuple[str, int], tuple[PodStatus, ...]] = field(default_factory=dict, init=False)
    _dirty: set[tuple[str, int]] = field(default_factory=set, init=False)
    _stopping: bool = field(default=False, init=False)
    _failed_at: float = field(default=0.0, init=False)  # monotonic time of the last failed delivery
    _watch: watch.Watch | None = field(default=None, init=False)
    _api: client.ApiClient = field(init=False, repr=False)
    _core: client.CoreV1Api = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._api = client.ApiClient(self.configuration)
        self._core = client.CoreV1Api(self._api)

    async def run(self) -> None:
        """List, report everything, watch from the list's resourceVersion; re-list on 410 Gone."""
        resource_version: str | None = None
        while not self._stopping:
            try:
                if resource_version is None:
                    resource_version = await self.resync()
                resource_version = await self._watch_once(resource_version)
                await self._flush(set(self._dirty))  # retry reports whose delivery failed
            except ApiException as exc:
                resource_version = None
                if exc.status == GONE:
                    log.info("pod watch in %s expired (410); re-listing", self.namespace)
                    continue
                log.warning("pod watch in %s failed: %s %s", self.namespace, exc.status, exc.reason)
                await asyncio.sleep(self.retry_seconds)
            except Exception:  # connection lost, bad payload: a watcher that dies silently is worse
                log.exception("pod watch in %s failed; re-listing", self.namespace)
                resource_version = None
                await asyncio.sleep(self.retry_seconds)

    def stop(self) -> None:
        self._stopping = True
        if self._watch is not None:
            _abort(self._watch)

    def close(self) -> None:
        self._api.close()  # type: ignore[no-untyped-call]

    async def resync(self) -> str:
        """Replace what we know with a fresh list and report every run. Returns the list's rv."""
        body = await asyncio.to_thread(self._list_pods)
        self.relists += 1
        previous = self._pods
        self._pods = {}
        for pod in body.get("items") or []:
            self._track(pod)
        # A pod that vanished while no watch was open gets the verdict a DELETED event gives.
        for uid, tracked in previous.items():
            if uid not in self._pods and not tracked.deleted:
                self._pods[uid] = tracked
                self._mark_deleted(uid)
        await self._flush({t.run for t in self._pods.values()}, force=True)
        rv: str = (body.get("metadata") or {}).get("resourceVersion") or ""
        return rv

    def _list_pods(self) -> dict[str, Any]:
        resp: object = self._core.list_namespaced_pod(
            self.namespace, label_selector=OWNED_SELECTOR, _preload_content=False, _request_timeout=60
        )
        return json_body(resp)

    async def _watch_once(self, resource_version: str) -> str:
        """One watch request; returns the resourceVersion to resume from."""
        if self._stopping:
            return resource_version
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[dict[str, Any] | BaseException | None] = asyncio.Queue()
        w = watch.Watch()  # type: ignore[no-untyped-call]
        self._watch = w

        def pump() -> None:
            try:
                for event in w.stream(  # type: ignore[no-untyped-call]
                    self._core.list_namespaced_pod,
                    self.namespace,
                    label_selector=OWNED_SELECTOR,
                    resource_version=resource_version,
                    allow_watch_bookmarks=True,
                    timeout_seconds=self.watch_timeout_seconds,
                    # a read timeout beyond the server's own timeout catches a silently dead peer
                    _request_timeout=(10, self.watch_timeout_seconds + 30),
                ):
                    # raw_object is the dict as sent; the model in `object` is not needed
                    loop.call_soon_threadsafe(queue.put_nowait, {"type": event["type"], "object": event["raw_object"]})
            except BaseException as exc:  # handed to the event loop, which re-raises it
                loop.call_soon_threadsafe(queue.put_nowait, exc)
            else:
                loop.call_soon_threadsafe(queue.put_nowait, None)

        pump_task = asyncio.ensure_future(asyncio.to_thread(pump))
        last_rv = resource_version
        try:
            while True:
                try:
                    item = await asyncio.wait_for(queue.get(), TICK_SECONDS)
                except TimeoutError:
                    if self._stopping:
                        # stop() may have come before the stream opened its socket: abort again.
                        _abort(w)
                    elif self._dirty and time.monotonic() - self._failed_at >= self.retry_seconds:
                        await self._flush(set(self._dirty))
                    continue
                if item is None:
                    return last_rv
                if isinstance(item, BaseException):
                    if self._stopping:
                        return last_rv
                    raise item
                last_rv = self._apply_event(item) or last_rv
                await self._flush(set(self._dirty))
        finally:
            w.stop()  # type: ignore[no-untyped-call]
            self._watch = None
            with contextlib.suppress(BaseException):  # its outcome already went through the queue
                await pump_task

    def _apply_event(self, event: Mapping[str, Any]) -> str | None:
        kind = event.get("type")
        obj = event.get("object") or {}
        meta = obj.get("metadata") or {}
        if kind == "ERROR":
            # The client raises 410 itself when it was given a timeout; other servers may send it.
            raise ApiException(status=obj.get("code"), reason=f"{obj.get('reason')}: {obj.get('message')}")
        rv: str | None = meta.get("resourceVersion")
        if kind == "DELETED":
            uid = meta.get("uid") or meta.get("name", "")
            if uid not in self._pods:
                self._track(obj)
            if uid in self._pods:
                self._mark_deleted(uid)
        elif kind in ("ADDED", "MODIFIED"):
            self._track(obj)
        return rv

    def _mark_deleted(self, uid: str) -> None:
        tracked = self._pods[uid]
        status = tracked.status
        if status.phase not in ("Succeeded", "Failed"):
            # Removed before it finished (evicted, node drained, deleted by hand): with
            # backoffLimit 0 its Job will not replace it, so the pod failed.
            status = status.model_copy(
                update={"phase": "Failed", "message": f"{tracked.name}: deleted before it finished"}
            )
        self._pods[uid] = _Tracked(tracked.key, tracked.name, status, tracked.created, deleted=True)
        self._dirty.add(tracked.run)

    def _track(self, pod: Mapping[str, Any]) -> None:
        parsed = pod_status(pod)
        if parsed is None:
            return
        key, status = parsed
        meta = pod.get("metadata") or {}
        uid = meta.get("uid") or meta.get("name", "")
        self._pods[uid] = _Tracked(key, meta.get("name", ""), status, str(meta.get("creationTimestamp") or ""))
        self._dirty.add((key.run_id, key.epoch))

    def _current(self, run: tuple[str, int]) -> tuple[PodStatus, ...]:
        latest: dict[PodKey, _Tracked] = {}
        for tracked in self._pods.values():
            if tracked.run != run:
                continue
            prev = latest.get(tracked.key)
            # A replacement pod (newer) speaks for its index, not the pod it replaced.
            if prev is None or tracked.created >= prev.created:
                latest[tracked.key] = tracked
        return tuple(latest[k].status for k in sorted(latest, key=lambda k: (k.pod_set, k.index)))

    async def _flush(self, runs: Iterable[tuple[str, int]], force: bool = False) -> None:
        for run in sorted(runs):
            pods = self._current(run)
            if pods and (force or self._sent.get(run) != pods):
                try:
                    report = PodReport(run_id=run[0], epoch=run[1], pods=list(pods))
                except ValueError as exc:  # e.g. a gang larger than reports carry: never stop the watcher
                    log.error("pod report for run %s cannot be built: %s", run[0], exc)
                    self._sent[run] = pods
                    self._dirty.discard(run)
                    continue
                try:
                    await self.sink(report)
                except Exception as exc:  # the transport is down: stays dirty, sent again after retry_seconds
                    log.warning("pod report for run %s not delivered: %s", run[0], exc)
                    self._failed_at = time.monotonic()
                    continue
                self.reports_sent += 1
                self._sent[run] = pods
            self._dirty.discard(run)
            # Once every pod of a run is gone and its last word delivered, forget the run.
            mine = [uid for uid, t in self._pods.items() if t.run == run]
            if mine and all(self._pods[uid].deleted for uid in mine):
                for uid in mine:
                    del self._pods[uid]
                self._sent.pop(run, None)


def _abort(w: watch.Watch) -> None:
    """Stop a watch now, not at its server-side timeout.

    `Watch.stop()` only takes effect at the next event, and its own socket shutdown looks for
    `connection.sock`, which urllib3 2 no longer keeps on a streaming response; so the socket the
    response reads from is shut down here, which ends the worker thread's blocked read at once.
    """
    w.stop()  # type: ignore[no-untyped-call]
    obj: Any = getattr(w, "_resp", None)
    for attr in ("_fp", "fp", "raw", "_sock"):
        obj = getattr(obj, attr, None)
    if isinstance(obj, socket.socket):
        with contextlib.suppress(OSError):  # already closed by the other side
            obj.shutdown(socket.SHUT_RDWR)
