"""Implicit outcome signals: test-runner summaries, tool-result errors, conversation signals, weak labels."""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from router.features.signals import (
    BUILD_ERROR,
    EXIT_CODE,
    RESENT,
    RUNTIME_ERROR,
    TESTS,
    TOOL_FAILURES,
    TOOL_LOOP,
    Signal,
    TestSummary,
    Weights,
    analyze,
    extract,
    glance,
    parse_test_summary,
    recent,
    request_fingerprint,
    resent_signal,
    stable_hash,
    summarize,
    switches,
    without_tools,
)
from router.features.signals.text import HEAD_CHARS, clean, strip_ansi
from router.features.signals.toolresult import test_summary as summary_of

SAMPLES = Path(__file__).parent / "samples"
PROTOCOLS = ("openai_chat", "anthropic", "openai_responses")


def sample(name: str) -> str:
    return (SAMPLES / name).read_text(encoding="utf-8")


# -- test-runner summaries -------------------------------------------------------------------

# name -> (runner, passed, failed, errors, skipped, unit), or None when no summary may be found
EXPECTED_SUMMARIES: dict[str, tuple[str, int, int, int, int, str] | None] = {
    "pytest_failed_color.txt": ("pytest", 10, 2, 0, 1, "tests"),
    "pytest_quiet_passed.txt": ("pytest", 42, 0, 0, 0, "tests"),
    "pytest_no_tests.txt": ("pytest", 0, 0, 0, 0, "tests"),
    "pytest_collection_error.txt": ("pytest", 0, 0, 1, 0, "tests"),
    "pytest_traceback_mentions_passed.txt": ("pytest", 4, 1, 0, 0, "tests"),
    "pytest_two_runs.txt": ("pytest", 6, 0, 0, 0, "tests"),
    "pytest_truncated_middle.txt": ("pytest", 245, 3, 0, 2, "tests"),
    "pytest_truncated_end.txt": None,
    "pytest_xfail_old.txt": ("pytest", 4, 0, 0, 1, "tests"),
    "unittest_ok.txt": ("unittest", 12, 0, 0, 0, "tests"),
    "unittest_failed.txt": ("unittest", 6, 2, 1, 0, "tests"),
    "unittest_django_skipped.txt": ("unittest", 4, 0, 0, 1, "tests"),
    "unittest_expected_failures.txt": ("unittest", 5, 2, 0, 3, "tests"),
    "go_ok_packages.txt": ("go", 3, 0, 0, 0, "packages"),
    "go_verbose_fail.txt": ("go", 2, 1, 0, 1, "tests"),
    "go_short_fail.txt": ("go", 2, 1, 0, 0, "packages"),
    "go_build_failed.txt": ("go", 1, 0, 1, 0, "packages"),
    "go_panic.txt": None,
    "cargo_ok_multi.txt": ("cargo", 9, 0, 0, 1, "tests"),
    "cargo_failed.txt": ("cargo", 3, 1, 0, 0, "tests"),
    "cargo_two_runs.txt": ("cargo", 3, 1, 0, 0, "tests"),
    "cargo_compile_error.txt": None,
    "jest_failed_color.txt": ("jest", 4, 1, 0, 1, "tests"),
    "jest_passed.txt": ("jest", 12, 0, 0, 0, "tests"),
    "vitest_failed_color.txt": ("vitest", 10, 1, 0, 1, "tests"),
    "vitest_passed.txt": ("vitest", 27, 0, 0, 0, "tests"),
    "mocha_failing.txt": ("mocha", 3, 1, 0, 1, "tests"),
    "mocha_passing.txt": ("mocha", 12, 0, 0, 0, "tests"),
    "mixed_go_then_jest.txt": ("jest", 7, 0, 0, 0, "tests"),
    "tsc_errors.txt": None,
    "make_c_error.txt": None,
    "python_syntax_error.txt": None,
    "python_traceback.txt": None,
    "node_module_not_found.txt": None,
}


def test_every_sample_has_an_expectation() -> None:
    assert {p.name for p in SAMPLES.glob("*.txt")} == set(EXPECTED_SUMMARIES)


@pytest.mark.parametrize("name", sorted(EXPECTED_SUMMARIES))
def test_sample_summary(name: str) -> None:
    expected = EXPECTED_SUMMARIES[name]
    got = parse_test_summary(sample(name))
    if expected is None:
        assert got is None
    else:
        assert got is not None
        assert (got.runner, got.passed, got.failed, got.errors, got.skipped, got.unit) == expected


def test_colour_samples_really_are_coloured() -> None:
    # The parsers must see through ANSI codes, so the samples must contain them.
    for name in ("pytest_failed_color.txt", "cargo_ok_multi.txt", "jest_failed_color.txt"):
        raw = sample(name)
        assert "\x1b[" in raw
        assert "\x1b" not in strip_ansi(raw)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("3 passed in 0.1s", ("pytest", 3, 0, 0, 0)),
        ("1 failed, 2 passed in 0.12s\n", ("pytest", 2, 1, 0, 0)),
        ("=== 1 error in 0.05s ===", ("pytest", 0, 0, 1, 0)),
        ("no tests ran in 0.00s", ("pytest", 0, 0, 0, 0)),
        ("==== 2 failed, 1 passed, 1 rerun in 61.20s (0:01:01) ====", ("pytest", 1, 2, 0, 0)),
        ("Ran 1 test in 0.000s\n\nOK\n", ("unittest", 1, 0, 0, 0)),
        ("Ran 0 tests in 0.000s\n\nNO TESTS RAN\n", ("unittest", 0, 0, 0, 0)),
        ("Ran 4 tests in 0.1s\n\nFAILED (errors=4)", ("unittest", 0, 0, 4, 0)),
        # An unreadable last candidate does not hide the summary before it.
        ("== 3 passed in 0.1s ==\n=== 3 apples in 0.1s ===\n", ("pytest", 3, 0, 0, 0)),
        # The verdict right after the count (a harness that drops blank lines), or after a stray line.
        ("Ran 3 tests in 0.1s\nOK\n", ("unittest", 3, 0, 0, 0)),
        ("Ran 2 tests in 0.01s\n\nResourceWarning: unclosed file\nOK\n", ("unittest", 2, 0, 0, 0)),
        ("=== RUN   TestX\n--- PASS: TestX (0.00s)\nPASS\n", ("go", 1, 0, 0, 0)),
        ("PASS\n", ("go", 1, 0, 0, 0)),
        ("--- FAIL: TestX (0.00s)\n    x_test.go:3: boom\n", ("go", 0, 1, 0, 0)),
        (
            "test result: ok. 5 passed; 0 failed; 1 ignored; 0 measured; 0 filtered out; finished in 0.00s",
            ("cargo", 5, 0, 0, 1),
        ),
        ("Tests:       1 failed, 4 passed, 5 total", ("jest", 4, 1, 0, 0)),
        ("Tests:       2 todo, 3 passed, 5 total", ("jest", 3, 0, 0, 2)),
        ("      Tests  2 failed | 10 passed (12)", ("vitest", 10, 2, 0, 0)),
        ("  5 passing (20ms)\n  2 failing\n", ("mocha", 5, 2, 0, 0)),
        ("  5 passing (20ms)\n  1 pending\n", ("mocha", 5, 0, 0, 1)),
    ],
)
def test_inline_summaries(text: str, expected: tuple[str, int, int, int, int]) -> None:
    got = parse_test_summary(text)
    assert got is not None
    assert (got.runner, got.passed, got.failed, got.errors, got.skipped) == expected


