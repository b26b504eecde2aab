"""Tool output clean-up shared by the parsers: a bounded tail, no ANSI colours, no carriage returns."""

from __future__ import annotations

import re
from typing import Final

#: Summaries sit at the end of a run's output; 20 KB of tail holds them with room for a failure report.
DEFAULT_MAX_CHARS: Final = 20_000
#: Harnesses report an exit code within this many characters of the start (mini-swe-agent, Codex)
#: or of the end (OpenHands, most shells' "exit status"); the digest of a result reads as much.
HEAD_CHARS: Final = 2_048
TAIL_CHARS: Final = 4_096

# CSI sequences, OSC sequences with a terminator, then any other two-byte escape. The character
# classes of each part are disjoint, so a long unterminated sequence costs one linear pass.
_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]{0,1024}(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")


def strip_ansi(text: str) -> str:
    return _ANSI.sub("", text) if "\x1b" in text else text


def clean(text: str, max_chars: int | None = DEFAULT_MAX_CHARS) -> str:
    """The last ``max_chars`` of ``text`` (whole lines only), without colours, with ``\\n`` line ends."""
    if max_chars is not None and len(text) > max_chars:
        text = text[-max_chars:] if max_chars > 0 else ""
        # The cut line could read as a different summary ("15 passed" cut to "5 passed"): drop it.
        nl = text.find("\n")
        if nl != -1:
            text = text[nl + 1 :]
    text = strip_ansi(text)
    if "\r" in text:
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    return text


def head(text: str, n: int = HEAD_CHARS) -> str:
    return strip_ansi(text[:n])
