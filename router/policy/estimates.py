"""What a call will take on a backend: its prompt in that provider's tokens, its output, its cached share.

Pure numbers, learned by ``router train`` from the log (the artifact's ``estimates``, per backend:
``router.learning.training.estimates``) or, before the log has any, priors:

* **Provider tokens.** The router counts (and estimates) prompts in o200k tokens; a provider bills
  and limits in its own. The ratio provider/o200k is learned per backend from the reported usage of
  the calls the router estimated without an anchor; before that, per provider family (Gemini's
  tokenizer counts 1.157 o200k tokens per token on agent conversations, OpenAI's is o200k).
* **Output.** The mean output of a call prices it (a median undercounts an agent's total output
  about 3x: most calls are short, a few are long); the 90th percentile is what a budget holds and,
  where above the policy's reserve, what the context window must leave room for. Where the log
  has enough calls of the same *turn shape* (how long the model's last turn and what it is
  answering are, and the program that turn ran: ``turn_cell``) the mean of that cell prices the
  call: still a mean, so sums stay unbiased, but a short tool result is not priced like a file
  just read.
* **Cache.** Providers cache a prefix in whole blocks (Gemini ~2k tokens, OpenAI 128), so what
  can be cached of a warm prefix is its whole blocks; ``cache_share`` is the share of those the
  provider reported cached (not all: an entry is evicted, a call goes to another machine). Where
  the log has enough calls of the same *cache cell* (``cache_cell``: how many whole blocks the
  previous call's reported cached count is behind the warm prefix, and how many blocks the prefix
  has) the cell's share is used: a call after a miss or a stale hit misses more often, a short
  prefix too. Still a share of a sum, so the cells' cached tokens sum to the log's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

__all__ = [
    "BOUNDS", "CACHE_BLOCKS", "FAMILY_RATIOS", "BackendEstimates", "Estimates", "cache_cell", "cell_mean", "parent_cell",
    "turn_cell", "turn_of_cell",
]  # fmt: skip

#: Provider tokens per o200k token, by the provider part of a litellm model name, before data.
FAMILY_RATIOS: Final[Mapping[str, float]] = {
    "openai": 1.0,
    "azure": 1.0,
    "gemini": 1.157,
    "vertex_ai": 1.157,
    # Claude's tokenizer cuts English and code finer than o200k (a rough prior; the log corrects it).
    "anthropic": 1.2,
    "bedrock": 1.2,
}
#: The cached share of the warm prefix's blocks before the log says: all of them (the provider's promise).
PRIOR_CACHE_SHARE: Final = 1.0
#: Tokens per cache block, by provider family: Gemini reports cached counts in steps of ~2k
#: (2,028, 4,044, 6,060... on the shipped trajectories), OpenAI caches in 128-token steps;
#: Anthropic caches up to the client's breakpoint, taken as the whole warm prefix (a block of 1).
CACHE_BLOCKS: Final[Mapping[str, int]] = {"gemini": 2048, "vertex_ai": 2048, "openai": 128, "azure": 128}


#: ``cache_cell``'s bounds: the gap (whole blocks the previous call's cached count is behind the
#: warm prefix) is capped at ``CACHE_GAP_CAP``; the prefix's size is cut at these whole blocks.
#: Chosen on training folds of the shipped trajectories (docs/routing.md, "Cache cells").
CACHE_GAP_CAP: Final = 6
CACHE_SIZE_CUTS: Final = (4, 8)  # two cuts, three sizes


def cache_cell(provider: str, cacheable: int, warm_cached: int | None) -> str | None:
    """The cache table's cell of a call with ``cacheable`` tokens of whole warm blocks, whose
    previous call on the same backend reported ``warm_cached`` cached tokens ("2:1": two blocks
    behind, a prefix of 4-7 blocks); None: no warm blocks, or the previous call's count is unknown."""
    if not cacheable or warm_cached is None:
        return None
    block = CACHE_BLOCKS.get(provider, 1)
    gap = min(max(-1, (cacheable - warm_cached) // block), CACHE_GAP_CAP)
    blocks = cacheable // block
    return f"{gap}:{(blocks >= CACHE_SIZE_CUTS[0]) + (blocks >= CACHE_SIZE_CUTS[1])}"


def turn_cell(turn_chars: tuple[int, int | None] | None, verb: str | None = None) -> str | None:
    """The output table's cell of a call: powers of two of the characters the model is answering
    and of its last turn ("12:9"; "12:-" before its first), then the program that turn ran
    (``turn_verb``: "12:9:sed"; none when it ran nothing). Coarser shapes lost accuracy on the
    shipped trajectories, finer ones had too few calls each; a verb's cell too rare to be learned
    falls back to its shape's (``parent_cell``)."""
    if turn_chars is None:
        return None
    new, reply = turn_chars
    shape = _SHAPES[max(new, 1).bit_length()][0 if reply is None else max(reply, 1).bit_length()]
    return shape if verb is None else f"{shape}:{verb}"


#: Every shape's name, by the bit lengths of its two sizes (0: the model has not spoken): looked up,
#: not formatted, on every decision.
_SHAPES: Final = tuple(tuple(f"{n}:{r or '-'}" for r in range(65)) for n in range(65))


def turn_of_cell(cell: str | None) -> tuple[tuple[int, int | None] | None, str | None]:
    """``turn_chars`` and ``turn_verb`` that ``turn_cell`` maps to ``cell`` (sizes at the cell's
    lower bound): how a logged decision's cell is decided again (``router.rollout.preview``)."""
    if cell is None:
        return None, None
    new, reply, *verb = cell.split(":", 2)
    chars = (1 << (int(new) - 1), None if reply == "-" else 1 << (int(reply) - 1))
    return chars, verb[0] if verb else None


def parent_cell(cell: str) -> str | None:
    """The shape a verb's cell falls back to ("12:9:sed" -> "12:9"; a shape has none)."""
    head, sep, _ = cell.rpartition(":")
    return head if sep and ":" in head else None


def cell_mean(cells: Mapping[str, float] | None, cell: str | None) -> float | None:
    """The learned mean of ``cell``, else of its shape; None: neither was learned."""
    if cell is None or not cells:
        return None
    mean = cells.get(cell)
    if mean is None:
        parent = parent_cell(cell)
        mean = cells.get(parent) if parent is not None else None
    return mean


@dataclass(frozen=True, slots=True)
class BackendEstimates:
    """One backend's learned numbers (None: not learned, the prior or the policy's default applies)."""

    tokens_ratio: float | None = None
    output_mean: float | None = None
    output_p90: float | None = None
    cache_share: float | None = None
    #: Calls it was learned from.
    n: int | None = None
    #: The mean output per ``turn_cell`` with enough calls (None: none learned).
    output_cells: Mapping[str, float] | None = field(default=None, hash=False)
    #: The cached share per ``cache_cell`` with enough calls (None: none learned).
    cache_cells: Mapping[str, float] | None = field(default=None, hash=False)


_NONE: Final = BackendEstimates()


class Estimates:
    """Per backend id: learned numbers, with priors by provider family where the log has none."""

    def __init__(self, learned: Mapping[str, BackendEstimates] | None = None) -> None:
        self.learned = dict(learned or {})

    def of(self, backend: str) -> BackendEstimates:
        return self.learned.get(backend, _NONE)

    def tokens_ratio(self, backend: str, provider: str) -> float:
        learned = self.of(backend).tokens_ratio
        return learned if learned is not None else FAMILY_RATIOS.get(provider, 1.0)

    def cache_share(self, backend: str, cell: str | None = None) -> float:
        """The cached share of the warm blocks in ``cell`` (else the backend's, else the prior)."""
        learned = self.of(backend)
        share = (learned.cache_cells or {}).get(cell) if cell is not None else None
        if share is None:
            share = learned.cache_share
        return share if share is not None else PRIOR_CACHE_SHARE

    def cacheable(self, provider: str, warm: int) -> int:
        """The whole cache blocks of a warm prefix of ``warm`` tokens."""
        block = CACHE_BLOCKS.get(provider, 1)
        return warm // block * block

    def output_mean(self, backend: str, cell: str | None) -> float | None:
        """The mean output of a call in ``cell`` (else its shape's, else the backend's overall mean)."""
        learned = self.of(backend)
        mean = cell_mean(learned.output_cells, cell)
        return mean if mean is not None else learned.output_mean

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Estimates) and other.learned == self.learned

    def __repr__(self) -> str:
        return f"Estimates({self.learned!r})"


#: Each learned number's name and the range a sane value lies in (the artifact refuses others).
BOUNDS: Final = (
    ("tokens_ratio", 0.2, 5.0),
    ("output_mean", 0.0, 10_000_000.0),
    ("output_p90", 0.0, 10_000_000.0),
    ("cache_share", 0.0, 1.0),
)
