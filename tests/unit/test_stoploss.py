"""The stop-loss `router train` learns (``learning.training.stoploss``): from recorded runs read by
a label model that has not seen them, kept only where it beats no stop-loss and a random stop of
its share out of fold, and written into the artifact beside the caps."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import orjson
import pytest

from router.app.cli import main
from router.features.task.attempt import AttemptControl
from router.learning.evals import turns
from router.learning.training import control, stoploss
from tests.unit.test_scope_effects import policy, write_log

SHIPPED = Path(__file__).resolve().parents[2] / "evals/data/trajectories/gemini-3-pro-preview.jsonl.gz"


def _runs(n: int, signal: bool) -> dict[str, control.Run]:
    """20 calls at $0.10, half resolved; with a signal, failing runs read low from the 4th call."""
    out = {}
    for i in range(n):
        ok = i % 2 == 0
        low = (not ok) if signal else i % 4 in (0, 1)  # blind: as often low, whatever the outcome
        readings = (0.8, 0.8, 0.8, *([0.1 if low else 0.8] * 17))
        out[f"t{i}"] = control.Run(ok, 2.0, 20, (0.1,) * 20, readings)
    return out


def test_a_stop_loss_is_kept_only_where_it_beats_a_random_stop_out_of_fold() -> None:
    kept = stoploss.choose("m", _runs(80, signal=True))
    assert kept.threshold is not None and kept.held_out is not None
    with_, without, random_ = kept.held_out
    assert with_ < without * 0.98 and with_ < random_ * 0.98
    blind = stoploss.choose("m", _runs(80, signal=False))
    assert blind.threshold is None and blind.reason
    few = stoploss.choose("m", _runs(10, signal=True))
    assert few.threshold is None and "too few runs" in few.reason
    # Into the artifact's block beside the caps; an off one leaves the block as it was.
    block = stoploss.merge({"m": AttemptControl(max_calls=40)}, {"m": kept, "n": blind})
    assert block == {"m": AttemptControl(max_calls=40, stop_below=kept.threshold)}


def test_runs_are_read_by_a_label_model_fitted_without_their_task() -> None:
    known = turns.load([SHIPPED], None)
    known = dict(sorted(known.items())[:60])
    runs = stoploss.runs_from(known)["gemini-3-pro-preview"]
    some = next(iter(runs.values()))
    assert len(runs) == 60 and some.call_costs is not None and some.readings is not None
    assert len(some.readings) == some.calls == len(some.call_costs)
    # Not the readings of a label model fitted on every run (which has seen this one).
    fitted = turns.label_model(list(known.values()))
    (t, _), r = next(iter(known.items()))
    assert list(runs[t].readings or ()) != pytest.approx([fitted.p_success(x) for x in r.before])


def test_router_train_learns_the_stop_loss_from_trajectories(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = write_log(tmp_path / "log.db")
    # Real runs, given as runs of the log's "strong".
    with gzip.open(SHIPPED, "rt") as f:
        runs = [{**json.loads(line), "model_id": "strong"} for _, line in zip(range(60), f, strict=False)]
    path = tmp_path / "runs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in runs))
    out = tmp_path / "learned.json"
    args = ["train", "--store", store, "--config", str(policy(tmp_path / "p.yaml", [])), "--out", str(out)]
    assert main([*args, "--trajectories", str(path)]) == 0
    printed = " ".join(capsys.readouterr().out.split())  # the console wraps long lines
    assert (
        f"stop-loss per model from --trajectories {path} (label model's P(success) read from call 3 on): strong "
        in printed
    )
    art = orjson.loads(out.read_bytes())
    report = art["stop_loss"]["strong"]
    assert report["runs"] == 60 and report["reason"]
    assert art["attempt_control"].get("strong", {}).get("stop_below") == report["threshold"]
    assert main(args) == 0  # without runs: from the log, which holds no reading (written by hand)
    assert "stop-loss: off (no attempt in the log of a model" in " ".join(capsys.readouterr().out.split())
    art = orjson.loads(out.read_bytes())
    assert art["stop_loss"] == {} and art["stop_loss_from"] == "the log"
