"""Prompt-token estimates: real o200k counts, per-message caching, the three protocol shapes."""

from __future__ import annotations

import inspect
import os
import random
import shutil
import subprocess
import sys
import typing
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import orjson
import pytest

from router.features.bpe import TokenizerUnavailable, build_encoding, find_tokenizers_dir
from router.features.tokens import IMAGE_TOKENS, MESSAGE_OVERHEAD, REPLY_PRIMING, TokenCounter

O200K_FILE = "fb374d419588a4632f3f557e76b4b70aebbca790"
CL100K_FILE = "9b5ad71b2ce5302211f9c61530b329a4922fc6a4"


@pytest.fixture(scope="module")
def shared() -> TokenCounter:
    """One counter for tests that only need the encoding (it is built once per process)."""
    return TokenCounter()


@pytest.fixture
def counter(shared: TokenCounter) -> TokenCounter:
    """A fresh cache on the already-loaded encoding, so hit/miss numbers start at zero."""
    return TokenCounter(encoding=shared.encoding)


def text_tokens(counter: TokenCounter, *pieces: str) -> int:
    """What one message's texts cost: the pieces are counted joined by newlines."""
    return counter.count_text("\n".join(pieces))


def one(counter: TokenCounter, *pieces: str) -> int:
    """Expected cost of a message whose readable texts are ``pieces``."""
    return MESSAGE_OVERHEAD + text_tokens(counter, *pieces)


# --- the encoding -------------------------------------------------------------------------


def test_real_o200k_encoding(shared: TokenCounter) -> None:
    assert shared.encoding_name == "o200k_base"
    assert shared.count_text("hello world") == 2
    assert shared.encoding.encode_ordinary("hello world") == [24912, 2375]
    assert shared.count_text("") == 0


def test_special_token_text_is_ordinary_text(shared: TokenCounter) -> None:
    # encode() would raise on these; a prompt may legitimately contain them.
    assert shared.count_text("<|endoftext|>") > 1


def test_code_estimate_is_near_chars_over_3_5(shared: TokenCounter) -> None:
    code = inspect.getsource(typing)[:100_000]
    assert len(code) == 100_000
    ratio = shared.count_text(code) / (len(code) / 3.5)
    assert 0.7 <= ratio <= 1.3, ratio


def test_long_text_is_chunked_without_losing_accuracy(shared: TokenCounter) -> None:
    code = inspect.getsource(typing)
    text = (code * 3)[:300_000]
    exact = len(shared.encoding.encode_ordinary(text))
    chunked = shared.count_text(text)
    # Cuts fall on newlines, where the pre-tokenizer splits anyway; here that is exact (cutting
    # at arbitrary characters would be a few tokens off).
    assert chunked == exact
    one_line = ("lorem ipsum dolor " * 20_000)[:300_000]
    # Without newlines the cuts split words: a couple of tokens per cut, five cuts here.
    assert abs(shared.count_text(one_line) - len(shared.encoding.encode_ordinary(one_line))) <= 10


def test_pathological_whitespace_run_does_not_panic(shared: TokenCounter) -> None:
    # A single million-space run makes tiktoken's regex engine panic (a BaseException); chunking
    # avoids it, so the real encoding answers (the len // 4 last resort would say 250,000).
    assert 7_000 < shared.count_text(" " * 1_000_000) < 9_000
    assert shared.count_text("x" * 1_000_000) == 2 * len(shared.encoding.encode_ordinary("x" * 500_000))


def test_loader_falls_back_to_cl100k(tmp_path: Path) -> None:
    source = find_tokenizers_dir()
    assert source is not None
    shutil.copy(source / CL100K_FILE, tmp_path / CL100K_FILE)
    enc = build_encoding(tmp_path)
    assert enc.name == "cl100k_base"
    assert len(enc.encode_ordinary("hello world")) == 2


def test_loader_skips_a_corrupt_o200k_file(tmp_path: Path) -> None:
    source = find_tokenizers_dir()
    assert source is not None
    (tmp_path / O200K_FILE).write_bytes(b"aGVsbG8= 0\n")
    shutil.copy(source / CL100K_FILE, tmp_path / CL100K_FILE)
    assert build_encoding(tmp_path).name == "cl100k_base"


