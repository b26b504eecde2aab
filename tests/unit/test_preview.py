"""Preview arithmetic: logged requests decided again under a new policy, costs at its prices."""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

import pytest
import yaml

from router.policy.active import load_active_policy
from router.rollout.preview import preview
from router.store import OutcomeRecord, RequestRecord
from router.store.records import Estimate, TryRecord

# Prices per 1M tokens; the catalog keeps them per token.
A = {"id": "a", "litellm_model": "openai/a", "protocol": "openai", "context_window": 10_000,
     "max_output_tokens": 1000, "prices": {"input": 1.0, "output": 4.0, "cache_read": 0.1}}  # fmt: skip
B = {"id": "b", "litellm_model": "anthropic/b", "protocol": "anthropic", "context_window": 100_000,
     "max_output_tokens": 8000, "prices": {"input": 3.0, "output": 15.0, "cache_read": 0.3, "cache_write": 3.75},
     "capabilities": {"thinking": True}}  # fmt: skip
M = 1e-6


def runtime(tmp_path: Path, candidates: list[str], name: str = "p", **extra: Any):  # type: ignore[no-untyped-def]
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"version": 1, "name": name, "models": [A, B],
                                    "routes": [{"match": "auto", "candidates": candidates}], **extra}))  # fmt: skip
    return load_active_policy(path)


def row(i: int, model: str, *, task: str = "t1", attempt: int = 1, inp: int = 1000, out: int = 100,
        read: int = 0, write: int = 0, cost: float = 0.0, **kw: Any) -> RequestRecord:  # fmt: skip
    fields: dict[str, Any] = {"requested_model": "auto", **kw}
    return RequestRecord(f"r{i}", 1000.0 + i, decision_id=f"d{i}", task_id=task, attempt=attempt,
                         protocol="openai_chat", chosen_model=model, tries=[TryRecord(model)],
                         prompt_tokens_est=inp, input_tokens=inp, output_tokens=out, cache_read_tokens=read,
                         cache_write_tokens=write, cost_usd=cost, n_messages=2, status=200, **fields)  # fmt: skip


def test_the_logging_policy_moves_nothing_and_costs_the_same(tmp_path: Path) -> None:
    rt = runtime(tmp_path, ["a", "b"])
    cost = (1000 * 1.0 + 100 * 4.0) * M
    rows = [row(1, "a", cost=cost), row(2, "a", task="t2", cost=cost)]
    p = preview(rows, [], rt)
    assert (p["requests"], p["tasks"], p["moved"], p["moves"]) == (2, 2, 0, {})
    assert p["cost_usd_before"] == p["cost_usd_after"] == pytest.approx(2 * cost)


def test_hosted_tool_fees_are_carried_not_projected_as_a_saving(tmp_path: Path) -> None:
    # Two web searches ($0.01 each) were billed on top of the tokens: the same policy must project
    # the same cost, and a move keeps them (the log keeps what they cost, not which tools ran).
    tokens = (1000 * 1.0 + 100 * 4.0) * M
    rows = [row(1, "a", cost=tokens + 0.02, cost_tools_usd=0.02)]
    same = preview(rows, [], runtime(tmp_path, ["a", "b"]))
    assert same["cost_usd_after"] == pytest.approx(same["cost_usd_before"]) == pytest.approx(tokens + 0.02)
    moved = preview(rows, [], runtime(tmp_path, ["b"], name="q"))
    assert moved["moves"] == {"a -> b": 1}
    assert moved["cost_usd_after"] == pytest.approx(0.02 + (1200 * 3.75 + 100 * 15.0) * M, abs=1e-9)


