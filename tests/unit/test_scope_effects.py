"""Per-scope learned effects (router.learning.training.scopes): the shrunk offsets, the held-out
keep-or-drop on hand-made data, the artifact round trip, the scoped scorer, and `router train`'s
per-scope report from a log."""

from __future__ import annotations

import asyncio
import hashlib
import logging
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
import yaml
from scipy import special

from router.app.cli import main
from router.features.task import vector as taskfeatures
from router.learning.training import dataset
from router.learning.training import scopes as scoped
from router.policy.active import load_active_policy
from router.policy.learned import LearnedScorer
from router.policy.scopes import ScopeFacts
from router.store.records import Estimate, OutcomeRecord, RequestRecord
from router.store.sqlite import SQLiteStore

VEC = taskfeatures.task_vector("fix the failing test")


def rows_for(task: int, outcomes: dict[str, list[bool]], repo: str = "acme/api") -> list[dataset.AttemptRow]:
    """One task's attempts: per model, one row per outcome given."""
    return [
        dataset.AttemptRow(
            f"t{task}", 1, m, VEC, ok, "explicit", 0.01, 3, 1.0, [m], facts=ScopeFacts(repo=repo)
        )
        for m, oks in outcomes.items()
        for ok in oks
    ]


def scope_data(p_true: dict[str, float], tasks: int, per_task: int, seed: int) -> list[dataset.AttemptRow]:
    rng = np.random.default_rng(seed)
    out: list[dataset.AttemptRow] = []
    for t in range(tasks):
        out += rows_for(t, {m: list(rng.random(per_task) < p) for m, p in p_true.items()})
    return out


def groups_of(rows: list[dataset.AttemptRow]) -> np.ndarray:
    return np.array([int(r.task_id[1:]) for r in rows])


def test_offsets_are_shrunk_towards_the_global_fit_more_the_less_data() -> None:
    # Global says 50%; the scope's model succeeds 80% of the time: logit(0.8) = 1.386.
    def offset(n: int) -> float:
        y = np.array([1.0] * (8 * n) + [0.0] * (2 * n))
        u, v = scoped.fit_offsets(np.zeros(10 * n), y, np.ones(10 * n), np.zeros(10 * n, dtype=int), 1)
        return u + v[0]

    small, large = offset(1), offset(100)
    assert 0 < small < large < np.log(4)
    assert large == pytest.approx(np.log(4), abs=0.02)  # 1000 attempts: the data wins
    assert small < 0.75 * np.log(4)  # 10 attempts: pulled well back towards the global fit
    # The penalised optimum by hand: the residuals balance each prior's pull (score equations).
    y = np.array([1.0] * 8 + [0.0] * 2)
    u, v = scoped.fit_offsets(np.zeros(10), y, np.ones(10), np.zeros(10, dtype=int), 1)
    resid = float(np.sum(y - special.expit(u + v[0])))
    assert resid == pytest.approx(u / scoped.COMMON_SD**2, abs=1e-9)
    assert resid == pytest.approx(v[0] / scoped.MODEL_SD**2, abs=1e-9)
    # No data on a model: it gets the scope's shared shift alone (its own offset stays 0).
    y = np.array([1.0] * 80 + [0.0] * 20)
    u, v = scoped.fit_offsets(np.zeros(100), y, np.ones(100), np.zeros(100, dtype=int), 2)
    assert v[1] == 0.0 and u > 0


def test_a_scope_whose_outcomes_really_differ_is_kept() -> None:
    # The global fit says 50% for both models; in this scope "a" succeeds 85%, "b" 30%.
    rows = scope_data({"a": 0.85, "b": 0.3}, tasks=40, per_task=3, seed=0)
    res = scoped.evaluate_scope("acme", rows, np.full(len(rows), 0.5), groups_of(rows))
    assert res.kept and res.offsets is not None
    assert res.loss_global == pytest.approx(np.log(2))  # 0.5 everywhere: log loss ln 2
    assert res.loss_scoped is not None and res.loss_scoped < res.loss_global - 0.05
    assert res.offsets.of("a") > 0.5 and res.offsets.of("b") < -0.5  # shrunk: logit 0.85 is 1.73
    assert res.line().startswith("scope acme: 40 tasks, 240 attempts: held-out log loss 0.6931 global, ")
    assert "→ kept (" in res.line()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_scope_that_behaves_as_the_global_fit_says_is_dropped(seed: int) -> None:
    # The global probabilities are the true ones: any offset fits noise, and held-out loss says so.
    p_true = {"a": 0.7, "b": 0.4}
    rows = scope_data(p_true, tasks=40, per_task=3, seed=seed)
    p = np.array([p_true[r.model] for r in rows])
    res = scoped.evaluate_scope("same", rows, p, groups_of(rows))
    assert not res.kept and res.offsets is None
    assert res.reason == "no held-out improvement"
    assert res.loss_scoped is not None and res.loss_global is not None and res.loss_scoped >= res.loss_global


