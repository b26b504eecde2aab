"""Test-runner summaries in tool output: pytest, unittest, go test, cargo test, jest, vitest, mocha.

Each parser returns the position of the last summary it recognises; ``parse_test_summary`` keeps
the one that comes last in the text, since an agent's later run supersedes an earlier one.
Every pattern is anchored at a line start or begins with a literal, adjacent repeats are disjoint
and repeated groups are bounded, so none can backtrack worse than linearly on hostile input. A
leading lookahead on the first character keeps the cost low where every position is a line start.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, ClassVar, Final

from router.features.signals.text import DEFAULT_MAX_CHARS, clean


@dataclass(frozen=True, slots=True)
class TestSummary:
    """Counts from one test run. ``unit`` is "tests", or "packages" when go reported only packages."""

    __test__: ClassVar[bool] = False  # not a pytest test class

    runner: str
    passed: int = 0
    failed: int = 0
    errors: int = 0
    skipped: int = 0
    unit: str = "tests"

    @property
    def ran(self) -> int:
        return self.passed + self.failed + self.errors

    @property
    def ok(self) -> bool | None:
        """True when at least one test ran and none failed; None when nothing ran."""
        if self.failed or self.errors:
            return False
        return True if self.passed else None

    @property
    def pass_fraction(self) -> float | None:
        return self.passed / self.ran if self.ran else None

    def as_dict(self) -> dict[str, Any]:
        return {
            "runner": self.runner,
            "passed": self.passed,
            "failed": self.failed,
            "errors": self.errors,
            "skipped": self.skipped,
            "unit": self.unit,
        }


_Found = tuple[int, TestSummary]
#: How many trailing candidates a parser tries before giving up (a truncated last block may not parse).
_TRIES: Final = 5

_COUNT = re.compile(r"(\d+) ([a-z]+)")


def _at_line_start(pattern: str) -> re.Pattern[str]:
    """A pattern that must begin a line, compiled to begin with the newline before the line.

    Searched in ``"\n" + text``, the engine skips from newline to newline (a literal first
    character) instead of trying ``^`` at every position of the text, and a match's start is
    the start of its line in ``text``.
    """
    # Runs at import only, before mutation testing switches a mutant on: none could be caught.
    return re.compile("\n" + pattern, re.M)  # pragma: no mutate


def _tally(counts: str, words: Mapping[str, str | None]) -> dict[str, int] | None:
    """Counts by field from ``"3 failed, 10 passed"``; None if any word is not the runner's."""
    out = {"passed": 0, "failed": 0, "errors": 0, "skipped": 0}
    for n, word in _COUNT.findall(counts):
        if word not in words:
            return None
        key = words[word]
        if key is not None:
            out[key] += int(n)
    return out


def _summary(runner: str, c: Mapping[str, int]) -> TestSummary:
    return TestSummary(runner, c["passed"], c["failed"], c["errors"], c["skipped"])


# -- pytest -----------------------------------------------------------------------------------

_PYTEST = _at_line_start(
    r"(?=[=\dn])(?:=+ )?((?:\d+ [a-z]+, ){0,12}\d+ [a-z]+|no tests ran)"
    r" in \d+(?:\.\d+)?(?:s| seconds)(?: \([\d:.]+\))?(?: =+)?[ \t]*$"
)
_PYTEST_WORDS: Final = MappingProxyType(
    {
        "passed": "passed", "xpassed": "passed", "failed": "failed", "error": "errors",
        "errors": "errors", "skipped": "skipped", "xfailed": "skipped", "deselected": None,
        "warning": None, "warnings": None, "rerun": None,
    }
)  # fmt: skip


def _pytest(text: str) -> _Found | None:
    if " in " not in text:
        return None
    for m in reversed(list(_PYTEST.finditer("\n" + text))[-_TRIES:]):
        counts = {"passed": 0, "failed": 0, "errors": 0, "skipped": 0}
        if m.group(1) != "no tests ran":
            tallied = _tally(m.group(1), _PYTEST_WORDS)
            if tallied is None:
                continue
            counts = tallied
        return m.start(), _summary("pytest", counts)
    return None


# -- unittest ---------------------------------------------------------------------------------

_UNITTEST_RAN = re.compile(r"^Ran (\d+) tests? in \d+(?:\.\d+)?s[ \t]*$", re.M)
_UNITTEST_VERDICT = re.compile(r"(OK|FAILED|NO TESTS RAN)(?: \(([a-z =\d,]{0,200})\))?[ \t]*")
_UNITTEST_COUNT = re.compile(r"(failures|errors|skipped|expected failures|unexpected successes)=(\d+)")


def _unittest(text: str) -> _Found | None:
    if "Ran " not in text:
        return None
    for m in reversed(list(_UNITTEST_RAN.finditer(text))[-_TRIES:]):
        # The verdict follows after a blank line; allow a stray line of interleaved stderr.
        lines = [ln for ln in text[m.end() : m.end() + 600].split("\n")[1:6] if ln.strip()][:3]
        for line in lines:
            v = _UNITTEST_VERDICT.fullmatch(line)
            if v is None:
                continue
            n = {k: int(c) for k, c in _UNITTEST_COUNT.findall(v.group(2) or "")}
            failed = n.get("failures", 0) + n.get("unexpected successes", 0)
            errors = n.get("errors", 0)
            skipped = n.get("skipped", 0) + n.get("expected failures", 0)
            passed = max(int(m.group(1)) - failed - errors - skipped, 0)
            return m.start(), TestSummary("unittest", passed, failed, errors, skipped)
    return None


# -- go test ----------------------------------------------------------------------------------