@pytest.mark.parametrize(
    "text",
    [
        "AssertionError: expected '3 passed in 0.1s'",  # not at a line start
        "E       assert '1 failed, 2 passed in 0.1s' == ''",
        "=== 3 apples in 0.1s ===",  # not pytest's vocabulary
        "Ran 3 tests in 0.01s\n",  # the verdict was cut off
        "Tests:       3 bananas, 3 total",
        "we ran 5 tests and they passed",
        "",
    ],
)
def test_lookalikes_are_not_summaries(text: str) -> None:
    assert parse_test_summary(text) is None


@pytest.mark.parametrize("junk", [None, 42, b"3 passed in 0.1s", ["3 passed in 0.1s"], {"text": "x"}])
def test_non_text_is_no_summary(junk: Any) -> None:
    assert parse_test_summary(junk) is None


@pytest.mark.parametrize(("text", "passed", "failed"), [("PASS\n", 1, 0), ("ok\nFAIL\n", 0, 1)])
def test_a_go_test_binary_alone_counts_as_one_package(text: str, passed: int, failed: int) -> None:
    assert parse_test_summary(text) == TestSummary("go", passed, failed, 0, 0, unit="packages")


def test_a_summary_as_the_label_details_keep_it() -> None:
    summary = TestSummary("go", 3, 1, 2, 4, unit="packages")
    assert summary.as_dict() == {
        "runner": "go", "passed": 3, "failed": 1, "errors": 2, "skipped": 4, "unit": "packages",
    }  # fmt: skip


def test_the_last_summary_wins_across_runners() -> None:
    text = "Tests:       1 failed, 1 passed, 2 total\n" + sample("pytest_quiet_passed.txt")
    got = parse_test_summary(text)
    assert got is not None and (got.runner, got.passed) == ("pytest", 42)
    got = parse_test_summary(sample("pytest_quiet_passed.txt") + "Tests:       1 failed, 1 passed, 2 total\n")
    assert got is not None and (got.runner, got.failed) == ("jest", 1)


def test_only_the_tail_is_read_and_a_cut_line_is_dropped() -> None:
    summary = "15 passed in 0.10s\n"
    after = "." * 30
    # The window starts inside the summary line ("5 passed in 0.10s"): that line must not count.
    assert parse_test_summary(summary + after, max_chars=len(summary) - 1 + len(after)) is None
    assert parse_test_summary(summary + after, max_chars=len(summary) + len(after)) is not None
    # A summary followed by more than the window of other output is out of sight.
    assert parse_test_summary(summary + "x\n" * 20_000) is None
    got = parse_test_summary(summary + "x\n" * 20_000, max_chars=None)
    assert got is not None and got.passed == 15


def test_summary_properties() -> None:
    s = TestSummary("pytest", passed=3, failed=1, errors=0, skipped=2)
    assert (s.ran, s.ok, s.pass_fraction) == (4, False, 0.75)
    assert TestSummary("pytest").ok is None and TestSummary("pytest").pass_fraction is None
    assert TestSummary("go", passed=2).ok is True


def test_clean_normalises_carriage_returns_and_colours() -> None:
    assert clean("\x1b[32mok\x1b[0m\r\nnext\rline") == "ok\nnext\nline"
    assert clean("\x1b]8;;http://x\x07link\x1b]8;;\x07") == "link"


# -- single tool results ---------------------------------------------------------------------

# name -> (exit code, build error kind, runtime error kind)
EXPECTED_RESULTS: dict[str, tuple[int | None, str | None, str | None]] = {
    "cargo_compile_error.txt": (None, "rust", None),
    "cargo_failed.txt": (None, None, "rust_panic"),
    "go_build_failed.txt": (None, "go", None),
    "go_verbose_fail.txt": (1, None, None),
    "go_panic.txt": (2, None, "go_panic"),
    "pytest_collection_error.txt": (None, "module_not_found", None),
    "pytest_quiet_passed.txt": (None, None, None),
    "unittest_failed.txt": (None, None, "python"),
    "tsc_errors.txt": (None, "typescript", None),
    "make_c_error.txt": (None, "make", None),
    "python_syntax_error.txt": (None, "syntax", "python"),
    "python_traceback.txt": (None, None, "python"),
    "node_module_not_found.txt": (None, "module_not_found", None),
    "jest_failed_color.txt": (None, None, None),
}


@pytest.mark.parametrize("name", sorted(EXPECTED_RESULTS))
def test_sample_tool_result(name: str) -> None:
    out = analyze(sample(name))
    assert (out.exit_code, out.build_error, out.runtime_error) == EXPECTED_RESULTS[name]


@pytest.mark.parametrize(
    ("text", "code"),
    [
        ("<returncode>1</returncode>\n<output>\nboom\n</output>", 1),
        # The harness's code beats an "exit status" printed by the command (`go test || true`).
        ("<returncode>0</returncode>\n<output>\nFAIL\nexit status 1\n</output>", 0),
        ("Exit code: 2\nWall time: 0.4 seconds\nOutput:\nmake: *** [all] Error 2\n", 2),
        ("Exit code 1\nnpm ERR! Missing script: test\n", 1),
        ("bash: rg: command not found\n[exit code: 127]", 127),
        ("Command failed with exit code 1: npm test", 1),
        ("some output\n[The command completed with exit code 0.]", 0),
        ("Process exited with code 3", 3),
        ("FAIL\texample.com/x\t0.01s\nexit status 1\n", 1),
        ("subprocess.CalledProcessError: Command '['make']' returned non-zero exit status 2.", 2),
        ("all good", None),
        ("the exit code is documented in README", None),
    ],
)
def test_exit_codes(text: str, code: int | None) -> None:
    assert analyze(text).exit_code == code


def test_exit_code_at_the_head_of_a_long_result() -> None:
    text = "Exit code: 1\nOutput:\n" + "line of output\n" * 100_000 + "3 passed in 0.1s\n"
    out = analyze(text)
    assert out.exit_code == 1
    assert out.tests is not None and out.tests.passed == 3
    assert out.failed


