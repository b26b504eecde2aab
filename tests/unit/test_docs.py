"""What the docs promise, checked: the settings they list against the code, every link between the
README and docs/ (anchors too), the README's layout tree against router/, its test command against CI's,
every policy snippet, the development page's tree, and the reference's commands, policy fields and log
columns named. The names the pages give (commands, variables, metrics ...): test_docs_names.py."""

from __future__ import annotations

import re
from pathlib import Path

from tests.unit.docpages import PAGES, ROOT, code_of, fenced_after, prose


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


#: [text](target) or ![alt](target); the target has no spaces (none of ours has).
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


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


def invalid_policy_snippets(text: str, name: str) -> list[str]:
    """Each ```yaml block of ``text`` that a router would refuse: a whole policy (it has ``version``)
    as it stands, a fragment laid over the demo policy (policies/examples/local.yaml), whose
    backends the fragments name. An elided hash (``3f5c…``) stands for a whole one."""
    import yaml

    from router.errors import ConfigError
    from router.policy.loading import parse_policy

    base = yaml.safe_load((ROOT / "policies" / "examples" / "local.yaml").read_text())
    refused = []
    for i, block in enumerate(re.findall(r"^```yaml\n(.*?)^```", text, re.S | re.M)):
        block = re.sub(r"\b(sha256: *)([0-9a-f]+)…", lambda m: m.group(1) + m.group(2).ljust(64, "0"), block)
        try:
            fragment = yaml.safe_load(block)
            whole = block if "version" in fragment else yaml.safe_dump({**base, **fragment})
            parse_policy(whole, source=f"{name} yaml block {i + 1}", env={})
        except (ConfigError, yaml.YAMLError, TypeError) as exc:
            refused.append(str(exc).splitlines()[0])
    return refused


def test_the_snippet_check_finds_a_refused_field() -> None:
    page = (
        "```yaml\nguard: {min_tasks: 20}\n```\n```yaml\ncontrol: {share: 0.05, rout: {passthrough: local-large}}\n```\n"
        "```yaml\nversion: 1\nmodels: [{id: m, litellm_model: openai/m, protocol: openai}]\nroutes: [{match: auto, "
        "candidates: [n]}]\nlearned: {artifact: a.json, sha256: 3f5c…}\n```\n"
    )
    assert invalid_policy_snippets(page, "p.md") == [
        "p.md yaml block 2: control.rout: unknown field (did you mean 'route'?)",
        "p.md yaml block 3: routes[0] (match 'auto').candidates[0]: unknown model id 'n' (known: m)",
    ]


def test_every_policy_snippet_in_the_docs_validates() -> None:
    """An operator copies these into a policy file: a field renamed in the code, or misspelt in a page,
    must not be shown as working."""
    assert [e for p in PAGES for e in invalid_policy_snippets(p.read_text(), p.name)] == []


def unlisted_modules(tree: str, package: Path) -> list[str]:
    """The modules and subpackages of each folder of ``package`` whose name the folder's part of the
    development page's ``tree`` (its line and the lines indented under it) does not give (``redis_*``
    covers every ``redis_`` module)."""
    import fnmatch

    parts: dict[str, str] = {}
    folder = None
    for line in tree.splitlines():
        if head := re.match(r"  ([a-z_]+)/\s", line):
            folder = head.group(1)
            parts[folder] = line
        elif folder and line.startswith("   "):
            parts[folder] += "\n" + line
        else:
            folder = None
    unlisted = []
    for folder, text in parts.items():
        words = re.findall(r"[a-z_]+\*?", text)
        for path in sorted((package / folder).iterdir()):
            if path.name.startswith("__") or not (path.suffix == ".py" or (path / "__init__.py").exists()):
                continue
            if not any(fnmatch.fnmatch(path.stem, w) for w in words):
                unlisted.append(f"{folder}/{path.name}")
    return unlisted


def test_the_module_check_finds_an_unlisted_module(tmp_path: Path) -> None:
    for name in (
        "app/cli.py",
        "app/demo.py",
        "app/sub/__init__.py",
        "shared/redis_keys.py",
        "shared/types.py",
    ):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("")
    tree = "router/\n  app/          the cli\n    sub/        its part\n  shared/       in redis_*\n"
    assert unlisted_modules(tree, tmp_path) == ["app/demo.py", "shared/types.py"]


def test_the_development_tree_names_every_module() -> None:
    """The README sends a reader to docs/development.md for "every module": a module added without a
    word there is one a reader cannot place."""
    tree = fenced_after((ROOT / "docs" / "development.md").read_text(), "## Layout")
    assert unlisted_modules(tree, ROOT / "router") == []


def test_the_reference_names_every_command() -> None:
    """docs/reference.md is where a reader looks for the commands: one added to the CLI shows there."""
    import argparse

    from router.app.cli import build_parser

    (commands,) = [a.choices for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    code = code_of((ROOT / "docs" / "reference.md").read_text())
    named = {m for chunk in code for m in re.findall(r"(?:router |^)([a-z][a-z-]*)(?![\w-])", chunk)}
    assert [c for c in commands if c not in named] == []


def schema_fields() -> set[str]:
    """Every field name a policy file may have, from its JSON Schema."""
    from router.policy.loading import json_schema

    names: set[str] = set()
    stack: list[object] = [json_schema()]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            names |= set(node.get("properties", {})) if isinstance(node.get("properties"), dict) else set()
            stack += node.values()
        elif isinstance(node, list):
            stack += node
    return names


def test_every_policy_field_is_documented() -> None:
    """A field the policy file accepts but no page names is one an operator cannot find out about
    (the README points to docs/policy.md for the file; fields are also explained where they act)."""
    text = "\n".join(p.read_text() for p in PAGES)
    fields = schema_fields()
    assert {"max_calls_per_attempt", "key_share", "escalate_below"} <= fields  # the schema is read deeply
    assert sorted(f for f in fields if not re.search(rf"(?<![\w$]){re.escape(f)}(?!\w)", text)) == []


def test_every_log_column_is_in_the_accounting_page() -> None:
    """docs/accounting.md is where an operator querying the log looks up a column: each of the
    requests' and outcomes' tables is named there."""
    from router.store import OutcomeRecord, RequestRecord

    text = (ROOT / "docs" / "accounting.md").read_text()
    columns = [*RequestRecord.columns(), *OutcomeRecord.columns()]
    assert [c for c in columns if f"`{c}`" not in text] == []


def test_the_policy_page_lists_the_rule_fields_and_operators_the_rules_take() -> None:
    """docs/policy.md gives the fields a rule may test and its operators as a closed list: a field
    added to the rules or renamed must show there."""
    from router.features.request import RULE_FIELDS
    from router.policy import rules

    text = (ROOT / "docs" / "policy.md").read_text()
    listed = re.search(r"Fields: (.*?)\. No eval", text, re.S)
    operators = re.search(r"fixed operator set: `([^`]*)`", text)
    assert listed and operators
    assert set(re.findall(r"`([^`]+)`", listed.group(1))) == {*RULE_FIELDS, "headers.<lower-case-name>"}
    assert operators.group(1).split() == [*rules._FIELD_OPS, *rules._LOGICAL_OPS]
