"""Where the client commands find the API when no --api is given: named contexts, like kubectl's.

`gpufleet login` checks an API URL and token and saves them as a context in the client's config
file (`$GPUFLEET_CLIENT_CONFIG`, default `~/.gpufleet/client.yaml`), made current; `gpufleet context`
lists, switches and deletes them. The file holds tokens, so it is written readable by its owner
only, and replaced whole (never half-written). Nothing else in gpufleet reads it.

Resolution (`resolve`): --api / $GPUFLEET_API, else the current context's API, else the local
default (`gpufleet up`'s). The token: --token / $GPUFLEET_TOKEN, else the token of the context
whose API is used, else the admin token `gpufleet up` wrote to the state directory.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import click
import yaml

from controlplane.paths import default_state_dir

CONFIG_ENV = "GPUFLEET_CLIENT_CONFIG"
CONFIG_FILE = "client.yaml"


def config_path() -> Path:
    configured = os.environ.get(CONFIG_ENV)
    return Path(configured).expanduser() if configured else default_state_dir() / CONFIG_FILE


@dataclass(frozen=True)
class Context:
    name: str
    api: str
    token: str | None = None


@dataclass
class Contexts:
    current: str | None = None
    by_name: dict[str, Context] = field(default_factory=dict)

    def active(self) -> Context | None:
        return self.by_name.get(self.current) if self.current else None


def load(path: Path | None = None) -> Contexts:
    """The saved contexts; none when the file does not exist. A file that is not ours says so."""
    path = path or config_path()
    try:
        text = path.read_text()
    except FileNotFoundError:
        return Contexts()
    except OSError as exc:
        raise click.ClickException(f"cannot read the gpufleet client config {path}: {exc}") from exc
    try:
        data = yaml.safe_load(text) or {}
        contexts = {
            str(name): Context(str(name), str(entry["api"]), entry.get("token") or None)
            for name, entry in (data.get("contexts") or {}).items()
        }
        current = data.get("current")
    except (yaml.YAMLError, AttributeError, KeyError, TypeError) as exc:
        raise click.ClickException(
            f"{path} is not a gpufleet client config (contexts: NAME: {{api, token}}, current: NAME): {exc}"
        ) from exc
    return Contexts(str(current) if current in contexts else None, contexts)


def save(contexts: Contexts, path: Path | None = None) -> Path:
    """Write the contexts, readable by the owner only, replacing the file whole."""
    path = path or config_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {
        "current": contexts.current,
        "contexts": {
            c.name: {"api": c.api, **({"token": c.token} if c.token else {})} for c in contexts.by_name.values()
        },
    }
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=".config-", suffix=".yaml")
    try:
        os.fchmod(handle, 0o600)
        with os.fdopen(handle, "w") as out:
            yaml.safe_dump(data, out, sort_keys=False)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return path


def resolve(api: str | None, token: str | None, default_api: str) -> tuple[str, str | None]:
    """The API URL and the token a command uses (see the module's rule); the token may still be
    None, for the state directory's admin token to fill in."""
    if api and token:
        return api, token
    active = load().active()
    if not api:
        api = active.api if active else default_api
    if not token and active is not None and active.api.rstrip("/") == api.rstrip("/"):
        token = active.token
    return api, token
