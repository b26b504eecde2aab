"""`router eval`: data validation, the replay's accounting on datasets small enough to work out by
hand, the learned policy's training path, and a cross-validation run on a tiny slice of the data."""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import math
from contextlib import redirect_stdout
from pathlib import Path

import numpy as np
import pytest

from router.app.cli import main
from router.learning.evals import baselines as bl
from router.learning.evals import deploy, loader, render, runner
from router.learning.evals.loader import DataError, Dataset
from router.learning.evals.simulate import Verifier, replay
from router.learning.evals.summary import combine, summarize
from router.learning.training import dataset, taskeffect
from router.policy.plan import Option, best_plan, evaluate

SHIPPED = Path(__file__).resolve().parents[2] / "evals" / "data" / "swebench-verified"

MODELS_CSV = "model_id,org,usd_per_m_input,usd_per_m_output,usd_per_m_cached_input\ncheap,A,0.1,0.4,0.01\nstrong,B,3,15,0.3\n"
TASKS = [
    {"instance_id": "t1", "repo": "o/r", "problem_statement": "Typo in the README"},
    {
        "instance_id": "t2",
        "repo": "o/r",
        "problem_statement": "Crash when parsing dates\nTraceback (most recent call last)",
    },
    {"instance_id": "t3", "repo": "o/s", "problem_statement": "Deadlock under load in the scheduler"},
]
#: (task, model): (resolved, cost, calls). t1 is easy, t2 needs the strong model, t3 nobody solves.
OUTCOMES = {
    ("t1", "cheap"): (1, 0.1, 5), ("t1", "strong"): (1, 1.0, 4),
    ("t2", "cheap"): (0, 0.2, 10), ("t2", "strong"): (1, 1.0, 6),
    ("t3", "cheap"): (0, 0.3, 20), ("t3", "strong"): (0, 2.0, 30),
}  # fmt: skip


def write_data(root: Path, tasks: list[dict[str, str]] = TASKS, models_csv: str = MODELS_CSV,
               outcomes: dict[tuple[str, str], tuple[int, float, int]] = OUTCOMES) -> Path:  # fmt: skip
    root.mkdir(parents=True, exist_ok=True)
    (root / "tasks.jsonl").write_text("".join(json.dumps(t) + "\n" for t in tasks))
    (root / "models.csv").write_text(models_csv)
    lines = ["instance_id,model_id,resolved,cost_usd,api_calls"]
    lines += [f"{t},{m},{r},{c},{n}" for (t, m), (r, c, n) in outcomes.items()]
    (root / "swe_outcomes.csv").write_text("\n".join(lines) + "\n")
    return root


@pytest.fixture
def tiny(tmp_path: Path) -> Dataset:
    return loader.load(write_data(tmp_path / "tiny"))


# --- loader -------------------------------------------------------------------------------------


def test_loads_a_valid_directory(tiny: Dataset) -> None:
    assert tiny.task_ids == ["t1", "t2", "t3"]
    assert tiny.model_ids == ["cheap", "strong"]
    assert tiny.outcome("t2", "strong").resolved and not tiny.outcome("t2", "cheap").resolved
    assert tiny.outcome("t3", "strong").cost == 2.0 and tiny.outcome("t3", "strong").calls == 30
    assert tiny.models[0].usd_per_m_cached_input == 0.01