def test_a_move_pays_the_new_prices_and_the_lost_cache(tmp_path: Path) -> None:
    # Logged: two calls of one attempt on a (openai), the second with 800 tokens read from cache.
    rows = [row(1, "a", inp=1000, cost=1.4e-3), row(2, "a", inp=1200, read=800, cost=1.0e-3)]
    p = preview(rows, [], runtime(tmp_path, ["b"]))
    assert p["moves"] == {"a -> b": 2}
    # b (anthropic) counts the same prompts in its own tokens, 1.2 per o200k token before its log
    # says (1000 → 1200, 1200 → 1440). The first call writes its whole prompt to the cache; the
    # second reads what the replay's first call left warm on b (1200 tokens) and writes the new 240.
    first = (1200 * 3.75 + 100 * 15.0) * M
    second = (1200 * 0.3 + 240 * 3.75 + 100 * 15.0) * M
    assert p["cost_usd_after"] == pytest.approx(first + second, abs=1e-9)
    # At b's prices with the logged cache reads, in b's tokens (as if the cache had moved along):
    # what is left is caching alone, not how the two count a prompt. The second call finds more
    # warm (1200 of 1440) than the log had cached (800 of 1200, 960 of b's).
    carried = (1200 * 3.0 + 100 * 15.0) * M + (480 * 3.0 + 960 * 0.3 + 100 * 15.0) * M
    assert p["cache_switch_usd"] == pytest.approx(first + second - carried, abs=1e-9)
    assert p["cost_usd_before"] == pytest.approx(2.4e-3)


def test_a_move_that_loses_no_cache_costs_nothing_for_the_switch(tmp_path: Path) -> None:
    # Nothing was read from a cache, so nothing is lost by moving: the switch's share is exactly
    # zero, never a float residue printed as "$-0.000000".
    c = dict(A, id="c", litellm_model="openai/c", prices={"input": 0.15, "output": 0.6, "cache_read": 0.075})
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"version": 1, "name": "c", "models": [A, c],
                                    "routes": [{"match": "auto", "candidates": ["c"]}]}))  # fmt: skip
    rt = load_active_policy(path)
    for inp, out in [(4984, 333), (1000, 100), (137, 7)]:
        switch = preview([row(1, "a", inp=inp, out=out)], [], rt)["cache_switch_usd"]
        assert switch == 0.0 and math.copysign(1.0, switch) == 1.0, (inp, out, switch)


def test_within_an_attempt_the_task_stays_where_the_new_policy_started_it(tmp_path: Path) -> None:
    # The new policy would pick a for the small first call, and b only for the one a cannot hold.
    rows = [
        row(1, "b", inp=500),
        row(2, "b", inp=11_500, out=900),
        row(3, "b", attempt=2, inp=11_800, out=900),
    ]
    p = preview(rows, [], runtime(tmp_path, ["a", "b"]))
    # Call 2 no longer fits a (b's 11,500 tokens are ~9,580 of a's, 1.2 to 1 before the log says;
    # + 1000 reserved > 10000): the pin cannot hold it; attempt 2 starts after a "failed" and goes
    # to b, where it was.
    assert p["moves"] == {"b -> a": 1}
    assert p["attempts"] == 2


def test_a_tasks_first_request_is_sized_as_serving_sized_it(tmp_path: Path) -> None:
    # A task's first request has no provider's count to start from: its logged estimate is o200k
    # tokens, as serving sized it (9,500 + 1,000 reserved > a's 10,000: b served it). Read as b's
    # count (9,500 b-tokens are ~7,900 of a's) the preview of the very policy that logged it moved
    # it to a (Qwen Code's opening on the demo policy: a move to local-nano, flagged as a risk).
    rt = runtime(tmp_path, ["a", "b"])
    p = preview([row(1, "b", inp=9_500, out=10)], [], rt)
    assert p["moves"] == {}
    # A later request's estimate starts from the count of the backend that served the one before
    # (b's): 10,400 of them are ~8,670 of a's, which a, where the replay started the task, holds.
    p = preview([row(1, "b", inp=500), row(2, "b", inp=10_400)], [], rt)
    assert p["moves"] == {"b -> a": 2}


def test_risks_name_what_the_logged_request_needed(tmp_path: Path) -> None:
    rows = [row(1, "b", thinking_budget=2048, out=3000)]
    p = preview(rows, [], runtime(tmp_path, ["a"]))
    assert p["moves"] == {"b -> a": 1}
    assert p["risks"]["counts"] == {"thinking": 1, "max_output_tokens": 1}


