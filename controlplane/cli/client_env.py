"""What a shell needs so the client commands find an API that `gpufleet up` started on a port or
state dir other than the defaults the client assumes (rest_api.DEFAULT_API, ~/.gpufleet)."""

from __future__ import annotations

import shlex
from pathlib import Path

from controlplane.cli.rest_api import DEFAULT_API, TOKEN_FILE
from controlplane.paths import default_state_dir


def export_line(port: int, state_dir: Path) -> str | None:
    """The `export …` line to paste, or None when the client's defaults already find this API.

    Both variables are printed whenever one is needed, so the line works as is in a fresh shell:
    GPUFLEET_STATE_DIR is where the client reads the admin token from.
    """
    api = f"http://127.0.0.1:{port}"
    state = state_dir.expanduser().resolve()
    if api == DEFAULT_API and state == default_state_dir().resolve():
        return None
    return f"export GPUFLEET_API={shlex.quote(api)} GPUFLEET_STATE_DIR={shlex.quote(str(state))}"


def login_line(port: int, state_dir: Path) -> str:
    """The `gpufleet login` command that saves this API and its admin token as the current context."""
    token = state_dir.expanduser().resolve() / TOKEN_FILE
    return f"gpufleet login http://127.0.0.1:{port} --token-file {shlex.quote(str(token))} --name local-{port}"