def test_missing_file_is_named(tmp_path: Path) -> None:
    root = write_data(tmp_path / "d")
    (root / "models.csv").unlink()
    with pytest.raises(DataError, match=r"missing models\.csv"):
        loader.load(root)
    with pytest.raises(DataError, match="not a directory"):
        loader.load(tmp_path / "nowhere")


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda o: {**o, ("t2", "cheap"): ("yes", 0.2, 10)}, r"swe_outcomes\.csv:4: resolved: expected 0 or 1, got 'yes'"),
        (lambda o: {**o, ("t1", "cheap"): (1, -1.0, 5)}, r"swe_outcomes\.csv:2: cost_usd: expected a finite number ≥ 0"),
        (lambda o: {**o, ("t1", "cheap"): (1, "nan", 5)}, r"swe_outcomes\.csv:2: cost_usd"),
        (lambda o: {**o, ("t1", "cheap"): (1, 0.1, 2.5)}, r"swe_outcomes\.csv:2: api_calls: expected a whole number"),
        (lambda o: {**o, ("t1", "ghost"): (1, 0.1, 5)}, r"swe_outcomes\.csv:8: model_id: 'ghost' is not in models\.csv"),
        (lambda o: {**o, ("t9", "cheap"): (1, 0.1, 5)}, r"swe_outcomes\.csv:8: instance_id: 't9' is not in tasks\.jsonl"),
        (lambda o: {k: v for k, v in o.items() if k != ("t3", "strong")}, r"no row for instance_id 't3' × model_id 'strong'"),
    ],
)  # fmt: skip
def test_bad_outcome_rows_name_file_line_and_column(tmp_path: Path, edit, message: str) -> None:  # type: ignore[no-untyped-def]
    root = write_data(tmp_path / "d", outcomes=edit(dict(OUTCOMES)))
    with pytest.raises(DataError, match=message):
        loader.load(root)


def test_duplicate_outcome_row(tmp_path: Path) -> None:
    root = write_data(tmp_path / "d")
    with (root / "swe_outcomes.csv").open("a") as f:
        f.write("t1,cheap,1,0.1,5\n")
    with pytest.raises(DataError, match=r"swe_outcomes\.csv:8: duplicate row for 't1' × 'cheap'"):
        loader.load(root)


def test_bad_tasks_and_models(tmp_path: Path) -> None:
    root = write_data(tmp_path / "a")
    (root / "tasks.jsonl").write_text(json.dumps(TASKS[0]) + "\n{not json\n")
    with pytest.raises(DataError, match=r"tasks\.jsonl:2: not JSON"):
        loader.load(root)
    (root / "tasks.jsonl").write_text(json.dumps({**TASKS[0], "problem_statement": ""}) + "\n")
    with pytest.raises(DataError, match=r"tasks\.jsonl:1: problem_statement: expected a non-empty string"):
        loader.load(root)
    (root / "tasks.jsonl").write_text(json.dumps(TASKS[0]) + "\n" + json.dumps(TASKS[0]) + "\n")
    with pytest.raises(DataError, match=r"tasks\.jsonl:2: instance_id: duplicate 't1'"):
        loader.load(root)
    root = write_data(tmp_path / "b", models_csv="model_id,usd_per_m_input\ncheap,0.1\n")
    with pytest.raises(DataError, match=r"models\.csv:1: missing column\(s\) usd_per_m_output"):
        loader.load(root)
    root = write_data(tmp_path / "c", models_csv="model_id,usd_per_m_input,usd_per_m_output\ncheap,0.1,abc\n")
    with pytest.raises(DataError, match=r"models\.csv:2: usd_per_m_output: expected a number, got 'abc'"):
        loader.load(root)


def test_shipped_data_loads_with_its_licence_notice() -> None:
    data = loader.load(SHIPPED)
    assert (len(data.tasks), len(data.models), len(data.outcomes)) == (361, 24, 361 * 24)
    assert "CC BY-NC 4.0" in (SHIPPED / "LICENSE-DATA.md").read_text()
    assert "CC BY-NC 4.0" in (SHIPPED / "README.md").read_text()


# --- the replay's accounting ------------------------------------------------------------------------


def test_single_model_accounting(tiny: Dataset) -> None:
    m = summarize(replay(tiny, tiny.task_ids, bl.sequence(["cheap"]), retries=0), tiny.model_ids)
    assert m["resolved_rate"] == pytest.approx(1 / 3)
    assert m["cost_per_task"] == pytest.approx((0.1 + 0.2 + 0.3) / 3)
    assert m["cost_per_completed"] == pytest.approx(0.6)
    assert m["mean_attempts"] == 1.0
    assert m["share_of_calls"] == {"cheap": 1.0, "strong": 0.0}