def test_exit_codes_in_a_long_results_tail() -> None:
    """Past the head, the last code the harness reports wins, in any of its shapes."""
    filler = "output line\n" * (HEAD_CHARS // 6)
    assert analyze(filler + "[exit code: 1]\nretrying\n[exit code: 0]\n").exit_code == 0
    assert analyze(filler + "<returncode>3</returncode>\n").exit_code == 3
    # The head's report stands, whatever the output says further down.
    assert analyze("Exit code: 2\n" + filler + "exit status 1\n").exit_code == 2


def test_a_result_is_read_within_max_chars_of_its_end() -> None:
    text = "x" * 5000 + "\nExit code: 1\n3 passed in 0.1s\n" + "y" * 200
    assert (glance(text).exit_code, analyze(text).exit_code) == (1, 1)
    assert summary_of(text) == TestSummary("pytest", 3)
    assert glance(text, max_chars=100).exit_code is None
    assert summary_of(text, max_chars=100) is None
    assert analyze(text, max_chars=100).tests is None
    # Not text at all: nothing to read, the same as an empty result.
    assert glance(None) == glance("") and glance(None).exit_code is None


def test_codex_json_shell_output() -> None:
    text = json.dumps(
        {"output": "3 failed, 9 passed in 1.2s\n", "metadata": {"exit_code": 1, "duration_seconds": 1.3}}
    )
    out = analyze(text)
    assert out.exit_code == 1
    assert out.tests is not None and (out.tests.passed, out.tests.failed) == (9, 3)
    assert analyze('{"output": "fine", "metadata": {"exit_code": true}}').exit_code is None
    assert analyze('{"not": "codex"}').exit_code is None
    assert analyze(text + "\n").exit_code == 1  # a trailing newline is still the same object
    assert analyze('{"output": "fine", "metadata": [1]}').exit_code is None


def _mini_v2(code: int, output: str) -> str:
    """A tool result as mini-swe-agent 2 (PyPI's, the README's recipe) renders it: its default
    ``mini.yaml`` observation template, and past 10,000 characters the head and tail of it."""
    if len(output) < 10000:
        return "{\n" + f'  "returncode": {code},\n  "output": {json.dumps(output)}\n' + "}"
    return (
        "{\n"
        + f'  "returncode": {code},\n  "output_head": {json.dumps(output[:5000])},\n'
        + f'  "output_tail": {json.dumps(output[-5000:])},\n  "elided_chars": {len(output) - 10000},\n'
        + '  "warning": "Output too long."\n}'
    )


def test_mini_swe_agent_2s_json_results_give_their_exit_code() -> None:
    # Its results were read as Codex's JSON, whose exit code is under "metadata": every one had
    # none, so no exit_code signal, no run of failures to leave a model for, no failed_rate.
    out = analyze(_mini_v2(1, "FAILED test_x.py::test_a\n1 failed, 2 passed in 0.3s\n"))
    assert out.exit_code == 1
    assert out.tests is not None and (out.tests.passed, out.tests.failed) == (2, 1)
    assert glance(_mini_v2(0, "hello.py\n")).exit_code == 0
    long = analyze(_mini_v2(2, "x" * 20000 + "\nModuleNotFoundError: No module named 'foo'\n"))
    assert long.exit_code == 2 and long.build_error == "module_not_found"  # read in the tail
    assert analyze('{"returncode": true, "output": "fine"}').exit_code is None
    failing = [
        msg
        for i in range(3)
        for msg in (
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": f"c{i}", "type": "function", "function": {"name": "bash", "arguments": json.dumps({"command": f"python t{i}.py"})}}
            ]},
            {"role": "tool", "tool_call_id": f"c{i}", "content": _mini_v2(1, f"Error {i}\n")},
        )
    ]  # fmt: skip
    assert TOOL_FAILURES in by_name(switches("openai_chat", [{"role": "user", "content": "fix"}, *failing]))


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        ("error[E0425]: cannot find value `x` in this scope\n", "rust"),
        ('error: could not compile `app` (bin "app") due to 2 previous errors\n', "rust"),
        ("./main.go:3:2: undefined: foo\n", "go"),
        ('main.go:3:2: "os" imported and not used\n', "go"),
        ("src/A.java:7: error: ';' expected\n", "java"),
        ("lib/x.cpp:10:3: fatal error: foo.h: No such file or directory\n", "c"),
        ("ImportError: cannot import name 'thing' from 'pkg'\n", "module_not_found"),
        ("    x_test.go:10: expected 3, got 4\n", None),  # a go test failure, not a compile error
        ("the word error alone\n", None),
    ],
)
def test_build_errors(text: str, kind: str | None) -> None:
    assert analyze(text).build_error == kind


def test_result_digest_ignores_timings_only() -> None:
    a = analyze("FAILED test_x - assert 1 == 2\n1 failed in 0.41s\n")
    b = analyze("FAILED test_x - assert 1 == 2\n1 failed in 0.39s\n")
    c = analyze("FAILED test_y - assert 1 == 2\n1 failed in 0.39s\n")
    assert a.digest == b.digest != c.digest


def test_timing_masks_are_those_of_the_reference_pattern() -> None:
    # The masking pattern is written for speed; it must mask exactly what this one does.
    import re

    from router.features.signals import toolresult

    reference = re.compile(r"(?<![\w.])\d+(?:\.\d+)?[ ]?(?:ms|s|seconds)\b|\b0x[0-9a-fA-F]{1,16}\b")
    rng = random.Random(3)
    alphabet = "0123456789 .xXmsecondaf_\n-:é٣"
    for _ in range(20_000):
        t = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 24)))
        assert toolresult._VOLATILE.sub("#", t) == reference.sub("#", t), t
        assert toolresult._mask_volatile(t) == reference.sub("#", t), t
        if t.isascii():
            assert toolresult._VOLATILE_ASCII.sub("#", t) == reference.sub("#", t), t
    ascii_lines = "0123456789 .xXmsecondaf_-:\n\n"
    for _ in range(2_000):  # longer ASCII text of many lines: the masking runs line by line
        t = "".join(rng.choice(ascii_lines) for _ in range(rng.randint(50, 400)))
        assert toolresult._mask_volatile(t) == reference.sub("#", t), t
    many = "took 1s at 0x1f\n" * 40
    assert toolresult._mask_volatile(many) == reference.sub("#", many) == "took # at #\n" * 40


@pytest.mark.parametrize(
    ("text", "runner"),
    [
        ("5 passed in 0.12s\n", "pytest"),
        ("output\r\n===== 1 failed, 2 passed in 3.1s =====\r\n", "pytest"),
        ("ok  \texample.com/pkg\t0.01s\n", "go"),
        ("--- FAIL: TestX (0.00s)\nFAIL\n", "go"),
        ("PASS", "go"),
        ("building\nFAIL  \n", "go"),
        ("building\nFAIL", "go"),
        ("FAILED\nok  \texample.com/a\t(cached)\n", "go"),
        ("tokens look ok here\nFAILED to build\n", None),
    ],
)
def test_line_anchored_summaries_on_first_and_last_lines(text: str, runner: str | None) -> None:
    found = parse_test_summary(text)
    assert (found.runner if found else None) == runner


# -- conversations in three protocols --------------------------------------------------------


@dataclass
class Step:
    tool: str
    args: dict[str, Any]
    output: str
    is_error: bool | None = None