def test_loader_error_is_clear(tmp_path: Path) -> None:
    with pytest.raises(TokenizerUnavailable, match=r"o200k_base: cannot read .*cl100k_base: cannot read"):
        build_encoding(tmp_path)
    with pytest.raises(TokenizerUnavailable, match="litellm is not installed"):
        build_encoding(None)


def test_loading_does_not_import_litellm_or_write_a_cache(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    code = (
        "import sys\n"
        "from router.features.tokens import TokenCounter\n"
        "assert TokenCounter().count_text('hello world') == 2\n"
        "assert 'litellm' not in sys.modules, 'litellm was imported'\n"
    )
    env = {**os.environ, "TIKTOKEN_CACHE_DIR": str(cache)}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert list(cache.iterdir()) == []


# --- OpenAI Chat Completions ----------------------------------------------------------------


def test_openai_chat_exact_count(counter: TokenCounter) -> None:
    messages = [
        {"role": "system", "content": "You are helpful."},
        {"role": "user", "content": "hello world"},
    ]
    expected = REPLY_PRIMING + one(counter, "You are helpful.") + one(counter, "hello world")
    assert counter.count_openai_chat(messages, None) == expected == 17


def test_openai_chat_parts_tool_calls_and_refusal(counter: TokenCounter) -> None:
    user = {
        "role": "user",
        "content": [
            {"type": "text", "text": "what is in this picture?"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
        ],
    }
    assert counter.count_openai_chat([user]) == (
        REPLY_PRIMING + one(counter, "what is in this picture?") + IMAGE_TOKENS
    )
    assistant = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "read_file", "arguments": '{"path": "src/main.py"}'},
            }
        ],
    }
    assert counter.count_openai_chat([assistant]) == (
        REPLY_PRIMING + one(counter, "read_file", '{"path": "src/main.py"}')
    )
    tool = {"role": "tool", "tool_call_id": "call_1", "content": "print('hi')"}
    assert counter.count_openai_chat([tool]) == REPLY_PRIMING + one(counter, "print('hi')")
    refusal = {"role": "assistant", "content": [{"type": "refusal", "refusal": "I can't help with that."}]}
    assert counter.count_openai_chat([refusal]) == REPLY_PRIMING + one(counter, "I can't help with that.")


def test_openai_legacy_function_call_and_dict_arguments(counter: TokenCounter) -> None:
    legacy = {"role": "assistant", "function_call": {"name": "f", "arguments": '{"a": 1}'}}
    assert counter.count_openai_chat([legacy]) == REPLY_PRIMING + one(counter, "f", '{"a": 1}')
    # Some clients send arguments as an object; it is counted as its JSON.
    as_object = {
        "role": "assistant",
        "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": {"a": 1}}}],
    }
    assert counter.count_openai_chat([as_object]) == REPLY_PRIMING + one(counter, "f", '{"a":1}')


def test_tools_are_counted_from_their_json_and_cached(counter: TokenCounter) -> None:
    tools = [
        {
            "type": "function",
            "function": {
                "name": "read_file",
                "description": "Read a file from the workspace and return its text.",
                "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
            },
        }
    ]
    messages = [{"role": "user", "content": "hi"}]
    without = counter.count_openai_chat(messages, None)
    with_tools = counter.count_openai_chat(messages, tools)
    assert with_tools - without == counter.count_text(orjson.dumps(tools).decode())
    assert with_tools - without > 20
    hits = counter.hits
    assert counter.count_openai_chat(messages, tools) == with_tools
    assert counter.hits == hits + 2  # the message and the tool list
    assert counter.count_openai_chat(messages, []) == without


# --- caching ---------------------------------------------------------------------------------


def conversation(n: int) -> list[dict[str, Any]]:
    return [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"message number {i} " * (i + 1)}
        for i in range(n)
    ]


