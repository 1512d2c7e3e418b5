"""The generated sections a page may ask for with `<!-- generated: NAME -->`."""

from __future__ import annotations

from collections.abc import Callable

from docsgen.cli_reference import cli_reference
from docsgen.events_reference import events_reference
from docsgen.metrics_reference import metrics_reference
from docsgen.rest_reference import rest_reference
from docsgen.settings_reference import settings_reference

SECTIONS: dict[str, Callable[[], str]] = {
    "cli": cli_reference,
    "rest": rest_reference,
    "settings": settings_reference,
    "metrics": metrics_reference,
    "events": events_reference,
}