def test_a_scope_below_the_minimum_is_reported_and_skipped() -> None:
    rows = scope_data({"a": 0.9}, tasks=34, per_task=1, seed=0)
    res = scoped.evaluate_scope("tiny", rows, np.full(len(rows), 0.5), groups_of(rows))
    assert not res.kept and res.loss_global is None
    assert res.line() == "scope tiny: 34 tasks, 34 attempts: skipped (too few labelled attempts: 34 < 100)"
    few_tasks = scope_data({"a": 0.9}, tasks=5, per_task=30, seed=0)
    res = scoped.evaluate_scope("few", few_tasks, np.full(150, 0.5), groups_of(few_tasks))
    assert res.reason == "too few tasks: 5 < 10"


def test_rows_count_for_the_first_scope_that_matches_them() -> None:
    from router.policy.config import Scope

    scopes = [Scope.model_validate({"name": "api", "match": {"repo": "acme/api"}}),
              Scope.model_validate({"name": "acme", "match": {"repo": "acme/*"}})]  # fmt: skip
    rows = rows_for(0, {"a": [True] * 3}) + rows_for(1, {"a": [True] * 2}, repo="acme/web")
    rows += rows_for(2, {"a": [True]}, repo="other/x")
    results = scoped.fit_scopes(scopes, rows, np.full(len(rows), 0.5), groups_of(rows))
    assert [(r.name, r.attempts) for r in results] == [("api", 3), ("acme", 2)]


# --- `router train` on a log, and the scorer that reads the scopes it kept --------------------------

M = {"litellm_model": "openai/x", "protocol": "openai", "context_window": 100_000, "max_output_tokens": 1000}


def policy(path: Path, scopes: list[dict[str, Any]], learned: dict[str, str] | None = None) -> Path:
    doc: dict[str, Any] = {
        "version": 1, "name": "p",
        "models": [{**M, "id": "cheap", "prices": {"input": 1, "output": 1}},
                   {**M, "id": "strong", "prices": {"input": 9, "output": 9}}],
        "routes": [{"match": "auto", "candidates": ["cheap", "strong"]}], "scopes": scopes,
    }  # fmt: skip
    if learned:
        doc["learned"] = learned
    path.write_text(yaml.safe_dump(doc))
    return path


def write_log(path: Path) -> str:
    """80 tasks in acme/* (where cheap succeeds 90%), 80 elsewhere (cheap 20%), 4 in tiny/*;
    strong succeeds 70% everywhere. No word of the task text names the repository."""
    rng = np.random.default_rng(0)
    requests, outcomes = [], []
    ts = 1_700_000_000.0
    repos = ["acme/api"] * 80 + ["zeta/core"] * 80 + ["tiny/x"] * 4
    for t, repo in enumerate(repos):
        vec = taskfeatures.to_json(taskfeatures.task_vector(f"fix issue_{t} in module_{t % 7}"))
        for m in ("cheap", "strong"):
            p = 0.7 if m == "strong" else (0.9 if repo.startswith("acme/") else 0.2)
            ts += 1
            task = f"t{t}-{m}"
            requests.append(RequestRecord(
                request_id=f"{task}#1", ts=ts, task_id=task, attempt=1, protocol="openai_chat",
                requested_model="auto", chosen_model=m, status=200, cost_usd=0.01 if m == "cheap" else 0.1,
                propensity=0.5, candidates=[Estimate("cheap", 0, 0, 0, 0.0), Estimate("strong", 0, 0, 0, 0.0)], task_features=vec, repo=repo,
            ))  # fmt: skip
            outcomes.append(
                OutcomeRecord(task, 1, bool(rng.random() < p), None, "explicit", None, ts + 0.5, True)
            )

    async def fill() -> None:
        store = SQLiteStore(str(path))
        await store.open()
        await store.write_requests(requests)
        for o in outcomes:
            await store.write_outcome(o)
        await store.close()

    asyncio.run(fill())
    return f"sqlite:///{path}"


SCOPES = [
    {"name": "acme", "match": {"repo": "acme/*"}},
    {"name": "tiny", "match": {"repo": "tiny/*"}, "objective": {"max_attempts": 1}},
]