def test_growing_conversation_costs_only_the_new_message(counter: TokenCounter) -> None:
    first = counter.count_openai_chat(conversation(10), None)
    assert (counter.hits, counter.misses) == (0, 10)
    grown = conversation(11)
    second = counter.count_openai_chat(grown, None)
    assert (counter.hits, counter.misses) == (10, 11)
    assert second == first + one(counter, grown[-1]["content"])


def test_identical_messages_in_other_calls_hit(counter: TokenCounter) -> None:
    system = "You are a coding agent. " * 50
    counter.count_anthropic(system, [{"role": "user", "content": "a"}], None)
    counter.count_anthropic(system, [{"role": "user", "content": "b"}], None)
    assert counter.hits == 1  # the system prompt
    assert counter.misses == 3


def test_lru_eviction_is_bounded(shared: TokenCounter) -> None:
    counter = TokenCounter(max_entries=5, encoding=shared.encoding)
    messages = conversation(20)
    for message in messages:
        counter.count_openai_chat([message])
    assert counter.cache_size == 5
    misses = counter.misses
    counter.count_openai_chat([messages[-1]])
    assert counter.misses == misses  # recent: still cached
    counter.count_openai_chat([messages[0]])
    assert counter.misses == misses + 1  # oldest: evicted
    assert counter.cache_size == 5


def test_lru_keeps_recently_used_entries(shared: TokenCounter) -> None:
    counter = TokenCounter(max_entries=3, encoding=shared.encoding)
    a, b, c, d = conversation(4)
    for m in (a, b, c):
        counter.count_openai_chat([m])
    counter.count_openai_chat([a])  # refresh a; b is now the oldest
    counter.count_openai_chat([d])  # evicts b
    misses = counter.misses
    counter.count_openai_chat([a])
    counter.count_openai_chat([c])
    assert counter.misses == misses
    counter.count_openai_chat([b])
    assert counter.misses == misses + 1


def test_cache_can_be_disabled_and_size_validated(shared: TokenCounter) -> None:
    counter = TokenCounter(max_entries=0, encoding=shared.encoding)
    counter.count_openai_chat(conversation(3))
    counter.count_openai_chat(conversation(3))
    assert (counter.hits, counter.misses, counter.cache_size) == (0, 6, 0)
    with pytest.raises(ValueError):
        TokenCounter(max_entries=-1)


def test_concurrent_counting_is_consistent(counter: TokenCounter) -> None:
    convo = conversation(40)
    expected = TokenCounter(encoding=counter.encoding).count_openai_chat(convo)
    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(lambda _: counter.count_openai_chat(convo), range(32)))
    assert set(results) == {expected}
    assert counter.cache_size == 40


# --- Anthropic Messages ----------------------------------------------------------------------


def test_anthropic_system_string_or_blocks(counter: TokenCounter) -> None:
    messages = [{"role": "user", "content": "hello world"}]
    as_string = counter.count_anthropic("Be terse.", messages, None)
    as_blocks = counter.count_anthropic(
        [{"type": "text", "text": "Be terse.", "cache_control": {"type": "ephemeral"}}], messages, None
    )
    assert as_string == as_blocks == REPLY_PRIMING + one(counter, "Be terse.") + one(counter, "hello world")
    assert counter.count_anthropic(None, messages, None) == REPLY_PRIMING + one(counter, "hello world")
    assert counter.count_anthropic("", messages, None) == counter.count_anthropic([], messages, None)


