"""Where a local installation keeps its state, shared by the server's settings and the CLI client.

Its own module so the client can find the state dir without importing the settings (pydantic-settings
and the service layer's parsers are most of a client command's start-up time otherwise).
"""

from __future__ import annotations

from pathlib import Path


def default_state_dir() -> Path:
    return Path.home() / ".gpufleet"
