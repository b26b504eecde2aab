"""Prompt size on the request path: known counts, estimates within hard bounds, exact once settled."""

from __future__ import annotations

import base64
import itertools
import random
from typing import Any

import orjson
import pytest

from router.features.memo import ConversationMemo
from router.features.promptsize import PromptSizer
from router.features.tokens import TokenCounter
from router.protocols import anthropic, openai_chat, responses
from router.protocols.common import ClientRequest


@pytest.fixture(scope="module")
def encoding() -> Any:
    return TokenCounter().encoding


def sizer(encoding: Any, memory: int = 10_000_000) -> PromptSizer:
    return PromptSizer(TokenCounter(encoding=encoding), ConversationMemo(memory))


def exact(req: ClientRequest, encoding: Any) -> int:
    return TokenCounter(encoding=encoding).count_request(req)


TOOLS = [{"type": "function", "function": {"name": "read_file", "parameters": {"type": "object"}}}]


def chat_req(messages: list[dict[str, Any]]) -> ClientRequest:
    return openai_chat.parse(orjson.dumps({"model": "auto", "messages": messages, "tools": TOOLS}))


def conversation(turns: int) -> list[dict[str, Any]]:
    msgs: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent. " * 20},
        {"role": "user", "content": "Fix the failing test in parser.py"},
    ]
    for i in range(turns):
        msgs += tool_turn(i)
    return msgs


def tool_turn(i: int, result: str | None = None) -> list[dict[str, Any]]:
    call = {
        "id": f"c{i}",
        "type": "function",
        "function": {"name": "read_file", "arguments": f'{{"path": "f{i}.py"}}'},
    }
    return [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": f"c{i}", "content": result or f"def f{i}():\n    return {i}\n" * 30},
    ]


def test_a_settled_size_is_the_exact_count(encoding: Any) -> None:
    s = sizer(encoding)
    req = chat_req(conversation(5))
    size = s.measure(req, "t", 10_000)
    assert not size.settled and size.low <= size.tokens <= size.high
    assert s.settle(size) == exact(req, encoding) == size.tokens == size.low == size.high
    assert size.settled


def test_the_next_turn_estimates_only_its_new_messages(encoding: Any) -> None:
    s = sizer(encoding)
    s.settle(s.measure(chat_req(conversation(5)), "t", 10_000))
    nxt = chat_req(conversation(5) + tool_turn(5))
    size = s.measure(nxt, "t", 10_000)
    assert sorted(u.slot for u in size.pending) == [len(nxt.messages) - 2, len(nxt.messages) - 1]
    assert size.low <= exact(nxt, encoding) <= size.high
    assert s.settle(size) == exact(nxt, encoding)
    again = s.measure(chat_req(conversation(5) + tool_turn(5) + tool_turn(6)), "t", 10_000)
    assert len(again.pending) == 2


def test_counts_reach_the_token_counter_cache_too(encoding: Any) -> None:
    s = sizer(encoding)
    req = chat_req(conversation(3))
    s.settle(s.measure(req, "t", 10_000))
    # Another conversation key (no memo), same counter: every part is known from its cache.
    other = PromptSizer(s.counter, ConversationMemo(10_000_000)).measure(
        chat_req(conversation(3)), "u", 10_000
    )
    assert other.settled and other.tokens == exact(req, encoding)


def test_without_memory_or_key_everything_unknown_is_estimated(encoding: Any) -> None:
    for s, key in ((sizer(encoding, memory=0), "t"), (sizer(encoding), None)):
        req = chat_req(conversation(2))
        size = s.measure(req, key, 10_000)
        assert len(size.pending) == len(req.messages) + 1  # the tools too
        assert s.settle(size) == exact(req, encoding)


def test_a_resent_request_is_reported(encoding: Any) -> None:
    s = sizer(encoding)
    assert not s.measure(chat_req(conversation(2)), "t", 10_000).repeat
    assert s.measure(chat_req(conversation(2)), "t", 10_000).repeat
    assert not s.measure(chat_req(conversation(2) + tool_turn(2)), "t", 10_000).repeat
    assert not s.measure(chat_req(conversation(2)), "other", 10_000).repeat


