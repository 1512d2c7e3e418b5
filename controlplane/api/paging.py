"""Pages bounded in bytes as well as items, and the cursor that continues them.

A page is encoded item by item and stops before the next item would take it past its byte cap;
`next` then names the last item sent, so the client goes on from there (`?cursor=`). At least one
item is always sent, so a client always makes progress (an item is far smaller than the cap).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence

from controlplane.service.views import Listed

# `<created_seq>.<id>`: both parts checked, so any cursor the pattern admits names a place in the
# order (one that matches no workload still does: the page starts after where it would be).
CURSOR_PATTERN = r"^[0-9]{1,18}\.[A-Za-z0-9-]{1,40}$"
_CURSOR = re.compile(CURSOR_PATTERN)


def cursor_of(position: tuple[int, str]) -> str:
    return f"{position[0]}.{position[1]}"


def parse_cursor(cursor: str) -> tuple[int, str]:
    """The place a cursor names. The route's query pattern refuses any other shape with a 422."""
    if not _CURSOR.match(cursor):
        raise ValueError(f"not a cursor: {cursor[:50]!r}")
    seq, _, workload_id = cursor.partition(".")
    return int(seq), workload_id


def encode_page(
    rows: Sequence[Listed], limit: int, max_bytes: int, encode: Callable[[Listed], bytes]
) -> tuple[bytes, int]:
    """`{"items": [...], "next": ...}` of at most `limit` of `rows` and at most `max_bytes` (but
    never fewer than one item), and how many items it holds. `rows` may hold one more than `limit`:
    that one only says whether a next page exists."""
    parts: list[bytes] = []
    size = len(b'{"items":[],"next":null}')
    for row in rows[:limit]:
        item = encode(row)
        # The item, its separating comma, and room for the cursor in place of `null`.
        grown = size + len(item) + (1 if parts else 0) + len(json.dumps(cursor_of(row.position)))
        if parts and grown > max_bytes:
            break
        parts.append(item)
        size += len(item) + (1 if len(parts) > 1 else 0)
    more = len(parts) < len(rows)
    following = json.dumps(cursor_of(rows[len(parts) - 1].position)).encode() if more and parts else b"null"
    return b'{"items":[' + b",".join(parts) + b'],"next":' + following + b"}", len(parts)
