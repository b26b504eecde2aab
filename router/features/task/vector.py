"""Task features: what the router knows about a task from the request that starts it.

One function serves the proxy, ``router train`` and ``router eval``, so what is trained and
evaluated is what routes live traffic. The features are computed from what a live router sees
— the first user message, the system prompt, the tools offered, a repository hint — never from
hindsight. Text becomes signed hashed word and word-pair counts (no vocabulary to ship, no text
kept: the log stores only the hashed vector), plus a few shape features. The repository gets a
hashed slot of its own at full weight: on real agent outcomes it is the strongest single
predictor of difficulty, and diluted among the words of a long issue it was all but lost.
"""

from __future__ import annotations

import itertools
import math
import re
import zlib
from collections.abc import ItemsView, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

#: Width of the hashed text space. Part of the artifact's feature schema.
HASH_DIM = 2048
SCHEMA_VERSION = 2

#: Dense features, in the order the artifact's weights expect.
NUMERIC = (
    "bias",
    "log_chars",
    "log_lines",
    "code_fences",
    "has_traceback",
    "n_urls",
    "log_system_chars",
    "n_tools",
    "attempt",
)

_WORD = re.compile(r"[a-z_][a-z0-9_]{1,30}")
#: A traceback is ``Traceback (most recent call last)``, ``panicked at``, or a stack frame that
#: ``\bat [\w.$]+\(.*:\d+\)`` matches: the frame pattern starts with its literal here (the boundary
#: checked behind it), so the engine skips to each "at " instead of trying every position.
_TRACEBACK_LINES = ("Traceback (most recent call last)", "panicked at")
_FRAME = re.compile(r"at (?<!\wat )[\w.$]+\(.*:\d+\)")
_URL = re.compile(r"https?://\S+")
_REPO = re.compile(r"github\.com/([\w.-]+/[\w.-]+)")
#: A git remote as a system prompt shows one (``origin https://github.com/o/n.git``,
#: ``git@github.com:o/n.git``): only a remote, since system prompts carry other github.com links
#: (Claude Code's names its own issue tracker, which would make every task "anthropics/claude-code").
_REMOTE = re.compile(
    r"(?:git@github\.com:|(?:origin|remote|upstream)\b[^\n]{0,40}?github\.com/|github\.com/(?=[\w.-]+/[\w.-]+?\.git\b))"
    r"([\w.-]+/[\w.-]+?)(?:\.git)?(?=[\s/'\"#?)]|$)"
)
MAX_TEXT = 20_000

Vector = dict[int, float]


def schema() -> dict[str, Any]:
    return {"version": SCHEMA_VERSION, "hash_dim": HASH_DIM, "numeric": list(NUMERIC)}


def _bucket(token: str) -> tuple[int, float]:  # what _hashed computes for each word and pair
    h = zlib.crc32(token.encode())
    return (h >> 1) % HASH_DIM, 1.0 if h & 1 else -1.0


def _has_traceback(text: str) -> bool:
    return any(line in text for line in _TRACEBACK_LINES) or _FRAME.search(text) is not None


def _hashed(text: str) -> tuple[list[int], list[float]]:
    """The hashed text features: buckets of the text's words and word pairs, each with its signed
    count log-scaled, L2-normalised (so long issues do not dominate by length alone), in the order
    each bucket first occurs.

    A real issue has ~2,000 words and pairs: they are hashed by ``map`` and summed by numpy rather
    than one Python step each, to exactly the floats the step-by-step sums gave (the counts are
    small integers, the logarithms are ``math.log1p``'s, and ``cumsum`` adds the squares in order).
    """
    words = _WORD.findall(text.lower())
    grams = [*words, *map(" ".join, itertools.pairwise(words))]
    if not grams:
        return [], []
    h = np.fromiter(map(zlib.crc32, map(str.encode, grams)), dtype=np.int64, count=len(grams))
    idx = (h >> 1) % HASH_DIM
    sums = np.bincount(idx, weights=np.where(h & 1, 1.0, -1.0), minlength=HASH_DIM)
    first = np.full(HASH_DIM, len(grams), dtype=np.int64)
    np.minimum.at(first, idx, np.arange(len(grams)))
    nonzero = np.flatnonzero(sums)
    if not len(nonzero):
        return [], []
    order = nonzero[np.argsort(first[nonzero])]
    counts = sums[order]
    magnitudes, which = np.unique(np.abs(counts), return_inverse=True)
    logs = np.array([math.log1p(m) for m in magnitudes.tolist()])[which]
    scaled = np.copysign(logs, counts)
    norm = math.sqrt(float(np.cumsum(scaled * scaled)[-1])) or 1.0
    return order.tolist(), (scaled / norm).tolist()


