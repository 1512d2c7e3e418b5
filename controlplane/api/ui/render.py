"""Templates, the page list and the headers every dashboard answer carries.

Jinja2 autoescapes every value: names, reasons and messages come from users and are shown as text.
Plots are SVG built by `controlplane.render.plots`, which escapes its own text; they are marked safe
here and nowhere else.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from fastapi import Request
from fastapi.responses import HTMLResponse
from jinja2 import Environment, FileSystemLoader, select_autoescape

from controlplane.service.views import Principal

NONE = "\u2013"  # an en dash: no value

HERE = Path(__file__).parent
STATIC_DIR = HERE / "static"
STATIC_PATH = "/ui/static"

# Scripts and styles only from this server's own files (no inline script, no eval), nothing from
# the network, no framing; the feed's script may only call back to this server.
UI_CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)


@dataclass(frozen=True)
class Page:
    path: str
    title: str


# The dashboard's pages, in the order of the navigation bar: a new page is one entry here plus its
# route in `pages.py`.
PAGES: list[Page] = [
    Page("/ui/fleet", "Fleet"),
    Page("/ui/queues", "Queues"),
    Page("/ui/workloads", "Workloads"),
    Page("/ui/idle", "Idle GPUs"),
    Page("/ui/utilization", "Utilization"),
    Page("/ui/audit", "Audit"),
    Page("/ui/events", "Events"),
]


def _number(value: float | None, digits: int = 1) -> str:
    if value is None:
        return NONE
    if float(value).is_integer():
        return f"{int(value):,}"
    return f"{value:,.{digits}f}"


def _when(value: datetime | None) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%S UTC") if value else NONE


def _percent(value: float | None) -> str:
    return NONE if value is None else f"{value:.0%}"


def _sharing(mode: str) -> str:
    """`mig:all-balanced` -> `MIG (all-balanced)`, `timeslice:4` -> `time-slice, 4 per GPU`."""
    if mode.startswith("mixed: "):  # pools of one model with different modes (`dashboard.fleet`)
        return "mixed: " + " + ".join(_sharing(part) for part in mode.removeprefix("mixed: ").split(" + "))
    kind, _, detail = mode.partition(":")
    names = {"mig": "MIG", "mps": "MPS", "timeslice": "time-slice", "exclusive": "exclusive"}
    name = names.get(kind, kind)
    if not detail:
        return name
    return f"{name} ({detail})" if kind == "mig" else f"{name}, {detail} per GPU"


templates = Environment(
    loader=FileSystemLoader(HERE / "templates"),
    autoescape=select_autoescape(default=True, default_for_string=True),
    trim_blocks=True,
    lstrip_blocks=True,
)
templates.filters["number"] = _number
templates.filters["when"] = _when
templates.filters["percent"] = _percent
templates.filters["sharing"] = _sharing


def page(
    request: Request, template: str, who: Principal | None, team: str | None, status: int = 200, **values: Any
) -> HTMLResponse:
    body = templates.get_template(template).render(
        pages=PAGES,
        current=request.url.path,
        who=who,
        team=team,
        static=STATIC_PATH,
        **values,
    )
    return HTMLResponse(body, status_code=status, headers=ui_headers())


def ui_headers() -> dict[str, str]:
    # same-origin, not the API's no-referrer: under no-referrer a browser sends `Origin: null` with
    # the page's own form posts, and the login's same-origin check could not tell them from forgeries.
    return {"Content-Security-Policy": UI_CSP, "Cache-Control": "no-store", "Referrer-Policy": "same-origin"}