def conversation(protocol: str, steps: list[Step]) -> list[Any]:
    """A realistic agent transcript: a user ask, then one tool call and its result per step."""
    if protocol == "openai_chat":
        msgs: list[Any] = [
            {"role": "system", "content": "You are a coding agent."},
            {"role": "user", "content": "Fix the failing tests."},
        ]
        for i, s in enumerate(steps):
            call = {
                "id": f"call_{i}",
                "type": "function",
                "function": {"name": s.tool, "arguments": json.dumps(s.args)},
            }
            msgs.append({"role": "assistant", "content": None, "tool_calls": [call]})
            msgs.append({"role": "tool", "tool_call_id": f"call_{i}", "content": s.output})
        return msgs
    if protocol == "anthropic":
        msgs = [{"role": "user", "content": "Fix the failing tests."}]
        for i, s in enumerate(steps):
            msgs.append(
                {
                    "role": "assistant",
                    "content": [
                        {"type": "text", "text": "Let me run that."},
                        {"type": "tool_use", "id": f"toolu_{i}", "name": s.tool, "input": s.args},
                    ],
                }
            )
            # Alternate the two shapes a tool_result's content may take.
            content: Any = s.output if i % 2 else [{"type": "text", "text": s.output}]
            block: dict[str, Any] = {"type": "tool_result", "tool_use_id": f"toolu_{i}", "content": content}
            if s.is_error is not None:
                block["is_error"] = s.is_error
            msgs.append({"role": "user", "content": [block]})
        return msgs
    items: list[Any] = [
        {"role": "user", "content": [{"type": "input_text", "text": "Fix the failing tests."}]}
    ]
    for i, s in enumerate(steps):
        items.append(
            {"type": "function_call", "call_id": f"fc_{i}", "name": s.tool, "arguments": json.dumps(s.args)}
        )
        output: Any = s.output if i % 2 else [{"type": "input_text", "text": s.output}]
        items.append({"type": "function_call_output", "call_id": f"fc_{i}", "output": output})
    return items


def by_name(signals: list[Signal]) -> dict[str, Signal]:
    return {s.name: s for s in signals}


PYTEST_FAIL = sample("pytest_two_runs.txt").split("--- after fix ---")[0]
PYTEST_PASS = "tests/test_cart.py ......  [100%]\n\n===== 6 passed in 0.38s =====\n"


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_latest_passing_run_is_a_success(protocol: str) -> None:
    steps = [
        Step("bash", {"command": "pytest -q"}, PYTEST_FAIL),
        Step("edit", {"path": "cart.py", "old": "a", "new": "b"}, "ok"),
        Step("bash", {"command": "pytest -q"}, PYTEST_PASS),
    ]
    signals = by_name(extract(protocol, conversation(protocol, steps)))
    t = signals[TESTS]
    assert (t.success, t.value, t.weight) == (True, 1.0, 1.0)
    assert t.details["passed"] == 6 and t.details["age"] == 0 and t.details["tool"] == "bash"
    label = summarize(list(signals.values()))
    assert label is not None
    assert (label.success, label.score, label.source) == (True, 1.0, TESTS)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_latest_failing_run_scores_its_pass_fraction(protocol: str) -> None:
    steps = [
        Step("bash", {"command": "cargo test"}, sample("cargo_ok_multi.txt")),
        Step("bash", {"command": "cargo test --lib"}, sample("cargo_failed.txt")),
        Step("read", {"path": "src/lib.rs"}, "fn parse() {}\n"),
    ]
    signals = by_name(extract(protocol, conversation(protocol, steps)))
    t = signals[TESTS]
    assert t.success is False and t.value == pytest.approx(0.75)
    assert t.details["age"] == 1 and t.weight == pytest.approx(0.85)
    label = summarize(list(signals.values()))
    assert label is not None and (label.success, label.score, label.source) == (False, 0.75, TESTS)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_run_outside_the_window_is_not_seen(protocol: str) -> None:
    steps = [Step("bash", {"command": "pytest"}, PYTEST_PASS)] + [
        Step("read", {"path": f"f{i}.py"}, f"contents {i}") for i in range(4)
    ]
    msgs = conversation(protocol, steps)
    assert TESTS in by_name(extract(protocol, msgs))
    assert TESTS not in by_name(extract(protocol, msgs, window=4))
    assert extract(protocol, msgs, window=0) == []


def test_anthropic_is_error_makes_a_failure_run() -> None:
    steps = [Step("bash", {"command": "make"}, "ok", is_error=False)] + [
        Step("bash", {"command": f"make v{i}"}, f"Exit code 2\nmake: *** [all] Error {i}", is_error=True)
        for i in range(3)
    ]
    signals = by_name(extract("anthropic", conversation("anthropic", steps)))
    f = signals[TOOL_FAILURES]
    assert (f.value, f.success, f.details["run"]) == (3.0, False, 3)
    assert signals[EXIT_CODE].value == 2.0
    assert signals[BUILD_ERROR].details["kind"] == "make"


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_failure_run_is_broken_by_a_success(protocol: str) -> None:
    fail = "<returncode>1</returncode>\n<output>\nerror\n</output>"
    ok = "<returncode>0</returncode>\n<output>\n</output>"
    steps = [Step("bash", {"command": f"c{i}"}, out) for i, out in enumerate([fail, fail, ok, fail, fail])]
    signals = by_name(extract(protocol, conversation(protocol, steps)))
    assert TOOL_FAILURES not in signals
    signals = by_name(extract(protocol, conversation(protocol, steps), failure_run=2))
    assert signals[TOOL_FAILURES].value == 2.0


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_back_to_back_identical_calls_are_a_loop(protocol: str) -> None:
    steps = [Step("read", {"path": "a.py", "limit": 50}, f"contents v{i}") for i in range(3)]
    loop = by_name(extract(protocol, conversation(protocol, steps)))[TOOL_LOOP]
    assert (loop.success, loop.value, loop.details["kind"], loop.details["tool"]) == (
        False,
        3.0,
        "consecutive_call",
        "read",
    )
    assert TOOL_LOOP not in by_name(extract(protocol, conversation(protocol, steps), loop_threshold=4))
    assert TOOL_LOOP not in by_name(extract(protocol, conversation(protocol, steps[:2])))


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_the_last_messages_read_once_give_the_signals_a_fresh_read_gives(protocol: str) -> None:
    fail = "<returncode>1</returncode>\n<output>\nerror\n</output>"
    steps = [Step("bash", {"command": "make"}, fail)] * 3 + [Step("bash", {"command": "pytest"}, PYTEST_FAIL)]
    msgs = conversation(protocol, steps)
    seen: list[Any] = [None] * len(msgs)
    read = recent(msgs, seen=seen)
    # The decision's switch signals, then the label's signals, from one reading of the window.
    assert switches(protocol, msgs, seen=seen, read=read) == switches(protocol, msgs)
    found = extract(protocol, msgs, seen=seen, read=read)
    assert found == extract(protocol, msgs) and {TESTS, TOOL_LOOP} <= set(by_name(found))
    # The reading is what they use: a window of one message finds neither a loop nor a run.
    short = recent(msgs, window=1)
    assert switches(protocol, msgs, read=short) == [] and TOOL_LOOP not in by_name(
        extract(protocol, msgs, read=short)
    )
    assert recent(msgs, window=0).results == [] == recent("not a list").calls


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_reading_keeps_its_window_tail_and_error_flags(protocol: str) -> None:
    # What the mutation run at ce73435 found no test of (signals.Recent, from 89f28b8): the default
    # window, a one-message window, max_chars on the way to the glance and to the full analysis, the
    # protocol's error flag, and the switch signals' cache key.
    steps = [Step("bash", {"command": f"c{i}"}, f"<returncode>{i}</returncode>") for i in range(12)]
    msgs = conversation(protocol, steps)
    assert len(recent(msgs).results) == len(recent(msgs, window=20).results) == 10
    assert len(recent(msgs, window=21).results) == 11 and len(recent(msgs, window=1).results) == 1

    long = PYTEST_PASS + "\n".join(f"log line {i}" for i in range(400))  # the summary 5 KB from the end
    msgs = conversation(protocol, [Step("bash", {"command": "pytest"}, long, is_error=True)])
    cut, whole = recent(msgs, max_chars=1000), recent(msgs)
    assert cut.results[0][1] == glance(long, cut.results[0][1].is_error, max_chars=1000)
    assert cut.results[0][1].digest != whole.results[0][1].digest
    assert cut.analyzed()[0][1].tests is None and whole.analyzed()[0][1].tests is not None
    flagged = protocol == "anthropic"  # the only protocol with an error flag on a result
    assert whole.analyzed()[0][1].is_error is (True if flagged else None)

    fail = "<returncode>1</returncode>\n<output>\nerror\n</output>"
    read = recent(conversation(protocol, [Step("bash", {"command": f"c{i}"}, fail) for i in range(2)]))
    w = Weights()
    assert read.switching(w, 3, 3) == (None, None)
    assert read.switching(w, 3, 3) is read.switching(w, 3, 3)  # read once
    assert read.switching(w, 2, 3)[0] is not None  # another threshold is another reading