def repo_hint(first_user_text: str, header: str | None = None, system_text: str = "") -> str | None:
    """The task's repository: the ``x-router-repo`` header, else the first ``github.com/owner/name``
    in the opening message, else a git remote in the system prompt. One answer for the log, the
    task vector and scopes."""
    if header:
        return header
    m = _REPO.search(first_user_text[:MAX_TEXT]) or _REMOTE.search(system_text[:MAX_TEXT])
    return m.group(1) if m else None


def task_vector(
    first_user_text: str,
    system_text: str = "",
    n_tools: int = 0,
    repo: str | None = None,
) -> Vector:
    """Sparse features: indices < len(NUMERIC) are the dense ones, the rest hashed text."""
    text = first_user_text[:MAX_TEXT]
    vec: Vector = {
        0: 1.0,
        1: math.log1p(len(first_user_text)) / 10,
        2: math.log1p(first_user_text.count("\n")) / 10,
        3: min(text.count("```"), 10) / 10,
        4: 1.0 if _has_traceback(text) else 0.0,
        5: min(len(_URL.findall(text)), 10) / 10,
        6: math.log1p(len(system_text)) / 10,
        7: min(n_tools, 50) / 50,
    }
    repo = repo or repo_hint(text)
    base = len(NUMERIC)
    buckets, values = _hashed(text)
    vec.update(zip([base + i for i in buckets], values, strict=True))
    if repo:
        idx, _ = _bucket(f"repo:{repo.lower()}")
        vec[base + idx] = vec.get(base + idx, 0.0) + 1.0
    return vec


class Packed(Mapping[int, float]):
    """A task vector kept for as long as its task is remembered: two arrays, 12 bytes a feature.

    As a dict of Python numbers a feature takes about 100 bytes, and a real issue hashes to ~200
    features (SWE-bench Verified: median 203, up to 774): with the tracker remembering up to 100k
    tasks, that was gigabytes. The scorer reads the arrays directly (``arrays``).
    """

    __slots__ = ("index_array", "value_array")

    def __init__(self, vec: Mapping[int, float]) -> None:
        order = sorted(vec)
        self.index_array = np.array(order, dtype=np.int32)
        self.value_array = np.array([vec[i] for i in order], dtype=np.float64)
        self.index_array.flags.writeable = self.value_array.flags.writeable = False

    def __getitem__(self, i: int) -> float:
        j = int(np.searchsorted(self.index_array, i))
        if j < len(self.index_array) and self.index_array[j] == i:
            return float(self.value_array[j])
        raise KeyError(i)

    def __iter__(self) -> Iterator[int]:
        return iter(self.index_array.tolist())

    def __len__(self) -> int:
        return len(self.index_array)

    def items(self) -> _PackedItems:
        return _PackedItems(self)


class _PackedItems(ItemsView[int, float]):
    _mapping: Packed

    def __iter__(self) -> Iterator[tuple[int, float]]:
        return zip(self._mapping.index_array.tolist(), self._mapping.value_array.tolist(), strict=True)


def arrays(vec: Mapping[int, float]) -> tuple[np.ndarray, np.ndarray]:
    """(indices, values) of a vector, without copying a packed one."""
    if isinstance(vec, Packed):
        return vec.index_array, vec.value_array
    return (
        np.fromiter(vec.keys(), dtype=np.int64, count=len(vec)),
        np.fromiter(vec.values(), dtype=np.float64, count=len(vec)),
    )


def with_attempt(vec: Mapping[int, float], attempt: int) -> Vector:
    out = dict(vec.items())
    out[NUMERIC.index("attempt")] = min(max(attempt - 1, 0), 5) / 5
    return out


def dense(vec: Mapping[int, float]) -> list[float]:
    """The full-width vector (for training)."""
    row = [0.0] * (len(NUMERIC) + HASH_DIM)
    for i, v in vec.items():
        row[i] = v
    return row


def dot(weights: Sequence[float], vec: Mapping[int, float]) -> float:
    return sum(weights[i] * v for i, v in vec.items())


def to_json(vec: Mapping[int, float]) -> dict[str, float]:
    return {str(i): round(v, 6) for i, v in vec.items()}


def from_json(obj: Mapping[str, float]) -> Vector:
    return {int(i): float(v) for i, v in obj.items()}
