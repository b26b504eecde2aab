"""What one tool result says: exit code, build or runtime errors, a test summary.

Only the head (where some harnesses report the exit code) and the tail (where summaries and
final errors are) of the text are scanned.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import re
from collections import deque
from dataclasses import dataclass
from typing import Any, Final

import orjson

from router.features.signals.testrunners import TestSummary, last_summary
from router.features.signals.text import DEFAULT_MAX_CHARS, HEAD_CHARS, TAIL_CHARS, clean, head

# How harnesses report a command's exit: mini-swe-agent's tag, Claude Code's and Codex's
# "Exit code N" line, OpenHands' closing note, and the "[exit code: N]" style of others.
_EXIT_HARNESS = re.compile(
    r"<returncode>[ \t]{0,4}(-?\d{1,4})[ \t]{0,4}</returncode>"
    r"|^(?:error: )?exit code:?[ \t]{0,4}(-?\d{1,4})\b"
    r"|\[exit code:?[ \t]{0,4}(-?\d{1,4})\]"
    r"|command failed with exit code:?[ \t]{0,4}(-?\d{1,4})\b"
    r"|(?:process|command) exited with (?:exit )?code:?[ \t]{0,4}(-?\d{1,4})\b"
    r"|command completed with exit code:?[ \t]{0,4}(-?\d{1,4})\b",
    re.I | re.M,
)
# What the output itself may say about an exit (go's test binary, subprocess errors, shells).
_EXIT_OUTPUT = re.compile(
    r"\bexit status (-?\d{1,4})\b|\bnon-zero exit status (-?\d{1,4})\b|\bexit(?:ed with)? code:?[ \t]{0,4}(-?\d{1,4})\b",
    re.I,
)


@dataclass(frozen=True, slots=True)
class _Probe:
    """A pattern run only when its literal needles occur in the text (cheap ``in`` tests).

    Each group of needles must have one occurring: the literals the pattern cannot match
    without. A line-anchored pattern tries every position of the text, a needle costs a scan in C.
    """

    kind: str
    needles: tuple[tuple[str, ...], ...]
    pattern: re.Pattern[str]

    def may_match(self, text: str) -> bool:
        # Loops rather than all(any(...)): two generators per probe cost more than the scans.
        for group in self.needles:
            for needle in group:
                if needle in text:
                    break
            else:
                return False
        return True


def _probe(kind: str, needles: tuple[str, ...], pattern: str, *more: tuple[str, ...]) -> _Probe:
    # Runs at import only, before mutation testing switches a mutant on: none could be caught.
    return _Probe(kind, (needles, *more), re.compile(pattern, re.M))  # pragma: no mutate


_BUILD: Final = (
    _probe("rust", ("error[E", "error: could not compile "), r"^error(?:\[E\d{4}\]|: could not compile )"),
    _probe("typescript", ("error TS",), r"error TS\d{4,5}: "),
    _probe(
        "syntax", ("SyntaxError: ", "IndentationError: ", "TabError: "), r"(?:Syntax|Indentation|Tab)Error: "
    ),
    _probe(
        "module_not_found",
        ("ModuleNotFoundError", "ImportError", "Cannot find module"),
        r"ModuleNotFoundError: |ImportError: cannot import name |^Error: Cannot find module '",
    ),
    _probe("go", (".go:",), r"^(?=[\w.])(?:\./)?[\w./-]{1,300}\.go:\d+:\d+: "),
    _probe(
        "c",
        (": error: ", ": fatal error: "),
        r"^(?=[\w.])[\w./-]{1,300}\.(?:c|cc|cpp|cxx|h|hpp):\d+:\d+: (?:fatal )?error: ",
    ),
    _probe("java", (".java:",), r"^(?=[\w.])[\w./-]{1,300}\.java:\d+: error: "),
    _probe("make", (": *** ",), r"^make(?:\[\d+\])?: \*\*\* "),
)
_RUNTIME: Final = (
    _probe("python", ("Traceback (most recent call last):",), r"^Traceback \(most recent call last\):"),
    _probe("go_panic", ("panic: ",), r"^panic: "),
    _probe("rust_panic", ("panicked at",), r"^thread '[^'\n]{0,300}' panicked at "),
    _probe(
        "node",
        ("Error",),
        r"^(?=[A-Z])(?:[A-Z]\w{0,40})?Error(?: \[\w{1,40}\])?: [^\n]{0,1000}\n[ \t]{2,8}at ",
        (" at ", "\tat "),
    ),
)

# Timings and addresses differ between runs that otherwise print the same thing. Written to
# start with the digit (the look-behinds then check what precedes it) so that the engine skips
# to digits instead of trying the whole pattern at every position; it masks exactly what
# ``(?<![\w.])\d+(?:\.\d+)?[ ]?(?:ms|s|seconds)\b|\b0x[0-9a-fA-F]{1,16}\b`` does.
_VOLATILE_PATTERN = (
    r"\d(?:(?<![\w.]\d)\d*(?:\.\d+)?[ ]?(?:ms|s|seconds)\b|(?<!\w\d)(?<=0)x[0-9a-fA-F]{1,16}\b)"
)
_VOLATILE = re.compile(_VOLATILE_PATTERN)
# On ASCII text (most tool output) \d, \w and \b mean the same with re.ASCII, whose tests are cheaper.
_VOLATILE_ASCII = re.compile(_VOLATILE_PATTERN, re.ASCII)
# Every match has a digit followed by "m", "s", " m", " s" or "x", and lies within one line: with
# digits made zeros (a C table lookup per byte), substring searches find the only lines to mask.
_DIGITS_TO_ZERO = bytes.maketrans(b"123456789", b"000000000")
_MASK_HINTS = (b"0s", b"0 s", b"0m", b"0 m", b"0x")
_MAX_MASKED_LINES = 32


def _mask_volatile(text: str) -> str:
    """``_VOLATILE.sub("#", text)``, computed on the lines where it can match."""
    if not text.isascii():
        return _VOLATILE.sub("#", text)
    zeroed = text.encode().translate(_DIGITS_TO_ZERO)
    starts: set[int] = set()
    for hint in _MASK_HINTS:
        i = zeroed.find(hint)
        while i != -1 and len(starts) <= _MAX_MASKED_LINES:
            starts.add(zeroed.rfind(b"\n", 0, i) + 1)
            i = zeroed.find(hint, i + 1)
    if not starts:
        return text
    if len(starts) > _MAX_MASKED_LINES:
        return _VOLATILE_ASCII.sub("#", text)
    # A line start is preceded by "\n", which the look-behinds treat as the start of the text.
    out: list[str] = []
    done = 0
    for start in sorted(starts):
        end = text.find("\n", start)
        end = len(text) if end == -1 else end
        out += (text[done:start], _VOLATILE_ASCII.sub("#", text[start:end]))
        done = end
    out.append(text[done:])
    return "".join(out)


@dataclass(frozen=True, slots=True)
class ToolOutcome:
    exit_code: int | None = None
    #: The protocol's own error flag (Anthropic ``is_error``); None when the protocol has none.
    is_error: bool | None = None
    build_error: str | None = None
    runtime_error: str | None = None
    tests: TestSummary | None = None
    #: A hash of the output's end with timings masked: equal results of repeated calls compare equal.
    digest: str = ""

    @property
    def failed(self) -> bool:
        return bool(self.is_error) or (self.exit_code is not None and self.exit_code != 0)

    @property
    def clean(self) -> bool:
        """Positive evidence that whatever broke before works now."""
        return (self.exit_code == 0 and not self.is_error) or self.tests is not None


def _first_code(m: re.Match[str] | None) -> int | None:
    if m is None:
        return None
    return next((int(g) for g in m.groups() if g is not None), None)


def _last(pattern: re.Pattern[str], text: str) -> re.Match[str] | None:
    last = deque(pattern.finditer(text), maxlen=1)
    return last[0] if last else None


def _last_kind(probes: tuple[_Probe, ...], text: str) -> str | None:
    """The kind of the probe whose match comes last in the text."""
    best: tuple[int, str] | None = None
    for p in probes:
        if p.may_match(text):
            m = _last(p.pattern, text)
            if m is not None and (best is None or m.start() > best[0]):
                best = m.start(), p.kind
    return best[1] if best else None


def _mentions_exit(text: str) -> bool:
    low = text.lower()
    return "exit" in low or "returncode" in low


def _exit_code(start: str, tail: str) -> int | None:
    code = None
    if _mentions_exit(start):
        code = _first_code(_EXIT_HARNESS.search(start))
    if code is None and _mentions_exit(tail):
        code = _first_code(_last(_EXIT_HARNESS, tail))
        if code is None:
            code = _first_code(_last(_EXIT_OUTPUT, tail))
    return code


def _harness_json(text: str) -> tuple[str, int | None] | None:
    """Shell results a harness writes as one JSON object: the printed text and its exit code.
    Codex's older ``{"output": ..., "metadata": {"exit_code": N}}``, and mini-swe-agent 2's
    ``{"returncode": N, "output": ...}`` (past 10,000 characters ``output_head`` and
    ``output_tail`` in place of ``output``), the PyPI release the README's recipe runs."""
    if not (text.startswith("{") and text.rstrip().endswith("}")):
        return None
    try:
        obj = orjson.loads(text)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(obj, dict):
        return None
    output, head_, tail_ = obj.get("output"), obj.get("output_head"), obj.get("output_tail")
    if not isinstance(output, str):
        if not (isinstance(head_, str) and isinstance(tail_, str)):
            return None
        output = f"{head_}\n{tail_}"
    meta = obj.get("metadata")
    code = meta.get("exit_code") if isinstance(meta, dict) else obj.get("returncode")
    return output, code if isinstance(code, int) and not isinstance(code, bool) else None