def test_anthropic_content_blocks(counter: TokenCounter) -> None:
    tool_input = {"command": "ls -la", "timeout": 30}
    assistant = {
        "role": "assistant",
        "content": [
            {"type": "thinking", "thinking": "I should list the files.", "signature": "c2lnbmF0dXJl" * 50},
            {"type": "redacted_thinking", "data": "ZW5jcnlwdGVk" * 1000},
            {"type": "text", "text": "Listing."},
            {"type": "tool_use", "id": "toolu_1", "name": "bash", "input": tool_input},
        ],
    }
    expected = one(counter, "I should list the files.", "Listing.", "bash", orjson.dumps(tool_input).decode())
    assert counter.count_anthropic(None, [assistant], None) == REPLY_PRIMING + expected

    result_text = {
        "role": "user",
        "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "README.md\nsrc"}],
    }
    assert counter.count_anthropic(None, [result_text], None) == REPLY_PRIMING + one(
        counter, "README.md\nsrc"
    )
    result_parts = {
        "role": "user",
        "content": [
            {
                "type": "tool_result",
                "tool_use_id": "toolu_2",
                "content": [
                    {"type": "text", "text": "screenshot:"},
                    {
                        "type": "image",
                        "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"},
                    },
                ],
            }
        ],
    }
    assert counter.count_anthropic(None, [result_parts], None) == (
        REPLY_PRIMING + one(counter, "screenshot:") + IMAGE_TOKENS
    )


def test_anthropic_documents_count_json_length(counter: TokenCounter) -> None:
    document = {
        "type": "document",
        "source": {"type": "base64", "media_type": "application/pdf", "data": "A" * 4000},
    }
    message = {"role": "user", "content": [{"type": "text", "text": "summarize"}, document]}
    expected = one(counter, "summarize") + len(orjson.dumps(document)) // 4
    assert counter.count_anthropic(None, [message], None) == REPLY_PRIMING + expected


def test_anthropic_tools_counted(counter: TokenCounter) -> None:
    tools = [{"name": "bash", "description": "Run a shell command.", "input_schema": {"type": "object"}}]
    messages = [{"role": "user", "content": "hi"}]
    delta = counter.count_anthropic(None, messages, tools) - counter.count_anthropic(None, messages, None)
    assert delta == counter.count_text(orjson.dumps(tools).decode())


# --- OpenAI Responses ------------------------------------------------------------------------


def test_responses_string_input_and_instructions(counter: TokenCounter) -> None:
    assert counter.count_responses(None, "hello world", None) == REPLY_PRIMING + one(counter, "hello world")
    assert counter.count_responses("Be terse.", "hello world", None) == (
        REPLY_PRIMING + one(counter, "Be terse.") + one(counter, "hello world")
    )


def test_responses_items(counter: TokenCounter) -> None:
    items = [
        {"role": "user", "content": "fix the bug"},
        {
            "type": "message",
            "role": "user",
            "content": [
                {"type": "input_text", "text": "see screenshot"},
                {"type": "input_image", "image_url": "data:image/png;base64,AAAA"},
            ],
        },
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Looking."}]},
        {"type": "function_call", "call_id": "c1", "name": "shell", "arguments": '{"cmd": ["ls"]}'},
        {"type": "function_call_output", "call_id": "c1", "output": "a.py\nb.py"},
    ]
    expected = (
        REPLY_PRIMING
        + one(counter, "fix the bug")
        + one(counter, "see screenshot")
        + IMAGE_TOKENS
        + one(counter, "Looking.")
        + one(counter, "shell", '{"cmd": ["ls"]}')
        + one(counter, "a.py\nb.py")
    )
    assert counter.count_responses(None, items, None) == expected


def test_responses_reasoning_counts_summary_not_encrypted_content(counter: TokenCounter) -> None:
    summary = [{"type": "summary_text", "text": "Checked the tests first."}]
    plain = {"type": "reasoning", "id": "rs_1", "summary": summary}
    encrypted = {**plain, "encrypted_content": "gAAAAB" * 5000}
    assert counter.count_responses(None, [plain], None) == REPLY_PRIMING + one(
        counter, "Checked the tests first."
    )
    assert counter.count_responses(None, [encrypted], None) == counter.count_responses(None, [plain], None)


def test_responses_output_as_parts_and_custom_tools(counter: TokenCounter) -> None:
    items = [
        {"type": "function_call_output", "call_id": "c", "output": [{"type": "input_text", "text": "done"}]},
        {"type": "custom_tool_call", "call_id": "d", "name": "apply_patch", "input": "*** Begin Patch"},
    ]
    expected = REPLY_PRIMING + one(counter, "done") + one(counter, "apply_patch", "*** Begin Patch")
    assert counter.count_responses(None, items, None) == expected


