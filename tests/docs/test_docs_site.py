"""The documentation site builds strictly, its reference pages are generated from the code, and the
README stays a short front page that still opens with the two commands."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest
from click import Context
from mkdocs.commands.build import build
from mkdocs.config import load_config

from controlplane.cli.main import main
from docsgen import mkdocs_hook
from docsgen.sections import SECTIONS

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
README_MAX_LINES = 200
SET_UP_AND_RUN = "pip install uv && uv sync --frozen && uv run gpufleet up --demo"
RUN_THE_TESTS = "./scripts/test"

# A string each generated reference page must show, read from the code it is generated from.
GENERATED = {
    "reference/cli/index.html": "gpufleet team create",
    "reference/rest/index.html": "POST /v1/workloads",
    "reference/settings/index.html": "GPUFLEET_DATABASE_URL",
    "reference/metrics/index.html": "gpufleet_admissions_total",
    "reference/events/index.html": "workload.cancelled",
}


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`mkdocs build --strict`, in this process (the generators' imports are then paid once)."""
    out = tmp_path_factory.mktemp("site")
    config = load_config(config_file=str(ROOT / "mkdocs.yml"), site_dir=str(out), strict=True)
    logging.getLogger("mkdocs").setLevel(logging.WARNING)
    build(config)  # raises mkdocs.exceptions.Abort on any warning in strict mode
    return out


def test_the_site_builds_strictly_with_every_reference_page_generated(site: Path) -> None:
    for page, expected in GENERATED.items():
        html = (site / page).read_text()
        assert expected in html, f"{page} does not show {expected!r}"
        assert "generated:" not in html, f"{page} kept a generation marker"


def test_every_command_of_the_cli_is_on_its_page(site: Path) -> None:
    html = (site / "reference/cli/index.html").read_text()
    ctx = Context(main, info_name="gpufleet")
    for name in main.list_commands(ctx):
        assert f"gpufleet {name}" in html, f"gpufleet {name} is missing from the CLI reference"


def test_generation_is_deterministic() -> None:
    for name, generate in SECTIONS.items():
        assert generate() == generate(), f"the {name} section differs between two runs"


def test_an_unknown_marker_fails_the_build() -> None:
    with pytest.raises(ValueError, match="no generated section 'nope'"):
        mkdocs_hook.fill("# Page\n\n<!-- generated: nope -->\n", "page.md")


def test_the_readme_is_short_and_opens_with_the_two_commands() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; move detail to docs/"
    top = lines[:40]
    assert SET_UP_AND_RUN in top, "the README's first command (set up and run) is gone from its top"
    assert RUN_THE_TESTS in top, "the README's second command (the test suite) is gone from its top"
    assert "## Architecture" in lines, "the README keeps a short architecture section"
    assert any("uv run mkdocs serve" in line for line in lines), "the README says how to serve the docs"


def test_ci_runs_the_readmes_test_command() -> None:
    assert (ROOT / ".ci" / "run").read_text().rstrip().endswith(f"exec {RUN_THE_TESTS}")


def test_the_readmes_links_point_at_files_that_exist() -> None:
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", README.read_text())
    local = [link for link in links if "://" not in link]
    assert local, "the README links to the docs"
    missing = [link for link in local if not (ROOT / link).exists()]
    assert not missing, f"README links to missing files: {missing}"