def test_requests_the_new_policy_cannot_route_are_counted(tmp_path: Path) -> None:
    rows = [row(1, "a", requested_model="gone"), RequestRecord("x", 1.0, status=401)]
    p = preview(rows, [], runtime(tmp_path, ["a"]))
    assert p["unroutable"] == {"UnknownModel": 1} and p["skipped"] == 1


def test_a_rule_on_a_logged_header_is_replayed(tmp_path: Path) -> None:
    rule = {"name": "premium", "when": {"headers.x-tier": "premium"}, "only": ["b"]}
    rt = runtime(tmp_path, ["a", "b"], rules=[rule])
    rows = [row(1, "b", rule_headers={"x-tier": "premium"}), row(2, "a", task="t2")]
    assert preview(rows, [], rt)["moved"] == 0
    assert rt.decider.rule_headers == ("x-tier",)


def test_offpolicy_success_uses_the_outcomes(tmp_path: Path) -> None:
    vec = {"0": 1.0}
    rows = [
        row(i, "a" if i % 2 else "b", task=f"t{i}", task_features=vec, propensity=0.5) for i in range(1, 21)
    ]
    outcomes = [
        OutcomeRecord(f"t{i}", 1, i % 2 == 0, None, "explicit", None, 2000.0, True) for i in range(1, 21)
    ]
    p = preview(rows, outcomes, runtime(tmp_path, ["b"]))
    off = p["success"]["offpolicy"]
    assert off["attempts"] == 20 and off["matched"] == 10
    assert off["before"]["success"] == 0.5 and off["after"]["success"] == 1.0
    assert p["success"]["learned_model"] is None  # no learned artifact in this policy


def test_the_printed_success_says_what_it_rests_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Printed, the off-policy line said "44 attempts" and "after: 0.801" where 5 of the 44 had
    # chosen what the new policy would (a move to a model no attempt had run), and a policy with no
    # learned routing was "n/a (no data for it in the window)", as if the log lacked something.
    from router.app.commands.preview import render

    vec = {"0": 1.0}
    rows = [
        row(i, "a" if i % 4 else "b", task=f"t{i}", task_features=vec, propensity=0.5) for i in range(1, 9)
    ]
    outcomes = [OutcomeRecord(f"t{i}", 1, True, None, "explicit", None, 2000.0, True) for i in range(1, 9)]
    p = preview(rows, outcomes, runtime(tmp_path, ["b"]))
    assert p["success"]["offpolicy"]["matched"] == 2
    assert p["success_missing"] == {
        "learned_model": "the policy routes by cheapest, with no learned model of success"
    }
    render(p)
    out = capsys.readouterr().out
    assert "8 attempts, 2 of them on the model the new policy would choose" in out
    assert (
        "success (learned_model): n/a (the policy routes by cheapest, with no learned model of success)"
        in out
    )
    empty = preview([], [], runtime(tmp_path, ["b"], name="q"))
    assert empty["success_missing"]["offpolicy"] == "no logged attempt with an outcome in the window"


def learned_runtime(tmp_path: Path, trained: list[Any]):  # type: ignore[no-untyped-def]
    """A policy of models a and b that pins the artifact fitted on ``trained`` attempt rows."""
    import hashlib

    from router.learning.training.fit import fit

    raw = fit(trained).to_json()
    (tmp_path / "learned.json").write_bytes(raw)
    return runtime(
        tmp_path, ["a", "b"], learned={"artifact": "learned.json", "sha256": hashlib.sha256(raw).hexdigest()}
    )


def test_success_by_the_learned_model_when_the_policy_pins_one(tmp_path: Path) -> None:
    from router.features.task.vector import task_vector, to_json
    from router.learning.training import dataset

    vec = task_vector("fix the race condition")
    trained = [dataset.AttemptRow(f"t{i}", 1, m, vec, m == "b", "explicit", 0.01, 3, 1.0, [m])
               for i in range(12) for m in ("a", "b")]  # fmt: skip
    rt = learned_runtime(tmp_path, trained)
    rows = [row(i, "a", task=f"t{i}", task_features=to_json(vec)) for i in range(1, 6)]
    p = preview(rows, [], rt)
    assert p["moves"] == {"a -> b": 5}  # the learned model expects b to complete the task, a not
    s = p["success"]["learned_model"]
    assert s["method"].startswith(f"learned model {rt.decider.scorer.name}") and s["attempts"] == 5
    assert s["after"]["mean"] > 0.5 > s["before"]["mean"]
    assert s["difference"]["mean"] == pytest.approx(s["after"]["mean"] - s["before"]["mean"], abs=1e-3)
    lo, hi = s["after"]["ci95"]
    assert lo <= s["after"]["mean"] <= hi