def analyze(
    text: Any, is_error: bool | None = None, *, max_chars: int | None = DEFAULT_MAX_CHARS
) -> ToolOutcome:
    """Read one tool result's text. Never raises; unreadable input gives an empty outcome."""
    if not isinstance(text, str):
        text = ""
    return _analyze(text, is_error, max_chars)


def glance(
    text: Any, is_error: bool | None = None, *, max_chars: int | None = DEFAULT_MAX_CHARS
) -> ToolOutcome:
    """The part of ``analyze`` a routing decision reads: exit code, error flag and digest.

    Loops and runs of failures are told from these alone; build and runtime errors and test
    summaries (left None here) only make the weak label, which can wait for ``analyze``.
    """
    if not isinstance(text, str):
        text = ""
    return _glance(text, is_error, max_chars)


def test_summary(text: Any, *, max_chars: int | None = DEFAULT_MAX_CHARS) -> TestSummary | None:
    """Only the test summary of ``analyze``: what the outcome label reads of every result, once."""
    if not isinstance(text, str):
        return None
    return _test_summary(text, max_chars)


def forget_results() -> None:
    _analyze.cache_clear()
    _glance.cache_clear()
    _test_summary.cache_clear()


def _output(text: str, max_chars: int | None) -> tuple[str, str, int | None]:
    """The text that was printed, its cleaned tail, and an exit code the harness reported apart."""
    code: int | None = None
    shell = _harness_json(text)
    if shell is not None:
        text, code = shell
    return text, clean(text, max_chars), code


