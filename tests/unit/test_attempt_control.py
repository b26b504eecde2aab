"""Control inside the attempt: the pure stop decision, a run replayed under it, the grid of fixed
orders under it (checked against the replay), and what `learn` keeps."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from router.features.task.attempt import (
    CAP,
    NONE,
    STOP_LOSS,
    AttemptControl,
    first_stop,
    message,
    stop_reason,
)
from router.learning.evals import baselines as bl
from router.learning.evals import loader
from router.learning.evals.loader import Dataset
from router.learning.evals.simulate import BUDGET, Execution, LabelVerifier, Verifier, replay
from router.learning.training import caps, control
from router.learning.training.dataset import AttemptRow
from tests.unit.test_evals import write_data


@pytest.fixture
def tiny(tmp_path: Path) -> Dataset:
    return loader.load(write_data(tmp_path / "tiny"))


def test_the_cap_refuses_the_call_after_max_calls() -> None:
    c = AttemptControl(max_calls=3)
    assert [stop_reason(c, k) for k in range(5)] == [None, None, None, CAP, CAP]
    assert stop_reason(NONE, 10_000) is None


def test_the_stop_loss_waits_for_min_calls_and_needs_a_reading() -> None:
    c = AttemptControl(stop_below=0.4, min_calls=3)
    assert stop_reason(c, 2, 0.1) is None  # too early to read anything into it
    assert stop_reason(c, 3, 0.1) == STOP_LOSS
    assert stop_reason(c, 3, 0.4) is None  # at the threshold: goes on
    assert stop_reason(c, 3, None) is None  # no reading: never stopped on a guess
    # Both rules: the cap comes first and says so.
    both = AttemptControl(max_calls=3, stop_below=0.4)
    assert stop_reason(both, 3, 0.1) == CAP


def test_first_stop_scans_a_recorded_run() -> None:
    c = AttemptControl(stop_below=0.5, min_calls=2)
    assert first_stop(c, 5, [0.9, 0.1, 0.6, 0.3, 0.2]) == (3, STOP_LOSS)
    assert first_stop(c, 3, [0.9, 0.8, 0.7]) is None
    assert first_stop(AttemptControl(max_calls=4), 4) is None  # exactly at the cap: it ran to its end
    assert first_stop(AttemptControl(max_calls=4), 9) == (4, CAP)


def test_the_stop_message_names_the_reason_and_the_setting() -> None:
    c = AttemptControl(max_calls=12, stop_below=0.35)
    assert "models.m.max_calls_per_attempt (12)" in message(CAP, "m", 12, c, None)
    text = message(STOP_LOSS, "m", 5, c, 0.2)
    assert "0.20" in text and "0.35" in text and text.startswith("attempt stopped by the router on m: ")


def test_a_capped_run_pays_only_the_calls_made() -> None:
    run = control.Run(True, 2.0, 10)
    got = control.controlled(run, AttemptControl(max_calls=4))
    assert (got.right, got.calls, got.stopped) == (False, 4, CAP) and got.cost == pytest.approx(0.8)
    # Where the conversation is known, the calls before the stop at their recorded costs.
    known = control.Run(True, 1.0, 4, call_costs=(0.1, 0.2, 0.3, 0.4), readings=(0.9, 0.9, 0.9, 0.1))
    got = control.controlled(known, AttemptControl(stop_below=0.5, min_calls=1))
    assert (got.right, got.calls, got.stopped) == (False, 3, STOP_LOSS) and got.cost == pytest.approx(0.6)
    # Without readings the stop-loss cannot act: only the cap can.
    assert control.controlled(run, AttemptControl(stop_below=0.9)).right


def test_the_cap_is_twice_the_median_of_resolved_runs() -> None:
    assert control.cap_for([10, 20, 30]) == 40
    assert control.cap_for([7], 1.5) == 11
    assert control.cap_for([]) is None


def test_the_replay_stops_an_attempt_and_escalates(tiny: Dataset) -> None:
    cascade = bl.sequence(["cheap", "strong"])
    # t1 on cheap takes 5 calls: a cap of 2 stops it at 2/5 of its cost, and strong solves it.
    ex = Execution({"cheap": AttemptControl(max_calls=2)})
    [t1] = replay(tiny, ["t1"], cascade, 1, execution=ex)
    assert t1.models == ("cheap", "strong") and t1.resolved and t1.stops == (CAP, None)
    assert t1.calls == (2, 4) and t1.cost == pytest.approx(0.1 * 2 / 5 + 1.0)
    # A stopped attempt is a failure the router knows of itself: no verifier is asked, nothing stands.
    [alone] = replay(tiny, ["t1"], cascade, 0, execution=ex)
    assert not alone.resolved and alone.attempts == 1


def test_the_budget_is_enforced_as_the_proxy_does(tiny: Dataset) -> None:
    cascade = bl.sequence(["cheap", "strong"])
    # t2: cheap fails ($0.2); strong would cost $1.0 (6 calls) but only $0.55 is left: the 4th call
    # would pass it, so three are made and paid.
    [t2] = replay(tiny, ["t2"], cascade, 1, budget=0.75)
    assert t2.stops == (None, BUDGET) and not t2.resolved and t2.cost == pytest.approx(0.2 + 0.5)
    assert t2.calls == (10, 3)


def test_the_label_verifier_judges_where_it_has_read_the_run(tiny: Dataset) -> None:
    cascade = bl.sequence(["cheap", "strong"])
    # The label rejects cheap's right result on t1 (it read the run); strong is judged exactly.
    judge = LabelVerifier({("t1", "cheap"): False}, Verifier())
    [t1] = replay(tiny, ["t1"], cascade, 1, verifier=judge)
    assert t1.models == ("cheap", "strong") and t1.resolved


def _runs(data: Dataset) -> dict[str, dict[str, control.Run]]:
    return {
        m: {t: control.Run(data.outcome(t, m).resolved, data.outcome(t, m).cost, data.outcome(t, m).calls)
            for t in data.task_ids}
        for m in data.model_ids
    }  # fmt: skip


@pytest.mark.parametrize("noise", [(0.0, 0.0), (0.2, 0.1)])
def test_the_grid_of_orders_matches_the_cascades_and_the_replay(
    tiny: Dataset, noise: tuple[float, float]
) -> None:
    runs = _runs(tiny)
    caps = {"cheap": AttemptControl(max_calls=8)}
    o = control.orders(control.table(runs, tiny.task_ids, caps, exact_noise=noise), 2)
    assert {o.names(i) for i in range(len(o.cost))} == {
        ("cheap",),
        ("strong",),
        ("cheap", "strong"),
        ("strong", "cheap"),
    }
    old = {c.models: c for c in bl.cascades(tiny, tiny.task_ids, 2, Verifier(*noise))}
    uncapped = control.orders(control.table(runs, tiny.task_ids, {}, exact_noise=noise), 2)
    for i in range(len(uncapped.cost)):
        c = old[uncapped.names(i)]
        assert uncapped.resolved[i] == pytest.approx(c.resolved_rate)
        assert uncapped.cost[i] == pytest.approx(c.cost_per_task)
    if noise == (0.0, 0.0):
        # Exactly what the replay measures under the same caps.
        for i in range(len(o.cost)):
            runs_ = replay(tiny, tiny.task_ids, bl.sequence(o.names(i)), 1, execution=Execution(caps))
            assert o.resolved[i] == pytest.approx(sum(r.resolved for r in runs_) / 3)
            assert o.cost[i] == pytest.approx(sum(r.cost for r in runs_) / 3)


def test_best_order_meets_the_target_at_least_cost_per_completed(tiny: Dataset) -> None:
    o = control.orders(control.table(_runs(tiny), tiny.task_ids, {}), 2)
    assert o.names(o.best(None)) == ("cheap",)  # $0.2/task for a third: the least per completed task
    assert o.names(o.best(0.6)) == ("cheap", "strong")


def _stoppable(n: int) -> dict[str, dict[str, control.Run]]:
    """An expensive model whose failing runs read low from their third call on, and a cheap one."""
    runs: dict[str, dict[str, control.Run]] = {"a-cheap": {}, "b-dear": {}}
    for i in range(n):
        t = f"t{i}"
        ok = i % 2 == 0
        runs["a-cheap"][t] = control.Run(i % 4 == 0, 0.01, 5)
        readings = [0.8, 0.8, 0.8] + [0.8 if ok else 0.1] * 17
        runs["b-dear"][t] = control.Run(ok, 2.0, 20, call_costs=(0.1,) * 20, readings=tuple(readings))
    return runs


def test_learn_keeps_a_stop_loss_that_beats_a_random_stop() -> None:
    runs = _stoppable(40)
    got = control.learn(runs, sorted(runs["b-dear"]), 2, 0.5, caps=False)
    assert got.controls["b-dear"].stop_below is not None
    report = got.report["b-dear"]
    assert report["kept"] and report["cost_per_completed"] < report["random_stop"]


def test_learn_turns_off_a_stop_loss_that_reads_nothing() -> None:
    runs = _stoppable(120)
    # The same readings on resolved and failed runs: a stop is a random stop.
    blind = {t: control.Run(r.resolved, r.cost, r.calls, r.call_costs, tuple([0.8, 0.8, 0.8] + [0.1 if int(t[1:]) % 3 else 0.8] * 17))
             for t, r in runs["b-dear"].items()}  # fmt: skip
    got = control.learn({**runs, "b-dear": blind}, sorted(blind), 2, 0.5, caps=False)
    assert "b-dear" not in got.controls and not got.report["b-dear"]["kept"]


def test_a_random_stop_matches_the_stop_loss_share() -> None:
    runs = _stoppable(400)["b-dear"]
    c = AttemptControl(stop_below=0.5)
    rnd = control.matched_random_stop(runs, c, seed=1)
    assert rnd is not None and set(rnd.at_calls) == {3}
    stopped = sum(rnd.stop_at(t, "b-dear") is not None for t in runs) / len(runs)
    assert stopped == pytest.approx(0.5, abs=0.07)


def _attempt(task: str, model: str, ok: bool, calls: int, failed: tuple[str, ...] = ()) -> AttemptRow:
    return AttemptRow(task, 1, model, {}, ok, "explicit", 0.1, calls, 1.0, [model], list(failed))


def test_train_caps_each_model_at_twice_the_median_of_its_resolved_attempts() -> None:
    rows = [_attempt(f"t{i}", "a", True, n) for i, n in enumerate((40, 60, 80))]
    rows += [_attempt("t9", "a", False, 100), _attempt("t9", "a", True, 90, ("a",))]
    rows += [_attempt("t0", "b", True, 50)]
    got = caps.from_log(rows, min_resolved=3)
    # a: its first resolved attempts (40, 60, 80: median 60); a repeat and the failures do not
    # count; b has too few resolved attempts for a cap, and the report says so.
    assert got.controls == {"a": AttemptControl(max_calls=120)}
    assert got.not_learned == {"b": "resolved attempts on 1 tasks (1 in all); a cap needs 3"}
    assert caps.line(got).startswith(
        "call caps per attempt (2 × the median calls of resolved attempts): a 120; "
    )
    assert "no cap for b: resolved attempts on 1 tasks" in caps.line(got)


def test_a_toy_log_of_short_attempts_learns_no_cap() -> None:
    # The demo's or the fake provider's log: attempts of two calls. A cap of 4 learned from it
    # would stop every real agent's attempt after four calls.
    rows = [_attempt(f"t{i}", "local-nano", True, 2) for i in range(30)]
    got = caps.from_log(rows)
    assert got.controls == {}
    assert got.not_learned["local-nano"].startswith(
        "2 × the median of its resolved attempts' calls is 4, under 20"
    )
    # Resolved attempts repeated on a few tasks are a few tasks' evidence, whatever their count.
    few = [_attempt(f"t{i % 3}", "m", True, 40) for i in range(30)]
    assert caps.from_log(few).controls == {}
    assert caps.from_log(few).not_learned["m"] == "resolved attempts on 3 tasks (30 in all); a cap needs 10"
    assert caps.line(caps.from_log(few)).startswith("call caps: none; no cap for m: ")


def test_the_proxy_stops_on_the_attempts_latest_label_and_keeps_saying_so(tmp_path: Path) -> None:
    import dataclasses

    from router.errors import AttemptStopped
    from router.features.labels.model import SOURCE
    from router.features.task.context import stop
    from router.features.task.tracker import TaskState
    from router.policy.active import attempt_controls
    from tests.unit.test_prior_plan import artifact, policy_with

    policy = policy_with(tmp_path, {"max_attempts": 2})
    learned = {"cheap": AttemptControl(max_calls=50, stop_below=0.3), "strong": AttemptControl(max_calls=9)}
    policy.use_attempt_controls(
        {"strong": AttemptControl(max_calls=4)}
    )  # as models.strong.max_calls_per_attempt: 4
    merged = attempt_controls(policy, dataclasses.replace(artifact(), controls=learned))
    # The file's cap overrides the learned one; the learned stop-loss stays.
    assert merged == {
        "cheap": AttemptControl(max_calls=50, stop_below=0.3),
        "strong": AttemptControl(max_calls=4),
    }
    policy.use_attempt_controls(merged)
    state = TaskState(attempt=2, pinned="cheap", calls=5)
    assert stop(policy.task_rules, state) is None  # no label yet: goes on
    state.last_label = (1, False, 0.1, SOURCE, ())  # a low reading of the previous attempt: not this one's
    assert stop(policy.task_rules, state) is None
    state.last_label = (2, False, 0.1, SOURCE, ())
    said = stop(policy.task_rules, state)
    assert said is not None and said[1] == STOP_LOSS
    assert "P(success) 0.10 fell below the stop-loss threshold 0.30" in said[0]
    assert state.failed_open and state.stopped == 2
    state.last_label = (2, True, 0.9, SOURCE, ())  # a later reading changes nothing: the attempt is over
    assert stop(policy.task_rules, state) == said
    # The error in the caller's protocol: the rule, the words, and what comes next beside them.
    err = AttemptStopped(said[0] + "; start the task again", STOP_LOSS, {"retry": True, "model": "strong"})
    assert err.param == STOP_LOSS and err.code == "attempt_stopped" and err.status == 400
    assert err.openai_body()["error"]["next"] == {"retry": True, "model": "strong"}
    anthropic = err.anthropic_body()["error"]
    assert anthropic["next"]["model"] == "strong" and anthropic["param"] == STOP_LOSS


def test_the_artifact_reads_its_attempt_control_block() -> None:
    import orjson

    from router.errors import ConfigError
    from router.features.task.vector import schema
    from router.policy.artifact import FORMAT, Artifact

    def read(block: object) -> dict[str, AttemptControl]:
        raw = orjson.dumps({"format": FORMAT, "feature_schema": schema(), "attempt_control": block})
        return dict(Artifact.from_json(raw, source="x.json").controls)

    got = read({"a": {"max_calls": 12, "stop_below": None}, "b": {"stop_below": 0.4}})
    assert got == {"a": AttemptControl(max_calls=12), "b": AttemptControl(stop_below=0.4)}
    assert read(None) == {}
    for bad in ({"a": {"max_calls": 0}}, {"a": {"stop_below": 1.5}}, {"a": 3}):
        with pytest.raises(ConfigError, match=r"x.json: attempt_control\.a"):
            read(bad)


@pytest.mark.parametrize("noise", [(0.0, 0.0), (0.3, 0.2)])
def test_the_control_evaluation_runs_end_to_end(tiny: Dataset, noise: tuple[float, float]) -> None:
    from router.learning.evals import attempts, controlview

    s = attempts.ControlSettings(
        retries=1, folds=3, targets=(0.6,), reference_attempts=1, workers=1, noise=noise
    )
    result = attempts.cross_validate(tiny, {}, s)
    rows = result["rows"]
    # Under noise, also the cascade a deployment could choose: on the same verdicts as the policy.
    assert {
        "cascade1@60%",
        "cascade2@60%",
        "cascade2+caps@60%",
        "policy@60%",
        "policy, random stop@60%",
        *(["cascade2, chosen on verdicts@60%"] if any(noise) else []),
    } == set(rows)
    assert (result["targets"]["0.60"]["not_below_cascade_on_verdicts"] is None) == (not any(noise))
    # The frontier plot draws it too, as a line of its own.
    assert ("cascade, chosen on verdicts" in result["sweep"]) == any(noise)
    assert len(rows["policy@60%"]["chosen_on_training"]) == 3  # one order per fold, each named
    assert result["targets"]["0.60"]["ratio"] > 0
    assert "| policy@60% |" in controlview.table(result)


SHIPPED_TRAJECTORIES = Path(__file__).resolve().parents[2] / "evals/data/trajectories"


def _shipped_slice(n: int, models: tuple[str, ...]) -> Dataset:
    """The first ``n`` shipped tasks on a few models, as the eval loads them."""
    from tests.unit.test_evals import SHIPPED

    full = loader.load(SHIPPED)
    tasks = full.tasks[:n]
    kept = [m for m in full.models if m.id in models]
    outcomes = {(t.id, m.id): full.outcome(t.id, m.id) for t in tasks for m in kept}
    return Dataset(full.source, tasks, kept, outcomes)


def test_no_test_fold_trajectory_is_fitted_on() -> None:
    from router.learning.evals import attempts, turns

    data = _shipped_slice(30, ("deepseek-v3.2-reasoner", "gemini-3-pro-preview"))
    known = turns.load([SHIPPED_TRAJECTORIES], data.task_ids)
    assert len(known) == 30
    train_ids, test_ids = data.task_ids[:20], data.task_ids[20:]
    # --trajectories holds every task's run (the test tasks' too); --test-trajectories some test runs.
    test_source = {k: v for k, v in known.items() if k[0] in test_ids[:6]}
    s = attempts.ControlSettings(retries=1, folds=3, targets=(0.7,), reference_attempts=1, workers=1)
    fold = attempts.evaluate_fold(data, train_ids, test_ids, known, s, test_source)
    assert {t for t, _ in fold.fitted_on} == set(train_ids)
    assert fold.replayed == frozenset(test_source)
    # Fitting is the same whether the training source holds the test tasks' runs or not.
    alone = {k: v for k, v in known.items() if k[0] in train_ids}
    without = attempts.evaluate_fold(data, train_ids, test_ids, alone, s, test_source)
    assert without.learned == fold.learned and without.rows == fold.rows
    # One source for both (no --test-trajectories): each side reads its own tasks' runs.
    same = attempts.evaluate_fold(data, train_ids, test_ids, known, s)
    assert {t for t, _ in same.replayed} == set(test_ids) and same.fitted_on == fold.fitted_on


def test_eval_takes_test_trajectories_apart_from_the_ones_fitted_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import gzip
    import json

    from router.app.cli import main
    from tests.unit.test_evals import write_data

    # Two files of real runs: the first fitted on, the second (other tasks) replayed.
    src = SHIPPED_TRAJECTORIES / "gemini-3-pro-preview.jsonl.gz"
    with gzip.open(src, "rt") as f:
        runs = [json.loads(line) for _, line in zip(range(45), f, strict=False)]
    first, second = tmp_path / "fit.jsonl", tmp_path / "test.jsonl"
    first.write_text("".join(json.dumps(r) + "\n" for r in runs[:30]))
    second.write_text("".join(json.dumps(r) + "\n" for r in runs[30:]))
    tasks = [
        {"instance_id": r["instance_id"], "repo": r["repo"], "problem_statement": "fix it"} for r in runs
    ]
    models = "model_id,org,usd_per_m_input,usd_per_m_output,usd_per_m_cached_input\ncheap,A,0.1,0.4,0.01\ngemini-3-pro-preview,G,2,12,0.2\n"  # fmt: skip
    outcomes: dict[tuple[str, str], tuple[int, float, int]] = {}
    for i, r in enumerate(runs):
        outcomes[r["instance_id"], "cheap"] = (int(i % 3 == 0), 0.05, 10)
        outcomes[r["instance_id"], "gemini-3-pro-preview"] = (
            int(r["resolved"]),
            r["cost_usd"],
            r["api_calls"],
        )
    root = write_data(tmp_path / "d", tasks, models, outcomes)
    args = ["eval", "--train", str(root), "--retries", "1", "--folds", "3", "--json", "--workers", "1"]
    assert main([*args, "--trajectories", str(first), "--test-trajectories", str(second)]) == 0
    setup = json.loads(capsys.readouterr().out)["setup"]
    assert (setup["trajectories"], setup["test_trajectories"]) == (30, 15)
    # Each fold fits on the first file's runs of its training tasks only (each run is left out
    # by the one fold testing its task) and replays the second file's runs of its test tasks.
    assert sum(setup["trajectories_replayed"]) == 15
    assert sum(30 - n for n in setup["trajectories_fitted"]) == 30
    assert main([*args, "--test-trajectories", str(tmp_path / "none.jsonl")]) == 2


def test_a_noisy_run_says_what_the_policys_order_resolves_on_the_true_outcomes(tiny: Dataset) -> None:
    """Under a noisy verifier the policy reads verdicts; the report sets its estimate of its order
    beside what that order resolves on the training tasks' true outcomes (judged by the verifier,
    in expectation) and the most any fixed order reaches there. Worked by hand on t1 (both
    models right) and t2 (only the strong one), verifier 0.3, 0.2: strong alone resolves both;
    strong → cheap resolves t1 and 0.8 of t2; cheap → strong t1 and 0.7 of t2; cheap alone t1."""
    from router.learning.evals import attempts, controlview

    by_hand = {
        ("strong",): 1.0, ("strong", "cheap"): 0.9, ("cheap", "strong"): 0.85, ("cheap",): 0.5,
    }  # fmt: skip
    s = attempts.ControlSettings(
        retries=1, folds=3, targets=(0.6,), reference_attempts=1, workers=1, noise=(0.3, 0.2)
    )
    fold = attempts.evaluate_fold(tiny, ["t1", "t2"], ["t3"], {}, s)
    seen = fold.learned["0.60"]["on_training"]
    plan = tuple(fold.chosen["policy@60%"].split(" → "))
    assert seen["best_fixed"] == pytest.approx(1.0)
    assert seen["true"] == pytest.approx(by_hand[plan])
    assert 0.0 <= seen["estimated"] <= 1.0
    result = attempts.cross_validate(tiny, {}, s)
    assert "on their true outcomes (the best fixed order there: " in controlview.table(result)
    # An exact verifier's policy reads the outcomes themselves: nothing to set beside them.
    exact = attempts.evaluate_fold(tiny, ["t1", "t2"], ["t3"], {}, dataclasses.replace(s, noise=(0.0, 0.0)))
    assert "on_training" not in exact.learned["0.60"]
