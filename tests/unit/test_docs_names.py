"""The names the docs give, checked against the code: every command and flag, ``ROUTER_*`` variable,
metric (both ways), cited test, path, ``python -m`` module, error type and ``x-router-*`` header. Each
check has a case that shows it finds a broken page."""

from __future__ import annotations

import re

from tests.unit.docpages import PAGES, ROOT, code_of, prose_with_spans, router_code

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
    code = router_code()
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
    code = router_code()
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


def test_every_metric_the_router_exports_is_documented() -> None:
    """The other way round: a family the router registers that no page names is one an operator
    cannot find out about (``router_state_*`` and ``router_log_*`` were on none)."""
    code = router_code()
    families = set(re.findall(r"(?:Counter|Gauge|Histogram|MetricFamily|hist)\(\s*\"(router_\w+)\"", code))
    assert {"router_ttft_seconds", "router_state_fail_open", "router_policy"} <= families  # read them all
    text = "\n".join(p.read_text() for p in PAGES)
    assert sorted(f for f in families if not re.search(rf"\b{f}(_total|_info)?\b", text)) == []


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
    code = router_code()
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
    code = router_code()
    assert [f"{p.name}: {h}" for p in PAGES for h in unknown_headers(p.read_text(), code)] == []


def unknown_make_targets(text: str, makefile: str) -> list[str]:
    """Each ``make TARGET`` in the code of ``text`` that ``makefile`` has no rule for."""
    targets = set(re.findall(r"^([a-z][\w-]*):", makefile, re.M))
    named = {t for chunk in code_of(text) for t in re.findall(r"(?:^|\s|\()make ([a-z][\w-]*)", chunk, re.M)}
    return sorted(named - targets)


def test_the_make_check_finds_a_missing_target() -> None:
    makefile = "demo: $(BIN)/.installed\n\t$(BIN)/router demo\ntest: lint\n\tpytest\n"
    page = "```sh\nmake demo    # the demo\nmake tests\n```\nthen `make test`, or make bench in prose"
    assert unknown_make_targets(page, makefile) == ["tests"]


def test_every_make_target_the_docs_name_exists() -> None:
    """``make demo``, ``make test``, ``make unit``, ``make bench`` ...: the commands the README
    starts a reader with are Makefile rules."""
    makefile = (ROOT / "Makefile").read_text()
    assert [f"{p.name}: make {t}" for p in PAGES for t in unknown_make_targets(p.read_text(), makefile)] == []


def unknown_endpoints(text: str, code: str) -> list[str]:
    """Each ``METHOD /path`` of ``text`` whose path (its ``{parameters}`` aside) no route string of
    ``code`` has."""

    def shape(path: str) -> str:
        return re.sub(r"\{[^}]*\}", "{}", path.rstrip("/."))

    routes = {shape(r) for r in re.findall(r"[\"'](/[\w/{}:._-]*)[\"']", code)}
    named = re.findall(r"\b(?:GET|POST|DELETE|PUT|PATCH) (/[\w/{}._-]*)", text)
    return sorted({p.rstrip(".") for p in named if shape(p) not in routes})


def test_the_endpoint_check_finds_a_renamed_endpoint() -> None:
    code = (
        'app.add_api_route("/v1/tasks/{task_id:path}", task)\napp.add_api_route("/v1/outcomes", outcomes)\n'
    )
    page = "`GET /v1/tasks/{id}` and POST /v1/outcomes. Then POST /v1/outcome."
    assert unknown_endpoints(page, code) == ["/v1/outcome"]


def test_every_endpoint_the_docs_name_is_served() -> None:
    """Clients and scripts call the endpoints as the pages write them (``POST /v1/outcomes``,
    ``GET /v1/tasks/{id}``, the fake provider's ``/_control/behaviour``)."""
    code = router_code()
    assert [f"{p.name}: {e}" for p in PAGES for e in unknown_endpoints(p.read_text(), code)] == []