async def test_a_served_preview_reads_the_same_without_the_prompt(tmp_path: Path) -> None:
    from dataclasses import replace

    from router.rollout.preview import UNREAD
    from router.store import open_store

    vec = {"0": 1.0}
    rows = [replace(row(i, "a" if i % 2 else "b", task=f"t{i % 4}", task_features=vec, propensity=0.5,
                        rule_headers={"x-tier": "premium"} if i == 3 else None),
                    prompt="the whole conversation", candidates=[Estimate("a", 0, 0, 0, 0.0), Estimate("b", 0, 0, 0, 0.0)])
            for i in range(1, 13)]  # fmt: skip
    outcomes = [OutcomeRecord(f"t{i}", 1, i % 2 == 0, None, "explicit", None, 2000.0, True) for i in range(4)]
    store = open_store(f"sqlite:///{tmp_path / 'log.db'}")
    await store.open()
    await store.write_requests(rows)
    everything, read = await store.requests_since(0.0), await store.requests_since(0.0, without=UNREAD)
    await store.close()
    assert all(r.prompt is None for r in read)
    rule = {"name": "premium", "when": {"headers.x-tier": "premium"}, "only": ["b"]}
    rt = runtime(tmp_path, ["a", "b"], rules=[rule])
    assert preview(read, outcomes, rt) == preview(everything, outcomes, rt)


