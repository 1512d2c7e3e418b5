"""mkdocs hook (named in mkdocs.yml `hooks:`): fills each `<!-- generated: NAME -->` marker with the
section docsgen writes from the code, so the reference pages are never stale and nothing generated
is committed (several branches change the CLI, the API and the settings at once; committed copies
would conflict at every merge and go stale between them).

An unknown marker, or a section that cannot be generated, fails the build.
"""

from __future__ import annotations

import re
import sys
from functools import cache
from pathlib import Path
from typing import Any

# mkdocs loads this file by path; the generators import the project's packages from its root, first
# (an editable install of another checkout, such as a shared virtualenv's, must not answer instead).
_ROOT = Path(__file__).resolve().parents[1]
sys.path[:] = [str(_ROOT), *(entry for entry in sys.path if entry != str(_ROOT))]

# mkdocs restores sys.path once its hooks are loaded, so the project's packages are bound now: their
# submodules, imported later by the generators, are then found inside them, in this checkout.
import adapters  # noqa: E402
import controlplane  # noqa: E402
from docsgen.sections import SECTIONS  # noqa: E402

_BOUND = (adapters, controlplane)

MARKER = re.compile(r"^<!-- generated: ([a-z-]+) -->$", re.MULTILINE)


@cache
def _section(name: str) -> str:
    return SECTIONS[name]()


def fill(markdown: str, where: str) -> str:
    def replace(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in SECTIONS:
            raise ValueError(f"{where}: no generated section {name!r}; known: {', '.join(sorted(SECTIONS))}")
        return _section(name)

    return MARKER.sub(replace, markdown)


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    return fill(markdown, str(page.file.src_uri))
