"""Every scenario in cases/ runs through the real core and must meet its `expect:` section.

A scenario with a top-level `xfail: "<why>"` pins behaviour that is not built yet: it is a
strict xfail, so it fails the suite the moment it starts passing and its mark must go.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from controlplane.scenario.expect import check_expectations
from controlplane.scenario.runner import run_scenario
from controlplane.scenario.validate import parse_scenario

CASES = Path(__file__).parent / "cases"
FILES = sorted(CASES.glob("*.yaml"))


def _load(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def _case(path: Path) -> Any:
    data = _load(path)
    why = data.get("xfail") if isinstance(data, dict) else None
    marks = [pytest.mark.xfail(strict=True, reason=str(why))] if why else []
    return pytest.param(path, id=path.stem, marks=marks)


@pytest.mark.parametrize("path", [_case(path) for path in FILES])
def test_scenario(path: Path) -> None:
    doc = parse_scenario(_load(path))
    assert doc.expect is not None, "a scenario test states what it expects"
    result = run_scenario(doc)
    failures = check_expectations(doc.expect, result)
    assert not failures, "\n".join(failures)


def test_the_suite_covers_enough_scenarios() -> None:
    assert len(FILES) >= 45
    assert all(path.name == path.name.lower() for path in FILES)
