"""No one virtual key shapes what ``router train`` learns for every key.

Any key can post outcomes for its own tasks, true or not, and as many as it likes. So before the
fit, each virtual key's labelled attempts together weigh at most ``share`` of the training set,
where ``share`` is ``max(max_share, 2 / K)`` over the K keys with labelled attempts (with few keys a
smaller share cannot hold for all of them). A key over it has its rows' weights scaled down by one
factor, chosen by water-filling so that the share holds after the scaling (the cap counts the
capped keys at their capped weight). Attempts of the master key and of open mode are the
operator's: they count in the total and are never scaled.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from router.learning.training.dataset import AttemptRow

#: The default largest share of the training weight one virtual key may have.
MAX_KEY_SHARE = 0.1


@dataclass(frozen=True, slots=True)
class Dominant:
    """A key whose rows were scaled down: its share of the weight before, and the factor."""

    key: str
    share: float
    scale: float


def cap(weights: dict[str, float], operator: float, share: float) -> float | None:
    """The largest weight a key may keep: ``c = share × (operator + Σ min(w, c))``; None when no
    key is over it."""
    total = operator + sum(weights.values())
    ordered = sorted(weights.values(), reverse=True)
    if not ordered or ordered[0] <= share * total:
        return None
    rest = total
    for m, w in enumerate(ordered, start=1):
        rest -= w  # the weight of the keys below the m largest, and the operator's
        if share * m >= 1:
            break
        c = share * rest / (1 - share * m)
        below = ordered[m] if m < len(ordered) else 0.0
        if below <= c <= w:
            return c
    return None  # unreachable while share × K ≥ 2 (some key is always left below the cap)


def cap_keys(rows: Sequence[AttemptRow], max_share: float = MAX_KEY_SHARE) -> list[Dominant]:
    """Scale down the weights of the keys over their share, in place; the keys scaled, largest first."""
    weights: dict[str, float] = defaultdict(float)
    operator = 0.0
    for r in rows:
        if r.facts.key is None:
            operator += r.weight
        else:
            weights[r.facts.key] += r.weight
    if not weights:
        return []
    share = max(max_share, 2 / len(weights))
    limit = cap(weights, operator, share) if share < 1 else None
    if limit is None:
        return []
    total = operator + sum(weights.values())
    scale = {k: limit / w for k, w in weights.items() if w > limit}
    for r in rows:
        if r.facts.key in scale:
            r.weight *= scale[r.facts.key]
    return sorted(
        (Dominant(k, weights[k] / total, s) for k, s in scale.items()), key=lambda d: (-d.share, d.key)
    )