def test_unknown_item_type_counts_json_length(counter: TokenCounter) -> None:
    item = {"type": "web_search_call", "id": "ws_1", "status": "completed", "action": {"query": "x" * 400}}
    expected = REPLY_PRIMING + MESSAGE_OVERHEAD + len(orjson.dumps(item)) // 4
    assert counter.count_responses(None, [item], None) == expected


# --- malformed shapes ------------------------------------------------------------------------


def deeply_nested(depth: int) -> Any:
    value: Any = "leaf"
    for _ in range(depth):
        value = [{"type": "tool_result", "content": value}]
    return value


GARBAGE: list[Any] = [
    None,
    5,
    -1.5,
    True,
    "plain string",
    [],
    {},
    [None, 5, "x", [], {}],
    {"role": "user"},
    {"role": "user", "content": 5},
    {"role": "user", "content": {"type": "text", "text": "a dict, not a list"}},
    {
        "role": "user",
        "content": [None, 7, ["nested"], {"type": "text", "text": None}, {"type": "text", "text": 9}],
    },
    {"role": "user", "content": [{"type": 5}, {"no": "type"}, {"type": "image"}, {"type": ["weird"]}]},
    {"role": "assistant", "tool_calls": "not a list"},
    {"role": "assistant", "tool_calls": [5, None, {"function": None}, {"function": {"name": 3}}]},
    {"role": "assistant", "function_call": "f"},
    {"type": "function_call", "arguments": {"a": [1, 2]}},
    {"type": "function_call_output", "output": {"weird": True}},
    {"type": "reasoning", "summary": "not a list", "content": 3, "encrypted_content": None},
    {"type": "tool_use", "input": 10**40},
    {"role": "user", "content": [{"type": "text", "text": "big"}, {"type": "document", "n": 10**40}]},
    {"role": "user", "content": [{"type": "text", "text": float("nan")}, float("inf")]},
    {"role": "user", "content": deeply_nested(2_000)},
    deeply_nested(50),
]


@pytest.mark.parametrize("value", GARBAGE, ids=range(len(GARBAGE)))
def test_garbage_never_raises(counter: TokenCounter, value: Any) -> None:
    for result in (
        counter.count_openai_chat([value], value),
        counter.count_openai_chat(value, None),
        counter.count_anthropic(value, [value], value),
        counter.count_anthropic(None, value, None),
        counter.count_responses(value, [value], value),
        counter.count_responses(None, value, None),
    ):
        assert isinstance(result, int)
        assert result >= REPLY_PRIMING


def random_json(rng: random.Random, depth: int = 0) -> Any:
    roll = rng.random()
    if depth > 4 or roll < 0.3:
        return rng.choice([None, True, False, 0, 7, -2.5, 10**30, "", "text", "<|endoftext|>", "ü" * 3])
    if roll < 0.65:
        return [random_json(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    keys = ["type", "role", "content", "text", "name", "arguments", "input", "output", "tool_calls",
            "function", "summary", "thinking", "refusal", "image_url"]  # fmt: skip
    types = ["text", "image", "tool_use", "tool_result", "thinking", "function_call", "message",
             "function_call_output", "reasoning", "input_text", "input_image", "refusal", "zzz"]  # fmt: skip
    out: dict[str, Any] = {}
    for _ in range(rng.randint(0, 5)):
        key = rng.choice(keys)
        out[key] = rng.choice(types) if key == "type" and rng.random() < 0.8 else random_json(rng, depth + 1)
    return out


def test_random_json_shapes_never_raise(counter: TokenCounter) -> None:
    rng = random.Random(1234)
    for _ in range(1500):
        value = random_json(rng)
        tools = random_json(rng) if rng.random() < 0.3 else None
        for result in (
            counter.count_openai_chat(value if rng.random() < 0.5 else [value], tools),
            counter.count_anthropic(random_json(rng), [value], tools),
            counter.count_responses(random_json(rng), value, tools),
        ):
            assert isinstance(result, int) and result >= REPLY_PRIMING
