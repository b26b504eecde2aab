"""`router train`'s replay of the training tasks (``learning.training.value._replay``) against
`router eval`'s replay (``learning.evals.simulate``): the same task, order and verifier give the
same completion and spend, including the last attempt's rule (a right result rejected there still
stands) and a repeat of a model already tried."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from router.learning.evals import baselines as bl
from router.learning.evals import loader
from router.learning.evals.loader import Dataset
from router.learning.evals.simulate import Verifier, run_task
from router.learning.training import value
from router.policy.plan import Option
from tests.unit.test_evals import write_data

ORDERS = (("cheap",), ("strong",), ("cheap", "strong"), ("strong", "cheap"))


@pytest.fixture
def tiny(tmp_path: Path) -> Dataset:
    return loader.load(write_data(tmp_path / "tiny"))


def _training_replay(
    data: Dataset, task: str, order: tuple[str, ...], attempts: int, noise: tuple[float, float]
) -> tuple[float, float]:
    logged = {
        m: value.Logged(0.5, data.outcome(task, m).resolved, data.outcome(task, m).cost)
        for m in data.model_ids
    }
    opts = [Option(m, 0.5, data.outcome(task, m).cost) for m in data.model_ids]
    got = value._replay(opts, logged, [value._Op(10.0, None, order)], attempts, 0.0, noise)
    # The last margin is infinite: the prior order alone, as a fixed cascade runs it.
    return float(got[0, 0, -1]), float(got[1, 0, -1])


@pytest.mark.parametrize("noise", [(0.0, 1.0), (1.0, 0.0), (0.0, 0.0)])
@pytest.mark.parametrize("attempts", [1, 2, 3])
def test_the_training_replay_is_the_eval_replay_under_a_verifier_that_never_hesitates(
    tiny: Dataset, noise: tuple[float, float], attempts: int
) -> None:
    # (0, 1) rejects every result: each task runs its order to the end and ends with the last
    # attempt's result, right or not. (1, 0) accepts every result: the first one stands.
    for task in tiny.task_ids:
        for order in ORDERS:
            run = run_task(tiny, task, bl.sequence(order), attempts - 1, Verifier(*noise))
            assert _training_replay(tiny, task, order, attempts, noise) == pytest.approx(
                (float(run.resolved), run.cost)
            ), (task, order, attempts, noise)


def test_a_right_result_rejected_on_the_last_attempt_counts_as_done(tiny: Dataset) -> None:
    fa, fr = 0.3, 0.2
    # t1: both models right. cheap → strong: cheap's right result accepted (0.8) ends it; rejected
    # (0.2), strong's right result is the last attempt's and stands whatever the verdict.
    done, spent = _training_replay(tiny, "t1", ("cheap", "strong"), 2, (fa, fr))
    assert done == pytest.approx(1.0) and spent == pytest.approx(0.1 + fr * 1.0)
    # An order shorter than the attempts left ends early the same way: its last result stands.
    assert _training_replay(tiny, "t1", ("cheap",), 3, (fa, fr))[0] == pytest.approx(1.0)
    # t2: cheap wrong, strong right. Accepted wrong (0.3) ends it unresolved; else strong, which stands.
    done, spent = _training_replay(tiny, "t2", ("cheap", "strong"), 2, (fa, fr))
    assert done == pytest.approx(1 - fa) and spent == pytest.approx(0.2 + (1 - fa) * 1.0)
    # Against the eval's replay, averaged over its seeded verdicts.
    runs = [
        run_task(tiny, "t2", bl.sequence(("cheap", "strong")), 1, Verifier(fa, fr, s)) for s in range(3000)
    ]
    assert np.mean([r.resolved for r in runs]) == pytest.approx(done, abs=0.03)
    assert np.mean([r.cost for r in runs]) == pytest.approx(spent, abs=0.03)
