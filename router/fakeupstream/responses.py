"""OpenAI Responses (``POST /v1/responses``) in the fake upstream's wire format."""

from __future__ import annotations

import itertools
import time
from collections.abc import Mapping
from typing import Any

import orjson

from router.errors import BadRequest, RouterError
from router.fakeupstream.reply import (
    FakeReply,
    FakeUsage,
    Frame,
    Ids,
    Prompt,
    Tool,
    parts_text,
    sign_thinking,
    sse,
)
from router.protocols.hosted import declared, max_uses

#: Items that carry a tool's output back to the model (Codex sends both kinds).
_TOOL_OUTPUTS = ("function_call_output", "custom_tool_call_output")


def chosen_tools(tools: list[Any], choice: Any) -> list[Tool]:
    """Function tools the reply may call; built-in and custom tools are accepted but never called."""
    if choice == "none":
        return []
    found: list[Tool] = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or not isinstance(tool.get("type"), str):
            raise BadRequest(f"tools[{i}].type: expected a string", param=f"tools[{i}]")
        if tool["type"] != "function":
            continue
        if not isinstance(tool.get("name"), str):
            raise BadRequest(f"tools[{i}].name: expected a string", param=f"tools[{i}]")
        parameters = tool.get("parameters")
        found.append(Tool(tool["name"], parameters if isinstance(parameters, dict) else {}))
    if isinstance(choice, dict) and choice.get("type") == "function":
        found.sort(key=lambda t: t.name != choice.get("name"))
    return found


def usage_body(usage: FakeUsage) -> dict[str, Any]:
    return {
        "input_tokens": usage.input_tokens,
        "input_tokens_details": {"cached_tokens": usage.cached_tokens},
        "output_tokens": usage.output_tokens,
        "output_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
        "total_tokens": usage.input_tokens + usage.output_tokens,
    }


