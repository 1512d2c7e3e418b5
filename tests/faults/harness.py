"""The fault suite's clients and its proofs.

`Load` keeps a steady stream of small gangs arriving by REST and by NATS, the way a careful client
would send them: every logical submit carries one idempotency key (REST) / `Gpufleet-Msg-Id` (NATS)
and is retried with the same key until it is acknowledged (201/200, or a JetStream PubAck). What
each attempt met is counted (`Figures`). `ReadyzProbe` samples `/readyz`. `verify_after_drain`
proves, from SQL, the simulated clusters' state files and the events stream, that no acknowledged
submission was lost, no run was dispatched twice, and every workload's events were published
exactly once each, complete and in order.

How the tests reach NATS is kept in `nats_connect` / `nats_submit_headers` / `read_events` only,
so a change of NATS identities touches this file in one place.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import nats
from nats.aio.client import Client
from nats.js.api import DeliverPolicy
from sqlalchemy import create_engine, text

from controlplane.service.telemetry_wire import GpuSample, encode_batch, telemetry_subject

TERMINAL = {"succeeded", "failed", "cancelled"}
SUBMIT_TIMEOUT = 2.0


# --- how the tests talk to NATS (one place) ---------------------------------------------------


async def nats_connect(url: str, **credentials: str) -> Client:
    """`url`: one server or a cluster's, comma-separated. `token` (a team's, with `inbox_prefix`
    `_INBOX.team-<team>`) or the control plane's `user` and `password`; a server without
    authentication ignores them."""
    return await nats.connect(
        url.split(","), name="faults-client", max_reconnect_attempts=-1, reconnect_time_wait=0.2, **credentials
    )


def nats_submit_headers(msg_id: str) -> dict[str, str]:
    # Identity is the NATS credential, not a header; the id is per sender.
    return {"Gpufleet-Msg-Id": msg_id}


async def read_events(url: str, prefix: str, secrets_file: Path | None = None) -> list[dict[str, Any]]:
    """Every workload event envelope in the events stream, in stream order. Reading a stream is the
    control plane's right only: on an authenticated server, connect as its user."""
    credentials: dict[str, str] = {}
    if secrets_file is not None:
        secrets = json.loads(secrets_file.read_text())
        credentials = {"user": secrets.get("control_user", "gpufleet"), "password": secrets["control_password"]}
    nc = await nats_connect(url, **credentials)
    try:
        js = nc.jetstream()
        sub = await js.subscribe(f"{prefix}.events.workload.>", ordered_consumer=True, deliver_policy=DeliverPolicy.ALL)
        out: list[dict[str, Any]] = []
        while True:
            try:
                msg = await sub.next_msg(timeout=2.0)
            except TimeoutError:
                break
            out.append(json.loads(msg.data))
        await sub.unsubscribe()
        return out
    finally:
        await nc.close()


# --- figures ---------------------------------------------------------------------------------


@dataclass
class Figures:
    rest: Counter[str] = field(default_factory=Counter)  # status code or exception name per attempt
    nats: Counter[str] = field(default_factory=Counter)  # "acked", "timeout", exception names
    recovery: dict[str, float] = field(default_factory=dict)  # seconds, per fault
    readyz: dict[str, Counter[str]] = field(default_factory=dict)  # per fault window: status counts

    def render(self) -> str:
        lines = [f"REST attempts: {dict(self.rest)}", f"NATS publishes: {dict(self.nats)}"]
        lines += [f"recovery {k}: {v:.1f} s" for k, v in self.recovery.items()]
        lines += [f"/readyz during {k}: {dict(v)}" for k, v in self.readyz.items()]
        return "\n".join(lines)


def gang_body(name: str, queue: str) -> dict[str, Any]:
    return {
        "name": name,
        "queue": queue,
        "idempotency_key": name,
        "duration_seconds": 1,
        "pod_sets": [{"name": "workers", "replicas": 2, "gpus": 1}],
    }


