"""`gpufleet server init` prepares an installation the way the compose file relies on."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from controlplane.bootstrap import Wiring
from controlplane.cli.main import main
from controlplane.config import Settings
from controlplane.service.admin import list_clusters, list_priority_classes
from controlplane.service.auth import authenticate


def test_init_migrates_seeds_and_issues_one_admin_token(tmp_path: Path, monkeypatch: object) -> None:
    state = tmp_path / "state"
    token_file = tmp_path / "secrets" / "admin.token"
    env = {"GPUFLEET_STATE_DIR": str(state), "GPUFLEET_DATABASE_URL": ""}
    runner = CliRunner()
    first = runner.invoke(main, ["server", "init", "--admin-token-file", str(token_file), "--sim-fleet"], env=env)
    assert first.exit_code == 0, first.output
    assert "written to" in first.output
    token = token_file.read_text().strip()
    assert token not in first.output
    assert oct(token_file.stat().st_mode & 0o777) == "0o600"
    again = runner.invoke(main, ["server", "init", "--admin-token-file", str(token_file)], env=env)
    assert again.exit_code == 0, again.output
    assert "kept in" in again.output
    assert token_file.read_text().strip() == token
    wiring = Wiring(Settings(state_dir=state))
    try:
        principal = authenticate(wiring.uow(), token)
        assert principal is not None
        assert principal.is_admin
        assert [pc.name for pc in list_priority_classes(wiring.uow())] == ["production", "batch"]
        assert sorted(c.provider for c in list_clusters(wiring.uow())) == ["sim"] * 4
    finally:
        wiring.close()
