"""Pages capped in bytes as well as items (`controlplane.api.paging`): whatever the items' sizes,
a page is valid JSON within its cap, holds at least one item, and its `next` names its last item."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controlplane.api.paging import cursor_of, encode_page, parse_cursor
from controlplane.service.views import Listed, WorkloadSummary

NOW = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)


def _listed(i: int, label_bytes: int) -> Listed:
    summary = WorkloadSummary(
        id=f"wl-{i:04d}",
        name=f"w{i}",
        team="t",
        queue="q",
        priority_class="batch",
        priority=100,
        kind="training",
        state="queued",
        reason="",
        queue_position=i,
        min_available=1,
        pods=1,
        pod_sets=[],
        requires_isolation=False,
        duration_seconds=None,
        max_runtime_seconds=None,
        spot="allow",
        same_pool="preferred",
        idempotency_key=None,
        labels={"pad": "x" * label_bytes},
        created_at=NOW,
        updated_at=NOW,
        finished_at=None,
        cluster=None,
        node_count=0,
        attempts=0,
    )
    return Listed((1_000_000 - i, summary.id), summary)


def _encode(row: Listed) -> bytes:
    return json.dumps({"id": row.workload.id, "labels": row.workload.labels}).encode()


@given(
    sizes=st.lists(st.integers(0, 3000), min_size=0, max_size=40),
    limit=st.integers(1, 40),
    cap=st.integers(100, 20_000),
)
def test_a_page_fits_its_cap_and_next_continues_after_its_last_item(sizes: list[int], limit: int, cap: int) -> None:
    rows = [_listed(i, size) for i, size in enumerate(sizes)]
    body, count = encode_page(rows, limit, cap, _encode)
    page = json.loads(body)
    assert len(page["items"]) == count <= limit
    assert [item["id"] for item in page["items"]] == [r.workload.id for r in rows[:count]]
    if count > 1:
        assert len(body) <= cap  # a single item may pass the cap: progress beats the bound
    if rows:
        assert count >= 1
    more = count < len(rows)
    assert page["next"] == (cursor_of(rows[count - 1].position) if more else None)
    if more and count < limit:
        # It stopped for bytes: the next item, with its cursor as `next`, would not have fitted.
        without_next = len(body) - len(json.dumps(page["next"])) + len("null")
        grown = without_next + 1 + len(_encode(rows[count])) + len(json.dumps(cursor_of(rows[count].position)))
        assert grown > cap


def test_cursors_round_trip_and_only_their_shape_is_accepted() -> None:
    assert parse_cursor(cursor_of((1714557600000000, "wl-0a1b"))) == (1714557600000000, "wl-0a1b")
    for bad in ("", "1", "1.", ".wl", "-1.wl", "1.wl 0", "1.wl/0", "9" * 19 + ".wl"):
        with pytest.raises(ValueError, match="not a cursor"):
            parse_cursor(bad)
