"""Ingress checks of the conversation's item and block types: what real clients send passes, as
do fields a known block does not declare; an unknown type is a 400 naming where it is."""

from __future__ import annotations

import typing
from typing import Any

import orjson
import pytest

from router.errors import BadRequest
from router.protocols import anthropic, openai_chat, responses


def literal_types(alias: Any) -> set[str]:
    """The ``type`` literals of a union of TypedDicts (the SDKs' request shapes)."""
    found: set[str] = set()

    def literals(hint: Any) -> list[str]:
        if typing.get_origin(hint) is typing.Literal:
            return [str(a) for a in typing.get_args(hint)]
        return [x for a in typing.get_args(hint) for x in literals(a)]

    for member in typing.get_args(alias):
        if typing.get_origin(member) is typing.Annotated:
            found |= literal_types(typing.get_args(member)[0])
        elif hasattr(member, "model_fields"):  # a pydantic model: a response block sent back
            found |= set(literals(member.model_fields["type"].annotation))
        else:
            found |= set(literals(typing.get_type_hints(member)["type"]))
    return found


def test_every_type_the_sdks_know_is_accepted() -> None:
    from anthropic.types import content_block_param
    from anthropic.types.beta import beta_content_block_param
    from openai.types.responses import response_input_item_param

    blocks = literal_types(beta_content_block_param.BetaContentBlockParam)
    blocks |= literal_types(content_block_param.ContentBlockParam)
    assert {"text", "tool_use", "tool_result", "thinking"} <= blocks  # the introspection works
    assert blocks <= set(anthropic.BLOCK_TYPES), sorted(blocks - set(anthropic.BLOCK_TYPES))
    items = literal_types(response_input_item_param.ResponseInputItemParam)
    assert {"message", "function_call", "function_call_output", "reasoning"} <= items
    assert items <= responses.ITEM_TYPES, sorted(items - responses.ITEM_TYPES)


def test_every_content_part_type_the_openai_sdk_knows_is_accepted() -> None:
    from openai.types.chat import chat_completion_assistant_message_param as assistant
    from openai.types.chat import chat_completion_content_part_param as chat_part
    from openai.types.responses import response_input_content_param as input_part
    from openai.types.responses import response_output_refusal_param, response_output_text_param

    chat = literal_types(chat_part.ChatCompletionContentPartParam)
    chat |= literal_types(assistant.ContentArrayOfContentPart)
    assert {"text", "image_url", "refusal"} <= chat  # the introspection works
    assert chat <= set(openai_chat.PART_TYPES), sorted(chat - set(openai_chat.PART_TYPES))
    parts = literal_types(input_part.ResponseInputContentParam)
    for output in (response_output_text_param.ResponseOutputTextParam,
                   response_output_refusal_param.ResponseOutputRefusalParam):  # fmt: skip
        parts |= set(typing.get_args(typing.get_type_hints(output)["type"]))
    assert {"input_text", "input_image", "output_text", "refusal"} <= parts
    assert parts <= set(responses.PART_TYPES), sorted(parts - set(responses.PART_TYPES))


@pytest.mark.parametrize(
    ("part", "said"),
    [
        ({"type": "bogus"}, "messages.0.content.1.type: unknown content part type 'bogus'"),
        ({"text": "no type"}, "messages.0.content.1.type: required"),
        ({"type": ["text"]}, "messages.0.content.1.type: unknown content part type ['text']"),
        ({"type": "image_url"}, "messages.0.content.1.image_url: required in a content part of type image_url"),
        ({"type": "image_url", "image_url": 5}, "messages.0.content.1.image_url: required"),
        ({"type": "text", "text": 5}, "messages.0.content.1.text: required in a content part of type text, as a string"),
    ],
)  # fmt: skip
def test_a_chat_content_part_of_no_known_type_or_shape_is_refused_naming_it(
    part: dict[str, Any], said: str
) -> None:
    # Forwarded, an unknown part was answered 200 as if it were not there (the fake provider;
    # a real one answers 400 in its own words), and litellm failed on a malformed image (a 500).
    body = {
        "model": "auto",
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}, part]}],
    }
    assert said in refused(openai_chat.parse, orjson.dumps(body))
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    assert openai_chat.parse(
        orjson.dumps({**body, "messages": [{"role": "user", "content": [image]}]})
    ).vision


def test_an_anthropic_text_or_image_block_without_its_content_is_refused() -> None:
    assert "messages.0.content.0.source: required in a content block of type image" in refused(
        anthropic.parse, messages({"role": "user", "content": [{"type": "image"}]})
    )
    assert "messages.0.content.0.text: required" in refused(
        anthropic.parse, messages({"role": "user", "content": [{"type": "text"}]})
    )


