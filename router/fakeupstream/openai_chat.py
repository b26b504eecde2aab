"""OpenAI Chat Completions (``POST /v1/chat/completions``) in the fake upstream's wire format."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import orjson

from router.errors import BadRequest, RouterError
from router.fakeupstream.reply import FakeReply, FakeUsage, Frame, Ids, Prompt, Tool, parts_text

FINGERPRINT = "fp_fakeupstream"


def chosen_tools(tools: list[Any], choice: Any) -> list[Tool]:
    """Function tools the reply may call, with ``tool_choice`` applied (a named tool goes first)."""
    if choice == "none":
        return []
    found: list[Tool] = []
    for i, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            if isinstance(tool, dict) and tool.get("type", "function") != "function":
                continue  # custom and built-in tools are accepted but never called
            raise BadRequest(f"tools[{i}].function.name: expected a string", param=f"tools[{i}]")
        parameters = function.get("parameters")
        found.append(Tool(function["name"], parameters if isinstance(parameters, dict) else {}))
    if isinstance(choice, dict) and isinstance(choice.get("function"), dict):
        name = choice["function"].get("name")
        found.sort(key=lambda t: t.name != name)
    return found


def usage_body(usage: FakeUsage) -> dict[str, Any]:
    return {
        "prompt_tokens": usage.input_tokens,
        "completion_tokens": usage.output_tokens,
        "total_tokens": usage.input_tokens + usage.output_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens, "audio_tokens": 0},
        "completion_tokens_details": {
            "reasoning_tokens": usage.reasoning_tokens,
            "audio_tokens": 0,
            "accepted_prediction_tokens": 0,
            "rejected_prediction_tokens": 0,
        },
    }


class OpenAIChat:
    """Parses chat requests and renders replies as completions or ``chat.completion.chunk`` streams."""

    request_id_header = "x-request-id"
    broken_frame = b'data: {"id": "chatcmpl-broken", "object": "chat.completion.chunk", "choices": [{\n\n'
    error_frame = (
        b'data: {"error": {"message": "fake upstream: injected stream error", "type": "server_error",'
        b' "param": null, "code": null}}\n\n'
    )
    context_message = (
        "This model's maximum context length is {window} tokens. However, your messages resulted in "
        "{tokens} tokens. Please reduce the length of the messages."
    )

    def prompt(self, body: dict[str, Any], model: str) -> Prompt:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest("messages: expected a non-empty array", param="messages")
        for i, message in enumerate(messages):
            if not isinstance(message, dict) or not isinstance(message.get("role"), str):
                raise BadRequest(f"messages[{i}]: expected an object with a string role", param="messages")
        tools = body.get("tools")
        if tools is not None and not isinstance(tools, list):
            raise BadRequest("tools: expected an array", param="tools")
        effort = body.get("reasoning_effort")
        if effort is not None and not isinstance(effort, str):
            raise BadRequest("reasoning_effort: expected a string", param="reasoning_effort")
        last = messages[-1]
        return Prompt(
            model=model,
            head=orjson.dumps(tools) if tools else b"",
            items=[orjson.dumps(m) for m in messages],
            tools=chosen_tools(tools, body.get("tool_choice")) if tools else [],
            tool_result=parts_text(last.get("content"), "text") if last["role"] == "tool" else None,
            reasoning_effort=effort,
        )

    def complete(self, reply: FakeReply, body: Mapping[str, Any], ids: Ids) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": reply.text or None, "refusal": None}
        finish = "stop"
        call = reply.tool_call
        if call is not None:
            finish = "tool_calls"
            message["tool_calls"] = [
                {
                    "id": ids.new("call_"),
                    "type": "function",
                    "function": {"name": call.name, "arguments": call.arguments_json},
                }
            ]
        message["annotations"] = []
        return {
            "id": ids.new("chatcmpl-"),
            "object": "chat.completion",
            "created": int(time.time()),
            "model": reply.model,
            "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish}],
            "usage": usage_body(reply.usage),
            "service_tier": "default",
            "system_fingerprint": FINGERPRINT,
        }

    def frames(self, reply: FakeReply, body: Mapping[str, Any], ids: Ids) -> list[Frame]:
        options = body.get("stream_options")
        include_usage = isinstance(options, dict) and options.get("include_usage") is True
        envelope = {
            "id": ids.new("chatcmpl-"),
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": reply.model,
            "system_fingerprint": FINGERPRINT,
        }
        # Every chunk shares its envelope, so it is serialized once and each delta spliced in.
        head = b"data: " + orjson.dumps(envelope)[:-1] + b',"choices":[{"index":0,"delta":'
        tail = b',"logprobs":null,"finish_reason":null}]' + (b',"usage":null' if include_usage else b"")
        tail += b"}\n\n"

        def chunk(delta: Mapping[str, Any]) -> bytes:
            return head + orjson.dumps(delta) + tail

        call = reply.tool_call
        if call is None:
            frames: list[Frame] = [(chunk({"role": "assistant", "content": "", "refusal": None}), False)]
            frames += [(chunk({"content": piece}), True) for piece in reply.pieces]
            finish = "stop"
        else:
            start = {
                "index": 0,
                "id": ids.new("call_"),
                "type": "function",
                "function": {"name": call.name, "arguments": ""},
            }
            frames = [
                (chunk({"role": "assistant", "content": None, "refusal": None}), False),
                (chunk({"tool_calls": [start]}), False),
            ]
            frames += [
                (chunk({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]}), True)
                for piece in call.pieces
            ]
            finish = "tool_calls"
        last = {**envelope, "choices": [{"index": 0, "delta": {}, "logprobs": None, "finish_reason": finish}]}
        if include_usage:
            last["usage"] = None
        frames.append((b"data: " + orjson.dumps(last) + b"\n\n", False))
        if include_usage:
            final = {**envelope, "choices": [], "usage": usage_body(reply.usage)}
            frames.append((b"data: " + orjson.dumps(final) + b"\n\n", False))
        frames.append((b"data: [DONE]\n\n", False))
        return frames

    def error_body(self, error: RouterError) -> dict[str, Any]:
        return error.openai_body()