def test_argument_key_order_does_not_hide_a_loop() -> None:
    msgs = conversation(
        "openai_chat", [Step("read", {"path": "a.py", "limit": 50}, f"v{i}") for i in range(3)]
    )
    msgs[2]["tool_calls"][0]["function"]["arguments"] = '{"limit":50,  "path":"a.py"}'
    assert by_name(extract("openai_chat", msgs))[TOOL_LOOP].details["kind"] == "consecutive_call"


def test_legacy_openai_function_calls_are_read() -> None:
    """Chat's older ``function_call`` (one call per message, results as ``role: function``)."""

    def legacy(args: list[str]) -> list[Any]:
        msgs: list[Any] = [{"role": "user", "content": "Fix the failing tests."}]
        for i, a in enumerate(args):
            msgs.append(
                {"role": "assistant", "content": None, "function_call": {"name": "read", "arguments": a}}
            )
            msgs.append({"role": "function", "name": "read", "content": f"contents v{i}"})
        return msgs

    loop = by_name(extract("openai_chat", legacy(['{"path": "a.py"}'] * 3)))[TOOL_LOOP]
    assert (loop.value, loop.details["kind"], loop.details["tool"]) == (3.0, "consecutive_call", "read")
    # Different arguments are different calls.
    assert TOOL_LOOP not in by_name(extract("openai_chat", legacy([f'{{"path": "{p}.py"}}' for p in "abc"])))


def test_arguments_json_cannot_write_still_tell_calls_apart() -> None:
    """Integers past 64 bits (which orjson refuses) are hashed by the fallback walk, not all alike."""

    def calls(values: list[int]) -> list[Any]:
        return conversation(
            "anthropic", [Step("seek", {"offset": v}, f"chunk {i}") for i, v in enumerate(values)]
        )

    assert by_name(extract("anthropic", calls([2**70] * 3)))[TOOL_LOOP].details["tool"] == "seek"
    assert TOOL_LOOP not in by_name(extract("anthropic", calls([2**70, 2**71, 2**72])))


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_edit_test_cycles_are_not_a_loop_unless_the_result_repeats(protocol: str) -> None:
    progress = [
        "===== 3 failed, 3 passed in 0.41s =====",
        "===== 2 failed, 4 passed in 0.40s =====",
        "===== 1 failed, 5 passed in 0.43s =====",
    ]
    steps: list[Step] = []
    for i, out in enumerate(progress):
        steps += [
            Step("edit", {"path": "a.py", "patch": f"fix {i}"}, "ok"),
            Step("bash", {"command": "pytest"}, out),
        ]
    assert TOOL_LOOP not in by_name(extract(protocol, conversation(protocol, steps)))

    stuck: list[Step] = []
    for i in range(3):
        out = f"FAILED test_a.py::test_x - assert 1 == 2\n===== 1 failed, 5 passed in 0.4{i}s ====="
        stuck += [
            Step("edit", {"path": "a.py", "patch": f"try {i}"}, "ok"),
            Step("bash", {"command": "pytest"}, out),
        ]
    loop = by_name(extract(protocol, conversation(protocol, stuck)))[TOOL_LOOP]
    assert (
        loop.value == 3.0
        and loop.details["kind"] == "same_call_same_result"
        and loop.details["tool"] == "bash"
    )


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_the_same_failure_from_different_calls_is_a_loop(protocol: str) -> None:
    out = "<returncode>127</returncode>\n<output>\nbash: jest: command not found\n</output>"
    steps = [Step("bash", {"command": c}, out) for c in ("jest", "npx jest --ci", "jest --runInBand")]
    signals = by_name(extract(protocol, conversation(protocol, steps)))
    assert signals[TOOL_LOOP].details["kind"] == "same_failing_result"
    assert signals[TOOL_FAILURES].value == 3.0
    assert signals[EXIT_CODE].value == 127.0


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_build_error_is_cleared_by_later_success_evidence(protocol: str) -> None:
    broken = Step("bash", {"command": "tsc"}, sample("tsc_errors.txt"))
    look = Step("read", {"path": "src/index.ts"}, "export const x = 1;\n")
    fixed = Step("bash", {"command": "tsc"}, "Exit code: 0\n")
    signals = by_name(extract(protocol, conversation(protocol, [broken, look])))
    b = signals[BUILD_ERROR]
    assert (b.success, b.details["kind"], b.details["age"]) == (False, "typescript", 1)
    assert b.weight == pytest.approx(0.4 * 0.85)
    signals = by_name(extract(protocol, conversation(protocol, [broken, look, fixed])))
    assert BUILD_ERROR not in signals
    assert signals[EXIT_CODE].success is None and signals[EXIT_CODE].value == 0.0