def test_a_responses_message_part_of_no_known_type_is_refused_naming_it() -> None:
    said = refused(responses.parse, items({"role": "user", "content": "hi"},
                                          {"role": "user", "content": [{"type": "bogus"}]}))  # fmt: skip
    assert said == "invalid request: input.1.content.0.type: unknown content part type 'bogus'"
    assert "input.0.content.0.text: required" in refused(
        responses.parse, items({"type": "message", "role": "user", "content": [{"type": "input_text"}]})
    )
    # Other items' content is not a message's: a reasoning item's is left to the backend.
    responses.parse(
        items(
            {"role": "user", "content": "hi"},
            {"type": "reasoning", "summary": [], "content": [{"type": "x"}]},
        )
    )


def messages(*msgs: dict[str, Any]) -> bytes:
    return orjson.dumps({"model": "claude-x", "max_tokens": 100, "messages": list(msgs)})


def items(*input_items: dict[str, Any]) -> bytes:
    return orjson.dumps({"model": "auto", "input": list(input_items)})


# Claude Code's shapes: thinking with a signature, tool use, tool results with cache markers,
# a mid-conversation system message; forward-compatible fields inside known blocks.
CLAUDE_CODE = messages(
    {"role": "user", "content": [{"type": "text", "text": "fix the bug", "cache_control": {"type": "ephemeral"}}]},
    {"role": "assistant", "content": [
        {"type": "thinking", "thinking": "look first", "signature": "c2ln"},
        {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"command": "ls"}, "caller": {"type": "direct"}},
    ]},
    {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "a.py"}],
         "cache_control": {"type": "ephemeral", "ttl": "1h"}},
    ]},
    {"role": "system", "content": "The user switched to plan mode."},
    {"role": "user", "content": "go on"},
)  # fmt: skip
# Codex's shapes: messages with input_text, reasoning carried encrypted, function and custom tool
# calls with their outputs, a local shell call.
CODEX = items(
    {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "be careful"}]},
    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "fix the bug"}]},
    {"type": "reasoning", "summary": [], "encrypted_content": "gAAA"},
    {"type": "function_call", "name": "shell", "arguments": "{\"command\": [\"ls\"]}", "call_id": "c1"},
    {"type": "function_call_output", "call_id": "c1", "output": "a.py"},
    {"type": "custom_tool_call", "call_id": "c2", "name": "apply_patch", "input": "*** Begin Patch"},
    {"type": "custom_tool_call_output", "call_id": "c2", "output": "done"},
    {"type": "local_shell_call", "call_id": "c3", "status": "completed",
     "action": {"type": "exec", "command": ["ls"]}},
    {"role": "assistant", "content": [{"type": "output_text", "text": "fixed", "annotations": []}]},
)  # fmt: skip


def test_what_real_clients_send_passes_through_unchanged() -> None:
    req = anthropic.parse(CLAUDE_CODE)
    assert req.body["messages"] == orjson.loads(CLAUDE_CODE)["messages"]
    assert req.messages[1]["content"][1]["caller"] == {"type": "direct"}  # a field the router does not know
    assert responses.parse(CODEX).body["input"] == orjson.loads(CODEX)["input"]


def refused(parse: Any, raw: bytes) -> str:
    with pytest.raises(BadRequest) as err:
        parse(raw)
    assert err.value.status == 400
    return err.value.message


@pytest.mark.parametrize(
    ("parse", "body", "param"),
    [
        (openai_chat.parse, {"model": "auto", "messages": "hi"}, "messages"),
        (openai_chat.parse, {"model": "auto", "temperature": "hot", "messages": [{"role": "user", "content": "x"}]},
         "temperature"),
        (openai_chat.parse, {"messages": [{"role": "user", "content": "x"}]}, "model"),
        (anthropic.parse, {"model": "claude-x", "messages": [{"role": "user", "content": "x"}]}, "max_tokens"),
        (responses.parse, {"model": "auto"}, "input"),
        (responses.parse, {"model": "auto", "input": "hi", "max_tool_calls": -1}, "max_tool_calls"),
        (responses.parse, {"model": "auto", "input": "hi", "max_tool_calls": "3"}, "max_tool_calls"),
        (responses.parse, {"model": "auto", "input": "hi", "max_tool_calls": True}, "max_tool_calls"),
    ],
)  # fmt: skip
def test_a_field_that_fails_validation_is_the_errors_param(parse, body: dict[str, Any], param: str) -> None:  # type: ignore[no-untyped-def]
    # It was null ("invalid request: temperature: Input should be a valid number", param null),
    # where the checks by hand (roles, content blocks) name it.
    with pytest.raises(BadRequest) as exc:
        parse(orjson.dumps(body))
    assert exc.value.param == param, str(exc.value)


