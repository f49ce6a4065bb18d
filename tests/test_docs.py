"""The generated file map (docs/files.md) is current; every relative link in the README resolves."""

from __future__ import annotations

import re
import runpy
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_file_map_is_current() -> None:
    render = runpy.run_path(str(ROOT / "docs" / "files.py"))["render"]
    current = (ROOT / "docs" / "files.md").read_text(encoding="utf-8")
    assert current == render(), "docs/files.md is stale: run `python docs/files.py`"


def test_every_relative_link_in_the_readme_resolves() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    links = [m for m in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text) if "://" not in m]
    assert links, "the README links its docs pages"
    missing = [link for link in links if not (ROOT / link).exists()]
    assert missing == []
