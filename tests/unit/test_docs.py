"""What the docs promise, checked: the settings they list against the code, every link between the
README and docs/ (anchors too), the README's layout tree against router/, its test command against CI's;
and every command and flag, ``ROUTER_*`` variable, metric, policy snippet and cited test they name."""

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


def code_of(text: str) -> list[str]:
    """The page's fenced blocks and inline code spans: where commands, variables and names are written."""
    blocks = re.findall(r"^ {0,3}```[a-z]*\n(.*?)^ {0,3}```", text, re.S | re.M)
    return blocks + re.findall(r"(?<!`)`([^`\n]+)`(?!`)", prose_with_spans(text))


def prose_with_spans(text: str) -> str:
    """The page without its fenced blocks (inline code kept)."""
    return re.sub(r"^ {0,3}```[a-z]*\n.*?^ {0,3}```", "", text, flags=re.S | re.M)


#: ``router CMD`` where a shell would run it: a line's or span's start, after a prompt, a path
#: (.venv/bin/), a separator or a variable assignment; not "the router on local-nano".
COMMAND = re.compile(r"(?:^|\$ |bin/|&& |; |\| |\(|\b[A-Z_]+=\S* )router ([a-z][a-z-]*)(.*)")


def unknown_commands(text: str) -> list[str]:
    """Each ``router CMD [ACTION] --flag`` of ``text`` that the CLI does not have."""
    import argparse

    from router.app.cli import build_parser

    def commands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
        found: dict[str, argparse.ArgumentParser] = {}
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                found |= action.choices
        return found

    top, unknown = build_parser(), []
    for chunk in code_of(text):
        for line in chunk.splitlines():
            line = re.sub(r"(^|\s)#.*", "", line)  # a shell comment
            for match in COMMAND.finditer(line):
                name, rest = match.group(1), re.split(r"\s(?:\||;|&&|>)\s", match.group(2))[0]
                parser = commands(top).get(name)
                if parser is None:
                    unknown.append(f"router {name}")
                    continue
                words = rest.split()
                if words and not words[0].startswith("-") and words[0] in commands(parser):
                    parser = commands(parser)[words[0]]  # router keys create
                    name += f" {words[0]}"
                flags = {f for a in parser._actions for f in a.option_strings}
                unknown += [f"router {name} {f}" for f in re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", rest)
                            if f not in flags]  # fmt: skip
    return unknown


def test_the_command_check_finds_a_missing_command_and_flag() -> None:
    page = (
        "Run `router tasks --recent` and `router keys create --name ci --budget 5`, then\n"
        "```sh\n$ router serve --config x.yaml --verbose   # the router on --nowhere\n"
        ".venv/bin/router traine --out a.json\nROUTER_PORT=1 router keys create --nmae x | head\n```\n"
        "the router on local-nano; `router report --since 1h --by arm`\n"
    )
    assert unknown_commands(page) == ["router serve --verbose", "router traine", "router keys create --nmae"]


def test_every_command_and_flag_the_docs_name_exists() -> None:
    """A command or flag renamed in the CLI, or misspelt in a page, is an error an operator meets
    when pasting it."""
    assert [f"{p.name}: {c}" for p in PAGES for c in unknown_commands(p.read_text())] == []


def router_variables(text: str) -> set[str]:
    """The ``ROUTER_*`` names ``text`` gives, ``ROUTER_LIMITS__A|B`` read as two."""
    names: set[str] = set()
    for head, tail in re.findall(r"\b(ROUTER_[A-Z0-9_]*?)(__[A-Z0-9_|]*)?(?![A-Z0-9_])", text):
        parts = [p for p in tail[2:].split("|") if p]
        names |= {f"{head}__{p}" for p in parts} if parts else {head + tail}
    return names


def variables_read() -> set[str]:
    """Every ``ROUTER_*`` variable the router reads: its settings (nested ones, and their groups'
    prefixes), the ones the CLI reads itself, and those the shipped policies interpolate."""
    from pydantic import BaseModel

    from router.app.settings import Settings

    read: set[str] = set()
    for name, field in Settings.model_fields.items():
        nested = field.annotation
        if isinstance(nested, type) and issubclass(nested, BaseModel):
            read |= {f"ROUTER_{name.upper()}__"} | {
                f"ROUTER_{name.upper()}__{n.upper()}" for n in nested.model_fields
            }
        else:
            read.add(f"ROUTER_{name.upper()}")
    code = "\n".join(p.read_text() for p in (ROOT / "router").rglob("*.py"))
    read |= set(re.findall(r"os\.environ(?:\.get\(|\[)\"(ROUTER_[A-Z0-9_]+)\"", code))
    policies = "\n".join(p.read_text() for p in (ROOT / "policies").rglob("*.yaml"))
    return read | set(re.findall(r"\$\{(ROUTER_[A-Z0-9_]+)", policies))


#: Not the router's: the variable docs/agents.md has an agent read the router's key from.
CLIENT_VARIABLES = {"ROUTER_KEY"}


