"""The docs hold together: the generated file map (docs/files.md) is current, every relative link
in the README and the docs pages resolves (files and #anchors), each page stays under ~400
lines, and no user page cites the project's issue numbers."""

from __future__ import annotations

import re
import runpy
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
GENERATED = {"files.md"}
MAX_LINES = 400
LINK = re.compile(r"\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~)")
ISSUE = re.compile(r"(?<![\w/])#\d{2}\b|\bissues? \d{2}\b", re.IGNORECASE)


def pages() -> list[Path]:
    """The README and every hand-written docs page."""
    return [ROOT / "README.md", *sorted(p for p in DOCS.glob("*.md") if p.name not in GENERATED)]


def prose(text: str) -> str:
    """The text outside fenced code blocks and inline code (links and headings live there)."""
    out, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line.strip()):
            fenced = not fenced
            continue
        if not fenced:
            out.append(re.sub(r"`[^`]*`", "", line))
    return "\n".join(out)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading anchor of a Markdown file, with GitHub's -1, -2 suffixes for repeats."""
    seen: dict[str, int] = {}
    out = set()
    fenced = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if FENCE.match(line.strip()):
            fenced = not fenced
        if fenced or not line.startswith("#"):
            continue
        base = slug(line.lstrip("#"))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def broken_links(page: Path) -> list[str]:
    """The relative links of `page` whose file, or whose #anchor in a Markdown file, is missing."""
    bad = []
    for target in LINK.findall(prose(page.read_text(encoding="utf-8"))):
        if "://" in target or target.startswith("mailto:"):
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            bad.append(f"{page.name}: {target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            bad.append(f"{page.name}: {target} (no heading #{anchor} in {dest.name})")
    return bad


def test_the_file_map_is_current() -> None:
    render = runpy.run_path(str(DOCS / "files.py"))["render"]
    current = (DOCS / "files.md").read_text(encoding="utf-8")
    assert current == render(), "docs/files.md is stale: run `python docs/files.py`"


def test_every_relative_link_resolves() -> None:
    readme = prose((ROOT / "README.md").read_text(encoding="utf-8"))
    assert "docs/diagnose.md" in LINK.findall(readme), "the README links its docs pages"
    assert [bad for page in pages() for bad in broken_links(page)] == []


def test_the_anchor_rule_is_github_s() -> None:
    assert slug("Quantized weights (`--weights`)") == "quantized-weights---weights"
    assert slug("Replicas: measured, horizontal against vertical") == \
        "replicas-measured-horizontal-against-vertical"
    assert slug("A busy neighbour") == "a-busy-neighbour"


def test_every_docs_page_is_under_the_length_limit() -> None:
    long = {p.name: n for p in pages()[1:]
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert long == {}, f"split these pages by topic (at most {MAX_LINES} lines each)"


def test_no_user_page_cites_an_issue_number() -> None:
    cited = {p.name: ISSUE.findall(prose(p.read_text(encoding="utf-8"))) for p in pages()}
    assert {name: hits for name, hits in cited.items() if hits} == {}
