"""The line `gpufleet up` prints so a client shell finds an API on a non-default port or state dir."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from controlplane.cli.client_env import export_line, login_line


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def exported(line: str) -> dict[str, str]:
    words = shlex.split(line)
    assert words[0] == "export"
    return dict(word.split("=", 1) for word in words[1:])


def test_defaults_need_no_line(home: Path) -> None:
    assert export_line(8080, home / ".gpufleet") is None


def test_other_port_names_api_and_state_dir(home: Path) -> None:
    line = export_line(9000, home / ".gpufleet")
    assert line is not None
    assert exported(line) == {"GPUFLEET_API": "http://127.0.0.1:9000", "GPUFLEET_STATE_DIR": str(home / ".gpufleet")}


def test_other_state_dir_is_absolute_and_quoted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "my state").mkdir()
    line = export_line(8080, Path("my state"))
    assert line is not None
    assert exported(line) == {"GPUFLEET_API": "http://127.0.0.1:8080", "GPUFLEET_STATE_DIR": str(tmp_path / "my state")}


def test_the_login_line_names_the_port_and_the_admin_token_file(tmp_path: Path) -> None:
    words = shlex.split(login_line(9000, tmp_path / "my state"))
    assert words[:3] == ["gpufleet", "login", "http://127.0.0.1:9000"]
    assert words[words.index("--token-file") + 1] == str(tmp_path / "my state" / "admin.token")
