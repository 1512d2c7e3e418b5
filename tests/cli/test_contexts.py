"""The client's saved contexts (`gpufleet login`): which API and token a command uses, and a
config file that is not ours said so plainly."""

from __future__ import annotations

import json
from pathlib import Path

import click
import pytest
import yaml
from click.testing import CliRunner

from controlplane.cli import contexts
from controlplane.cli.main import main


@pytest.fixture
def config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "config.yaml"
    monkeypatch.setenv(contexts.CONFIG_ENV, str(path))
    return path


def test_options_win_then_the_current_context_then_the_local_default(config: Path) -> None:
    assert contexts.resolve(None, None, "http://local") == ("http://local", None)
    saved = contexts.Contexts("lab", {"lab": contexts.Context("lab", "https://lab.example", "t-lab")})
    contexts.save(saved)
    assert contexts.resolve(None, None, "http://local") == ("https://lab.example", "t-lab")
    assert contexts.resolve(None, "mine", "http://local") == ("https://lab.example", "mine")
    # Another API named on the command line never gets the context's token.
    assert contexts.resolve("https://other.example", None, "http://local") == ("https://other.example", None)
    assert contexts.resolve("https://lab.example/", None, "http://local") == ("https://lab.example/", "t-lab")


def test_a_file_that_is_not_a_client_config_is_named_in_the_error(config: Path) -> None:
    config.write_text("contexts: [1, 2]\n")
    with pytest.raises(click.ClickException, match="is not a gpufleet client config"):
        contexts.load()
    config.write_text("current: gone\ncontexts: {}\n")
    assert contexts.load().active() is None  # a current context that was deleted by hand: none


def test_context_list_prints_yaml_and_json_alike_and_never_a_token(config: Path) -> None:
    saved = contexts.Contexts("lab", {"lab": contexts.Context("lab", "https://lab.example", "gpf_secret")})
    contexts.save(saved)
    runner = CliRunner()
    as_json = runner.invoke(main, ["context", "list", "-o", "json"])
    as_yaml = runner.invoke(main, ["context", "list", "-o", "yaml"])
    table = runner.invoke(main, ["context", "list"])
    for result in (as_json, as_yaml, table):
        assert result.exit_code == 0, result.output
        assert "gpf_secret" not in result.output
    expected = {"current": "lab", "contexts": [{"name": "lab", "api": "https://lab.example", "token_saved": True}]}
    assert json.loads(as_json.stdout) == yaml.safe_load(as_yaml.stdout) == expected
    assert "https://lab.example" in table.stdout
