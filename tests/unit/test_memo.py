"""The conversation memo: prefix reuse, moving cache markers, several requests per task, a byte bound."""

from __future__ import annotations

import copy
import threading
from typing import Any

import orjson
import pytest

from router.features.memo import ConversationMemo, Snapshot, common_prefix, same


def chat(n: int, seed: str = "") -> list[dict[str, Any]]:
    return [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"message {i}{seed}"} for i in range(n)
    ]


def snapshot(messages: list[Any], weight: int = 100, **kw: Any) -> Snapshot:
    counts: list[int | None] = [10 + i for i in range(len(messages))]
    return Snapshot(messages, counts, kw.get("system"), None, kw.get("tools"), None, weight)


def fresh(value: Any) -> Any:
    # What the next request parses into: equal values, none of the same objects.
    return orjson.loads(orjson.dumps(value))


def test_a_growing_conversation_shares_its_whole_previous_request() -> None:
    memo = ConversationMemo(10_000)
    first = chat(6)
    memo.remember("t", snapshot(first))
    nxt = fresh(first) + chat(2, seed=" new")
    m = memo.match("t", nxt, None, None)
    assert m.snapshot is not None and m.snapshot.messages is first
    assert (m.prefix, m.repeat, m.same_system, m.same_tools) == (6, False, True, True)
    assert memo.hits == 1


def test_an_edited_history_shares_only_what_precedes_the_edit() -> None:
    memo = ConversationMemo(10_000)
    memo.remember("t", snapshot(chat(6)))
    edited = chat(6)
    edited[3]["content"] = "rewritten"
    assert memo.match("t", edited, None, None).prefix == 3
    assert memo.match("t", chat(6, seed="x"), None, None).prefix == 0
    assert memo.match("other", chat(6), None, None).snapshot is None


def test_a_resent_request_is_a_repeat_and_a_changed_system_or_tools_is_not() -> None:
    memo = ConversationMemo(10_000)
    tools = [{"name": "read", "input_schema": {"type": "object"}}]
    memo.remember("t", snapshot(chat(4), system="be brief", tools=tools))
    assert memo.match("t", chat(4), "be brief", fresh(tools)).repeat
    assert not memo.match("t", chat(4), "be verbose", tools).repeat
    assert not memo.match("t", chat(4), "be brief", [*tools, {"name": "write"}]).repeat
    assert not memo.match("t", chat(3), "be brief", tools).repeat  # a shorter request repeats nothing
    assert not memo.match("t", chat(5), "be brief", tools).repeat


def anthropic_turn(n: int) -> list[dict[str, Any]]:
    """Claude Code's shape: content blocks, the cache marker on the last block of the last message."""
    out: list[dict[str, Any]] = []
    for i in range(n):
        role = "user" if i % 2 == 0 else "assistant"
        if role == "assistant":
            block: dict[str, Any] = {
                "type": "tool_use",
                "id": f"tu{i}",
                "name": "Bash",
                "input": {"cmd": f"ls {i}"},
            }
        else:
            block = {"type": "tool_result", "tool_use_id": f"tu{i - 1}", "content": f"out {i}"}
        out.append({"role": role, "content": [block]})
    out[-1]["content"][-1]["cache_control"] = {"type": "ephemeral"}
    return out


def test_the_cache_marker_moving_to_the_last_message_keeps_the_prefix() -> None:
    memo = ConversationMemo(10_000)
    memo.remember("t", snapshot(anthropic_turn(5)))
    nxt = anthropic_turn(7)  # the marker left message 4 for message 6
    assert nxt[4] != memo.match("t", nxt, None, None).snapshot.messages[4]  # type: ignore[union-attr]
    m = memo.match("t", nxt, None, None)
    assert m.prefix == 5
    # Resent with the marker elsewhere, it is the same request.
    moved = anthropic_turn(5)
    del moved[-1]["content"][-1]["cache_control"]
    moved[0]["content"][0]["cache_control"] = {"type": "ephemeral"}
    assert memo.match("t", moved, None, None).repeat


