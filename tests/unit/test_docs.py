"""What the docs promise, checked: the settings they list against the code, every link between the
README and docs/ (anchors too), the README's layout tree against router/, its test command against CI's."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_setting_is_in_the_reference() -> None:
    """docs/reference.md says it lists every environment variable; ROUTER_DURABLE_LOG, _PRELOAD,
    _TRACE_PROMPTS, _REDIS_PREFIX and _LIMITS__* were only in other pages, or in none."""
    from pydantic import BaseModel

    from router.app.settings import Settings

    text = (ROOT / "docs" / "reference.md").read_text()
    missing = []
    for name, field in Settings.model_fields.items():
        nested = field.annotation
        if isinstance(nested, type) and issubclass(nested, BaseModel):
            # ROUTER_TIMEOUTS__CONNECT|FIRST_TOKEN|...: each part named after the group's prefix.
            group = re.search(rf"ROUTER_{name.upper()}__([A-Z0-9_|]+)", text)
            given = set(group.group(1).split("|")) if group else set()
            missing += [
                f"ROUTER_{name.upper()}__{n.upper()}" for n in nested.model_fields if n.upper() not in given
            ]
        elif f"ROUTER_{name.upper()}" not in text:
            missing.append(f"ROUTER_{name.upper()}")
    assert not missing, missing


PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
#: [text](target) or ![alt](target); the target has no spaces (none of ours has).
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def prose(text: str) -> str:
    """The page without fenced code blocks or inline code spans, where a link is only text."""
    lines, fenced = [], False
    for line in text.splitlines():
        if re.match(r" {0,3}(```|~~~)", line):
            fenced = not fenced
        elif not fenced:
            lines.append(re.sub(r"(`+).*?\1", "", line))
    return "\n".join(lines)


def anchors(text: str) -> set[str]:
    """The anchors GitHub gives a page's headings: lower case, punctuation dropped, spaces as
    hyphens, and -1, -2 ... after a repeated one."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    fenced = False
    for line in text.splitlines():
        if re.match(r" {0,3}(```|~~~)", line):
            fenced = not fenced
        elif not fenced and (heading := re.match(r"#{1,6} +(.+?) *$", line)):
            words = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.group(1)).replace("`", "")
            slug = re.sub(r"[^\w\- ]", "", words.lower()).replace(" ", "-")
            count = seen.get(slug, 0)
            seen[slug] = count + 1
            found.add(slug if count == 0 else f"{slug}-{count}")
    return found


def broken_links(page: Path) -> list[str]:
    """Each relative link of ``page`` whose file is missing, or whose #anchor is no heading there."""
    broken = []
    for target in LINK.findall(prose(page.read_text())):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto: are not ours to check
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path) if path else page
        if not dest.exists():
            broken.append(f"{page.name}: {target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest.read_text()):
            broken.append(f"{page.name}: {target}: no such heading")
    return broken


def test_the_link_check_finds_a_missing_file_and_a_missing_heading(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "## Estimates: prompt, output, cost\n## The dashboard (`/ui`)\n## Twice\n## Twice\n"
        "[ok](#estimates-prompt-output-cost) [ok](#the-dashboard-ui) [ok](#twice-1) [ok](page.md#twice)\n"
        "[gone](other.md) [gone](page.md#nowhere) `[code](not-a-link.md)` [web](https://example.com/x)\n"
        "```\n[in a block](not-a-link-either.md)\n```\n"
    )
    assert broken_links(page) == [
        "page.md: other.md: no such file",
        "page.md: page.md#nowhere: no such heading",
    ]


def test_every_relative_link_in_the_readme_and_docs_resolves() -> None:
    """Links between the README and docs/ (anchors included) break when a section moves or is
    renamed; GitHub shows a broken one as a 404 or a jump to nowhere."""
    assert [b for page in PAGES for b in broken_links(page)] == []


def fenced_after(text: str, heading: str) -> str:
    """The first fenced block after ``heading`` in ``text``."""
    match = re.search(rf"^{re.escape(heading)}\n.*?^```[a-z]*\n(.*?)^```", text, re.S | re.M)
    assert match, f"no fenced block after {heading!r}"
    return match.group(1)


def test_the_readmes_layout_names_every_part_of_the_package() -> None:
    """The README's tree lists each folder and module at the top of router/, and nothing that is
    not there: a new folder, or one renamed, must show in it."""
    tree = fenced_after((ROOT / "README.md").read_text(), "## Layout")
    listed: set[str] = set()
    for line in tree.splitlines():
        if line.startswith("  ") and not line.startswith("   "):  # router/'s children, two in
            listed |= set(re.findall(r"\b([a-z_]+/|[a-z_]+\.py)(?=\s|$)", line))
    package = {
        f"{p.name}/" if p.is_dir() else p.name
        for p in (ROOT / "router").iterdir()
        if (p.is_dir() and (p / "__init__.py").exists()) or (p.suffix == ".py" and p.name != "__init__.py")
    }
    assert listed == package


def test_the_readmes_test_command_is_the_one_ci_runs() -> None:
    """The README promises that its second command runs every test; CI (.ci/run) runs exactly it."""
    commands = [
        line.split("#")[0].strip()
        for line in fenced_after((ROOT / "README.md").read_text(), "## Two commands").splitlines()
    ]
    assert commands == ["make demo", "make test"]
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines() if line.strip()]
    assert ci[-1] == "make test"