@pytest.mark.parametrize(
    ("parse", "body", "said"),
    [
        (responses.parse, {"model": "auto", "input": 5}, "input: Input should be a valid string or a valid list"),
        (responses.parse, {"model": "auto", "input": [1]}, "input.0: Input should be a valid dictionary"),
        (responses.parse, {"model": "auto", "input": []},
         "input: List should have at least 1 item after validation, not 0"),
        (anthropic.parse, {"model": "claude-x", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}],
                           "system": 5}, "system: Input should be a valid string or a valid list"),
        (openai_chat.parse, {"model": "auto", "messages": [{"role": "user", "content": "x"}],
                             "tools": [{"type": "function", "function": 5}]},
         "tools.0.function: Input should be a valid dictionary"),
    ],
)  # fmt: skip
def test_a_field_of_two_shapes_is_told_in_the_clients_words(parse, body: dict[str, Any], said: str) -> None:  # type: ignore[no-untyped-def]
    # It said "input.str: Input should be a valid string; input.list[dict[str,any]]: Input should
    # be a valid list" (pydantic's names for the shapes), and "... or instance of _Function".
    with pytest.raises(BadRequest) as exc:
        parse(orjson.dumps(body))
    assert str(exc.value) == f"invalid request: {said}"


def test_a_responses_cap_on_hosted_tool_calls_is_forwarded() -> None:
    """``max_tool_calls`` was not on the allow-list: the router dropped it, and the provider made
    as many hosted calls (each billed) as it liked."""
    body = {"model": "auto", "input": "hi", "tools": [{"type": "web_search"}], "max_tool_calls": 1}
    assert responses.parse(orjson.dumps(body)).body["max_tool_calls"] == 1


def test_an_unknown_responses_item_is_refused_naming_it() -> None:
    ok = {"role": "user", "content": "hi"}
    assert refused(responses.parse, items(ok, {"type": "bogus"})) == (
        "invalid request: input.1.type: unknown item type 'bogus'"
    )
    assert (
        refused(responses.parse, items({"content": "no role, no type"}))
        == "invalid request: input.0.type: required"
    )
    assert "input.0.role: must be one of" in refused(
        responses.parse, items({"role": "wizard", "content": "hi"})
    )
    assert "input.1.role" in refused(responses.parse, items(ok, {"type": "message", "content": "hi"}))
    assert "…" in refused(responses.parse, items({"type": "x" * 500}))  # never echoed whole


def test_a_stored_item_referenced_by_id_is_refused_as_previous_response_id_is() -> None:
    # The provider's stored item was sent on unseen: the router sized and held a prompt of a few
    # tokens, whatever the item held (a long reply, referenced many times over).
    ok = {"role": "user", "content": "hi"}
    said = refused(responses.parse, items(ok, {"type": "item_reference", "id": "msg_abc"}))
    assert said.startswith("invalid request: input.1: item_reference is not supported")
    previous = orjson.dumps({"model": "auto", "input": "hi", "previous_response_id": "r"})
    assert "stateless" in refused(responses.parse, previous)


def test_a_responses_message_with_content_of_no_known_shape_is_refused() -> None:
    # Forwarded, it failed in translation on every backend as an upstream error (502), and a
    # handful of such requests opened every backend's breaker for everyone.
    for content in (5, {"a": 1}, [5], ["hi"]):
        assert refused(responses.parse, items({"role": "user", "content": content})) == (
            "invalid request: input.0.content: must be a string or a list of content parts"
        )
    assert "input.1.content" in refused(
        responses.parse,
        items({"role": "user", "content": "hi"}, {"type": "message", "role": "user", "content": 5}),
    )
    responses.parse(items({"role": "user", "content": [{"type": "input_text", "text": "hi"}]}))


def test_an_unknown_anthropic_block_is_refused_naming_it() -> None:
    text = {"type": "text", "text": "hi"}
    assert refused(anthropic.parse, messages({"role": "user", "content": [text, {"type": "bogus"}]})) == (
        "invalid request: messages.0.content.1.type: unknown content block type 'bogus'"
    )
    assert refused(anthropic.parse, messages({"role": "user", "content": [{"text": "hi"}]})) == (
        "invalid request: messages.0.content.0.type: required"
    )


