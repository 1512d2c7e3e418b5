"""The HTML report page: well-formed, self-contained, escaped, one plot per figure, and honest when
a report is empty."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from typing import Any

import click
import pytest

from controlplane.cli.report_commands import parse_bucket
from controlplane.cli.report_html import page

HOSTILE = "<script>alert(1)</script>\"'&<img src=x onerror=alert(2)>"
START = "2026-05-01T00:00:00Z"


class Collect(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def parse(html: str) -> Collect:
    parser = Collect()
    parser.feed(html)
    parser.close()
    return parser


def reports(team: str) -> dict[str, Any]:
    bucket = {"bucket_start": START, "bucket_end": "2026-05-01T01:00:00Z"}
    return {
        "waiting": {
            "start": START,
            "end": START,
            "note": "lower bounds",
            "rows": [{"team": team, "queue": team, "size": "<=1", "workloads": 1, "p50_seconds": 60.0}],
            "teams": [{"team": team, "queue": "all", "size": "all", "p50_seconds": 60.0, "p95_seconds": 90.0}],
            "total": {"team": "all", "workloads": 1},
        },
        "fairness": {
            "by": "team",
            "rows": [{**bucket, "team": team, "queue": "all", "share": 0.5, "entitlement": 0.25}],
        },
        "cost": {"group_by": "team", "groups": [{"group": team, "allocated_cost": 10.0, "used_cost": 2.0}]},
        "timeline": {
            "group_by": "team",
            "rows": [{**bucket, "group": team, "allocated_gpu_hours": 3.0, "used_gpu_hours": 1.0}],
        },
    }


def test_a_hostile_team_name_is_text_everywhere() -> None:
    html = page(f"report {HOSTILE}", reports(HOSTILE))
    parsed = parse(html)
    assert "script" not in parsed.tags
    assert "img" not in parsed.tags
    assert "<script" not in html
    assert "onerror=alert" not in html.replace("onerror=alert(2)&gt;", "")  # only as escaped text
    assert HOSTILE in "".join(parsed.text)  # still shown, as text
    svgs = re.findall(r"<svg\b.*?</svg>", html, flags=re.DOTALL)
    assert len(svgs) == 5  # timeline 2, waiting 1, fairness 1, cost 1
    for svg in svgs:
        ET.fromstring(svg)  # each plot is well-formed XML


def test_every_section_renders_and_empty_reports_say_no_data() -> None:
    empty = {
        "timeline": {"rows": []},
        "utilization": {"groups": [], "total": {}},
        "waiting": {"rows": [], "teams": [], "total": {}},
        "fairness": {"rows": []},
        "evictions": {"rows": [], "by_kind": [], "total": {}},
        "cost": {"groups": [], "total": {}},
    }
    html = page("empty", empty)
    parsed = parse(html)
    assert parsed.tags.count("section") == 6
    assert parsed.tags.count("svg") == 7
    assert html.count('class="no-data"') == 7
    assert "http" not in html.replace("http://www.w3.org/2000/svg", "")


@pytest.mark.parametrize(("text", "seconds"), [("3600", 3600), ("30m", 1800), ("6h", 21600), ("1d", 86400)])
def test_bucket_durations(text: str, seconds: int) -> None:
    assert parse_bucket(text) == seconds


def test_a_bad_bucket_is_refused() -> None:
    with pytest.raises(click.BadParameter):
        parse_bucket("soon")