class Load:
    """Two submitters in threads: REST every `rest_every` s (None: no REST), NATS every `nats_every` s."""

    def __init__(
        self,
        base: Callable[[], str],
        token: str,
        queue: str,
        nats_url: str,
        prefix: str,
        figures: Figures,
        rest_every: float | None = 0.4,
        nats_every: float = 0.5,
        team: str = "llm",
    ) -> None:
        self.team = team
        self.base, self.token, self.queue = base, token, queue
        self.nats_url, self.prefix, self.figures = nats_url, prefix, figures
        self.rest_every, self.nats_every = rest_every, nats_every
        self.acked: dict[str, str] = {}  # name -> "rest" | "nats"
        self.rest_acks: list[float] = []  # monotonic times of REST acknowledgements
        self.stopping = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=lambda: asyncio.run(self._nats()), name="nats-load", daemon=True)]
        if rest_every is not None:
            self._threads.append(threading.Thread(target=self._rest, name="rest-load", daemon=True))

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def stop(self) -> None:
        self.stopping.set()
        for t in self._threads:
            if t.is_alive():
                t.join(30)

    def first_rest_ack_after(self, moment: float) -> float | None:
        """Seconds from `moment` to the first REST acknowledgement after it, if any yet."""
        later = [t for t in list(self.rest_acks) if t > moment]
        return min(later) - moment if later else None

    def _ack(self, name: str, via: str) -> None:
        with self._lock:
            self.acked[name] = via
            if via == "rest":
                self.rest_acks.append(time.monotonic())

    def _rest(self) -> None:
        headers = {"Authorization": f"Bearer {self.token}"}
        n = 0
        with httpx.Client(timeout=SUBMIT_TIMEOUT) as http:
            while not self.stopping.is_set():
                n += 1
                name = f"rest-{n}"
                while not self.stopping.is_set():  # retry the same key until acknowledged
                    try:
                        r = http.post(f"{self.base()}/v1/workloads", json=gang_body(name, self.queue), headers=headers)
                        self.figures.rest[str(r.status_code)] += 1
                        if r.status_code in (200, 201):
                            self._ack(name, "rest")
                            break
                    except httpx.HTTPError as exc:
                        self.figures.rest[type(exc).__name__] += 1
                    time.sleep(0.2)
                time.sleep(self.rest_every or 0.0)

    async def _nats(self) -> None:
        nc = await nats_connect(self.nats_url, token=self.token, inbox_prefix=f"_INBOX.team-{self.team}")
        js = nc.jetstream()
        n = 0
        try:
            while not self.stopping.is_set():
                n += 1
                name = f"nats-{n}"
                payload = json.dumps(gang_body(name, self.queue)).encode()
                while not self.stopping.is_set():  # retry with the same Gpufleet-Msg-Id until acked
                    try:
                        await js.publish(
                            f"{self.prefix}.submit.{self.team}.{self.queue}",
                            payload,
                            timeout=SUBMIT_TIMEOUT,
                            headers=nats_submit_headers(name),
                        )
                        self.figures.nats["acked"] += 1
                        self._ack(name, "nats")
                        break
                    except TimeoutError:
                        self.figures.nats["timeout"] += 1
                    except Exception as exc:
                        self.figures.nats[type(exc).__name__] += 1
                        await asyncio.sleep(0.2)
                await asyncio.sleep(self.nats_every)
        finally:
            # the server may have just been killed: a reset while closing is not a test failure
            with contextlib.suppress(OSError, nats.errors.Error):
                await nc.close()


class TelemetryLoad:
    """A cluster agent: a DCGM batch of `SAMPLES` GPU samples every 0.1 s on its own credential,
    each retried with the same `Gpufleet-Msg-Id` until JetStream acknowledges it."""

    SAMPLES = 2

    def __init__(self, url: str, prefix: str, cluster: str, credential: str, figures: Figures) -> None:
        self.url, self.prefix, self.cluster, self.credential = url, prefix, cluster, credential
        self.figures = figures
        self.acked: list[str] = []
        self.stopping = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), name="telemetry-load", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self.stopping.set()
        if self._thread.is_alive():
            self._thread.join(30)

    def batch(self) -> bytes:
        now = time.time()
        samples = [
            GpuSample(self.cluster, "node-1", f"GPU-{i}", i, now, {"sm_active": 0.5}) for i in range(self.SAMPLES)
        ]
        return encode_batch(self.cluster, samples)

    async def _run(self) -> None:
        nc = await nats_connect(self.url, token=self.credential, inbox_prefix=f"_INBOX.cluster-{self.cluster}")
        js = nc.jetstream()
        try:
            for n in itertools.count(1):
                if self.stopping.is_set():
                    break
                msg_id, payload = f"t-{n}", self.batch()
                while not self.stopping.is_set():
                    try:
                        await js.publish(
                            telemetry_subject(self.prefix, self.cluster),
                            payload,
                            timeout=2.0,
                            headers={"Gpufleet-Msg-Id": msg_id},
                        )
                        self.figures.nats["telemetry acked"] += 1
                        self.acked.append(msg_id)
                        break
                    except Exception as exc:
                        self.figures.nats[f"telemetry {type(exc).__name__}"] += 1
                        await asyncio.sleep(0.2)
                await asyncio.sleep(0.1)
        finally:
            with contextlib.suppress(OSError, nats.errors.Error):
                await nc.close()


