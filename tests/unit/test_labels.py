"""The outcome label: both shapes of agent read alike, the model artifact, fitting, evaluation, weights."""

from __future__ import annotations

import gzip
import hashlib
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import orjson
import pytest

from router.errors import ConfigError
from router.features import signals
from router.features.labels import features
from router.features.labels.infer import LOOPING_P
from router.features.labels.model import DEFAULT_PATH, DEFAULT_SHA256, SOURCE, LabelModel, default
from router.features.signals.transcript import ToolCall, ToolResult, message_events
from router.features.task.context import weak_label
from router.learning.labels import fit as fitting
from router.learning.labels.evaluate import Attempt, checkpoint_quality, evaluate, stop_loss
from router.learning.labels.replay import Trajectory, load, replay, requests
from router.learning.training import dataset
from router.protocols import openai_chat
from router.store import OutcomeRecord, RequestRecord
from tests.unit.test_signals import PROTOCOLS, PYTEST_FAIL, PYTEST_PASS, Step, conversation

TRAJECTORIES = Path(__file__).resolve().parents[2] / "evals/data/trajectories/gemini-3-pro-preview.jsonl.gz"


def text_conversation(steps: list[Step]) -> list[dict[str, Any]]:
    """The steps in mini-swe-agent's text protocol: a bash block, the result as a user message."""
    msgs: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "Fix the failing tests."},
    ]
    for s in steps:
        msgs.append({"role": "assistant", "content": f"THOUGHT: go.\n\n```bash\n{s.args['command']}\n```"})
        msgs.append({"role": "user", "content": f"<returncode>0</returncode>\n<output>\n{s.output}</output>"})
    return msgs


def shaped(protocol: str, steps: list[Step]) -> list[Any]:
    return text_conversation(steps) if protocol == "text" else conversation(protocol, steps)


ALL_SHAPES = (*PROTOCOLS, "text")
STEPS = [
    Step("bash", {"command": "pytest -q"}, PYTEST_FAIL),
    Step("bash", {"command": "sed -i s/a/b/ cart.py"}, ""),
    Step("bash", {"command": "pytest -q"}, PYTEST_PASS),
]


# -- the text protocol reads as tool calls and results -------------------------------------------


def test_a_bash_block_is_a_call_and_a_returncode_message_its_result() -> None:
    call = message_events({"role": "assistant", "content": "THOUGHT: x\n\n```bash\nls -la\n```"})
    assert len(call) == 1 and isinstance(call[0], ToolCall) and call[0].name == "bash"
    result = message_events(
        {"role": "user", "content": "<returncode>1</returncode>\n<output>\nno\n</output>"}
    )
    assert len(result) == 1 and isinstance(result[0], ToolResult) and result[0].is_error is None
    timeout = message_events(
        {"role": "user", "content": "The last command <command>sleep 99</command> timed out"}
    )
    assert isinstance(timeout[0], ToolResult) and timeout[0].is_error is True
    # Not the protocol: two blocks (a format error), an ordinary user message, a tool-calling turn.
    assert message_events({"role": "assistant", "content": "```bash\nls\n```\n```bash\npwd\n```"}) == []
    assert message_events({"role": "user", "content": "Fix the failing tests."}) == []
    chat_call = {"id": "c", "type": "function", "function": {"name": "run", "arguments": "{}"}}
    both = message_events({"role": "assistant", "content": "```bash\nls\n```", "tool_calls": [chat_call]})
    assert [e.name for e in both if isinstance(e, ToolCall)] == ["run"]


def test_the_signals_read_the_text_protocol_as_they_read_tool_results() -> None:
    text = {s.name: s for s in signals.extract("openai_chat", text_conversation(STEPS[:1]))}
    chat = {s.name: s for s in signals.extract("openai_chat", conversation("openai_chat", STEPS[:1]))}
    assert text[signals.TESTS].success is False and text[signals.TESTS].value == chat[signals.TESTS].value
    looping = text_conversation([Step("bash", {"command": "pytest -q"}, PYTEST_FAIL)] * 4)
    assert signals.TOOL_LOOP in {s.name for s in signals.switches("openai_chat", looping)}