# Agents resend every earlier tool result on every turn: each is read once, then remembered
# (bounded), so a growing conversation costs only its new tail — as token counting does.
@functools.lru_cache(maxsize=4096)
def _glance(text: str, is_error: bool | None, max_chars: int | None) -> ToolOutcome:
    text, tail, code = _output(text, max_chars)
    if code is None:
        code = _exit_code(head(text, HEAD_CHARS), tail[-TAIL_CHARS:])
    end = _mask_volatile(tail[-TAIL_CHARS:])
    digest = hashlib.blake2b(end.encode("utf-8", "replace"), digest_size=12)
    return ToolOutcome(exit_code=code, is_error=is_error, digest=digest.hexdigest())


@functools.lru_cache(maxsize=4096)
def _test_summary(text: str, max_chars: int | None) -> TestSummary | None:
    return last_summary(_output(text, max_chars)[1])


@functools.lru_cache(maxsize=4096)
def _analyze(text: str, is_error: bool | None, max_chars: int | None) -> ToolOutcome:
    seen = _glance(text, is_error, max_chars)
    _, tail, _ = _output(text, max_chars)
    return dataclasses.replace(
        seen,
        build_error=_last_kind(_BUILD, tail),
        runtime_error=_last_kind(_RUNTIME, tail),
        # The label reads every result's test summary (``test_summary``) after the signals have
        # analysed the latest ones: through its cache, each summary is parsed once.
        tests=_test_summary(text, max_chars),
    )