_GO_PKG = _at_line_start(
    r"(ok|FAIL)[ \t]+\S+[ \t]+(?:\d+(?:\.\d+)?s|\(cached\)|(\[(?:build|setup) failed\]))"
)
# Top-level tests only: subtests are indented, and their parent reports their failure.
_GO_TEST = _at_line_start(r"--- (PASS|FAIL|SKIP): \S")
_GO_BARE = _at_line_start(r"(PASS|FAIL)[ \t]*$")


def _go(text: str) -> _Found | None:
    # The line patterns jump from newline to newline: running them costs less than any guard.
    lines = "\n" + text
    pkgs = list(_GO_PKG.finditer(lines))
    tests = list(_GO_TEST.finditer(lines))
    bare = list(_GO_BARE.finditer(lines))
    if not (pkgs or tests or bare):
        return None
    pos = max(ms[-1].start() for ms in (pkgs, tests, bare) if ms)
    broken = sum(1 for m in pkgs if m.group(2))
    if any(m.group(1) == "PASS" for m in tests):
        # -v output: every top-level test reports, so count tests.
        kinds = [m.group(1) for m in tests]
        return pos, TestSummary("go", kinds.count("PASS"), kinds.count("FAIL"), broken, kinds.count("SKIP"))
    if pkgs:
        ok = sum(1 for m in pkgs if m.group(1) == "ok")
        failed = sum(1 for m in pkgs if m.group(1) == "FAIL" and not m.group(2))
        return pos, TestSummary("go", ok, failed, broken, 0, unit="packages")
    if tests:
        return pos, TestSummary("go", 0, len([m for m in tests if m.group(1) == "FAIL"]), 0, 0)
    # A test binary run alone prints only PASS or FAIL.
    passed = bare[-1].group(1) == "PASS"
    return pos, TestSummary("go", int(passed), int(not passed), 0, 0, unit="packages")


# -- cargo test -------------------------------------------------------------------------------

_CARGO = re.compile(
    r"^test result: (?:ok|FAILED)\. (\d+) passed; (\d+) failed; (\d+) ignored; (\d+) measured;", re.M
)
_CARGO_START = re.compile(r"^[ \t]{0,12}Finished ", re.M)


def _cargo(text: str) -> _Found | None:
    if "test result:" not in text:
        return None
    blocks = list(_CARGO.finditer(text))
    if not blocks:
        return None
    last = blocks[-1].start()
    # One `cargo test` prints a block per test binary (unit, integration, doc): sum those of the
    # last invocation, which begins after its "Finished" line.
    start = max((m.start() for m in _CARGO_START.finditer(text, 0, last)), default=-1)
    run = [m for m in blocks if m.start() > start]
    passed, failed, ignored = (sum(int(m.group(i)) for m in run) for i in (1, 2, 3))
    return last, TestSummary("cargo", passed, failed, 0, ignored)


# -- jest / vitest ----------------------------------------------------------------------------

_JEST = re.compile(r"^Tests:[ \t]+((?:\d+ [a-z]+, ){0,8})\d+ total", re.M)
_VITEST = re.compile(r"^[ \t]*Tests[ \t]+((?:\d+ [a-z]+ \| ){0,8}\d+ [a-z]+) \(\d+\)", re.M)
_JS_WORDS: Final = MappingProxyType(
    {"passed": "passed", "failed": "failed", "skipped": "skipped", "todo": "skipped", "pending": "skipped"}
)


def _js(runner: str, pattern: re.Pattern[str], text: str) -> _Found | None:
    for m in reversed(list(pattern.finditer(text))[-_TRIES:]):
        counts = _tally(m.group(1), _JS_WORDS)
        if counts is not None:
            return m.start(), _summary(runner, counts)
    return None


def _jest(text: str) -> _Found | None:
    return _js("jest", _JEST, text) if "Tests:" in text else None


def _vitest(text: str) -> _Found | None:
    return _js("vitest", _VITEST, text) if "Tests" in text else None


# -- mocha ------------------------------------------------------------------------------------

_MOCHA_PASSING = re.compile(r"^(?=[ \t\d])[ \t]*(\d+) passing \(\d+(?:\.\d+)?[a-z]{0,2}\)[ \t]*$", re.M)
_MOCHA_MORE = re.compile(r"[ \t]*(\d+) (pending|failing)[ \t]*")


def _mocha(text: str) -> _Found | None:
    if " passing (" not in text:
        return None
    matches = list(_MOCHA_PASSING.finditer(text))
    if not matches:
        return None
    last = matches[-1]
    counts = {"pending": 0, "failing": 0}
    # "N pending" and "N failing" follow the passing line directly, in that order.
    for line in text[last.end() : last.end() + 200].split("\n")[1:4]:
        more = _MOCHA_MORE.fullmatch(line)
        if more is None:
            break
        counts[more.group(2)] = int(more.group(1))
    summary = TestSummary("mocha", int(last.group(1)), counts["failing"], 0, counts["pending"])
    return last.start(), summary


_PARSERS: Final[tuple[Callable[[str], _Found | None], ...]] = (
    _pytest, _unittest, _go, _cargo, _jest, _vitest, _mocha,
)  # fmt: skip


def last_summary(cleaned: str) -> TestSummary | None:
    """The last summary in text already passed through ``clean``."""
    best: _Found | None = None
    for parse in _PARSERS:
        found = parse(cleaned)
        if found is not None and (best is None or found[0] > best[0]):
            best = found
    return best[1] if best else None


def parse_test_summary(text: Any, *, max_chars: int | None = DEFAULT_MAX_CHARS) -> TestSummary | None:
    """The last test-run summary in a tool result's text, or None. Reads only the last ``max_chars``."""
    if not isinstance(text, str) or not text:
        return None
    return last_summary(clean(text, max_chars))