def test_cascade_pays_for_failed_attempts(tiny: Dataset) -> None:
    runs = replay(tiny, tiny.task_ids, bl.sequence(["cheap", "strong"]), retries=1)
    assert [r.models for r in runs] == [("cheap",), ("cheap", "strong"), ("cheap", "strong")]
    m = summarize(runs, tiny.model_ids)
    assert m["resolved_rate"] == pytest.approx(2 / 3)
    assert m["cost_per_task"] == pytest.approx((0.1 + 1.2 + 2.3) / 3)
    assert m["cost_per_completed"] == pytest.approx(3.6 / 2)
    assert m["mean_attempts"] == pytest.approx(5 / 3)
    # calls: cheap 5+10+20, strong 6+30
    assert m["share_of_calls"]["strong"] == pytest.approx(36 / 71)
    assert m["share_of_attempts"]["strong"] == pytest.approx(2 / 5)


def test_a_repeat_repeats_the_recorded_failure_and_its_cost(tiny: Dataset) -> None:
    seen: list[tuple[str, int, tuple[str, ...], float]] = []

    def stubborn(task: str, attempt: int, failed: tuple[str, ...], spent: float) -> str:
        seen.append((task, attempt, failed, spent))
        return "cheap"

    runs = replay(tiny, ["t2"], stubborn, retries=2)
    assert runs[0].models == ("cheap", "cheap", "cheap") and not runs[0].resolved
    assert runs[0].cost == pytest.approx(0.6)
    # The chooser is told what failed and what was spent, as a live router knows it.
    assert seen == [("t2", 1, (), 0.0), ("t2", 2, ("cheap",), 0.2), ("t2", 3, ("cheap",), pytest.approx(0.4))]


def test_oracle_and_stopping(tiny: Dataset) -> None:
    runs = replay(tiny, tiny.task_ids, bl.oracle(tiny), retries=2)
    assert [r.models for r in runs] == [("cheap",), ("strong",), ("cheap",)]
    assert summarize(runs, tiny.model_ids)["cost_per_task"] == pytest.approx((0.1 + 1.0 + 0.3) / 3)
    first = bl.first_untried(["strong", "cheap"])
    assert [r.models for r in replay(tiny, ["t3"], first, retries=5)] == [("strong", "cheap")]


def test_cascades_are_chosen_by_cost_per_completed_under_a_floor(tiny: Dataset) -> None:
    cands = bl.cascades(tiny, tiny.task_ids, max_len=2)
    assert len(cands) == 2 + 2
    best = bl.best_cascade(cands)
    assert best.models == ("cheap",) and best.cost_per_completed == pytest.approx(0.6)
    floor = bl.best_cascade(cands, floor=0.6)
    assert floor.models == ("cheap", "strong")
    assert floor.resolved_rate == pytest.approx(2 / 3) and floor.cost_per_task == pytest.approx(1.2)
    # No cascade reaches 90%: the most successful, cheapest first.
    assert bl.best_cascade(cands, floor=0.9).models == ("cheap", "strong")