def test_router_train_reports_each_scope_and_the_scorer_applies_the_kept_ones(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    store = write_log(tmp_path / "log.db")
    config = policy(tmp_path / "p.yaml", SCOPES)
    out = tmp_path / "learned.json"
    assert main(["train", "--store", store, "--config", str(config), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    lines = [line for line in printed.splitlines() if line.startswith("scope ")]
    assert len(lines) == 2, printed
    assert lines[0].startswith("scope acme: 80 tasks, 160 attempts: held-out log loss ")
    assert "→ kept (" in lines[0]
    assert lines[1] == "scope tiny: 4 tasks, 8 attempts: skipped (too few labelled attempts: 8 < 100)"
    art = orjson.loads(out.read_bytes())
    assert set(art["scopes"]) == {"acme"} and art["scopes"]["acme"]["match"] == {"repo": "acme/*"}
    assert [r["scope"] for r in art["scope_report"]] == ["acme", "tiny"]

    # The router: acme's scorer raises cheap's chance (90% there vs ~55% over the log); others don't.
    sha = hashlib.sha256(out.read_bytes()).hexdigest()
    rt = load_active_policy(policy(tmp_path / "p.yaml", SCOPES, {"artifact": str(out), "sha256": sha}))
    vec = taskfeatures.task_vector("fix issue_1000 in module_3")

    def p_cheap(scorer: object) -> float:
        assert isinstance(scorer, LearnedScorer)
        return {o.model: o.p_success for o in scorer.options(vec, ["cheap", "strong"])}["cheap"]

    glob = p_cheap(rt.decider.scorer)
    acme = rt.arm_for("t", ScopeFacts(repo="acme/web"))[1].scorer
    assert p_cheap(acme) > glob + 0.15
    # The policy and its scopes pin one file: it is read once per load, not once per scope.
    assert isinstance(acme, LearnedScorer) and isinstance(rt.decider.scorer, LearnedScorer)
    assert acme.artifact is rt.decider.scorer.artifact
    assert p_cheap(rt.arm_for("t", ScopeFacts(repo="tiny/x"))[1].scorer) == glob
    assert special.logit(p_cheap(acme)) - special.logit(glob) == pytest.approx(
        art["scopes"]["acme"]["common"] + art["scopes"]["acme"]["models"]["cheap"], abs=1e-6
    )
    # A scope whose match changed since training is not given effects fitted for other tasks.
    moved = [{**SCOPES[0], "match": {"repo": "acme/api"}}, SCOPES[1]]
    with caplog.at_level(logging.WARNING, logger="router.policy"):
        rt = load_active_policy(policy(tmp_path / "p.yaml", moved, {"artifact": str(out), "sha256": sha}))
    assert p_cheap(rt.arm_for("t", ScopeFacts(repo="acme/api"))[1].scorer) == glob
    assert "scope acme: the learned artifact's effects were trained for match" in caplog.text


def test_scopelog_writes_recorded_runs_as_a_log_with_a_scope_per_repository_owner(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from router.app.commands.train import read_log
    from router.learning.evals import scopelog
    from router.policy.loading import load_policy
    from tests.unit.test_evals import OUTCOMES as OUTCOMES_3
    from tests.unit.test_evals import TASKS as TASKS_3
    from tests.unit.test_evals import write_data

    data = write_data(tmp_path / "data", tasks=[*TASKS_3, {**TASKS_3[0], "instance_id": "t4", "repo": "p/q"}],
                      outcomes={**OUTCOMES_3, ("t4", "cheap"): (1, 0.1, 5), ("t4", "strong"): (0, 1.0, 5)})  # fmt: skip
    out = tmp_path / "out"
    for flags in ([], ["--no-repo-feature"]):
        assert scopelog.main([str(out), "--data", str(data), *flags]) == 0
        assert capsys.readouterr().out.startswith(f"wrote {out / 'log.db'} (8 attempts of 4 tasks)")
        scopes = load_policy(out / "policy.yaml").spec.scopes
        assert [(s.name, s.match.repo) for s in scopes] == [("o", "o/*"), ("p", "p/*")]
        requests, outcomes = asyncio.run(read_log(f"sqlite:///{out / 'log.db'}"))
        rows = dataset.build(requests, outcomes)
        assert {(r.task_id, r.facts.repo) for r in rows if r.model == "cheap"} == {
            ("t1#cheap", "o/r"),
            ("t2#cheap", "o/r"),
            ("t3#cheap", "o/s"),
            ("t4#cheap", "p/q"),
        }
        # The repository's hashed feature is in the task vector unless left out.
        repo_bucket = len(taskfeatures.NUMERIC) + taskfeatures._bucket("repo:o/r")[0]
        t1 = next(r for r in rows if r.task_id == "t1#cheap")
        assert (t1.vector.get(repo_bucket, 0.0) >= 1.0) == (not flags)
