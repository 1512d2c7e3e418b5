"""Templates, the page list and the headers every dashboard answer carries.

Jinja2 autoescapes every value: names, reasons and messages come from users and are shown as text.
Plots are SVG built by `controlplane.render.plots`, which escapes its own text; they are marked safe
here, and the `ago` filter builds its `<time>` element with `Markup.format` (which escapes every value).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from fastapi import Request
from fastapi.responses import HTMLResponse
from jinja2 import Environment, FileSystemLoader, select_autoescape
from markupsafe import Markup

from controlplane.api.ui.session import csrf_token
from controlplane.service.views import Principal

NONE = "\u2013"  # an en dash: no value
TIMES = "\u00d7"  # the multiplication sign

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


def _span(seconds: float) -> str:
    """A duration as people say it: `45 s`, `12 min`, `3 h 5 min`, `2 d 4 h`."""
    seconds = max(0, int(seconds))
    if seconds < 60:
        return f"{seconds} s"
    minutes, hours, days = seconds // 60, seconds // 3600, seconds // 86400
    if minutes < 60:
        return f"{minutes} min"
    if hours < 24:
        rest = minutes % 60
        return f"{hours} h {rest} min" if rest else f"{hours} h"
    rest = hours % 24
    return f"{days} d {rest} h" if rest else f"{days} d"


def _ago(value: datetime | None, now: datetime | None = None) -> Markup:
    """A `<time>` saying how long ago (`3 min ago`), the exact UTC time on hover (its title) and in
    its `datetime` attribute. Escaped here: the one filter that returns markup."""
    if value is None:
        return Markup(NONE)  # noqa: S704 - a constant
    now = now or datetime.now(UTC)
    delta = (now - value).total_seconds()
    said = "just now" if abs(delta) < 5 else (f"{_span(delta)} ago" if delta > 0 else f"in {_span(-delta)}")
    return Markup('<time datetime="{}" title="{}">{}</time>').format(value.isoformat(), _when(value), said)


def _waited(seconds: float | None) -> str:
    return NONE if not seconds else _span(seconds)


def _pod_gpus(pod_set: Mapping[str, Any]) -> str:
    """What one pod of a pod set asks for: `8 GPU`, `MIG 3g.40gb`, `0.5 of a GPU`, `no GPU`."""
    if pod_set.get("mig_profile"):
        return f"MIG {pod_set['mig_profile']}"
    if pod_set.get("gpu_fraction"):
        return f"{pod_set['gpu_fraction']:g} of a GPU"
    gpus = int(pod_set.get("gpus") or 0)
    return f"{gpus} GPU" if gpus else "no GPU"


def _gpus(pod_sets: Sequence[Mapping[str, Any]]) -> str:
    """A workload's GPU ask: `2 TIMES 8 GPU`, `3 TIMES MIG 1g.10gb + 1 TIMES 1 GPU` (TIMES: the sign)."""
    return " + ".join(f"{p.get('replicas', 0)} {TIMES} {_pod_gpus(p)}" for p in pod_sets) or NONE


def _models(pod_sets: Sequence[Mapping[str, Any]]) -> str:
    """The GPU models a workload accepts, or `any`."""
    models = sorted({str(m) for p in pod_sets for m in p.get("gpu_models") or ()})
    return ", ".join(models) if models else "any"


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
templates.filters["ago"] = _ago
templates.filters["waited"] = _waited
templates.filters["gpus"] = _gpus
templates.filters["pod_gpus"] = _pod_gpus
templates.filters["models"] = _models


def page(
    request: Request, template: str, who: Principal | None, team: str | None, status: int = 200, **values: Any
) -> HTMLResponse:
    body = templates.get_template(template).render(
        pages=PAGES,
        current=request.url.path,
        who=who,
        team=team,
        static=STATIC_PATH,
        csrf=csrf_token(request),
        **values,
    )
    return HTMLResponse(body, status_code=status, headers=ui_headers())


def ui_headers() -> dict[str, str]:
    # same-origin, not the API's no-referrer: under no-referrer a browser sends `Origin: null` with
    # the page's own form posts, and the login's same-origin check could not tell them from forgeries.
    return {"Content-Security-Policy": UI_CSP, "Cache-Control": "no-store", "Referrer-Policy": "same-origin"}