# -- the features: one reading per message, the same in every shape ------------------------------


@pytest.mark.parametrize("protocol", ALL_SHAPES)
def test_the_features_are_the_same_in_every_shape(protocol: str) -> None:
    x = features.vector(features.conversation(shaped(protocol, STEPS)))
    ref = features.vector(features.conversation(text_conversation(STEPS)))
    assert x["log_steps"] == ref["log_steps"] == pytest.approx(1.386294, abs=1e-6)  # 3 turns
    assert x["no_tests"] == 0.0 and x["tests_failing"] == 0.0  # the latest run passed
    assert x["repeats"] == ref["repeats"] == pytest.approx(1 / 3)  # "pytest -q" twice of three
    # Only the wrappers differ (a THOUGHT line, <returncode> tags): a few percent of this tiny
    # conversation, under 0.01 on a real run (test_both_shapes_of_a_real_run...).
    assert x["log_chars"] == pytest.approx(ref["log_chars"], abs=0.25)


def test_the_latest_failing_run_and_format_errors_are_read() -> None:
    msgs = text_conversation([STEPS[2], STEPS[0]])
    msgs.append({"role": "user", "content": "Please always provide EXACTLY ONE action in triple backticks"})
    x = features.vector(features.conversation(msgs))
    assert x["tests_failing"] == 1.0 and x["format_errors"] == pytest.approx(0.693147, abs=1e-6)