class Responses:
    """Parses Responses requests and renders replies as response objects or typed event streams."""

    request_id_header = "x-request-id"
    broken_frame = b'event: response.output_text.delta\ndata: {"type": "response.output_text.delta", \n\n'
    error_frame = sse(
        "error",
        {
            "type": "error",
            "code": "server_error",
            "message": "fake upstream: injected stream error",
            "param": None,
        },
    )
    context_message = (
        "Your input exceeds the context window of this model ({tokens} tokens > {window}). "
        "Please adjust your input and try again."
    )

    def prompt(self, body: dict[str, Any], model: str) -> Prompt:
        given = body.get("input")
        if isinstance(given, str):
            items: list[Any] = [{"role": "user", "content": given}]
        elif isinstance(given, list) and given:
            items = given
        else:
            raise BadRequest("input: expected a string or a non-empty array of items", param="input")
        for i, item in enumerate(items):
            if not isinstance(item, dict):
                raise BadRequest(f"input[{i}]: expected an object", param="input")
        instructions = body.get("instructions")
        if instructions is not None and not isinstance(instructions, str):
            raise BadRequest("instructions: expected a string", param="instructions")
        tools = body.get("tools")
        if tools is not None and not isinstance(tools, list):
            raise BadRequest("tools: expected an array", param="tools")
        reasoning = body.get("reasoning")
        effort = reasoning.get("effort") if isinstance(reasoning, dict) else None
        last = items[-1]
        head = (orjson.dumps(instructions) if instructions else b"") + (orjson.dumps(tools) if tools else b"")
        return Prompt(
            model=model,
            head=head,
            items=[orjson.dumps(item) for item in items],
            tools=chosen_tools(tools, body.get("tool_choice")) if tools else [],
            tool_result=parts_text(last.get("output"), "input_text")
            if last.get("type") in _TOOL_OUTPUTS
            else None,
            reasoning_effort=effort if isinstance(effort, str) and effort != "none" else None,
            hosted=declared(tools or ()),
            max_uses=max_uses(tools or (), body.get("max_tool_calls")),
        )

    def _output(self, reply: FakeReply, body: Mapping[str, Any], ids: Ids) -> list[dict[str, Any]]:
        output: list[dict[str, Any]] = []
        if reply.usage.reasoning_tokens:
            reasoning: dict[str, Any] = {"id": ids.new("rs_"), "type": "reasoning", "summary": []}
            include = body.get("include")
            if isinstance(include, list) and "reasoning.encrypted_content" in include:
                reasoning["encrypted_content"] = sign_thinking(reply.model)
            output.append(reasoning)
        output.extend(item for kind in reply.hosted if (item := _hosted_item(kind, ids)) is not None)
        call = reply.tool_call
        if call is None:
            part = {"type": "output_text", "text": reply.text, "annotations": [], "logprobs": []}
            output.append(
                {
                    "id": ids.new("msg_"),
                    "type": "message",
                    "status": "completed",
                    "role": "assistant",
                    "content": [part],
                }
            )
        else:
            output.append(
                {
                    "id": ids.new("fc_"),
                    "type": "function_call",
                    "status": "completed",
                    "arguments": call.arguments_json,
                    "call_id": ids.new("call_"),
                    "name": call.name,
                }
            )
        return output

    def _response(self, reply: FakeReply, body: Mapping[str, Any], ids: Ids) -> dict[str, Any]:
        reasoning = body.get("reasoning")
        return {
            "id": ids.new("resp_"),
            "object": "response",
            "created_at": int(time.time()),
            "status": "completed",
            "background": False,
            "error": None,
            "incomplete_details": None,
            "instructions": body.get("instructions"),
            "max_output_tokens": body.get("max_output_tokens"),
            "model": reply.model,
            "output": self._output(reply, body, ids),
            "parallel_tool_calls": body.get("parallel_tool_calls", True),
            "previous_response_id": body.get("previous_response_id"),
            "reasoning": reasoning if isinstance(reasoning, dict) else {"effort": None, "summary": None},
            "service_tier": "default",
            "store": body.get("store", True),
            "temperature": body.get("temperature", 1.0),
            "text": body.get("text") or {"format": {"type": "text"}},
            "tool_choice": body.get("tool_choice", "auto"),
            "tools": body.get("tools") or [],
            "top_p": body.get("top_p", 1.0),
            "truncation": body.get("truncation", "disabled"),
            "usage": usage_body(reply.usage),
            "user": None,
            "metadata": body.get("metadata") or {},
        }

    def complete(self, reply: FakeReply, body: Mapping[str, Any], ids: Ids) -> dict[str, Any]:
        return self._response(reply, body, ids)

    def frames(self, reply: FakeReply, body: Mapping[str, Any], ids: Ids) -> list[Frame]:
        done = self._response(reply, body, ids)
        sequence = itertools.count()
        frames: list[Frame] = []

        def emit(kind: str, content: bool = False, **fields: Any) -> None:
            event = {"type": kind, "sequence_number": next(sequence), **fields}
            frames.append((sse(kind, event), content))

        pending = {**done, "status": "in_progress", "output": [], "usage": None}
        emit("response.created", response=pending)
        emit("response.in_progress", response=pending)
        for index, item in enumerate(done["output"]):
            where = {"item_id": item["id"], "output_index": index}
            if item["type"] == "message":
                part = item["content"][0]
                emit(
                    "response.output_item.added",
                    output_index=index,
                    item={**item, "status": "in_progress", "content": []},
                )
                emit("response.content_part.added", **where, content_index=0, part={**part, "text": ""})
                for piece in reply.pieces:
                    emit(
                        "response.output_text.delta", True, **where, content_index=0, logprobs=[], delta=piece
                    )
                emit("response.output_text.done", **where, content_index=0, text=part["text"], logprobs=[])
                emit("response.content_part.done", **where, content_index=0, part=part)
            elif item["type"] == "function_call":
                emit(
                    "response.output_item.added",
                    output_index=index,
                    item={**item, "status": "in_progress", "arguments": ""},
                )
                for piece in reply.tool_call.pieces if reply.tool_call else []:
                    emit("response.function_call_arguments.delta", True, **where, delta=piece)
                emit(
                    "response.function_call_arguments.done",
                    **where,
                    name=item["name"],
                    arguments=item["arguments"],
                )
            else:
                emit("response.output_item.added", output_index=index, item=item)
            emit("response.output_item.done", output_index=index, item=item)
        emit("response.completed", response=done)
        return frames

    def failed_frame(self, reply: FakeReply, body: Mapping[str, Any], ids: Ids) -> bytes:
        """The ``response.failed`` event of a reply that failed once begun: what it used is billed."""
        failed = {**self._response(reply, body, ids), "status": "failed", "output": [],
                  "error": {"code": "server_error", "message": "fake upstream: the response failed"}}  # fmt: skip
        return sse("response.failed", {"type": "response.failed", "sequence_number": 0, "response": failed})

    def error_body(self, error: RouterError) -> dict[str, Any]:
        return error.openai_body()


def _hosted_item(kind: str, ids: Ids) -> dict[str, Any] | None:
    """The output item a call of a hosted tool leaves (None: a kind this server does not play)."""
    done = {"status": "completed"}
    if kind.startswith("web_search"):
        return {
            "id": ids.new("ws_"),
            "type": "web_search_call",
            **done,
            "action": {"type": "search", "query": "fake"},
        }
    if kind == "file_search":
        return {
            "id": ids.new("fs_"),
            "type": "file_search_call",
            **done,
            "queries": ["fake"],
            "results": None,
        }
    if kind == "code_interpreter":
        return {"id": ids.new("ci_"), "type": "code_interpreter_call", **done, "code": "print(1)",
                "container_id": ids.new("cntr_"), "outputs": []}  # fmt: skip
    if kind == "image_generation":
        return {"id": ids.new("ig_"), "type": "image_generation_call", **done, "result": ""}
    return None