def test_combine_pools_ratios_over_folds() -> None:
    folds = [
        {"tasks": 4, "resolved": 1, "cost": 4.0, "resolved_rate": 0.25, "cost_per_task": 1.0,
         "cost_per_completed": 4.0, "mean_attempts": 1.0, "share_of_calls": {"a": 1.0}, "share_of_attempts": {"a": 1.0}},
        {"tasks": 4, "resolved": 3, "cost": 12.0, "resolved_rate": 0.75, "cost_per_task": 3.0,
         "cost_per_completed": 4.0, "mean_attempts": 2.0, "share_of_calls": {"a": 0.0}, "share_of_attempts": {"a": 0.5}},
        {"tasks": 2, "resolved": 2, "cost": 2.0, "resolved_rate": 1.0, "cost_per_task": 1.0,
         "cost_per_completed": 1.0, "mean_attempts": 1.0, "share_of_calls": {"a": 0.5}, "share_of_attempts": {"a": 1.0}},
    ]  # fmt: skip
    m = combine(folds)
    assert (m["tasks"], m["folds"], m["resolved"], m["cost"]) == (10, 3, 6, 18.0)
    assert m["resolved_rate"] == pytest.approx(0.6) and m["cost_per_task"] == pytest.approx(1.8)
    # Sum of cost over sum of completions ($18 / 6), not the mean of the per-fold ratios ($3).
    assert m["cost_per_completed"] == pytest.approx(3.0)
    assert m["std"]["cost_per_completed"] == pytest.approx(np.std([4.0, 4.0, 1.0]))
    assert m["share_of_calls"] == {"a": pytest.approx(0.5)}


def test_a_noisy_verifier_ends_tasks_on_false_accepts_and_discards_false_rejects(tiny: Dataset) -> None:
    cascade = bl.sequence(["cheap", "strong"])
    # Accepts everything: the cheap model's wrong result on t2 ends the task unresolved.
    yes = Verifier(false_accept=0.999999, false_reject=0.0)
    [t2] = replay(tiny, ["t2"], cascade, retries=1, verifier=yes)
    assert t2.models == ("cheap",) and not t2.resolved
    # Rejects every right result: the cheap model's right result on t1 is discarded and the strong
    # one tries; its right result, rejected too, is the last attempt's: the task ends with it, done.
    no = Verifier(false_accept=0.0, false_reject=0.999999)
    [t1] = replay(tiny, ["t1"], cascade, retries=1, verifier=no)
    assert t1.models == ("cheap", "strong") and t1.resolved and t1.cost == pytest.approx(1.1)
    # With no attempt after it, the cheap model's rejected right result stands as well.
    [alone] = replay(tiny, ["t1"], cascade, retries=0, verifier=no)
    assert alone.models == ("cheap",) and alone.resolved
    # Verdicts are seeded per task, attempt and model: every chooser sees the same one.
    half = Verifier(0.5, 0.5, seed=3)
    assert [half.accepts("t", 1, "m", True) for _ in range(3)] == [half.accepts("t", 1, "m", True)] * 3
    # A cascade's expected outcome under noise, as the replay averages it.
    [c] = [
        c for c in bl.cascades(tiny, ["t1", "t2"], 2, Verifier(0.2, 0.1)) if c.models == ("cheap", "strong")
    ]
    # t1: cheap right, accepted 0.9; else (0.1) strong right, the last step, standing either way → 1.0.
    # t2: cheap wrong, rejected 0.8 → strong right, the last step → 0.8.
    assert c.resolved_rate == pytest.approx((1.0 + 0.8) / 2)
    assert c.cost_per_task == pytest.approx((0.1 + 0.1 * 1.0 + 0.2 + 0.8 * 1.0) / 2)


def test_always_cheapest_chooses_among_competent_models(tiny: Dataset) -> None:
    # cheap resolves 1/3 of the tasks, strong 2/3: at 40%, only strong is competent.
    assert bl.competent(tiny, tiny.task_ids, 0.40) == ["strong"]
    assert bl.competent(tiny, tiny.task_ids, 0.30) == ["cheap", "strong"]
    assert bl.competent(tiny, tiny.task_ids, 0.90) == ["cheap", "strong"]  # none is: all of them


# --- the learned policy's path ----------------------------------------------------------------------