def test_a_preview_warns_when_success_falls_for_sure(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # a completes 7 tasks of 12 at a 50th of b's cost, b all 12: the learned policy moves
    # every logged request from b to a, for less success. The preview said only "risks: none".
    from router.app.commands.preview import _retrain, render
    from router.features.task.vector import task_vector, to_json
    from router.learning.training import dataset

    vec = task_vector("fix the race condition")
    cost = {"a": 0.001, "b": 0.05}
    trained = [dataset.AttemptRow(f"t{i}", 1, m, vec, m == "b" or i < 7, "explicit", cost[m], 3, 1.0, [m])
               for i in range(12) for m in ("a", "b")]  # fmt: skip
    rt = learned_runtime(tmp_path, trained)
    rows = [row(i, "b", task=f"t{i}", task_features=to_json(vec)) for i in range(1, 6)]
    p = preview(rows, [], rt)
    assert p["moves"] == {"b -> a": 5}
    assert p["success"]["learned_model"]["difference"]["ci95"][1] < 0
    (warning,) = p["warnings"]
    assert warning.startswith("success falls: the learned model expects -")
    # It said no more: what to do about it was left to guess, and the demo's learned policy warns.
    assert warning.endswith(
        "the whole 95% interval below 0. Its objective, the least cost per completed task (no "
        "objective.target_success or value_per_completed_usd), trades that success for cost: to hold it, set "
        "objective.target_success with objective.max_attempts: 1 and train again, or keep the running policy "
        "(promote nothing)"
    )
    config = tmp_path / "p.yaml"
    args = argparse.Namespace(config=str(config), store="sqlite:///elsewhere.db", since="7d")
    render(p, _retrain(args, tmp_path / "learned.json"))
    out = capsys.readouterr().out
    assert "warning: success falls" in out
    assert out.splitlines()[-5:-2] == [
        f"  router train --config {config} --out {tmp_path / 'learned.next.json'} --store sqlite:///elsewhere.db",
        f"  router promote {tmp_path / 'learned.next.json'} --config {config}",
        f"  router preview --config {config} --since 7d --store sqlite:///elsewhere.db",
    ]

    # With a target over several attempts, the first attempt is meant to be cheap: raising the
    # target did not lift it on the demo's log (a cascade from the cheapest model at 0.5 and 0.7).
    def warned(objective: dict[str, Any]) -> str:
        targeted = runtime(tmp_path, ["a", "b"], name="t", objective=objective,
                           learned={"artifact": "learned.json", "sha256": rt.policy.spec.learned.sha256})  # fmt: skip
        (warning,) = preview(rows, [], targeted)["warnings"]
        return str(warning)

    assert warned({"target_success": 0.6}).endswith(
        "Success is per attempt: for objective.target_success 0.6 over up to 3 attempts the plan starts tasks "
        "on cheaper models and tries a failed one again on another, which this preview does not replay and "
        "which happens only where failures are reported (router outcome --failure, POST /v1/outcomes) and the "
        "agent runs the task again. To hold success on the first attempt, set objective.max_attempts: 1 and "
        "train again, or keep the running policy (promote nothing)"
    )
    # a's 7 of 12 meet a target of 0.5 alone (0.6 would move everything to b, and warn of nothing).
    assert warned({"target_success": 0.5, "max_attempts": 1}).endswith(
        "Its objective asks for that (objective.target_success 0.5): to hold success, raise it and train "
        "again, or keep the running policy (promote nothing)"
    )
    assert "for objective.value_per_completed_usd $0.5 over up to 2 attempts" in warned(
        {"value_per_completed_usd": 0.5, "max_attempts": 2}
    )
    # A move that does not lower success says nothing.
    assert (
        preview([row(i, "a", task=f"t{i}", task_features=to_json(vec)) for i in range(1, 6)], [], rt)[
            "warnings"
        ]
        == []
    )


def test_a_task_of_side_calls_alone_counts_its_attempt(tmp_path: Path) -> None:
    # A task whose requests are all side calls (a title, a summary) has an attempt as any task does:
    # "3 requests of 2 tasks (1 attempts)" counted only the attempts a main-loop request opened.
    rows = [row(1, "a"), row(2, "a", side_call=True), row(3, "a", task="t2", side_call=True)]
    p = preview(rows, [], runtime(tmp_path, ["a", "b"]))
    assert (p["requests"], p["tasks"], p["attempts"]) == (3, 2, 2)
    # Its second attempt too, and an attempt counts once however many side calls it had.
    more = [*rows, row(4, "a", task="t2", attempt=2, side_call=True), row(5, "a", task="t2", side_call=True)]
    assert preview(more, [], runtime(tmp_path, ["a", "b"], name="q"))["attempts"] == 3


def test_the_printed_cost_says_what_caching_changes_as_dollars_or_not_at_all(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # It printed "of which $+0.000000 from prompt caching" where caching changed nothing (the demo's
    # preview, in docs/policy.md), a sign between the dollar and its digits unlike the figures beside it.
    from router.app.commands.preview import render

    p = preview([row(1, "a")], [], runtime(tmp_path, ["b"]))
    printed = {}
    for switch in (0.0, 2e-7, 0.0004321, -0.012):
        render({**p, "cache_switch_usd": switch})
        printed[switch] = next(
            line for line in capsys.readouterr().out.splitlines() if line.startswith("cost:")
        )
    assert printed[0.0] == printed[2e-7] and "caching" not in printed[0.0]
    assert printed[0.0004321].endswith("; of which +$0.000432 from prompt caching after the moves")
    assert printed[-0.012].endswith("; of which -$0.012000 from prompt caching after the moves")


def test_a_preview_of_an_empty_window_says_so_and_what_to_try(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A log with nothing in the window printed "0 requests of 0 tasks (0 attempts) decided again"
    # and a page of n/a, as though the policy had been compared with something.
    from router.app.cli import main

    store = f"sqlite:///{tmp_path / 'log.db'}"
    assert main(["migrate", "--store", store]) == 0
    config = tmp_path / "p.yaml"
    runtime(tmp_path, ["a", "b"])
    capsys.readouterr()
    assert main(["preview", "--config", str(config), "--store", store, "--since", "2h"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == (
        f"nothing was decided again: {store} has no request in the last 2h; try a longer --since, or --store "
        "the log your routers write (their ROUTER_STORE)"
    )