def test_runtime_error_and_exit_code_from_chat() -> None:
    steps = [
        Step("bash", {"command": "python migrate.py"}, sample("python_traceback.txt") + "\nexit status 1")
    ]
    signals = by_name(extract("openai_chat", conversation("openai_chat", steps)))
    assert signals[RUNTIME_ERROR].details["kind"] == "python"
    assert signals[EXIT_CODE].success is False
    label = summarize(list(signals.values()))
    assert label is not None and (label.success, label.source, label.score) == (False, RUNTIME_ERROR, 0.0)


def test_responses_custom_and_shell_calls_are_read() -> None:
    items = [
        {
            "type": "local_shell_call",
            "call_id": "s1",
            "action": {"type": "exec", "command": ["go", "test", "./..."]},
        },
        {"type": "local_shell_call_output", "call_id": "s1", "output": sample("go_short_fail.txt")},
        {"type": "custom_tool_call", "call_id": "p1", "name": "apply_patch", "input": "*** Begin Patch"},
        {"type": "custom_tool_call_output", "call_id": "p1", "output": "Done!"},
    ]
    t = by_name(extract("openai_responses", items))[TESTS]
    assert t.details["runner"] == "go" and t.details["tool"] == "local_shell" and t.details["age"] == 1


def test_parallel_anthropic_results_in_one_message() -> None:
    msgs = [
        {"role": "user", "content": "go"},
        {
            "role": "assistant",
            "content": [
                {"type": "tool_use", "id": "a", "name": "bash", "input": {"command": "pytest"}},
                {"type": "tool_use", "id": "b", "name": "bash", "input": {"command": "ruff check"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "a", "content": "2 passed in 0.1s"},
                {"type": "tool_result", "tool_use_id": "b", "content": "All checks passed!"},
            ],
        },
    ]
    t = by_name(extract("anthropic", msgs))[TESTS]
    assert (t.success, t.details["age"], t.details["tool"]) == (True, 1, "bash")


# -- summarize -------------------------------------------------------------------------------


def sig(name: str, success: bool | None, weight: float, value: float | None = None) -> Signal:
    return Signal(name, value, success, weight, {})


def test_tests_dominate_heavier_contrary_signals() -> None:
    signals = [
        sig(TOOL_LOOP, False, 0.9),
        sig(BUILD_ERROR, False, 0.8),
        sig(TESTS, True, 0.3, value=1.0),
    ]
    label = summarize(signals)
    assert label is not None
    assert (label.success, label.source, label.score, label.weight) == (True, TESTS, 1.0, 0.3)
    assert label.details["disagreeing"] == [BUILD_ERROR, TOOL_LOOP]


def test_without_tests_the_heaviest_signal_decides_and_agreement_adds_weight() -> None:
    signals = [sig(EXIT_CODE, False, 0.1, 1.0), sig(BUILD_ERROR, False, 0.4), sig(TOOL_LOOP, False, 0.2)]
    label = summarize(signals)
    assert label is not None
    assert (label.success, label.source, label.score) == (False, BUILD_ERROR, 0.0)
    assert label.weight == pytest.approx(1 - 0.9 * 0.6 * 0.8)
    assert label.details["agreeing"] == [BUILD_ERROR, EXIT_CODE, TOOL_LOOP]


def test_a_label_without_tests_scores_its_verdict_and_stays_in_bounds() -> None:
    failed = summarize([sig(EXIT_CODE, False, 0.1, 1.0)])  # exit code 1: the value is the code
    assert failed is not None and (failed.success, failed.score) == (False, 0.0)
    passed = summarize([sig(EXIT_CODE, True, 0.1, 0.0)])
    assert passed is not None and (passed.success, passed.score) == (True, 1.0)
    # Whatever a signal claims, a score and a weight are shares.
    over = summarize([sig(TESTS, True, 1.5, value=1.5)])
    assert over is not None and (over.score, over.weight) == (1.0, 1.0)


def test_describing_signals_give_no_label() -> None:
    assert summarize([]) is None
    assert summarize([sig(EXIT_CODE, None, 0.1, 0.0), sig(TESTS, None, 1.0)]) is None
    assert summarize([sig(TESTS, True, 0.0, 1.0)]) is None
    assert summarize([None, "junk", 3]) is None  # type: ignore[list-item]


def test_resent_request_is_a_weak_failure() -> None:
    s = resent_signal(2)
    assert (s.name, s.value, s.success) == (RESENT, 2.0, False)
    label = summarize([s])
    assert label is not None and (label.success, label.source) == (False, RESENT)


def test_custom_weights() -> None:
    w = Weights(build_error=0.05, runtime_error=0.5, decay=0.5)
    msgs = conversation(
        "openai_chat", [Step("bash", {"command": "x"}, sample("python_syntax_error.txt")), Step("r", {}, "")]
    )
    signals = by_name(extract("openai_chat", msgs, weights=w))
    assert signals[BUILD_ERROR].weight == pytest.approx(0.025)
    assert signals[RUNTIME_ERROR].weight == pytest.approx(0.25)
    label = summarize(list(signals.values()))
    assert label is not None and label.source == RUNTIME_ERROR


# -- request fingerprints --------------------------------------------------------------------


def anthropic_body(**over: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": "claude-sonnet-4-5",
        "max_tokens": 4096,
        "stream": True,
        "metadata": {"user_id": "u1"},
        "system": [{"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}}],
        "messages": [{"role": "user", "content": [{"type": "text", "text": "fix it"}]}],
        "tools": [
            {
                "name": "bash",
                "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}},
            }
        ],
    }
    body.update(over)
    return body


def test_fingerprint_ignores_the_model_and_delivery_settings() -> None:
    base = request_fingerprint("anthropic", anthropic_body())
    assert base == request_fingerprint(
        "anthropic", anthropic_body(model="claude-haiku-4-5", max_tokens=1, stream=False)
    )
    assert base == request_fingerprint(
        "anthropic", anthropic_body(metadata={"user_id": "other"}, temperature=0.2)
    )
    moved = anthropic_body()
    moved["system"] = [{"type": "text", "text": "You are Claude Code."}]
    moved["messages"] = [
        {
            "role": "user",
            "content": [{"type": "text", "text": "fix it", "cache_control": {"type": "ephemeral"}}],
        }
    ]
    assert base == request_fingerprint("anthropic", moved)
    reordered = dict(reversed(list(anthropic_body().items())))
    assert base == request_fingerprint("anthropic", reordered)


def test_fingerprint_changes_with_content() -> None:
    base = request_fingerprint("anthropic", anthropic_body())
    others = [
        anthropic_body(messages=[{"role": "user", "content": [{"type": "text", "text": "fix it!"}]}]),
        anthropic_body(system="You are Claude Code."),
        anthropic_body(tools=[]),
    ]
    digests = {request_fingerprint("anthropic", b) for b in others}
    assert base not in digests and len(digests) == len(others)
    assert base != request_fingerprint("openai_chat", anthropic_body())
    chat = {"model": "gpt-5", "messages": [{"role": "user", "content": "hi"}]}
    responses = {"model": "gpt-5", "input": "hi", "instructions": "be brief"}
    assert request_fingerprint("openai_chat", chat) == request_fingerprint(
        "openai_chat", chat | {"model": "o3"}
    )
    assert request_fingerprint("openai_responses", responses) != request_fingerprint(
        "openai_responses", responses | {"instructions": "be long"}
    )


def test_stable_hash_distinguishes_types_and_survives_junk() -> None:
    assert len({stable_hash(v) for v in (1, 1.5, "1", True, None, [1], {"1": 1}, [], {}, "")}) == 10
    cyclic: dict[str, Any] = {"a": 1}
    cyclic["self"] = cyclic
    deep: Any = "leaf"
    for _ in range(100_000):
        deep = [deep]
    for junk in (cyclic, deep, {1: object(), (2,): b"x"}, None, 3.5, float("nan"), "\ud800"):
        a = request_fingerprint("anthropic", junk)
        assert a == request_fingerprint("anthropic", junk)
    # A block shared by two places hashes like two equal copies (as its JSON would).
    block = {"type": "text", "text": "same"}
    assert stable_hash([block, block]) == stable_hash([dict(block), dict(block)])
    assert stable_hash(cyclic) != stable_hash({"a": 1, "self": {"a": 1}})
    bomb: list[Any] = ["x"]
    for _ in range(80):
        bomb = [bomb, bomb]  # 2**80 leaves if walked naively
    assert stable_hash(bomb, max_nodes=10_000) == stable_hash(bomb, max_nodes=10_000)
    assert stable_hash(bomb, max_nodes=10_000) != stable_hash(bomb, max_nodes=20_000)


def test_stable_hash_tells_apart_what_json_tells_apart() -> None:
    """Equal values hash alike (key order aside); values that differ in a type, a key, a bool or
    after a cycle do not, and no value raises, whatever is in it."""
    values = (1, 1.5, "1", b"1", b"2", True, False, None, [1], {"1": 1}, {"2": 1}, [], {}, "", object())
    assert len({stable_hash(v) for v in values}) == len(values)
    assert stable_hash({"a": 1, "b": [2, 3]}) == stable_hash({"b": [2, 3], "a": 1})
    assert stable_hash(object()) == stable_hash(object())  # junk hashes by its type
    cyclic: dict[str, Any] = {"a": 1}
    cyclic["self"] = cyclic
    assert stable_hash([cyclic, 1]) != stable_hash([cyclic, 2])  # what follows a cycle still counts
    assert stable_hash({1: object(), (2,): b"x"}) != stable_hash({1: object(), (2,): b"y"})


def test_stable_hash_walks_every_node_within_its_bound() -> None:
    # [1, 2] is four nodes: the list, its two items and its end.
    assert stable_hash([1, 2], max_nodes=4) == stable_hash([1, 2])
    assert stable_hash([1, 2], max_nodes=3) != stable_hash([1, 2])


# -- malformed input -------------------------------------------------------------------------

MALFORMED: list[Any] = [
    None,
    1,
    "x",
    [],
    {"role": "tool", "content": None},
    {"role": "tool", "tool_call_id": 5, "content": {"a": 1}},
    {"role": "assistant", "tool_calls": "nope"},
    {
        "role": "assistant",
        "tool_calls": [None, {"function": 3}, {"function": {"name": 1, "arguments": "{bad"}}],
    },
    {"role": "assistant", "function_call": {"name": "legacy", "arguments": None}},
    {"role": "user", "content": [None, {"type": "tool_result", "content": {"a": 1}, "is_error": "yes"}]},
    {
        "role": "user",
        "content": [{"type": "tool_result", "tool_use_id": [], "content": [None, 1, {"text": 2}]}],
    },
    {"role": "assistant", "content": [{"type": "tool_use", "id": None, "name": None, "input": [[["x"]]]}]},
    {"type": "function_call_output", "output": 12},
    {"type": "function_call", "call_id": {}, "name": [], "arguments": 7},
    {"type": "local_shell_call", "action": None},
]


@pytest.mark.parametrize("protocol", [*PROTOCOLS, "bogus"])
def test_malformed_messages_never_raise(protocol: str) -> None:
    assert extract(protocol, None) == []
    assert extract(protocol, "messages") == []
    assert extract(protocol, {"messages": []}) == []
    signals = extract(protocol, MALFORMED)
    assert all(isinstance(s, Signal) for s in signals)
    summarize(signals)


def test_random_junk_never_raises() -> None:
    rnd = random.Random(1234)
    keys = ["role", "content", "type", "tool_calls", "function", "name", "arguments", "id", "tool_call_id",
            "tool_use_id", "call_id", "output", "input", "is_error", "text", "action"]  # fmt: skip
    atoms: list[Any] = [None, 0, -1, 2.5, True, "", "tool", "assistant", "tool_result", "tool_use",
                        "function_call", "function_call_output", "3 passed in 0.1s", "Exit code 1"]  # fmt: skip

    def junk(depth: int) -> Any:
        if depth == 0 or rnd.random() < 0.3:
            return rnd.choice(atoms)
        if rnd.random() < 0.5:
            return [junk(depth - 1) for _ in range(rnd.randint(0, 4))]
        return {rnd.choice(keys): junk(depth - 1) for _ in range(rnd.randint(0, 5))}

    for _ in range(300):
        msgs = [junk(5) for _ in range(rnd.randint(0, 8))]
        for protocol in PROTOCOLS:
            summarize(extract(protocol, msgs, window=rnd.randint(-1, 10), loop_threshold=rnd.randint(0, 3)))
        request_fingerprint("anthropic", {"messages": msgs})


# -- bounded cost ----------------------------------------------------------------------------

N = 1_000_000


def mixed_tokens() -> str:
    rnd = random.Random(7)
    vocab = ["passed", " ", ", ", "1", "\n", "=", " in ", "s", "\x1b[", ".go:", ":", "Error", "exit code",
             "Tests", "\t", "ok", "FAIL", "|", "(", ")", "0.5", "Ran ", "test result: ok. ", "Traceback"]  # fmt: skip
    return "".join(rnd.choice(vocab) for _ in range(N // 3))[:N]


# Each aims at a pattern's weak spot: long runs that a greedy part eats and then gives back.
ADVERSARIAL: dict[str, Callable[[], str]] = {
    "digits": lambda: "1" * N,
    "pytest_items": lambda: "1 passed, " * (N // 10),
    "equals": lambda: "=" * N,
    "exit_spaces": lambda: "exit code" + " " * N,
    "returncode": lambda: "<returncode>" + " " * N,
    "ansi_params": lambda: "\x1b[" + "1;" * (N // 2),
    "ansi_opens": lambda: "\x1b[" * (N // 2),
    "osc": lambda: "\x1b]" + "a" * N,
    "go_path": lambda: "./" + "a." * (N // 2),
    "c_paths": lambda: "a.c:1:1: " * (N // 9),
    "jest_items": lambda: "Tests: " + "1 a, " * (N // 5),
    "vitest_items": lambda: "Tests " + "1 a | " * (N // 6),
    "mocha_spaces": lambda: " " * N + "1 passing (",
    "node_error": lambda: "Error: " + "x" * N,
    "rust_thread": lambda: "thread '" + "a" * N,
    "ran_lines": lambda: "Ran 1 tests in 1s\n" * (N // 18),
    "pytest_lines": lambda: "1 passed in 1s\n" * (N // 15),
    "go_test_lines": lambda: "--- PASS: T\n" * (N // 12),
    "newlines": lambda: "\n" * N,
    "carriage_returns": lambda: "\r" * N,
    "mixed": mixed_tokens,
}


# Every literal the parsers test for before running a pattern, so that all patterns do run.
NEEDLES = (
    "\nx in Ran Tests: Tests ok PASS FAIL --- test result: 1 passing ( exit returncode error TS Error: "
    "ModuleNotFoundError ImportError Cannot find module .go: error: .java: make Traceback panic: panicked at"
)


@pytest.mark.parametrize("name", sorted(ADVERSARIAL))
def test_one_megabyte_of_hostile_text_is_cheap(name: str) -> None:
    text = ADVERSARIAL[name]() + NEEDLES
    assert len(text) >= N * 0.9
    start = time.thread_time()
    parse_test_summary(text)
    analyze(text)
    capped = time.thread_time() - start
    assert capped < 1.0, f"{name}: {capped:.3f}s with the default cap"  # typically a few ms
    # The whole megabyte too, so that the cap is not what hides a pattern's backtracking: linear
    # patterns take a fraction of a second here, a catastrophic one would not finish at all.
    # CPU time of this thread, not wall time: a busy machine must not fail a linear pattern.
    start = time.thread_time()
    analyze(text, max_chars=None)
    whole = time.thread_time() - start
    assert whole < 3.0, f"{name}: {whole:.3f}s uncapped"


def test_long_conversation_reads_only_the_window() -> None:
    big = "x" * N + "\n5 passed in 1s\n"
    steps = [Step("bash", {"command": f"step {i}"}, big) for i in range(2_000)]
    msgs = conversation("openai_chat", steps)
    start = time.thread_time()
    signals = extract("openai_chat", msgs)
    assert time.thread_time() - start < 1.0
    assert by_name(signals)[TESTS].details["passed"] == 5


# -- reading a conversation once: slots kept between its requests -----------------------------


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_slots_give_the_signals_a_fresh_read_gives(protocol: str) -> None:
    steps = [Step("bash", {"command": "pytest -q"}, PYTEST_FAIL) for _ in range(3)]
    steps += [Step("bash", {"command": "make"}, "make: *** [all] Error 2\nexit code 2", True)] * 3
    msgs = conversation(protocol, steps)
    seen: list[Any] = [None] * len(msgs)
    first = extract(protocol, msgs, seen=seen)
    assert first == extract(protocol, msgs)
    start = max(0, len(msgs) - 20)
    assert all(slot is not None for slot in seen[start:]) and all(slot is None for slot in seen[:start])
    # The next turn keeps the slots of the messages it shares and reads only its new ones.
    nxt = conversation(protocol, [*steps, Step("bash", {"command": "pytest -q"}, PYTEST_PASS)])
    carried = seen + [None] * (len(nxt) - len(msgs))
    assert extract(protocol, nxt, seen=carried) == extract(protocol, nxt)
    assert carried[: len(msgs)] == seen and all(slot is not None for slot in carried[-2:])


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_without_tools_only_when_the_window_read_holds_no_tool_event(protocol: str) -> None:
    plain = [{"role": "user", "content": "explain this"}, {"role": "assistant", "content": "sure"}] * 3
    seen: list[Any] = [None] * len(plain)
    assert not without_tools(seen, len(plain))  # not read yet: unknown
    switches(protocol, plain, seen=seen)
    assert without_tools(seen, len(plain)) and extract(protocol, plain) == []
    assert not without_tools(None, len(plain))
    msgs = conversation(protocol, [Step("bash", {"command": "pytest -q"}, PYTEST_FAIL)])
    seen = [None] * len(msgs)
    switches(protocol, msgs, seen=seen)
    assert not without_tools(seen, len(msgs)) and extract(protocol, msgs) != []


def test_a_filled_slot_is_used_instead_of_the_message() -> None:
    from router.features.signals.conversation import read

    msgs = conversation("openai_chat", [Step("bash", {"command": "pytest -q"}, PYTEST_PASS)])
    failing = conversation("openai_chat", [Step("bash", {"command": "pytest -q"}, PYTEST_FAIL)])
    stale: list[Any] = [None] * (len(msgs) - 1) + [read(failing[-1], 20_000)]
    tests = by_name(extract("openai_chat", msgs, seen=stale))[TESTS]
    assert tests.success is False  # read from the slot, not from the (passing) message
    assert by_name(extract("openai_chat", msgs))[TESTS].success is True
    # Slots that do not match the conversation's length are ignored.
    assert extract("openai_chat", msgs, seen=[None]) == extract("openai_chat", msgs)


# -- what a routing decision waits for: the switch signals, from a glance ----------------------


def _switch_cases() -> list[list[Step]]:
    fail = Step("bash", {"command": "make"}, "make: *** [all] Error 2\nexit code 2", True)
    return [
        [Step("bash", {"command": "pytest -q"}, PYTEST_FAIL)] * 4,  # a loop on the same failing run
        [fail, fail, fail],  # a failure run
        [Step("read", {"path": f"f{i}.py"}, f"line {i}\nexit code 0") for i in range(5)],  # neither
        [
            Step("bash", {"command": "pytest -q"}, PYTEST_FAIL),
            Step("bash", {"command": "pytest"}, PYTEST_PASS),
        ],
    ]


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("steps", _switch_cases(), ids=("loop", "failures", "neither", "tests"))
def test_switches_are_the_loop_and_failure_signals_of_extract(protocol: str, steps: list[Step]) -> None:
    from router.features.signals import switches

    msgs = conversation(protocol, steps)
    full = [s for s in extract(protocol, msgs) if s.name in (TOOL_LOOP, TOOL_FAILURES)]
    assert switches(protocol, msgs) == full
    seen: list[Any] = [None] * len(msgs)
    assert switches(protocol, msgs, seen=seen) == full
    assert extract(protocol, msgs, seen=seen) == extract(protocol, msgs)  # slots filled by a glance


def test_a_glance_is_the_analysis_without_errors_and_tests() -> None:
    from router.features.signals import glance

    for text in (
        PYTEST_FAIL,
        PYTEST_PASS,
        "error[E0308]: mismatched types\nexit code 101",
        "Traceback (most recent call last):\n",
    ):
        full, quick = analyze(text, True), glance(text, True)
        assert (quick.exit_code, quick.is_error, quick.digest) == (full.exit_code, full.is_error, full.digest)
        assert quick.failed == full.failed and (quick.build_error, quick.runtime_error, quick.tests) == (
            None,
            None,
            None,
        )
    assert analyze(PYTEST_FAIL).tests is not None
