"""The one renderer: every decision type has a sentence that starts with its kind, and fields that
are plain JSON."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from controlplane.core.decision import (
    BehindHeads,
    BorrowingLimit,
    Eviction,
    EvictionKind,
    FairShareTurn,
    IsolationOnlyTimeSliced,
    NeverFits,
    NoFit,
    NotConsidered,
    NotLent,
    OutsideGuarantee,
    PendingKind,
    PendingReason,
    QuotaLimit,
    ReservationNote,
    SchedulingFailed,
    UnusableQuota,
    Why,
)
from controlplane.service.wording import eviction_fields, eviction_text, pending_fields, pending_text

EVERY_WHY: list[Why] = [
    NoFit(4, "sim-h100", 2),
    NoFit(1, None),
    NoFit(1, "c1", 0, ("guarded",), datetime(2026, 1, 1, tzinfo=UTC)),
    NeverFits(3, "c1", 1),
    NeverFits(2, None, only_over_pools=True),
    NeverFits(1, None),
    IsolationOnlyTimeSliced(),
    FairShareTurn("q1", 0.25, ("a", "b", "c"), 2),
    QuotaLimit("q1", "gpu-eq", 4.0, 1.0),
    QuotaLimit("t1", "gpu-eq", 6.0, 8.0, never=True),
    BehindHeads("q1", 16),
    BorrowingLimit("team", "H100-80GB", 8.0),
    OutsideGuarantee(),
    OutsideGuarantee(2.5),
    NotLent("gpu-eq"),
    UnusableQuota("q1", "limit", "gpu-eq", "inf"),
    UnusableQuota("q1", "weight", None, "nan"),
    SchedulingFailed("ValueError", "boom"),
    NotConsidered(3),
]

PREFIX = {
    PendingKind.NO_FIT: "no-fit:",
    PendingKind.NEVER_FITS: "never-fits: can never fit in this fleet",
    PendingKind.ISOLATION: "isolation:",
    PendingKind.FAIR_SHARE: "fair-share:",
    PendingKind.BEHIND: "behind: waits its turn in queue",
    PendingKind.ERROR: "error:",
    PendingKind.NOT_CONSIDERED: "error: not considered",
}


@pytest.mark.parametrize("why", EVERY_WHY, ids=lambda why: type(why).__name__)
def test_every_pending_reason_has_a_sentence_led_by_its_kind_and_json_fields(why: Why) -> None:
    reason = PendingReason("w", why)
    text = pending_text(reason)
    assert text.startswith("quota:" if reason.kind.is_quota else PREFIX[reason.kind])
    fields = pending_fields(reason)
    assert fields["kind"] == reason.kind.value
    assert json.loads(json.dumps(fields)) == fields


def test_the_known_sentences_stay_as_they_were() -> None:
    assert pending_text(PendingReason("w", QuotaLimit("q1", "gpu-eq", 0.4, 0.5))) == (
        "quota: q1 limit is 0.4 gpu-eq and its work in use leaves less than the 0.5 this gang needs"
    )
    assert pending_text(PendingReason("w", NoFit(1, None))) == (
        "no-fit: needs 1 pods placed at once in one cluster; no cluster has room for any"
    )
    fair = pending_text(PendingReason("w", FairShareTurn("q1", 0.25, ("a", "b", "c"), 2)))
    assert fair == (
        "fair-share: queue q1 (share 0.250) waits its turn; queues ordered ahead of it by fair share "
        "(a, b, c and 2 more) took the capacity it fits this cycle"
    )


def test_a_reservation_is_appended_and_carried_as_fields() -> None:
    due = datetime(2026, 1, 1, tzinfo=UTC)
    reason = PendingReason("w", NoFit(8, "east", 4), ReservationNote(2, "east", "big", due))
    assert pending_text(reason).endswith(
        f"; reservation: 2 node(s) of cluster east held for big, due by {due.isoformat()}"
    )
    assert pending_fields(reason)["reservation"] == {
        "nodes": 2,
        "cluster": "east",
        "holder": "big",
        "due": due.isoformat(),
    }
    waiting = PendingReason("w", NoFit(8, "east", 4), ReservationNote(2, "east", "big", None))
    assert pending_text(waiting).endswith("due when running work ends")


@pytest.mark.parametrize("kind", list(EvictionKind))
def test_every_eviction_kind_names_its_end_cause_and_beneficiary(kind: EvictionKind) -> None:
    eviction = Eviction("v", "run", kind, "b-id", "urgent", "qa", 10, "qb", 1)
    text = eviction_text(eviction)
    assert text.startswith(f"{eviction.end_cause}:")
    assert "urgent" in text
    fields = eviction_fields(eviction)
    assert fields["kind"] == kind.value
    assert fields["end_cause"] == eviction.end_cause.value
    assert json.loads(json.dumps(fields)) == fields


def test_a_victim_protected_by_its_minimum_runtime_is_named_with_when_protection_ends() -> None:
    until = datetime(2026, 1, 1, 12, tzinfo=UTC)
    text = pending_text(PendingReason("w", NoFit(1, "c1", 0, ("a", "b"), until)))
    assert text.endswith(
        "; evicting a, b would make room, but a, b are protected by their minimum runtime "
        "until 2026-01-01T12:00:00+00:00"
    )