def test_training_rows_come_from_log_records(tiny: Dataset) -> None:
    arrivals = runner.arrivals_for(tiny)
    requests, outcomes = deploy.log_records(tiny, tiny.task_ids, arrivals)
    rows = dataset.build(requests, outcomes, now=math.inf)
    assert len(rows) == 6
    assert {(r.model, r.success) for r in rows if r.task_id.startswith("t2#")} == {
        ("cheap", False),
        ("strong", True),
    }
    assert rows[0].vector[0] == 1.0 and len(rows[0].vector) > 10  # the task's features, as logged
    assert all(r.propensity == 0.5 and r.label_source == "explicit" and r.attempt == 1 for r in rows)
    assert sorted(r.cost for r in rows) == sorted(c for _, c, _ in OUTCOMES.values())
    # The repository is what the x-router-repo header carries: tasks of different repos differ.
    assert arrivals["t1"].vector != arrivals["t3"].vector and arrivals["t1"].features.tools


def test_router_chooses_through_the_decider(tiny: Dataset, tmp_path: Path) -> None:
    arrivals = runner.arrivals_for(tiny)
    dep = deploy.Deployment(tiny, deploy.train(tiny, tiny.task_ids, arrivals), tmp_path)
    decider = dep.decider(deploy.Knobs(max_attempts=2))
    assert decider.scorer.name.startswith("learned:")
    route = deploy.Router(decider, arrivals, None)
    first = route("t1", 1, (), 0.0)
    assert first in tiny.model_ids
    # After a failure on the first choice the next attempt may not repeat it when another fits.
    assert route("t1", 2, (first,), 0.1) in tiny.model_ids


def test_task_effect_makes_retries_after_failure_less_hopeful() -> None:
    a, b = Option("a", 0.5, 1.0), Option("b", 0.5, 1.0)
    independent = evaluate([a, b])
    assert evaluate([a, b], task_sd=0.0) == independent
    assert independent.success == pytest.approx(0.75)
    correlated = evaluate([a, b], task_sd=2.0)
    assert 0.5 < correlated.success < 0.75
    assert correlated.expected_cost == pytest.approx(1.5, abs=1e-6)  # the first attempt fails half the time
    after = best_plan([a, b], attempts_left=1, already_failed=["a"], task_sd=2.0)
    assert after.models == ("b",) and after.success < 0.45


def test_task_effect_is_estimated_from_grouped_outcomes() -> None:
    rng = np.random.default_rng(0)
    tasks, per_task = 300, 6
    groups = np.repeat(np.arange(tasks), per_task)
    u = np.repeat(rng.normal(size=tasks), per_task)
    y = rng.random(tasks * per_task) < 1 / (1 + np.exp(-(1.5 * u)))
    p = np.full(tasks * per_task, 0.5)
    assert 1.0 <= taskeffect.estimate(groups, p, y) <= 2.2
    independent = rng.random(tasks * per_task) < 0.5
    assert taskeffect.estimate(groups, p, independent) <= 0.4
    assert taskeffect.estimate(np.arange(tasks), p[:tasks], y[:tasks]) == 0.0  # no task seen twice


# --- a cross-validation run small enough for CI -------------------------------------------------------


def slice_of_shipped(root: Path, n_tasks: int, models: list[str]) -> Path:
    data = loader.load(SHIPPED)
    keep = data.task_ids[:n_tasks]
    tasks = [json.loads(line) for line in (SHIPPED / "tasks.jsonl").read_text().splitlines()]
    with (SHIPPED / "models.csv").open() as f:
        rows = [r for r in csv.DictReader(f) if r["model_id"] in models]
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(rows[0]))
    w.writeheader()
    w.writerows(rows)
    outcomes = {(t, m): (int(o.resolved), o.cost, o.calls) for (t, m), o in data.outcomes.items()
                if t in keep and m in models}  # fmt: skip
    return write_data(root, [t for t in tasks if t["instance_id"] in keep], buf.getvalue(), outcomes)


