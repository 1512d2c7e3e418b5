"""Every event gpufleet emits, every reason it names and every dead letter it keeps is bounded,
whatever a sender put in the request (issue 21: a 700,007-byte submit gave a 2,100,298-byte
rejection event, and a dead letter of a body just under 1 MiB was larger than the server takes)."""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime

import pytest
from pydantic import BaseModel, ValidationError

from adapters.nats.sizes import (
    DEAD_LETTER_EXCERPT,
    ENVELOPE_ROOM,
    MessageTooLarge,
    check_fits,
    dead_letter_body,
    header_bytes,
    inbound_limit,
)
from controlplane.service.events import MAX_EVENT_BYTES, envelope
from controlplane.service.ingest_messages import MAX_ERRORS_NAMED, errors_text
from controlplane.service.nats_identity import sender_of_subject

NOW = datetime(2026, 12, 5, tzinfo=UTC)
MIB = 1 << 20


def test_a_small_event_is_written_as_it_is() -> None:
    _, payload = envelope("workload.queued", {"workload_id": "w-1", "reason": "quota"}, NOW)
    assert json.loads(payload)["data"] == {"workload_id": "w-1", "reason": "quota"}


@pytest.mark.parametrize(
    "data",
    [
        {"workload_id": "w-1", "reason": "x" * 2_100_000},
        {"workload_id": "w-1", "errors": [f"pod_sets.{i}.replicas: bad" for i in range(100_000)]},
        {"workload_id": "w-1", "nested": {f"k{i}": {"v": "é" * 500} for i in range(2_000)}},
        {f"key-{i}": "v" * 150 for i in range(5_000)},
    ],
)
def test_a_large_event_is_cut_down_and_marked(data: dict[str, object]) -> None:
    _, payload = envelope("workload.rejected", data, NOW)
    assert len(payload.encode()) <= MAX_EVENT_BYTES
    body = json.loads(payload)
    assert (body["type"], body["version"]) == ("workload.rejected", 1)
    assert body["data"]["truncated"] is True
    assert body["data"]["original_bytes"] > MAX_EVENT_BYTES
    if "workload_id" in data:
        assert body["data"]["workload_id"] == "w-1"  # what says which workload survives


def test_a_rejection_names_a_few_errors_and_counts_the_rest() -> None:
    class PodSet(BaseModel):
        replicas: int

    class Submit(BaseModel):
        pod_sets: list[PodSet]

    with pytest.raises(ValidationError) as caught:
        Submit.model_validate({"pod_sets": [{"replicas": "x" * 10_000}] * 5_000})
    text = errors_text(caught.value)
    assert text.count("pod_sets.") == MAX_ERRORS_NAMED
    assert text.endswith(f"and {5_000 - MAX_ERRORS_NAMED:,} more errors")
    assert len(text) < 5_000


def test_headers_are_measured_as_the_wire_carries_them() -> None:
    headers = {"Gpufleet-Msg-Id": "abc", "Nats-Msg-Id": "é"}
    wire = b"NATS/1.0\r\nGpufleet-Msg-Id: abc\r\nNats-Msg-Id: \xc3\xa9\r\n\r\n"
    assert header_bytes(headers) == len(wire)
    assert header_bytes({}) == header_bytes(None) == 0


def test_a_message_above_the_servers_limit_is_never_sent() -> None:
    headers = {"Gpufleet-Msg-Id": "x"}
    check_fits(b"x" * (MIB - header_bytes(headers)), headers, MIB)
    with pytest.raises(MessageTooLarge, match="above the server's limit"):
        check_fits(b"x" * (MIB - header_bytes(headers) + 1), headers, MIB)


def test_the_inbound_limit_leaves_room_for_the_envelope() -> None:
    assert inbound_limit(MIB) == MIB - ENVELOPE_ROOM
    assert inbound_limit(100) == 0


def test_a_dead_letter_carries_the_body_when_it_fits_else_an_excerpt_and_its_digest() -> None:
    small = b"{not json"
    headers: dict[str, str] = {"Gpufleet-Dlq-Reason": "r"}
    assert dead_letter_body(small, headers, MIB) == small
    assert "Gpufleet-Original-Sha256" not in headers
    for size in (MIB - 100, MIB - ENVELOPE_ROOM, 3 * MIB):
        data = bytes(range(256)) * (size // 256) + b"x" * (size % 256)
        headers = {"Gpufleet-Dlq-Reason": "r" * 1000, "Gpufleet-Original-Subject": "s" * 1000}
        body = dead_letter_body(data, headers, MIB)
        assert len(body) + header_bytes(headers) <= MIB
        if body != data:
            assert body == data[:DEAD_LETTER_EXCERPT]
            assert headers["Gpufleet-Original-Bytes"] == str(size)
            assert headers["Gpufleet-Original-Sha256"] == hashlib.sha256(data).hexdigest()


@pytest.mark.parametrize(
    ("subject", "inbox"),
    [
        ("p.submit.llm.q", "_INBOX.team-llm"),
        ("p.cancel.llm", "_INBOX.team-llm"),
        ("p.cluster.c1.pods", "_INBOX.cluster-c1"),
        ("p.cluster.c1.a.b", "_INBOX.cluster-c1"),
        ("p.telemetry.c1.dcgm", "_INBOX.cluster-c1"),
        ("p.submit.llm", None),
        ("p.cancel.llm.x", None),
        ("p.events.workload.llm.q.queued", None),
        ("q.submit.llm.q", None),
        ("p.in.submit.llm.q", None),
    ],
)
def test_the_sender_of_a_subject_and_its_own_inbox(subject: str, inbox: str | None) -> None:
    sender = sender_of_subject("p", subject)
    assert (sender.inbox_prefix if sender else None) == inbox