def test_mini_swe_agent_2s_format_errors_and_cut_outputs_are_read() -> None:
    # Its templates (mini.yaml, tool calls; default.yaml, text) no longer open with mini-swe-agent
    # 1's "Please always provide EXACTLY ONE action", and its cut output is JSON with the warning
    # last: a run of rejected turns and cut outputs read as none of either.
    call = {
        "id": "c1",
        "type": "function",
        "function": {"name": "bash", "arguments": '{"command": "cat big"}'},
    }
    cut = '{\n  "returncode": 0,\n  "output_head": "' + "x" * 5000 + '",\n  "output_tail": "y",\n'
    cut += '  "elided_chars": 12000,\n  "warning": "Output too long."\n}'
    msgs = [
        {"role": "user", "content": "Please solve this issue: fix it"},
        {"role": "assistant", "content": "thinking"},
        {
            "role": "user",
            "content": "Tool call error:\n\n<error>\nNo tool calls found in the response.\n</error>",
        },
        {"role": "assistant", "content": "still thinking"},
        {"role": "user", "content": "Format error:\n\n<error>\nNo action found.\n</error>"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": cut},
    ]
    x = features.vector(features.conversation(msgs))
    assert x["format_errors"] == pytest.approx(1.098612, abs=1e-6)  # log1p(2)
    assert x["too_long"] == pytest.approx(0.693147, abs=1e-6)


def test_memo_slots_give_what_a_fresh_read_gives_and_are_reused() -> None:
    msgs = text_conversation(STEPS)
    seen: list[Any] = [None] * len(msgs)
    assert features.conversation(msgs, seen) == features.conversation(msgs)
    assert all(s is not None and s.label is not None for s in seen)
    # A filled slot is used instead of the message: a stale reading shows through.
    stale = seen[-1].label
    seen[-1].label = features.Facts(step=True, chars=10**6)
    assert features.vector(features.conversation(msgs, seen))["log_chars"] > 13
    seen[-1].label = stale


def test_each_turn_adds_its_new_messages_to_the_tally_the_last_turn_left() -> None:
    msgs = text_conversation([*STEPS, STEPS[0], *STEPS])
    msgs.append({"role": "user", "content": "Please always provide EXACTLY ONE action in triple backticks"})
    turns: list[list[Any]] = []
    for k in range(3, len(msgs) + 1):
        # The memo's slots: the readings of the messages shared with the last turn, then empty ones.
        seen = [*(turns[-1] if turns else [])[:k], None]
        seen += [None] * (k - len(seen))
        assert features.of(msgs[:k], seen) == features.vector(features.conversation(msgs[:k]))
        assert seen[-1].tally is not None
        turns.append(seen)
    assert all(t[-1].tally is None for t in turns[:-1])  # moved on with each turn, not copied
    # A resend of an earlier turn, and a branch off it with another last message, still sum right.
    old = turns[3]
    assert features.of(msgs[: len(old)], old) == features.vector(features.conversation(msgs[: len(old)]))
    branch = [*msgs[: len(old) - 1], {"role": "user", "content": "<returncode>1</returncode>"}]
    assert features.of(branch, [*old[:-1], None]) == features.vector(features.conversation(branch))
    # The tally is what is added to: a stale one shows through.
    turns[-1][-1].tally = features.Tally(chars=10**6)
    assert features.of(msgs, turns[-1])["log_chars"] > 13


# -- the artifact -------------------------------------------------------------------------------


def _artifact(**over: Any) -> bytes:
    art = {"format": "router-labels/1", "features": ["log_steps"], "mean": [2.0], "scale": [1.0],
           "coef": [-1.0], "intercept": 1.0, "platt": [1.0, 0.0], **over}  # fmt: skip
    return orjson.dumps(art)


def test_the_artifact_is_read_checked_and_pinned(tmp_path: Path) -> None:
    raw = _artifact()
    m = LabelModel.from_json(raw, source="a.json", expected_sha256=hashlib.sha256(raw).hexdigest())
    assert m.p_success({"log_steps": 2.0}) == pytest.approx(1 / (1 + 2.718281828**-1.0))
    assert m.p_success({"log_steps": 4.0}) < m.p_success({"log_steps": 1.0})
    assert m.threshold == 0.5 and m.meta == {} and m.sha256 == hashlib.sha256(raw).hexdigest()
    with pytest.raises(ConfigError, match=r"a\.json: sha256 mismatch"):
        LabelModel.from_json(raw, source="a.json", expected_sha256="0" * 64)
    # A bad field is named with its file, in one line.
    for bad, why in (
        (
            _artifact(features=["log_steps", "mood"]),
            r"a\.json: features\[1\]: expected a feature this router reads",
        ),
        (_artifact(scale=[0.0]), r"a\.json: scale\[0\]: expected a number in \(0, inf\), got 0\.0"),
        (_artifact(mean=[1.0, 2.0]), r"a\.json: mean: expected a list of 1, got a list of 2"),
        (_artifact(intercept=None), r"a\.json: intercept: missing"),
        (_artifact(platt=[1.0, "x"]), r"a\.json: platt\[1\]: expected a number"),
        (_artifact(threshold=2), r"a\.json: threshold: expected a number in \[0, 1\]"),
        (b"not json", r"a\.json: not a label model artifact: not JSON"),
        (b"[]", r"a\.json: not a label model artifact: format is None"),
        (_artifact(format="pickle"), "format is 'pickle'"),
    ):
        with pytest.raises(ConfigError, match=why):
            LabelModel.from_json(bad, source="a.json")
    with pytest.raises(ConfigError, match="cannot read"):
        LabelModel.load(tmp_path / "missing.json", None)


def test_the_shipped_default_is_the_pinned_file() -> None:
    assert hashlib.sha256(DEFAULT_PATH.read_bytes()).hexdigest() == DEFAULT_SHA256
    m = default()
    assert m.features == fitting.DEFAULT_FEATURES and m.meta["attempts"] == 361
    # The value writes the shipped file byte for byte: the format is the one it was fitted in.
    assert m.to_json() == DEFAULT_PATH.read_bytes()


def test_a_policy_pins_its_own_label_model(tmp_path: Path) -> None:
    from router.policy.loading import parse_policy
    from tests.unit.test_config import BASE

    raw = _artifact()
    (tmp_path / "labels.json").write_bytes(raw)
    source = str(tmp_path / "policy.yaml")

    def with_labels(sha: str) -> str:
        return BASE + f"tasks:\n  label_model: {{artifact: labels.json, sha256: {sha}}}\n"

    pinned = parse_policy(with_labels(hashlib.sha256(raw).hexdigest()), source=source, env={})
    assert pinned.label_model.features == ("log_steps",)
    assert parse_policy(BASE, source=source, env={}).label_model is default()
    with pytest.raises(ConfigError, match="sha256 mismatch"):
        parse_policy(with_labels("a" * 64), source=source, env={})


# -- the label the proxy writes ------------------------------------------------------------------


def test_the_weak_label_is_the_models_probability_with_the_signals_beside_it() -> None:
    body = {"model": "auto", "messages": conversation("openai_chat", STEPS)}
    req = openai_chat.parse(orjson.dumps(body))
    label = weak_label(req, 3, resent=True)
    x = features.vector(features.conversation(req.messages))
    p = default().p_success(x)
    assert label.source == SOURCE and label.score == round(p, 6) and label.success == (p >= 0.5)
    assert label.weight == round(abs(2 * p - 1), 6)
    assert "resent" in label.details["signals"] and signals.TESTS in label.details["signals"]


# -- fitting and measuring ----------------------------------------------------------------------


def _separable(n: int = 120) -> list[fitting.Sample]:
    return [fitting.Sample(f"t{i}", {"log_steps": float(i % 10)}, i % 10 < 6) for i in range(n)]


def test_fitting_learns_the_direction_and_cross_validation_keeps_tasks_apart() -> None:
    samples = _separable()
    m = fitting.fit(samples, ["log_steps"])
    assert LabelModel.from_json(m.to_json(), source="x") == m  # what the file keeps is what scored
    assert m.p_success({"log_steps": 0.0}) > 0.9 > 0.1 > m.p_success({"log_steps": 9.0})
    oof = fitting.cross_validate(samples, ["log_steps"])
    assert fitting.quality(list(oof), [int(s.success) for s in samples])["auc"] > 0.95
    # A label that only the task's own samples reveal cannot be learned across folds.
    leaky = [
        fitting.Sample(f"g{i // 4}", {"log_steps": float(i // 4)}, (i // 4) % 2 == 0) for i in range(200)
    ]
    oof = fitting.cross_validate(leaky, ["log_steps"])
    assert fitting.quality(list(oof), [int(s.success) for s in leaky])["auc"] < 0.7
    with pytest.raises(ValueError, match="both"):
        fitting.fit([fitting.Sample("a", {}, True)] * 3, ["log_steps"])


def test_quality_against_hand_computed_figures() -> None:
    q = fitting.quality([0.9, 0.8, 0.3, 0.65], [1, 1, 0, 0])
    assert q["auc"] == 1.0 and q["brier"] == pytest.approx((0.01 + 0.04 + 0.09 + 0.4225) / 4, abs=1e-4)
    assert q["brier_constant"] == 0.25 and q["agreement"] == 0.75 and q["agreement_constant"] == 0.5
    assert [(b["bin"], b["n"]) for b in q["reliability"]] == [("0.2-0.4", 1), ("0.6-0.8", 1), ("0.8-1.0", 2)]


def _attempt(resolved: bool, cv: list[float], costs: list[float]) -> Attempt:
    msgs: list[dict[str, Any]] = [{"role": "system", "content": ""}, {"role": "user", "content": "task"}]
    for c in costs:
        msgs += [
            {"role": "assistant", "content": "x", "usage": {"cost": c}},
            {"role": "user", "content": "y"},
        ]
    t = Trajectory("t", resolved, msgs)
    return Attempt(t, [{}] * len(cv), cv, [None] * len(cv), cv)


def test_stop_loss_saves_the_turns_after_the_cut() -> None:
    good = _attempt(True, [0.8, 0.7, 0.9], [1.0, 2.0, 3.0])
    bad = _attempt(False, [0.6, 0.4, 0.3], [1.0, 2.0, 4.0])
    at = {r["threshold"]: r for r in stop_loss([good, bad], thresholds=(0.5, 0.75))}
    assert at[0.5] | {"attempts_cut": 1, "resolved_lost": 0, "usd_saved": 6.0} == at[0.5]
    assert at[0.75]["attempts_cut"] == 2 and at[0.75]["resolved_lost"] == 1
    # good is cut before its turn 2 (2 + 3 not spent), bad before its turn 1 (1 + 2 + 4)
    assert at[0.75]["usd_saved"] == pytest.approx(5.0 + 7.0)
    q = checkpoint_quality([good, bad], 3, "cv")
    assert q["attempts"] == 2 and q["coverage"] == 1.0 and q["auc"] == 1.0


# -- replaying real trajectories -----------------------------------------------------------------


def test_both_shapes_of_a_real_run_give_one_request_per_turn_and_the_same_label() -> None:
    t = load(TRAJECTORIES, limit=1)[0]
    bodies = {shape: [orjson.loads(b) for b in requests(t, shape)] for shape in ("tools", "text")}
    # One request before each assistant turn; the submitting turn is the last one's reply.
    turns = sum(m["role"] == "assistant" for m in t.messages)
    assert len(bodies["tools"]) == len(bodies["text"]) == turns == 32
    last = bodies["tools"][-1]["messages"]
    assert any(m["role"] == "tool" for m in last) and not any("<returncode>" in str(m["content"])
                                                              for m in last if m["role"] == "user")  # fmt: skip
    assert bodies["text"][-1]["messages"] == [
        {"role": m["role"], "content": m["content"]} for m in t.messages[:-2]
    ]
    tools, text = replay(t, "tools", default()), replay(t, "text", default())
    assert [u.label.success for u in tools] == [u.label.success for u in text]
    assert tools[-1].label.score == pytest.approx(text[-1].label.score, abs=0.01)


def test_evaluate_reports_every_checkpoint_per_shape(tmp_path: Path) -> None:
    ts = load(TRAJECTORIES, limit=12)
    report = evaluate(ts, default(), shapes=("text",), folds=2, with_stop_loss=True)
    per = report["shapes"]["text"]
    assert set(per["cv"]) == {"last", "10", "20", "30"} and per["cv"]["last"]["coverage"] == 1.0
    assert per["cv"]["last"]["attempts"] == 12 and len(per["stop_loss"]) == 9


def test_eval_labels_cli_prints_json_and_refuses_a_missing_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from router.app.cli import main

    small = tmp_path / "runs.jsonl.gz"
    with gzip.open(TRAJECTORIES, "rb") as src, gzip.open(small, "wb") as dst:
        dst.writelines(line for _, line in zip(range(8), src, strict=False))
    assert (
        main(["eval-labels", "--trajectories", str(small), "--shape", "tools", "--folds", "2", "--json"]) == 0
    )
    out = json.loads(capsys.readouterr().out)
    assert out["trajectories"] == 8 and set(out["shapes"]) == {"tools"}
    assert main(["eval-labels", "--trajectories", str(tmp_path / "none.jsonl")]) == 2
    assert "no such trajectories file" in capsys.readouterr().err


# -- labels in training: weighed by confidence, explicit outcomes dominate ------------------------


def test_training_weighs_inferred_labels_by_confidence_and_explicit_ones_fully() -> None:
    def outcome(source: str, score: float | None, success: bool = True, ts: float = 1.0) -> OutcomeRecord:
        return OutcomeRecord("a", 1, success, score, source, None, ts, source == "explicit")

    assert dataset.label_weight(outcome("explicit", None)) == 1.0
    assert dataset.label_weight(outcome(SOURCE, 0.8)) == pytest.approx(0.6)
    assert dataset.label_weight(outcome(SOURCE, 0.5)) == 0.0
    assert dataset.label_weight(outcome("tests", 1.0)) == dataset.INFERRED_WEIGHT
    req = RequestRecord(
        "r", 1.0, task_id="a", attempt=1, status=200, chosen_model="m", task_features={"0": 1.0}
    )
    inferred = outcome(SOURCE, 0.1, success=False, ts=5.0)
    (row,) = dataset.build([req], [inferred], now=2.0)
    assert not row.success and row.label_source == SOURCE and row.weight == pytest.approx(0.8)
    explicit = outcome("explicit", None, ts=2.0)
    (row,) = dataset.build([req], [inferred, explicit], now=2.0)
    assert row.success and row.label_source == "explicit" and row.weight == 1.0


# -- the label model from the log's explicit outcomes ---------------------------------------------


def _logged(n: int) -> list[OutcomeRecord]:
    rows: list[OutcomeRecord] = []
    for i in range(n):
        steps = float(i % 10)
        x = {"log_chars": 10.0, "log_steps": steps, "no_tests": 0.0, "repeats": 0.0}
        rows.append(OutcomeRecord(f"t{i}", 1, True, 0.7, SOURCE, {"features": x}, 1.0, False))
        rows.append(OutcomeRecord(f"t{i}", 1, steps < 5, None, "explicit", None, 2.0, True))
    rows.append(OutcomeRecord("lonely", 1, True, None, SOURCE, {"features": {}}, 1.0, False))
    return rows


def test_train_measures_the_model_in_force_and_refits_from_explicit_outcomes(tmp_path: Path) -> None:
    from router.learning.labels import fromlog

    few = fromlog.train(_logged(20), default(), tmp_path / "few.json")
    assert few["explicit_with_label"] == 20 and few["refit"] is None and "needs 50" in few["why_not"]
    assert not (tmp_path / "few.json").exists()
    report = fromlog.train(_logged(80), default(), tmp_path / "l.json")
    assert report["explicit_with_label"] == 80  # the attempt without an explicit outcome is left out
    assert report["refit"]["cv"]["auc"] > 0.95 > report["current"]["auc"]
    m = LabelModel.load(tmp_path / "l.json", report["refit"]["sha256"])
    assert m.p_success({"log_steps": 1.0}) > 0.5 > m.p_success({"log_steps": 8.0})
    text = "\n".join(fromlog.lines(report))
    assert "refitted, 5-fold CV by task: AUC" in text
    # "pin it under tasks.label_model" left the shape of the entry to the docs.
    assert f"\n    sha256 {report['refit']['sha256']}\n" in text
    assert "pin it to use it: tasks: {label_model: {artifact: PATH, sha256: SHA256}}" in text


def test_a_refit_that_reads_the_outcomes_no_better_than_their_base_rate_is_not_offered(
    tmp_path: Path,
) -> None:
    from router.learning.labels import fromlog

    # The same conversations as above, with outcomes that have nothing to do with them: of the
    # eight tasks of each conversation length, every other one resolved.
    rows = [replace(r, success=int(r.task_id[1:]) // 10 % 2 == 0) if r.explicit else r for r in _logged(80)]
    report = fromlog.train(rows, default(), tmp_path / "noise.json")
    assert report["refit"]["cv"]["auc"] < 0.6
    text = "\n".join(fromlog.lines(report))
    assert (
        "not worth pinning: out of fold it tells resolved attempts from failed ones no better than chance"
        in text
    )
    assert "pin it to use it" not in text
    # A refit that reads them well is offered (above): the warning is not given for every refit.
    assert fromlog.train(_logged(80), default(), None)["refit"]["not_worth_pinning"] is None


def test_escalation_reads_the_attempts_stored_label_once() -> None:
    from router.features.task.context import LOW_P_SUCCESS, escalation
    from router.features.task.tracker import TaskState

    state = TaskState(attempt=2)
    assert escalation(0.5, state) is None  # no label yet
    state.last_label = (1, False, 0.2, SOURCE, ())
    assert escalation(0.5, state) is None  # an earlier attempt's
    state.last_label = (2, True, 0.7, SOURCE, ())
    assert escalation(0.5, state) is None and escalation(None, state) is None
    state.last_label = (2, False, 0.3, "tests", ())
    assert escalation(0.5, state) is None  # not the model's probability
    state.last_label = (2, False, 0.3, SOURCE, ())
    assert escalation(0.5, state) == LOW_P_SUCCESS
    assert escalation(0.5, state) is None  # once per attempt
    state.attempt, state.last_label = 3, (3, False, 0.3, SOURCE, ())
    assert escalation(0.5, state) == LOW_P_SUCCESS


def test_a_message_type_of_a_list_or_object_is_read_as_no_call() -> None:
    # Found fuzzing a real router: a chat message's "type" (no parser reads it) of a list was looked
    # up in a set, a TypeError, and the task's weak label was lost.
    plain = [
        {"role": "user", "content": "hi"},
        {"role": "user", "content": "x"},
        {"role": "user", "content": "ok"},
    ]
    odd = [plain[0], {"role": "user", "content": "x", "type": ["function_call"]}, plain[2]]
    assert features.of(odd) == features.of(plain)


# -- a runaway tool loop ---------------------------------------------------------------------------


def _looping(t: Trajectory, start: int, turns: int) -> Trajectory:
    """``t``'s opening messages, then the agent running ``ls`` ``turns`` times with the same output
    (the demo's fake provider answers every turn so; mini-swe-agent ran it 1,131 times)."""
    loop: list[dict[str, Any]] = []
    for _ in range(turns):
        loop.append({"role": "assistant", "content": "THOUGHT: Let me look around.\n\n```bash\nls\n```"})
        loop.append(
            {"role": "user", "content": "<returncode>0</returncode>\n<output>\nREADME.md\nsrc\n</output>"}
        )
    # The run's own last turn (the submission and what it printed) is asked for after the loop.
    return Trajectory(t.instance_id, False, [*t.messages[:start], *loop, *t.messages[-2:]])


@pytest.mark.parametrize("shape", ["text", "tools"])
def test_an_attempt_still_in_a_tool_loop_is_never_a_success(shape: str) -> None:
    t = load(TRAJECTORIES, limit=1)[0]
    # Six real turns, then 150 turns of `ls`: the model alone said success, P 0.986.
    turns = replay(_looping(t, 14, 150), shape, default())
    last = turns[-1].label
    assert not last.success and last.score == LOOPING_P and last.weight == round(abs(2 * LOOPING_P - 1), 6)
    assert last.details["model_p"] > 0.8 and signals.TOOL_LOOP in last.details["signals"]
    # Caught from the loop threshold's third repeat on, not at the first repeat of a call.
    loops = [u.label.score == LOOPING_P and not u.label.success for u in turns]
    first = loops.index(True)
    assert all(loops[first:]) and not any(loops[:first])
    assert first == 9  # request 7 is asked for the first `ls`; request 10 carries three of them
    # The agent leaving the loop (any other call) ends the cap: the label is the model's again.
    out = _looping(t, 14, 10)
    out.messages[-2:-2] = [
        {"role": "assistant", "content": "THOUGHT: Read it.\n\n```bash\ncat README.md\n```"},
        {"role": "user", "content": "<returncode>0</returncode>\n<output>\n# demo\n</output>"},
    ]
    after = replay(out, shape, default())[-1].label
    assert "model_p" not in after.details and after.score == after.details["p"]
    # Nor is the same call whose output changes stuck (a test run rerun while files change).
    moving = _looping(t, 14, 10)
    for i, m in enumerate(moving.messages[14:-2]):
        if m["role"] == "user":
            m["content"] = m["content"].replace("src", f"src\nbuild_{i}.log")
    assert all("model_p" not in u.label.details for u in replay(moving, shape, default()))


def test_a_real_run_that_never_loops_keeps_the_models_label() -> None:
    for t in load(TRAJECTORIES, limit=5):
        for u in replay(t, "text", default()):
            assert "model_p" not in u.label.details
            assert u.label.score == pytest.approx(default().p_success(u.label.details["features"]), abs=1e-5)