def _adversarial() -> list[str]:
    rng = random.Random(7)
    return [
        "漢字かな交じり文、中文标点。" * 200,
        "🙂👍🏽🏳️‍🌈" * 300,
        base64.b64encode(rng.randbytes(6_000)).decode(),
        "".join(chr(rng.randrange(0x20, 0x2FFF)) for _ in range(5_000)),
        "a" * 20_000,
        " \n\t" * 3_000,
        "e\u0301\u0302\u0303" * 2_000,  # combining marks: one letter, many code points
        "",
    ]


@pytest.mark.parametrize("text", _adversarial(), ids=lambda t: repr(t[:8]))
def test_an_estimate_never_leaves_its_bounds(encoding: Any, text: str) -> None:
    s = sizer(encoding)
    s.settle(s.measure(chat_req(conversation(1)), "t", 10_000))
    req = chat_req(conversation(1) + tool_turn(1, result=text or " "))
    size = s.measure(req, "t", 10_000)
    true = exact(req, encoding)
    assert size.low <= size.tokens <= size.high
    assert size.low <= true <= size.high
    assert s.settle(size) == true


def anthropic_req(n: int) -> ClientRequest:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Fix the bug"}]
    for i in range(n):
        messages.append({"role": "assistant", "content": [
            {"type": "text", "text": "Reading."},
            {"type": "tool_use", "id": f"tu{i}", "name": "Read", "input": {"path": f"f{i}.py"}},
        ]})  # fmt: skip
        messages.append({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": f"tu{i}", "content": f"line {i}\n" * 50},
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}},
        ]})  # fmt: skip
    messages[-1]["content"][-1]["cache_control"] = {"type": "ephemeral"}
    body = {
        "model": "auto", "max_tokens": 1000, "messages": messages,
        "system": [{"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}}],
        "tools": [{"name": "Read", "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}}}],
    }  # fmt: skip
    return anthropic.parse(orjson.dumps(body))


def test_anthropic_conversation_with_a_moving_cache_marker(encoding: Any) -> None:
    s = sizer(encoding)
    first = anthropic_req(3)
    assert s.settle(s.measure(first, "t", 10_000)) == exact(first, encoding)
    nxt = anthropic_req(4)
    size = s.measure(nxt, "t", 10_000)
    # The previously last message lost its marker: still known. System and tools are known.
    assert sorted(u.slot for u in size.pending) == [len(nxt.messages) - 2, len(nxt.messages) - 1]
    assert size.low <= exact(nxt, encoding) <= size.high
    assert s.settle(size) == exact(nxt, encoding)


def test_responses_instructions_and_string_input(encoding: Any) -> None:
    s = sizer(encoding)
    body = {"model": "auto", "instructions": "Be brief.", "input": "What is 2 + 2?", "tools": [
        {"type": "function", "name": "calc", "parameters": {"type": "object"}}]}  # fmt: skip
    req = responses.parse(orjson.dumps(body))
    size = s.measure(req, "t", 1_000)
    assert {u.slot for u in size.pending} == {0, -1, -2}  # the input item, instructions, tools
    assert s.settle(size) == exact(req, encoding)
    assert s.measure(responses.parse(orjson.dumps(body)), "t", 1_000).settled


def test_the_chars_per_token_ratio_is_learned_from_exact_counts(encoding: Any) -> None:
    s = sizer(encoding)
    before = s.chars_per_token
    cjk = "漢字かな交じり文、中文标点。" * 2_000  # about one character per token, far from the default
    s.settle(s.measure(chat_req([{"role": "user", "content": cjk}]), "t", 10_000))
    assert s.chars_per_token < before


def test_what_readers_made_of_a_message_is_kept_for_the_next_turn(encoding: Any) -> None:
    s = sizer(encoding)
    first = s.measure(chat_req(conversation(3)), "t", 10_000)
    assert first.facts is not None and set(first.facts) == {None}
    first.facts[3] = ["what the signals read"]
    req = chat_req(conversation(3) + tool_turn(3))
    nxt = s.measure(req, "t", 10_000)
    assert nxt.facts is not None and len(nxt.facts) == len(req.messages)
    assert nxt.facts[3] == ["what the signals read"] and nxt.facts[-2:] == [None, None]
    edited = conversation(3)
    edited[2]["content"] = "another task"
    assert set(s.measure(chat_req(edited), "t", 10_000).facts or ()) == {None}


# The provider's reported count of a served request anchors the conversation's next turn.

REPORTED = 5_000  # deliberately far from the tiktoken count: the anchor is the provider's word


def new_messages_exactly(req: ClientRequest, k: int, encoding: Any) -> int:
    counter = TokenCounter(encoding=encoding)
    return sum(counter.count_item(m) for m in req.messages[k:])


def test_the_next_turn_starts_from_the_providers_count_of_the_last(encoding: Any) -> None:
    s = sizer(encoding)
    first = chat_req(conversation(5))
    s.reported(s.measure(first, "t", 10_000), REPORTED)
    assert s.counter.cache_size == 0  # nothing was tokenized
    nxt = chat_req(conversation(5) + tool_turn(5))
    size = s.measure(nxt, "t", 10_000)
    k = len(first.messages)
    assert size.anchored and size.exact == REPORTED
    assert sorted(u.slot for u in size.pending) == [k, k + 1]  # only the new messages
    assert REPORTED < size.low <= size.tokens <= size.high
    # Counted exactly (a limit near), the anchor stays and only the new messages are tokenized.
    assert s.settle(size) == REPORTED + new_messages_exactly(nxt, k, encoding)
    # The same request again is exactly what the provider said.
    s.reported(s.measure(first, "u", 10_000), REPORTED)
    again = s.measure(first, "u", 10_000)
    assert again.settled and again.tokens == again.low == again.high == REPORTED


def test_a_turn_without_a_count_keeps_the_anchor_for_the_next(encoding: Any) -> None:
    s = sizer(encoding)
    first = chat_req(conversation(2))
    s.reported(s.measure(first, "t", 10_000), REPORTED)
    s.measure(chat_req(conversation(2) + tool_turn(2)), "t", 10_000)  # failed: no usage reported
    size = s.measure(chat_req(conversation(2) + tool_turn(2) + tool_turn(3)), "t", 10_000)
    k = len(first.messages)
    assert size.anchored and size.exact == REPORTED
    assert sorted(u.slot for u in size.pending) == [k, k + 1, k + 2, k + 3]


@pytest.mark.parametrize("change", ["tools", "edit", "other task"])
def test_the_anchor_is_not_used_for_another_prompt(encoding: Any, change: str) -> None:
    s = sizer(encoding)
    s.reported(s.measure(chat_req(conversation(3)), "t", 10_000), REPORTED)
    msgs = conversation(3) + tool_turn(3)
    key = "t"
    if change == "edit":
        msgs[1] = {"role": "user", "content": "Another task"}
    elif change == "other task":
        key = "u"
    req = chat_req(msgs)
    if change == "tools":
        req = openai_chat.parse(orjson.dumps({"model": "auto", "messages": msgs}))
    size = s.measure(req, key, 10_000)
    assert not size.anchored
    assert s.settle(size) == exact(req, encoding)


def test_each_backends_chars_per_token_is_learned_from_its_providers_counts(encoding: Any) -> None:
    s = sizer(encoding)
    s.reported(s.measure(chat_req(conversation(1)), "t", 10_000), REPORTED, "gemini", 1.157)
    o200k, before = s.chars_per_token, s.provider_chars_per_token("gemini")
    big = "x" * 40_000
    size = s.measure(chat_req(conversation(1) + tool_turn(1, result=big)), "t", 10_000)
    assert size.anchor_model == "gemini" and size.provider_tokens == size.tokens
    # The provider counted one token per character of the new text (and the fixed overheads).
    fixed = sum(u.fixed for u in size.pending)
    s.reported(size, REPORTED + fixed + size.pending_chars, "gemini", 1.157)
    assert s.provider_chars_per_token("gemini") < before
    # Neither the o200k rate nor another backend's learns from this provider's counts.
    assert s.chars_per_token == o200k and s.provider_chars_per_token("other") == o200k
    # The next tail of the conversation is estimated at the rate this backend taught.
    nxt = s.measure(
        chat_req(conversation(1) + tool_turn(1, result=big) + tool_turn(2, result=big)), "t", 10_000
    )
    assert nxt.anchored and nxt.tokens - nxt.exact > 0.8 * len(big)


def test_a_count_by_another_backend_teaches_no_rate(encoding: Any) -> None:
    s = sizer(encoding)
    s.reported(s.measure(chat_req(conversation(1)), "t", 10_000), REPORTED, "gemini", 1.157)
    size = s.measure(chat_req(conversation(1) + tool_turn(1, result="x" * 40_000)), "t", 10_000)
    s.reported(size, REPORTED + 40_000, "gpt", 1.0)  # switched: the anchor was in another provider's tokens
    assert s.provider_chars_per_token("gpt") == s.provider_chars_per_token("gemini") == s.chars_per_token


def test_a_backends_tails_are_sampled_less_often_once_counted_enough(encoding: Any) -> None:
    from router.features.promptsize import TAIL_SAMPLE, TAIL_SAMPLE_SETTLED

    s = sizer(encoding)
    msgs = conversation(1)
    s.reported(s.measure(chat_req(msgs), "t", 10_000), REPORTED, "gemini", 1.1)
    total, sampled, ratios = REPORTED, [], []
    for i in range(2, 2 + 16 * TAIL_SAMPLE + 3 * TAIL_SAMPLE_SETTLED):
        msgs = msgs + tool_turn(i, result=f"line {i} of a long file\n" * 1200)  # ~8,400 o200k tokens
        size = s.measure(chat_req(msgs), "t", 10_000)
        total += 9_000
        if s.reported(size, total, "gemini", 1.1):
            sampled.append(i)
            s.learn_tail(size, total, "gemini")
            ratios.append(s.tail_ratio("gemini"))
    gaps = [b - a for a, b in itertools.pairwise(sampled)]
    # One in TAIL_SAMPLE until ~100k tokens of tails are counted (12 samples here), then one in
    # TAIL_SAMPLE_SETTLED: the ratio it learnt stays in use.
    settled = gaps.index(next(g for g in gaps if g != TAIL_SAMPLE))
    assert 9 < settled < 14 and set(gaps[:settled]) == {TAIL_SAMPLE}
    assert gaps[-2:] == [TAIL_SAMPLE_SETTLED] * 2 and None not in ratios[settled:]


def test_a_settled_tail_is_in_o200k_tokens_beside_the_anchor(encoding: Any) -> None:
    s = sizer(encoding)
    s.reported(s.measure(chat_req(conversation(2)), "t", 10_000), REPORTED, "gemini", 1.157)
    size = s.measure(chat_req(conversation(2) + tool_turn(2)), "t", 10_000)
    assert size.provider_tokens == size.tokens > size.anchor_tokens == REPORTED
    s.settle(size)
    assert size.provider_tokens == REPORTED < size.tokens  # the rest is o200k, for the decision to convert


def test_a_sampled_tails_ratio_converts_what_settle_counts_of_a_later_tail(encoding: Any) -> None:
    from router.features.promptsize import TAIL_SAMPLE

    s = sizer(encoding)
    counter = TokenCounter(encoding=encoding)
    msgs = conversation(1)
    s.reported(s.measure(chat_req(msgs), "t", 10_000), REPORTED, "gemini", 1.1)
    total, samples = REPORTED, 0
    for i in range(2, 200):
        new = tool_turn(i, result=f"line {i} of a long file\n" * 200)
        msgs = msgs + new
        size = s.measure(chat_req(msgs), "t", 10_000)
        # This provider counts 1.3 tokens per o200k token of tool output.
        total += round(1.3 * sum(counter.count_item(m) for m in new))
        if s.reported(size, total, "gemini", 1.1):
            samples += 1
            s.learn_tail(size, total, "gemini")
        if s.tail_ratio("gemini") is not None:
            break
    # Only one tail in TAIL_SAMPLE was counted, and only once enough was.
    assert 1 < samples < i // TAIL_SAMPLE + 1 and s.tail_ratio("gemini") == pytest.approx(1.3, rel=0.01)
    msgs = msgs + tool_turn(999, result="more output\n" * 300)
    size = s.measure(chat_req(msgs), "t", 10_000)
    tail = sum(counter.count_item(m) for m in msgs[-2:])
    assert s.settle(size) == size.provider_tokens == total + round(1.3 * tail)
    assert s.tail_ratio("other") is None
