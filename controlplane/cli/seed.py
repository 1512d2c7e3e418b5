"""What a fresh installation needs before teams can submit: schema, priority classes, an admin token."""

from __future__ import annotations

from pathlib import Path

from controlplane import bootstrap
from controlplane.bootstrap.wiring import write_secret
from controlplane.service import admin, auth
from controlplane.service.commands import PriorityClassSpec, TokenSpec


def ensure_admin_token_file(wiring: bootstrap.Wiring, path: Path) -> str:
    """The admin token of this state dir: kept across restarts, issued on first start."""
    if path.exists():
        return path.read_text().strip()
    _, raw = auth.issue_token(wiring.uow(), TokenSpec(name="up-admin", role="admin"), "up", bootstrap.utc_now())
    write_secret(path, raw)
    return raw


def seed_defaults(wiring: bootstrap.Wiring) -> None:
    if admin.list_priority_classes(wiring.uow()):
        return
    now = bootstrap.utc_now()
    for spec in (
        PriorityClassSpec(name="batch", value=100, is_default=True),
        PriorityClassSpec(name="production", value=1000, preemptible=False),
    ):
        admin.put_priority_class(wiring.uow(), spec, "up", now)