def test_the_variable_check_reads_groups_and_finds_a_misspelt_one() -> None:
    assert router_variables("`ROUTER_LIMITS__MAX_HEADERS|KEEP_ALIVE_S` and ROUTER_LIMITS__, ROUTER_PORT=1") == {
        "ROUTER_LIMITS__MAX_HEADERS", "ROUTER_LIMITS__KEEP_ALIVE_S", "ROUTER_LIMITS__", "ROUTER_PORT"}  # fmt: skip
    assert router_variables("ROUTER_MAX_BODY_BYTE=1 ROUTER_LIMITS__MAX_HEADER") - variables_read() == {
        "ROUTER_MAX_BODY_BYTE", "ROUTER_LIMITS__MAX_HEADER"}  # fmt: skip


def test_every_router_variable_the_docs_name_is_read_by_the_router() -> None:
    """An operator who sets a variable a page names expects it to change something; a misspelt or
    retired one is silently ignored."""
    read = variables_read() | CLIENT_VARIABLES
    assert {f"{p.name}: {v}" for p in PAGES for v in router_variables(p.read_text()) - read} == set()


def metrics_defined() -> set[str]:
    """The metric families the router registers (their names are literals in the code)."""
    code = "\n".join(p.read_text() for p in (ROOT / "router").rglob("*.py"))
    return set(re.findall(r"\"(router_[a-z_]+)\"", code))


def unknown_metrics(text: str, defined: set[str]) -> list[str]:
    """Each ``router_*`` series ``text`` names that no family defines (``_total``, ``_bucket`` ... read
    as the family's series)."""
    unknown = []
    for name in sorted(set(re.findall(r"\brouter_[a-z_]+", "\n".join(code_of(text))))):
        family = re.sub(r"_(total|bucket|sum|count|info)$", "", name)
        if name not in defined and family not in defined:
            unknown.append(name)
    return unknown


def test_the_metric_check_finds_a_misspelt_series() -> None:
    page = "`router_requests_total`, `router_ttft_seconds_bucket`, `rate(router_request_total[5m])`"
    assert unknown_metrics(page, metrics_defined()) == ["router_request_total"]


def test_every_metric_the_docs_name_is_exported() -> None:
    """A dashboard or alert written from the docs queries these names; a wrong one graphs nothing."""
    defined = metrics_defined()
    assert [f"{p.name}: {m}" for p in PAGES for m in unknown_metrics(p.read_text(), defined)] == []


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


def test_every_test_the_docs_cite_exists() -> None:
    """A page backs a claim with a test by name (``test_x.py::test_y``): a test renamed or removed
    leaves the claim unbacked, and the reader looking for it finds nothing."""
    paths = [*(ROOT / "tests").rglob("test_*.py"), *(ROOT / "benchmarks").rglob("test_*.py")]
    files = {p.name for p in paths}
    defined = {m for p in paths for m in re.findall(r"^\s*(?:async )?def (test_\w+)", p.read_text(), re.M)}
    missing = []
    for page in PAGES:
        text = page.read_text()
        for module, test in re.findall(r"\b(test_\w+\.py)::(test_\w+)", text):
            owners = [p for p in (ROOT / "tests").rglob(module) if re.search(rf"def {test}\b", p.read_text())]
            missing += [] if owners else [f"{page.name}: {module}::{test}"]
        for name in set(re.findall(r"(?<![\w/:.])(test_\w+)(?![\w.])", text)):
            if (
                name not in defined
                and f"{name}.py" not in files
                and not any(f.startswith(name) for f in files)
            ):
                missing.append(f"{page.name}: {name}")
    assert missing == []


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


def missing_paths(text: str) -> list[str]:
    """Each file (``router/…/x.py``, ``tests/…``, ``benchmarks/…``, ``deploy/…``: a name with an
    extension, or a glob matching at least one) or package folder (``router/…/``) that ``text`` names
    and is not there, and each ``path.py:name`` whose module defines no ``name``. Not a model name
    (``router/auto``) or a folder a command writes (``benchmarks/results/``, ``benchmarks/.venv-…``)."""
    missing = []
    pattern = (
        r"(?<![\w/.-])((?:router|tests|benchmarks|deploy)/[\w/*-]*(?:\.[a-z]+\b|\*|(?<=[a-z])/))(?::(\w+))?"
    )
    for path, name in re.findall(pattern, text):
        if "/." in path or (path.endswith("/") and not path.startswith(("router/", "tests/"))):
            continue
        found = sorted(ROOT.glob(path.rstrip("/")))
        if not found:
            missing.append(path)
        elif name and not re.search(
            rf"^\s*(?:async def|def|class) {name}\b|^{name}\b", found[0].read_text(), re.M
        ):
            missing.append(f"{path}:{name}")
    return missing


def test_the_path_check_finds_a_moved_module() -> None:
    page = (
        "`router/policy/decide.py:estimate`, `router/policy/decide.py:guess`, tests/unit/test_*.py, router/gone.py.\n"
        "router/features/signals/, router/nowhere/, model router/auto, /srv/router/policy.yaml, benchmarks/results/"
    )
    assert missing_paths(page) == ["router/policy/decide.py:guess", "router/gone.py", "router/nowhere/"]