class ReadyzProbe:
    """Samples `/readyz` every 0.2 s into (monotonic time, status) pairs; "down" when unreachable."""

    def __init__(self, base: Callable[[], str]) -> None:
        self.base = base
        self.samples: list[tuple[float, str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="readyz", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(10)

    def _run(self) -> None:
        with httpx.Client(timeout=1.0) as http:
            while not self._stop.is_set():
                try:
                    status = str(http.get(f"{self.base()}/readyz").status_code)
                except httpx.HTTPError:
                    status = "down"
                self.samples.append((time.monotonic(), status))
                time.sleep(0.2)

    def between(self, start: float, end: float) -> Counter[str]:
        return Counter(s for t, s in self.samples if start <= t <= end)


def eventually(check: Callable[[], bool], timeout: float, what: str, explain: Callable[[], str] | None = None) -> float:
    """Seconds until `check()` held; fails the test after `timeout`."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        try:
            if check():
                return time.monotonic() - start
        except Exception:
            pass  # the thing being waited for may still be down
        time.sleep(0.1)
    detail = ""
    if explain is not None:
        try:
            detail = f"; {explain()}"
        except Exception as exc:  # the explanation is a courtesy; never hide the timeout behind it
            detail = f"; (no detail: {exc!r})"
    raise AssertionError(f"not reached within {timeout:.0f} s: {what}{detail}")


def count(database_url: str, query: str) -> int:
    """The one number a `SELECT count(*) ...` gives (a fresh engine: the database may have restarted)."""
    engine = create_engine(database_url)
    try:
        with engine.connect() as conn:
            return int(conn.execute(text(query)).scalar_one())
    finally:
        engine.dispose()


# --- the run both fault tests share -----------------------------------------------------------


def start_load(
    base: str,
    admin: dict[str, str],
    database_url: str,
    nats_url: str,
    prefix: str,
    figures: Figures,
    probe: ReadyzProbe,
) -> Load:
    """Team `llm`, queue `train` and a team token; then gangs arriving steadily by REST and NATS while
    `probe` samples `/readyz`, until a few have succeeded (the warm-up before the first fault)."""
    assert httpx.post(f"{base}/v1/teams", json={"name": "llm"}, headers=admin).status_code == 201
    r = httpx.post(f"{base}/v1/queues", json={"name": "train", "team": "llm"}, headers=admin)
    assert r.status_code == 201, r.text
    token = httpx.post(f"{base}/v1/tokens", json={"name": "t", "team": "llm"}, headers=admin).json()["token"]
    load = Load(lambda: base, token, "train", nats_url, prefix, figures)
    load.start()
    try:
        probe.start()
        query = "SELECT count(*) FROM runs WHERE state = 'succeeded'"
        eventually(lambda: count(database_url, query) >= 3, 60, "warm-up")
    except BaseException:
        load.stop()  # the caller never got it to stop
        raise
    return load


def drain_and_verify(
    load: Load,
    database_url: str,
    nats_url: str,
    prefix: str,
    sim_dir: Path,
    drain_timeout: float,
    secrets_file: Path | None = None,
) -> int:
    """After the faults: 20 acknowledged submissions, the load stopped, every one of them finished and
    the relay idle, then `verify_after_drain`; returns how many were acknowledged."""
    eventually(lambda: len(load.acked) >= 20, 60, "20 acknowledged submissions")
    load.stop()
    acked = dict(load.acked)
    eventually(
        lambda: drained(database_url, acked),
        drain_timeout,
        "every acknowledged gang finished",
        lambda: undrained(database_url, acked),
    )
    unpublished = "SELECT count(*) FROM outbox WHERE published_at IS NULL"
    eventually(lambda: count(database_url, unpublished) == 0, 30, "relay idle")
    events = asyncio.run(read_events(nats_url, prefix, secrets_file))
    verify_after_drain(database_url, sim_dir, events, acked)
    assert len(acked) >= 20
    return len(acked)


# --- the proofs ------------------------------------------------------------------------------


def workload_states(database_url: str) -> dict[str, list[tuple[str, str]]]:
    """name -> [(workload id, state)] for every workload in the database."""
    engine = create_engine(database_url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(text("SELECT name, id, state FROM workloads")).all()
    finally:
        engine.dispose()
    out: dict[str, list[tuple[str, str]]] = {}
    for name, wid, state in rows:
        out.setdefault(name, []).append((wid, state))
    return out


def drained(database_url: str, acked: dict[str, str]) -> bool:
    states = workload_states(database_url)
    return all(name in states and all(s in TERMINAL for _, s in states[name]) for name in acked)


def undrained(database_url: str, acked: dict[str, str]) -> str:
    """What is still missing or not finished among the acknowledged submissions (for failures)."""
    states = workload_states(database_url)
    missing = sorted(name for name in acked if name not in states)
    open_ = {name: states[name] for name in acked if name in states and any(s not in TERMINAL for _, s in states[name])}
    return f"without a workload: {missing}; not finished: {open_}"


def verify_after_drain(database_url: str, sim_dir: Path, events: list[dict[str, Any]], acked: dict[str, str]) -> None:
    states = workload_states(database_url)
    # No acknowledged submission lost, none doubled by a retry, every one finished.
    missing = sorted(set(acked) - set(states))
    assert not missing, f"acknowledged submissions without a workload: {missing}"
    doubled = {name: rows for name, rows in states.items() if len(rows) > 1}
    assert not doubled, f"one submission became several workloads: {doubled}"
    not_done = {name: rows[0][1] for name, rows in states.items() if rows[0][1] != "succeeded"}
    assert not not_done, f"workloads that did not succeed: {not_done}"

    engine = create_engine(database_url)
    try:
        with engine.connect() as conn:
            runs = conn.execute(text("SELECT id, workload_id, state, started_at FROM runs")).all()
            outbox = conn.execute(text("SELECT id, payload FROM outbox ORDER BY seq")).all()
    finally:
        engine.dispose()
    # No run dispatched twice: the clusters created exactly one set of objects per run.
    created = sum(json.loads(f.read_text())["created"] for f in sim_dir.glob("*.json"))
    assert created == len(runs), f"clusters created {created} run objects for {len(runs)} runs"
    assert all(r.started_at is not None for r in runs if r.state == "succeeded"), "a run succeeded unstarted"

    # Events: the stream holds each outbox event exactly once, and per workload in commit order.
    ids = [e["id"] for e in events]
    dupes = [i for i, c in Counter(ids).items() if c > 1]
    assert not dupes, f"events published more than once: {dupes[:5]}"
    in_outbox = {row.id: json.loads(row.payload) for row in outbox}
    workload_ids = {wid for rows in states.values() for wid, _ in rows}
    expected: dict[str, list[str]] = {}
    for event_id, payload in in_outbox.items():
        wid = payload["data"].get("workload_id")
        if payload["type"].startswith("workload.") and wid in workload_ids:
            expected.setdefault(wid, []).append(event_id)
    seen: dict[str, list[dict[str, Any]]] = {}
    for e in events:
        seen.setdefault(e["data"]["workload_id"], []).append(e)
    for wid, want in expected.items():
        got = seen.get(wid, [])
        assert [e["id"] for e in got] == want, f"workload {wid}: events {[e['type'] for e in got]} differ from SQL"
        versions = [e["data"]["version"] for e in got]
        assert versions == sorted(set(versions)), f"{wid}: versions {versions}"
        types = [e["type"].removeprefix("workload.") for e in got]
        assert types[0] == "queued", f"{wid}: {types}"
        assert types[-1] == "succeeded", f"{wid}: {types}"
        assert "running" in types, f"{wid}: succeeded without running: {types}"
        assert types.index("running") < types.index("succeeded"), f"{wid}: {types}"
        assert types.count("succeeded") == 1, f"{wid}: {types}"