def test_a_system_message_cannot_open_the_conversation() -> None:
    # The top-level system field is for that; mid-conversation system messages are the beta's.
    message = refused(
        anthropic.parse,
        messages({"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}),
    )
    assert message.startswith(
        "invalid request: messages.0.role: a system message cannot open the conversation"
    )
    assert "messages.0.role" in refused(anthropic.parse, messages({"role": "tool", "content": "x"}))


@pytest.mark.parametrize("protocol", ["openai_chat", "anthropic"])
def test_one_pass_over_the_messages_reads_images_and_reports_the_first_fault_as_the_checks_do(
    protocol: str,
) -> None:
    parse = anthropic.parse if protocol == "anthropic" else openai_chat.parse
    image = (
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}
        if protocol == "anthropic"
        else {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}}
    )
    text = {"type": "text", "text": "hi"}
    plain = {"role": "user", "content": "hi"}
    reply = {"role": "assistant", "content": "ok"}
    assert parse(messages(plain, reply, {"role": "user", "content": [text, image]})).vision
    assert not parse(messages(plain, reply, {"role": "user", "content": [text]})).vision
    # Two faults: the role check runs over every message before any block is looked at.
    faults = messages({"role": "user", "content": [{"type": "bogus"}]}, {"role": "wizard", "content": "x"})
    if protocol == "anthropic":
        assert refused(parse, faults).startswith("invalid request: messages.1.role: must be one of")
    assert refused(parse, messages(plain, {"role": "user", "content": 3})) == (
        "invalid request: messages.1.content: must be a string or a list of content blocks"
    )
    assert refused(parse, messages(plain, {"role": "user", "content": ["x"]})).startswith(
        "invalid request: messages.1.content"
    )


def test_signed_blocks_are_read_in_the_parsers_pass_as_the_history_check_reads_them() -> None:
    from dataclasses import replace

    from router.features.task.context import signed_history

    plain = {"role": "user", "content": "hi"}
    thinking = {"type": "thinking", "thinking": "hm", "signature": "c2ln"}
    cases = {
        "signed thinking": ({"role": "assistant", "content": [thinking]}, "anthropic"),
        "redacted": (
            {"role": "assistant", "content": [{"type": "redacted_thinking", "data": "x"}]},
            "anthropic",
        ),
        "unsigned": ({"role": "assistant", "content": [{**thinking, "signature": ""}]}, None),
        "text": ({"role": "assistant", "content": [{"type": "text", "text": "ok"}]}, None),
    }
    for name, (reply, expected) in cases.items():
        req = anthropic.parse(messages(plain, reply, plain))
        assert req.signed_blocks is (expected is not None), name
        # The walk over the history, as for a request whose parser did not read it, agrees.
        assert signed_history(req) == signed_history(replace(req, signed_blocks=None)) == expected, name


def test_a_chat_request_with_two_output_limits_is_sized_by_the_larger() -> None:
    # Both are forwarded, and backends differ in which they obey (DeepSeek and others read only
    # max_tokens). Read as the smaller, a client that sent max_completion_tokens 1 next to
    # max_tokens 8000 had each request's budget hold sized for one output token.
    def limit(**fields: int) -> int | None:
        body = {"model": "auto", "messages": [{"role": "user", "content": "hi"}], **fields}
        return openai_chat.parse(orjson.dumps(body)).max_output_tokens

    assert limit(max_completion_tokens=1, max_tokens=8000) == 8000
    assert limit(max_tokens=1, max_completion_tokens=8000) == 8000
    assert limit(max_tokens=300) == limit(max_completion_tokens=300) == 300
    assert limit() is None


@pytest.mark.parametrize("parse", [openai_chat.parse, responses.parse])
def test_a_service_tier_billed_above_the_catalog_is_refused(parse) -> None:  # type: ignore[no-untyped-def]
    def body(tier: Any) -> bytes:
        conversation = (
            {"messages": [{"role": "user", "content": "hi"}]}
            if parse is openai_chat.parse
            else {"input": "hi"}
        )
        return orjson.dumps({"model": "auto", **conversation, "service_tier": tier})

    for tier in ("priority", "scale", 5):
        with pytest.raises(BadRequest) as exc:
            parse(body(tier))
        assert exc.value.param == "service_tier" and "standard rates" in exc.value.message
    for tier in ("auto", "default", "flex", None):
        assert parse(body(tier)).body.get("service_tier") == tier