def test_same_ignores_only_cache_markers() -> None:
    a = {"role": "user", "content": [{"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}}]}
    b = {"role": "user", "content": [{"type": "text", "text": "hi"}]}
    assert same(a, b) and same([a], [b])
    assert not same(a, {"role": "user", "content": [{"type": "text", "text": "ho"}]})
    assert not same("a", "b") and not same(1, "1") and not same({}, [])
    assert common_prefix([a, a, b], [b, b, a, a]) == 3


def test_a_task_keeps_its_last_few_requests_and_the_longest_prefix_wins() -> None:
    memo = ConversationMemo(100_000, per_key=3)
    main = chat(10)
    memo.remember("t", snapshot(main))
    side = [{"role": "user", "content": "write a title for this conversation"}]
    memo.remember("t", snapshot(side))  # a side call of the same task in between
    m = memo.match("t", fresh(main) + chat(2, seed="n"), None, None)
    assert m.snapshot is not None and m.snapshot.messages is main and m.prefix == 10
    for i in range(3):
        memo.remember("t", snapshot(chat(2, seed=f"side {i}")))
    assert memo.match("t", main, None, None).prefix == 0  # pushed out by three newer requests
    assert len(memo) == 3


def test_siblings_differing_in_their_last_message_still_find_an_older_repeat() -> None:
    memo = ConversationMemo(100_000, per_key=4)
    base = chat(9)
    siblings = [[*base, {"role": "user", "content": f"retry {i}"}] for i in range(3)]
    for messages in siblings:  # the newest is "retry 2"
        memo.remember("t", snapshot(messages))
    again = memo.match("t", fresh(siblings[0]), None, None)  # the oldest, sent again
    assert again.repeat and again.prefix == 10 and again.snapshot is not None
    assert again.snapshot.messages is siblings[0]
    other = memo.match("t", [*fresh(base), {"role": "user", "content": "retry 3"}], None, None)
    assert not other.repeat and other.prefix == 9 and other.snapshot is not None
    assert other.snapshot.messages is siblings[2]  # ties go to the most recent


def test_a_request_that_continues_another_replaces_it() -> None:
    memo = ConversationMemo(100_000)
    first = snapshot(chat(4), weight=40)
    memo.remember("t", first)
    second = snapshot(chat(6), weight=60)
    memo.remember("t", second, replaces=first)
    assert len(memo) == 1 and memo.bytes == 60


def test_memory_is_bounded_by_bytes_least_recently_used_first() -> None:
    memo = ConversationMemo(1_000)
    for key in "abc":
        memo.remember(key, snapshot(chat(4, seed=key), weight=400))
    assert memo.bytes <= 1_000
    assert memo.match("a", chat(4, seed="a"), None, None).snapshot is None  # the oldest went
    assert memo.match("b", chat(4, seed="b"), None, None).snapshot is not None
    memo.remember("d", snapshot(chat(4, seed="d"), weight=400))
    # "b" was just used: "c" goes.
    assert memo.match("c", chat(4, seed="c"), None, None).snapshot is None
    assert memo.match("b", chat(4, seed="b"), None, None).snapshot is not None
    memo.remember("huge", snapshot(chat(4), weight=5_000))  # larger than the bound: not kept
    assert memo.match("huge", chat(4), None, None).snapshot is None
    assert memo.bytes <= 1_000


def test_one_task_alone_over_the_bound_keeps_its_newest_request() -> None:
    memo = ConversationMemo(1_000)
    for i in range(3):
        memo.remember("t", snapshot(chat(4, seed=str(i)), weight=400))
    assert memo.bytes == 800 and len(memo) == 2
    assert memo.match("t", chat(4, seed="2"), None, None).repeat


def test_zero_or_negative_bounds() -> None:
    memo = ConversationMemo(0)
    memo.remember("t", snapshot(chat(2), weight=1))
    assert memo.match("t", chat(2), None, None).snapshot is None
    with pytest.raises(ValueError):
        ConversationMemo(-1)


def test_counts_filled_from_threads_while_requests_match() -> None:
    memo = ConversationMemo(10_000_000)
    base = chat(200)
    snap = Snapshot(base, [None] * 200, None, None, None, None, 1_000)
    memo.remember("t", snap)
    errors: list[BaseException] = []

    def fill(offset: int) -> None:
        try:
            for i in range(offset, 200, 4):
                snap.counts[i] = i
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=fill, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for _ in range(50):
        m = memo.match("t", copy.deepcopy(base), None, None)
        assert m.prefix == 200
        memo.remember(f"other{_}", snapshot(chat(3), weight=10))
    for t in threads:
        t.join()
    assert not errors and snap.counts == list(range(200))
