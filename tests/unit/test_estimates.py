"""Per-backend estimates: provider tokens, output mean and 90th percentile, cached share; learned from the log."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from router.errors import ConfigError, ContextTooLarge
from router.features.request import Features
from router.learning.training.estimates import MIN_ROWS, as_estimates, fit_estimates
from router.policy.catalog import build_catalog
from router.policy.decide import Decider
from router.policy.estimates import BackendEstimates, Estimates, turn_cell, turn_of_cell
from router.policy.loading import parse_policy
from router.store import RequestRecord
from router.store.records import Estimate

POLICY = """
models:
  - {id: gem, litellm_model: gemini/g, protocol: openai, prices: {input: 2, output: 12, cache_read: 0.2},
     context_window: 20000, max_output_tokens: 8000}
  - {id: gpt, litellm_model: openai/o, protocol: openai, prices: {input: 1, output: 4, cache_read: 0.1},
     context_window: 20000, max_output_tokens: 8000}
routes:
  - {match: auto, candidates: [gem, gpt]}
"""


def decider(learned: dict[str, BackendEstimates] | None = None) -> Decider:
    policy = parse_policy(POLICY, source="t.yaml", env={})
    return Decider(policy, build_catalog(policy, lookup=lambda m: None), estimates=Estimates(learned))


def feats(prompt: int = 10_000, **kw: Any) -> Features:
    base: dict[str, Any] = dict(protocol="openai_chat", requested_model="auto", prompt_tokens=prompt,
                                max_output_tokens=None, tools=False, n_tools=0, thinking=False, vision=False,
                                stream=False, n_messages=3, prompt_anchor=0)  # fmt: skip
    base.update(kw)
    return Features(**base)


def test_an_o200k_estimate_is_counted_in_each_providers_tokens() -> None:
    d = decider().decide(feats(10_000))
    assert d.estimate("gem").prompt_tokens == 11_570  # type: ignore[union-attr]  # Gemini's prior 1.157
    assert d.estimate("gpt").prompt_tokens == 10_000  # type: ignore[union-attr]
    learned = decider({"gem": BackendEstimates(tokens_ratio=1.3)}).decide(feats(10_000))
    assert learned.estimate("gem").prompt_tokens == 13_000  # type: ignore[union-attr]


def test_an_estimate_of_unknown_units_is_taken_as_is() -> None:
    d = decider().decide(feats(10_000, prompt_anchor=None))
    assert [e.prompt_tokens for e in d.candidates] == [10_000, 10_000]


def test_an_anchor_stays_in_its_providers_tokens_and_converts_for_another() -> None:
    # 9,000 tokens as gem's provider counted them (with the estimate of the tail after), 1,000 o200k.
    f = feats(10_000, prompt_anchor=9_000, anchor_model="gem")
    d = decider().decide(f)
    assert d.estimate("gem").prompt_tokens == 9_000 + 1_157  # type: ignore[union-attr]
    assert d.estimate("gpt").prompt_tokens == round(9_000 / 1.157) + 1_000  # type: ignore[union-attr]


def test_the_window_is_checked_in_the_backends_own_tokens() -> None:
    # 16,000 o200k tokens + the 4,096 reserve fit gpt's 20k window; in Gemini's tokens they do not.
    d = decider().decide(feats(15_000))
    assert d.estimate("gem").excluded is not None and d.estimate("gem").excluded.startswith("context")  # type: ignore[union-attr]
    assert d.estimate("gpt").excluded is None  # type: ignore[union-attr]


def test_learned_output_mean_prices_a_call_and_its_90th_percentile_is_held_and_reserved() -> None:
    d = decider({"gpt": BackendEstimates(output_mean=300, output_p90=2_000)})
    e = d.decide(feats(1_000)).estimate("gpt")
    assert e is not None and e.output_tokens == 300
    assert e.cost_usd == pytest.approx((1_000 * 1 + 300 * 4) / 1e6)
    assert e.hold_usd == pytest.approx((1_000 * 1 + 2_000 * 4) / 1e6)
    # The window leaves room for the 90th percentile where it is above the policy's 4,096.
    wide = decider({"gpt": BackendEstimates(output_p90=6_000)})
    with pytest.raises(ContextTooLarge, match=r"gpt: context: ~15000 prompt \+ 6000 output"):
        wide.decide(feats(15_000))
    assert decider().decide(feats(15_000)).estimate("gpt").excluded is None  # type: ignore[union-attr]
    # Nothing learned: the policy's default output, and the hold is the expected cost.
    plain = decider().decide(feats(1_000)).estimate("gpt")
    assert plain is not None and plain.output_tokens == 1024 and plain.hold_usd == plain.cost_usd


def test_a_short_learned_90th_percentile_never_shrinks_the_windows_reserve() -> None:
    """After the demo's log the learned 90th percentile was 8 tokens, and the window left room
    for those 8 only: a 19,900-token prompt was kept for a 20k window, which a server that gives
    a call with no limit its own (DeepSeek's 4,096: 'maximum context length is 131072 tokens.
    However, you requested 131329 tokens (123137 in the messages, 8192 in the completion)')
    refuses. The policy's reserve_output_tokens is the least room left."""
    short = decider({"gpt": BackendEstimates(output_mean=5, output_p90=8)})
    with pytest.raises(ContextTooLarge, match=r"gpt: context: ~19900 prompt \+ 4096 output"):
        short.decide(feats(19_900))
    assert short.decide(feats(15_000)).chosen == "gpt"
    # A client's own limit is what the call carries: that room, not the reserve, is left.
    assert short.decide(feats(19_900, max_output_tokens=50)).chosen == "gpt"


def test_a_warm_prompt_is_cached_in_whole_blocks_at_the_learned_share() -> None:
    f = feats(10_000, warm_model="gpt", warm_tokens=9_000)
    # OpenAI caches in 128-token blocks: 70 whole blocks of the 9,000 warm tokens, all of them before data.
    prior = decider().decide(f).estimate("gpt")
    assert prior is not None and prior.cached_tokens == prior.cacheable_tokens == 8_960
    learned = decider({"gpt": BackendEstimates(cache_share=0.8)}).decide(f).estimate("gpt")
    assert (
        learned is not None
        and learned.cached_tokens == round(8_960 * 0.8)
        and learned.cacheable_tokens == 8_960
    )
    # Gemini's blocks are ~2k: a warm prefix under one block has nothing to cache.
    gem = decider().decide(feats(1_500, warm_model="gem", warm_tokens=1_900)).estimate("gem")
    assert gem is not None and gem.cached_tokens == 0 and gem.cacheable_tokens is None
    assert (
        decider().decide(feats(9_000, warm_model="gem", warm_tokens=4_500)).estimate("gem").cached_tokens
        == 4_096
    )  # type: ignore[union-attr]


def row(task: str, ts: float, **kw: Any) -> RequestRecord:
    base: dict[str, Any] = {"status": 200, "chosen_model": "gem", "input_tokens": 1_000, "output_tokens": 100,
                            "cache_read_tokens": 0, "prompt_tokens_est": 1_000,
                            "candidates": [Estimate("gem", 1_000, 100, 0, 0.0)], **kw}  # fmt: skip
    return RequestRecord(f"{task}@{ts}", ts, task_id=task, **base)


def test_fit_from_the_log() -> None:
    rows = []
    for i in range(MIN_ROWS):
        # A task's first call: estimated without an anchor, 1.2x as the provider counted it.
        rows.append(row(f"t{i}", 1.0, input_tokens=1_200, output_tokens=100 + i, prompt_tokens_est=1_000))
        # Its next: 80 % of the warm prefix's blocks reported cached; its estimate says nothing of the ratio.
        rows.append(row(f"t{i}", 2.0, input_tokens=4_000, output_tokens=100 + i, cache_read_tokens=1_600,
                        prompt_tokens_est=4_000, candidates=[Estimate("gem", 4_000, 100, 1_500, 0.0,
                                                                       cacheable_tokens=2_000)]))  # fmt: skip
    rows.append(row("side", 0.5, side_call=True, output_tokens=10_000))  # side calls and failures say nothing
    rows.append(row("t0", 0.1, status=502, input_tokens=9_999))
    fitted = fit_estimates(rows)["gem"]
    assert fitted["tokens_ratio"] == 1.2 and fitted["cache_share"] == 0.8
    typed = as_estimates(fit_estimates(rows)).of("gem")
    assert (typed.tokens_ratio, typed.cache_share, typed.output_mean, typed.n) == (
        1.2, 0.8, fitted["output_mean"], fitted["n"]
    )  # fmt: skip
    assert fitted["output_mean"] == pytest.approx(100 + (MIN_ROWS - 1) / 2)
    assert fitted["output_p90"] == 100 + MIN_ROWS * 9 // 10 - 1
    # Too few tasks for a ratio or a cache share (19 each): their priors stay.
    assert set(fit_estimates(rows[: 2 * MIN_ROWS - 2])["gem"]) == {"output_mean", "output_p90", "n"}
    assert fit_estimates(rows[: MIN_ROWS - 1]) == {}


def test_the_artifacts_estimates_are_validated() -> None:
    import orjson

    from router.features.task.vector import schema
    from router.policy.artifact import FORMAT, Artifact

    def read(block: object) -> Estimates:
        raw = orjson.dumps({"format": FORMAT, "feature_schema": schema(), "estimates": block})
        return Artifact.from_json(raw, source="a.json").estimates

    e = read({"gem": {"tokens_ratio": 1.1, "output_mean": 250.0}})
    assert e.tokens_ratio("gem", "gemini") == 1.1 and e.tokens_ratio("other", "anthropic") == 1.2
    with pytest.raises(ConfigError, match=r"a.json: estimates.gem.cache_share"):
        read({"gem": {"cache_share": 1.5}})
    with pytest.raises(ConfigError, match="estimates: expected"):
        read([1])


def test_turn_chars_reads_what_the_model_answers_and_its_last_turn() -> None:
    from router.features.request import turn_chars

    assert turn_chars([{"role": "system", "content": "s"}, {"role": "user", "content": "fix it"}]) == (
        7,
        None,
    )
    chat = [
        {"role": "user", "content": "fix it"},
        {"role": "assistant", "content": "ok", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": '{"cmd": "ls"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "a.py\nb.py"},
        {"role": "tool", "tool_call_id": "c2", "content": "done"},
    ]  # fmt: skip
    new, reply = turn_chars(chat)
    assert new == len("a.py\nb.py") + len("done")
    assert reply is not None and reply > len("ok")  # the tool call's arguments are part of the turn
    # Responses items: a function call is the model's turn, its output what it answers.
    items = [{"type": "function_call", "name": "bash", "arguments": "{}", "call_id": "c"},
             {"type": "function_call_output", "call_id": "c", "output": "x" * 100}]  # fmt: skip
    assert turn_chars(items)[0] >= 100 and turn_chars(items)[1] is not None


def test_the_output_of_a_call_is_its_turn_cells_mean_where_learned() -> None:
    short, long = (40, 200), (20_000, 200)
    cell = turn_cell(short)
    d = decider({"gpt": BackendEstimates(output_mean=300, output_cells={cell: 50.0})})  # type: ignore[dict-item]
    e = d.decide(feats(1_000, turn_chars=short)).estimate("gpt")
    assert e is not None and e.output_tokens == 50 and e.output_cell == cell
    assert e.cost_usd == pytest.approx((1_000 * 1 + 50 * 4) / 1e6)
    # A cell the log had too few calls of, or a request whose turn was not measured: the backend's mean.
    assert d.decide(feats(1_000, turn_chars=long)).estimate("gpt").output_tokens == 300  # type: ignore[union-attr]
    plain = d.decide(feats(1_000)).estimate("gpt")
    assert plain is not None and plain.output_tokens == 300 and plain.output_cell is None


def test_turn_cells_are_learned_from_the_logged_cell_and_round_trip_the_artifact() -> None:
    import orjson

    from router.features.task.vector import schema
    from router.policy.artifact import FORMAT, Artifact

    rows = [row(f"t{i}", 1.0, output_tokens=40, candidates=[Estimate("gem", 0, 0, 0, 0.0, output_cell="6:8")])
            for i in range(MIN_ROWS)]  # fmt: skip
    rows += [row(f"u{i}", 1.0, output_tokens=900, candidates=[Estimate("gem", 0, 0, 0, 0.0, output_cell="15:8")])
             for i in range(MIN_ROWS - 1)]  # fmt: skip
    fitted = fit_estimates(rows)["gem"]
    # A cell of MIN_ROWS calls has its mean; one call short, it is priced at the backend's mean.
    assert fitted["output_cells"] == {"6:8": 40.0}
    assert fitted["output_mean"] == pytest.approx(
        (40 * MIN_ROWS + 900 * (MIN_ROWS - 1)) / (2 * MIN_ROWS - 1), abs=0.01
    )
    est = as_estimates({"gem": fitted})
    raw = orjson.dumps({"format": FORMAT, "feature_schema": schema(),
                        "estimates": {"gem": {"output_mean": 300.0, "output_cells": {"6:8": 40.0}}}})  # fmt: skip
    read = Artifact.from_json(raw, source="a.json").estimates
    assert read.output_mean("gem", "6:8") == 40.0 and read.output_mean("gem", "15:8") == 300.0
    assert est.output_mean("gem", "6:8") == 40.0
    with pytest.raises(ConfigError, match=r"estimates.gem.output_cells.6:8"):
        Artifact.from_json(orjson.dumps({"format": FORMAT, "feature_schema": schema(),
                                         "estimates": {"gem": {"output_cells": {"6:8": -1}}}}), source="a.json")  # fmt: skip


def test_the_pipeline_tells_the_decision_the_turns_shape() -> None:
    import orjson

    from router.policy.pipeline import request_features
    from router.protocols import WIRES
    from router.protocols.common import OPENAI_CHAT

    body = {"model": "auto", "messages": [{"role": "user", "content": "fix it"},
                                          {"role": "assistant", "content": "I will look."},
                                          {"role": "user", "content": "x" * 3_000}]}  # fmt: skip
    req = WIRES[OPENAI_CHAT].parse(orjson.dumps(body))
    f = request_features(req, 1_000, {})
    assert f.turn_chars == (3_000, len("I will look."))
    d = decider({"gpt": BackendEstimates(output_mean=300, output_cells={turn_cell(f.turn_chars): 900.0})})  # type: ignore[dict-item]
    e = d.decide(replace(f, prompt_anchor=0)).estimate("gpt")
    assert e is not None and e.output_tokens == 900 and e.output_cell == turn_cell((3_000, 12))
    assert f.turn_verb is None  # the last turn ran nothing
    body["messages"][1]["content"] = "I will look.\n```bash\nls -la\n```"
    assert request_features(WIRES[OPENAI_CHAT].parse(orjson.dumps(body)), 1_000, {}).turn_verb == "ls"


def test_turn_verb_reads_the_program_the_models_last_turn_ran_in_each_shape() -> None:
    from router.features.request import turn_verb

    text = [{"role": "user", "content": "fix it"},
            {"role": "assistant", "content": "THOUGHT: run it.\n\n```bash\nPYTHONPATH=. /usr/bin/python3 -m pytest\n```"},
            {"role": "user", "content": "<returncode>0</returncode>"}]  # fmt: skip
    assert turn_verb(text) == "python3"  # the assignment skipped, the path's program
    chat = [{"role": "assistant", "content": None, "tool_calls": [{"id": "c", "type": "function", "function": {
                "name": "bash", "arguments": '{"command": "sed -n 1,20p a.py"}'}}]},
            {"role": "tool", "tool_call_id": "c", "content": "x"}]  # fmt: skip
    assert turn_verb(chat) == "sed"
    # A command that carries a whole file is read from its start (not parsed to its end).
    heredoc = '{"command": "cat <<\'EOF\' > a.py\\n' + "x = 1\\n" * 10_000 + 'EOF"}'
    chat[0]["tool_calls"][0]["function"]["arguments"] = heredoc  # type: ignore[index]
    assert turn_verb(chat) == "cat"
    messages = [{"role": "assistant", "content": [{"type": "text", "text": "Reading."},
                 {"type": "tool_use", "id": "t", "name": "Read", "input": {"file_path": "a.py"}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "x"}]}]  # fmt: skip
    assert turn_verb(messages) == "Read"  # no command: the tool's name
    items = [{"type": "function_call", "name": "shell", "arguments": '{"command": ["bash", "-lc", "grep -rn x ."]}',
              "call_id": "c"}, {"type": "function_call_output", "call_id": "c", "output": "x"}]  # fmt: skip
    assert turn_verb(items) == "grep"

    # Nothing run, no turn yet, or a word that is no program's name (it would key the table and the log).
    def answered(said: str) -> list[dict[str, str]]:
        return [{"role": "assistant", "content": said}, {"role": "user", "content": "ok"}]

    assert turn_verb(answered("Done.")) is None
    assert turn_verb([{"role": "user", "content": "```bash\nls\n```"}]) is None
    assert turn_verb(answered("```bash\nécho:x\n```")) is None


def test_a_verbs_cell_falls_back_to_its_shapes_then_to_the_backends_mean() -> None:
    from router.policy.estimates import parent_cell

    shape = turn_cell((40, 200))
    assert shape == "6:8" and turn_cell((40, 200), "sed") == "6:8:sed" and parent_cell("6:8:sed") == "6:8"
    assert parent_cell("6:8") is None and parent_cell("6:-") is None
    d = decider({"gpt": BackendEstimates(output_mean=300, output_cells={"6:8:sed": 900.0, "6:8": 50.0})})  # type: ignore[dict-item]

    def estimate(new: int, verb: str | None) -> Estimate:
        e = d.decide(feats(1_000, turn_chars=(new, 200), turn_verb=verb)).estimate("gpt")
        assert e is not None
        return e

    assert [estimate(40, v).output_tokens for v in ("sed", "cat", None)] == [900, 50, 50]
    assert estimate(40, "cat").output_cell == "6:8:cat"  # logged as it is: the log learns it
    assert estimate(20_000, "sed").output_tokens == 300  # neither the verb's cell nor the shape's: the mean


def test_a_shapes_cell_is_learned_from_its_verbs_cells_together() -> None:
    def logged(i: int, cell: str, out: int) -> RequestRecord:
        said = [Estimate("gem", 0, 0, 0, 0.0, output_cell=cell)]
        return row(f"t{cell}{i}", 1.0, output_tokens=out, candidates=said)

    rows = [logged(i, "6:8:sed", 900) for i in range(MIN_ROWS)]
    rows += [logged(i, "6:8:cat", 100) for i in range(MIN_ROWS - 1)] + [logged(0, "6:8", 100)]
    cells = fit_estimates(rows)["gem"]["output_cells"]
    # sed has its calls' mean; cat, one call short, is priced at its shape's: all 2 * MIN_ROWS calls of 6:8.
    assert cells == {"6:8:sed": 900.0, "6:8": 500.0}


def test_cache_cell_reads_how_far_the_last_reported_cache_is_behind_the_warm_blocks() -> None:
    from router.policy.estimates import cache_cell

    # Gemini's 2,048-token blocks: 5 warm blocks; the last call had all but one of them cached.
    assert cache_cell("gemini", 5 * 2048, 4 * 2048 - 20) == "1:1"
    assert cache_cell("gemini", 5 * 2048, 0) == "5:1"  # the last call missed
    # Far behind is capped at 6 blocks; 8 blocks or more is the top size.
    assert cache_cell("gemini", 20 * 2048, 0) == "6:2"
    assert cache_cell("gemini", 2 * 2048, 3 * 2048) == "-1:0"  # more was cached than is warm now
    # Nothing warm to cache, or no count from the provider: no cell (the backend's share applies).
    assert cache_cell("gemini", 0, 0) is None and cache_cell("gemini", 4096, None) is None


def test_the_cached_share_is_the_cache_cells_where_learned() -> None:
    f = feats(10_000, warm_model="gem", warm_tokens=9_000)
    d = decider({"gem": BackendEstimates(cache_share=0.9, cache_cells={"0:1": 1.0, "4:1": 0.5})})
    # 4 whole blocks of 2,048 are warm; the last call had them all cached (gap 0), or none (gap 4).
    after_hit = d.decide(replace(f, warm_cached=8_192)).estimate("gem")
    after_miss = d.decide(replace(f, warm_cached=0)).estimate("gem")
    assert after_hit is not None and after_hit.cache_cell == "0:1" and after_hit.cached_tokens == 8_192
    assert after_miss is not None and after_miss.cache_cell == "4:1" and after_miss.cached_tokens == 4_096
    assert after_miss.cost_usd > after_hit.cost_usd
    # A cell too rare to be learned, or no count of the last call: the backend's share.
    assert d.decide(replace(f, warm_cached=6_144)).estimate("gem").cached_tokens == round(8_192 * 0.9)  # type: ignore[union-attr]
    unknown = d.decide(f).estimate("gem")
    assert unknown is not None and unknown.cache_cell is None and unknown.cached_tokens == round(8_192 * 0.9)


def test_cache_cells_are_learned_from_the_logged_cell_and_round_trip_the_artifact() -> None:
    import orjson

    from router.features.task.vector import schema
    from router.policy.artifact import FORMAT, Artifact

    def logged(i: int, cell: str, cached: int) -> RequestRecord:
        said = [Estimate("gem", 10_000, 100, 0, 0.0, cacheable_tokens=8_192, cache_cell=cell)]
        return row(f"t{cell}{i}", 1.0, input_tokens=10_000, cache_read_tokens=cached, candidates=said)

    rows = [logged(i, "0:1", 8_192) for i in range(MIN_ROWS)]
    rows += [logged(i, "4:1", 0) for i in range(MIN_ROWS - 1)]
    fitted = fit_estimates(rows)["gem"]
    # A cell of MIN_ROWS calls has its share; one call short, the backend's share (of all the calls) prices it.
    assert fitted["cache_cells"] == {"0:1": 1.0}
    assert fitted["cache_share"] == pytest.approx(MIN_ROWS / (2 * MIN_ROWS - 1), abs=1e-4)
    assert as_estimates({"gem": fitted}).cache_share("gem", "0:1") == 1.0
    raw = orjson.dumps({"format": FORMAT, "feature_schema": schema(),
                        "estimates": {"gem": {"cache_share": 0.9, "cache_cells": {"4:1": 0.5}}}})  # fmt: skip
    read = Artifact.from_json(raw, source="a.json").estimates
    assert read.cache_share("gem", "4:1") == 0.5 and read.cache_share("gem", "0:1") == 0.9
    with pytest.raises(ConfigError, match=r"estimates.gem.cache_cells.4:1"):
        Artifact.from_json(orjson.dumps({"format": FORMAT, "feature_schema": schema(),
                                         "estimates": {"gem": {"cache_cells": {"4:1": 1.5}}}}), source="a.json")  # fmt: skip


def test_the_control_arm_prices_a_call_with_the_running_policys_learned_estimates(tmp_path: Path) -> None:
    """The arms differ in what they choose, not in what a call costs: a control arm priced on the
    priors held the flat output default (~3.6x a real call), met budgets first, and ranked its
    route's candidates by it."""
    import hashlib

    import orjson
    import yaml

    from router.features.task.vector import schema
    from router.policy.active import load_active_policy
    from router.policy.artifact import FORMAT
    from router.rollout.preview import preview

    # gem writes short replies, gpt long ones: learned, gem is the cheaper call; on priors, gpt.
    learned = {"gem": {"output_mean": 10.0}, "gpt": {"output_mean": 2_000.0, "output_p90": 4_000.0}}
    art = orjson.dumps({"format": FORMAT, "feature_schema": schema(), "estimates": learned})
    (tmp_path / "a.json").write_bytes(art)
    doc = yaml.safe_load(POLICY) | {
        "learned": {"artifact": "a.json", "sha256": hashlib.sha256(art).hexdigest()},
        "control": {"share": 0.999, "route": {"candidates": ["gem", "gpt"]}},
    }
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(doc))
    rt = load_active_policy(tmp_path / "p.yaml")
    arm, control = rt.arm_for("t1", None)
    assert arm == "control"
    f = feats(1_000)
    treated, held = rt.decider.decide(f).estimate("gpt"), control.decide(f)
    assert treated is not None and held.estimate("gpt") == treated
    assert held.chosen == "gem"
    # The preview decides the arm again with the same numbers: the logged choice stands.
    logged = row("t1", 1.0, decision_id="d1", requested_model="auto", protocol="openai_chat")
    assert preview([logged], [], rt)["moves"] == {}


def test_the_preview_prices_a_logged_call_in_its_turn_cell(tmp_path: Path) -> None:
    """The preview rebuilt a logged request without its turn's shape and program, so it priced
    each backend at its overall mean where serving had used the turn's cell: here it moved a
    decision serving would make again (gpt after a ``sed``, whose replies gem writes long)."""
    import hashlib

    import orjson
    import yaml

    from router.features.task.vector import schema
    from router.policy.active import load_active_policy
    from router.policy.artifact import FORMAT
    from router.rollout.preview import features_of, preview

    cell = "12:9:sed"
    assert turn_cell(*turn_of_cell(cell)) == cell
    assert turn_cell(*turn_of_cell("3:-")) == "3:-" and turn_of_cell(None) == (None, None)
    learned = {"gem": {"output_mean": 10.0, "output_cells": {cell: 3_000.0}},
               "gpt": {"output_mean": 2_000.0, "output_cells": {cell: 50.0}}}  # fmt: skip
    art = orjson.dumps({"format": FORMAT, "feature_schema": schema(), "estimates": learned})
    (tmp_path / "a.json").write_bytes(art)
    doc = yaml.safe_load(POLICY) | {
        "learned": {"artifact": "a.json", "sha256": hashlib.sha256(art).hexdigest()}
    }
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(doc))
    rt = load_active_policy(tmp_path / "p.yaml")
    served = rt.decider.decide(feats(1_000, turn_chars=(2_048, 256), turn_verb="sed"))
    assert served.chosen == "gpt" and served.estimate("gpt").output_cell == cell  # type: ignore[union-attr]
    logged = row("t1", 1.0, decision_id="d1", requested_model="auto", protocol="openai_chat",
                  chosen_model="gpt", candidates=served.candidates)  # fmt: skip
    f = features_of(logged, None)
    assert turn_cell(f.turn_chars, f.turn_verb) == cell
    assert preview([logged], [], rt)["moves"] == {}
