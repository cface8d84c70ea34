"""Every link between the README and the pages under docs/ lands: the file is there and, where
the link names a section, the page has that heading (issue 40: run logs moved out of the
reference pages into docs/results/, and a link to a moved section must follow it)."""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path
from urllib.parse import unquote, urlsplit

from markdown_it import MarkdownIt

ROOT = Path(__file__).parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def tokens(page: Path) -> list:
    """The page's inline tokens' children, flattened (markdown-it-py, rich's own parser)."""
    found = []
    for block in MarkdownIt("commonmark").enable("table").parse(page.read_text()):
        found.append(block)
        found.extend(block.children or [])
    return found


def slug(text: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens (as
    mdit_py_plugins.anchors' slugify)."""
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


@cache
def anchors(page: Path) -> set[str]:
    """The section anchors of `page`, a repeated heading numbered as GitHub numbers it."""
    seen: dict[str, int] = {}
    found = set()
    stream = MarkdownIt("commonmark").parse(page.read_text())
    for opening, inline in zip(stream, stream[1:]):
        if opening.type == "heading_open":
            base = slug("".join(child.content for child in inline.children or []))
            found.add(base if base not in seen else f"{base}-{seen[base]}")
            seen[base] = seen.get(base, 0) + 1
    return found


def links(page: Path) -> list[str]:
    """The page's links and images that point inside the repository."""
    out = []
    for token in tokens(page):
        target = token.attrs.get("href") or token.attrs.get("src") if token.attrs else None
        if target and not urlsplit(target).scheme and not target.startswith("//"):
            out.append(target)
    return out


def test_every_link_in_the_readme_and_docs_lands_on_a_file_and_a_heading():
    broken = []
    for page in PAGES:
        for target in links(page):
            path, _, fragment = target.partition("#")
            file = (page.parent / unquote(path)).resolve() if path else page
            if not file.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
            elif fragment and file.suffix == ".md" and unquote(fragment) not in anchors(file):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


def test_the_link_check_sees_a_moved_section():
    """The check itself: the README's link to the agents replay is found and, pointed at the
    reference page the section left, would be refused."""
    readme = ROOT / "README.md"
    assert "docs/results/drafting.md#the-agents-replay" in links(readme)
    assert "the-agents-replay" in anchors(ROOT / "docs" / "results" / "drafting.md")
    assert "the-agents-replay" not in anchors(ROOT / "docs" / "drafting.md")