def test_cross_validation_on_a_slice(tmp_path: Path) -> None:
    models = ["deepseek-v3.2-reasoner", "gpt-5-mini-medium", "gemini-3-pro-preview", "claude-opus-4-5"]
    data = loader.load(slice_of_shipped(tmp_path / "slice", 40, models))
    settings = runner.EvalSettings(retries=1, folds=2, frontier=(0.05, 1.0), targets=(0.65,), strong_shares=(0.5,),
                               workers=1, target_success=0.6)  # fmt: skip
    report = runner.cross_validate(data, settings)
    assert set(report) == {"policy", "baselines", "oracle", "frontier"}
    keys = {"resolved_rate", "cost_per_task", "cost_per_completed", "mean_attempts", "share_of_calls", "std"}
    assert keys <= set(report["policy"]) and keys <= set(report["oracle"])
    assert {f"single:{m}" for m in models} | {"random", "always-cheapest", "always-strongest", "routellm@50%", "best-single",
                                               "cascade", "cascade@65%"} == set(report["baselines"])  # fmt: skip
    assert [p["value"] for p in report["frontier"]] == [0.05, 1.0]
    # The target was turned into a value on each fold's training tasks.
    assert all(v is not None and v > 0 for v in report["policy"]["objective"]["value_chosen_on_training"])
    for name, m in [("policy", report["policy"]), ("oracle", report["oracle"]), *report["baselines"].items()]:
        assert 0 <= m["resolved_rate"] <= report["oracle"]["resolved_rate"] + 1e-9, name
        # The policy may stop before its first attempt (a value too small to pay for one).
        assert (0 if name == "policy" else 1) <= m["mean_attempts"] <= 2, name
        assert sum(m["share_of_calls"].values()) == pytest.approx(1.0), name
    assert report["policy"]["setup"]["folds"] == 2 and report["policy"]["setup"]["tasks"] == 40
    assert "b_cascades" in report["policy"]["targets"]
    # With a noisy verifier the same run reports target (c), and the frontier at no noise beside it.
    noisy = runner.cross_validate(data, dataclasses.replace(settings, noise=(0.2, 0.1)))
    [row] = noisy["policy"]["targets"]["c_noisy_cascades"]["targets"]
    assert row["target"] == 0.65 and row["met"] == (
        row["policy_resolved_rate"] >= row["cascade_resolved_rate"] and row["cost_ratio"] <= 1.05
    )
    assert [p["value"] for p in noisy["frontier_exact"]] == [0.05, 1.0]
    noisy["policy"]["setup"]["seconds"] = 1.0
    table = render.targets_table([noisy])
    assert "| (c) retries 2 noise 0.2,0.1, target 65% |" in table and "verifier noise 0.2,0.1" in table


def test_cli_prints_one_json_object_and_writes_the_report(tmp_path: Path) -> None:
    root = slice_of_shipped(tmp_path / "slice", 24, ["deepseek-v3.2-reasoner", "gemini-3-pro-preview"])
    out = io.StringIO()
    with redirect_stdout(out):
        code = main(["eval", "--train", str(root), "--folds", "2", "--workers", "1", "--json",
                     "--out", str(tmp_path / "report")])  # fmt: skip
    assert code == 0
    obj = json.loads(out.getvalue())
    assert set(obj) == {"policy", "baselines", "oracle", "frontier"}
    assert obj["policy"]["objective"]["max_attempts"] == 1
    assert (tmp_path / "report" / "report.md").read_text().startswith("# router eval")
    for png in ("cost_success.png", "share_of_calls.png"):
        assert (tmp_path / "report" / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_rejects_bad_knobs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["eval", "--train", str(tmp_path), "--target-success", "1.5"]) == 2
    assert "--target-success" in capsys.readouterr().err
    assert main(["eval", "--train", str(tmp_path), "--target-success", "0.7", "--value-usd", "1"]) == 2
    assert "give one" in capsys.readouterr().err
    assert main(["eval", "--train", str(tmp_path), "--verifier-noise", "0.2"]) == 2
    assert "FA,FR" in capsys.readouterr().err
    assert main(["eval", "--train", str(tmp_path / "nowhere")]) == 2
    assert "not a directory" in capsys.readouterr().err