def test_every_path_the_docs_name_exists() -> None:
    """The pages point readers at modules and tests by path: a module moved leaves them at nothing."""
    assert [f"{p.name}: {m}" for p in PAGES for m in missing_paths(p.read_text())] == []


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


def unrunnable_modules(text: str) -> list[str]:
    """Each ``python -m MODULE`` of ``text``, of this checkout (router, benchmarks, tests), that is no
    module or has nothing to run (no ``__main__.py``, no ``if __name__ == "__main__"``)."""
    unrunnable = []
    for module in sorted(set(re.findall(r"python -m ((?:router|benchmarks|tests)(?:\.\w+)*)", text))):
        base = ROOT.joinpath(*module.split("."))
        main = base / "__main__.py" if base.is_dir() else base.with_suffix(".py")
        if not main.exists() or (
            main.name != "__main__.py" and '__name__ == "__main__"' not in main.read_text()
        ):
            unrunnable.append(module)
    return unrunnable


def test_the_module_check_finds_a_module_that_cannot_run() -> None:
    page = "`python -m benchmarks.guard`, `python -m router.fakeupstream`, python -m benchmarks.gone, python -m router.ids"
    assert unrunnable_modules(page) == ["benchmarks.gone", "router.ids"]


def test_every_module_the_docs_run_can_run() -> None:
    """The pages measure with ``python -m benchmarks.…`` and the like: a module renamed or moved
    leaves the command a reader copies failing."""
    assert [f"{p.name}: {m}" for p in PAGES for m in unrunnable_modules(p.read_text())] == []


#: CamelCase names in the pages that are other software's: a cookie attribute, Apache's
#: directive, Starlette's class.
OTHERS_NAMES = {"HttpOnly", "MinRate", "StreamingResponse"}


def unknown_classes(text: str, code: str) -> list[str]:
    """Each CamelCase name in a code span of ``text`` (an error type such as ``UpstreamTimeout``, a
    class) that ``code`` neither defines as a class nor writes as a string."""
    names = (
        set(re.findall(r"(?<!`)`([A-Z][a-z]+[A-Z][A-Za-z]+)`(?!`)", prose_with_spans(text))) - OTHERS_NAMES
    )
    return sorted(n for n in names if not re.search(rf"class {n}\b|[\"']{n}[\"']", code))


def test_the_class_check_finds_a_renamed_error_type() -> None:
    code = 'class UpstreamTimeout(Exception): ...\nerror_type = "AttemptStopped"\n'
    page = "`UpstreamTimeout`, `AttemptStopped`, `UpstreamTimedOut`, `HttpOnly` and UnknownThing"
    assert unknown_classes(page, code) == ["UpstreamTimedOut"]


def test_every_error_type_and_class_the_docs_name_exists() -> None:
    """The log's `error_type` and the console name errors by their class: an operator greps for the
    name a page gives."""
    code = "\n".join(p.read_text() for p in (ROOT / "router").rglob("*.py"))
    assert [f"{p.name}: {n}" for p in PAGES for n in unknown_classes(p.read_text(), code)] == []


def unknown_headers(text: str, code: str) -> list[str]:
    """Each ``x-router-*`` header ``text`` names (any case) that ``code`` neither reads nor sends."""
    known = {h.lower() for h in re.findall(r"x-router-[a-z-]*[a-z]", code, re.I)}
    return sorted({h.lower() for h in re.findall(r"x-router-[a-z-]*[a-z]", text, re.I)} - known)


def test_the_header_check_finds_a_misspelt_header() -> None:
    code = 'TASK = "x-router-task-id"\nresponse.headers["X-Router-Model"] = m\n'
    assert unknown_headers("`X-Router-Task-Id`, `x-router-model`, `x-router-tasks`", code) == [
        "x-router-tasks"
    ]


def test_every_router_header_the_docs_name_exists() -> None:
    """Clients set and read the x-router-* headers as the pages spell them; a misspelt one is
    silently ignored (a task never named, a cost never read)."""
    code = "\n".join(p.read_text() for p in (ROOT / "router").rglob("*.py"))
    assert [f"{p.name}: {h}" for p in PAGES for h in unknown_headers(p.read_text(), code)] == []


def test_every_metric_the_router_exports_is_documented() -> None:
    """The other way round: a family the router registers that no page names is one an operator
    cannot find out about (``router_state_*`` and ``router_log_*`` were on none)."""
    code = "\n".join(p.read_text() for p in (ROOT / "router").rglob("*.py"))
    families = set(re.findall(r"(?:Counter|Gauge|Histogram|MetricFamily|hist)\(\s*\"(router_\w+)\"", code))
    assert {"router_ttft_seconds", "router_state_fail_open", "router_policy"} <= families  # read them all
    text = "\n".join(p.read_text() for p in PAGES)
    assert sorted(f for f in families if not re.search(rf"\b{f}(_total|_info)?\b", text)) == []
