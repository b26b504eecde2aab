"""Training caps each virtual key's share of the labels (router.learning.training.keyshare)."""

from __future__ import annotations

import pytest

from router.learning.training.dataset import AttemptRow
from router.learning.training.keyshare import cap, cap_keys
from router.policy.scopes import ScopeFacts


def rows(key: str | None, n: int) -> list[AttemptRow]:
    return [AttemptRow(task_id=f"{key}-{i}", attempt=1, model="m", vector={}, success=True, label_source="explicit",
                       cost=0.0, n_calls=1, propensity=1.0, actions=["m"], facts=ScopeFacts(key=key))
            for i in range(n)]  # fmt: skip


def test_the_cap_holds_after_scaling() -> None:
    weights = {"big": 100.0, **{f"k{i}": 5.0 for i in range(19)}}
    c = cap(weights, 0.0, 0.1)
    assert c is not None and c == pytest.approx(0.1 * (95 + c))


def test_a_dominant_key_is_scaled_down_and_named() -> None:
    data = rows("big", 100) + [r for i in range(19) for r in rows(f"k{i}", 5)]
    dominant = cap_keys(data, 0.1)
    assert [d.key for d in dominant] == ["big"] and dominant[0].share == pytest.approx(100 / 195)
    total = sum(r.weight for r in data)
    assert sum(r.weight for r in data if r.facts.key == "big") == pytest.approx(0.1 * total)


def test_few_keys_and_the_operator() -> None:
    # Two keys: a share under 2/K cannot hold for both, so nothing is scaled.
    assert cap_keys(rows("a", 50) + rows("b", 5), 0.1) == []
    # The operator's rows count in the total and are never scaled.
    data = rows(None, 100) + rows("a", 50) + [r for i in range(20) for r in rows(f"k{i}", 5)]
    dominant = cap_keys(data, 0.1)
    assert [d.key for d in dominant] == ["a"]
    assert all(r.weight == 1.0 for r in data if r.facts.key is None)
