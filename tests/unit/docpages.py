"""The README and docs/ as the docs checks read them: the pages, their prose, their code."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def router_code() -> str:
    """The router's source, every module of it in one text."""
    return "\n".join(p.read_text() for p in (ROOT / "router").rglob("*.py"))


def prose(text: str) -> str:
    """The page without fenced code blocks or inline code spans, where a link is only text."""
    lines, fenced = [], False
    for line in text.splitlines():
        if re.match(r" {0,3}(```|~~~)", line):
            fenced = not fenced
        elif not fenced:
            lines.append(re.sub(r"(`+).*?\1", "", line))
    return "\n".join(lines)


def fenced_after(text: str, heading: str) -> str:
    """The first fenced block after ``heading`` in ``text``."""
    match = re.search(rf"^{re.escape(heading)}\n.*?^```[a-z]*\n(.*?)^```", text, re.S | re.M)
    assert match, f"no fenced block after {heading!r}"
    return match.group(1)


def code_of(text: str) -> list[str]:
    """The page's fenced blocks and inline code spans: where commands, variables and names are written."""
    blocks = re.findall(r"^ {0,3}```[a-z]*\n(.*?)^ {0,3}```", text, re.S | re.M)
    return blocks + re.findall(r"(?<!`)`([^`\n]+)`(?!`)", prose_with_spans(text))


def prose_with_spans(text: str) -> str:
    """The page without its fenced blocks (inline code kept)."""
    return re.sub(r"^ {0,3}```[a-z]*\n.*?^ {0,3}```", "", text, flags=re.S | re.M)
