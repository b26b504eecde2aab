"""OpenAI Responses: request validation, usage, stream observation, error events.

Only the stateless mode (``store: false`` or no reliance on stored responses) is served: the
router keeps no responses, so ``previous_response_id`` (and an ``item_reference`` input item, a
stored item by its id) is refused with a 400 that says so.
"""

from __future__ import annotations

from typing import Annotated, Any

import orjson
from pydantic import BaseModel, ConfigDict, Field

from router.errors import BadRequest, RouterError
from router.protocols.common import (
    OPENAI_RESPONSES,
    ClientRequest,
    Flag,
    MaxTokens,
    PartKinds,
    Usage,
    allow,
    check_parts,
    check_service_tier,
    error_message,
    event_json,
    first_user_text,
    has_image,
    load_body,
    not_json,
    shown,
    text_of,
    validated,
)
from router.protocols.fetched import names_unseen
from router.protocols.hosted import counted, item_kind, most, responses_calls
from router.protocols.pausedgc import collector_paused
from router.protocols.toolschema import check_responses_tools

ALLOWED = frozenset(
    {
        "model", "input", "instructions", "tools", "tool_choice", "parallel_tool_calls", "reasoning",
        "max_output_tokens", "temperature", "top_p", "text", "stream", "store", "include",
        "prompt_cache_key", "truncation", "user", "metadata", "service_tier", "max_tool_calls",
    }
)  # fmt: skip


#: The input item types of the Responses API (the SDK's ``ResponseInputItemParam``;
#: ``tests/unit/test_protocols.py`` checks the installed SDK's). Another type is refused here,
#: naming where it is: forwarded, it came back as some backend's unrelated complaint.
ITEM_TYPES = frozenset(
    {
        "message", "file_search_call", "computer_call", "computer_call_output", "web_search_call",
        "function_call", "function_call_output", "tool_search_call", "tool_search_output",
        "additional_tools", "configuration_update", "reasoning", "compaction", "compaction_trigger",
        "image_generation_call", "code_interpreter_call", "local_shell_call", "local_shell_call_output",
        "shell_call", "shell_call_output", "apply_patch_call", "apply_patch_call_output",
        "mcp_list_tools", "mcp_approval_request", "mcp_approval_response", "mcp_call",
        "custom_tool_call", "custom_tool_call_output", "item_reference", "program", "program_output",
    }
)  # fmt: skip
#: Content part types of a message item, and what each must carry (``PartKinds``).
PART_TYPES: PartKinds = {
    "input_text": ("text", str),
    "output_text": ("text", str),
    "input_image": None,  # an image_url or a file_id
    "input_file": None,
    "input_audio": ("input_audio", dict),
    "refusal": ("refusal", str),
    "summary_text": ("text", str),
    "reasoning_text": ("text", str),
}
#: A message item's roles (an item with a role and no type is a message).
ROLES = frozenset({"user", "assistant", "system", "developer"})


class _Reasoning(BaseModel):
    model_config = ConfigDict(extra="allow")
    effort: str | None = None


class _Request(BaseModel):
    model_config = ConfigDict(extra="allow")
    model: Annotated[str, Field(min_length=1, max_length=256)]
    input: str | Annotated[list[dict[str, Any]], Field(min_length=1)]
    instructions: str | None = None
    stream: Flag | None = False
    tools: list[dict[str, Any]] | None = None
    temperature: Annotated[float, Field(ge=0, le=2, strict=True)] | None = None
    top_p: Annotated[float, Field(ge=0, le=1, strict=True)] | None = None
    max_output_tokens: MaxTokens | None = None
    reasoning: _Reasoning | None = None
    previous_response_id: str | None = None
    prompt_cache_key: str | None = None
    #: The most calls of hosted tools the reply may make, all kinds together.
    max_tool_calls: Annotated[int, Field(ge=0, strict=True)] | None = None


@collector_paused
def parse(raw: bytes) -> ClientRequest:
    body, encoded = load_body(raw)
    req = validated(_Request, body)
    if req.previous_response_id:
        raise BadRequest(
            "previous_response_id is not supported: this router keeps no responses (stateless mode); "
            "send the whole conversation in input with store: false",
        )
    check_service_tier(body.get("service_tier"))
    check_responses_tools(req.tools)
    items = [{"role": "user", "content": req.input}] if isinstance(req.input, str) else body["input"]
    check_items(items)
    effort = req.reasoning.effort if req.reasoning else None
    return ClientRequest(
        protocol=OPENAI_RESPONSES,
        encoded=encoded,
        body=allow(body, ALLOWED),
        model=req.model,
        stream=bool(req.stream),
        messages=items,
        system=req.instructions,
        tools=body.get("tools") or [],
        max_output_tokens=req.max_output_tokens,
        temperature=req.temperature,
        top_p=req.top_p,
        reasoning_effort=effort,
        thinking=effort not in (None, "none", "minimal"),
        vision=any(has_image(i.get("content")) for i in items),
        unseen=names_unseen(encoded.get("input")),
        first_user_text=first_user_text(items),
        system_text=text_of(req.instructions),
        session_hint=req.prompt_cache_key,
    )


def check_items(items: list[dict[str, Any]]) -> None:
    """Every input item is of a type the Responses API knows, and a message has a known role.

    Only the item's type (and a message's role, content's shape and parts' types, and that a
    text part has its text) is checked: fields an item does not declare pass through as before. Content of another
    shape failed in translation on every backend, as if each were down."""
    for i, item in enumerate(items):
        kind = item.get("type")
        if kind is None and "role" not in item:
            raise BadRequest(f"invalid request: input.{i}.type: required", param="input")
        # A type or role of a list or an object cannot be looked up in a set: a 500 before.
        if kind is not None and (not isinstance(kind, str) or kind not in ITEM_TYPES):
            raise BadRequest(
                f"invalid request: input.{i}.type: unknown item type {shown(kind)}", param="input"
            )
        if kind == "item_reference":
            # An item the provider stored from an earlier response, as previous_response_id names
            # one: the router sees none of its tokens, so it neither sized the prompt for the
            # window nor held its price in the budgets (a reference to a long reply, repeated,
            # was a prompt of any size held as a few tokens).
            raise BadRequest(
                f"invalid request: input.{i}: item_reference is not supported: this router keeps no "
                "responses (stateless mode) and cannot see or price what one refers to; send the item itself",
                param="input",
            )  # fmt: skip
        if (kind is None or kind == "message") and (
            not isinstance(role := item.get("role"), str) or role not in ROLES
        ):
            raise BadRequest(
                f"invalid request: input.{i}.role: must be one of {', '.join(sorted(ROLES))}", param="input"
            )
        if (kind is None or kind == "message") and not _content_shaped(item.get("content")):
            raise BadRequest(
                f"invalid request: input.{i}.content: must be a string or a list of content parts",
                param="input",
            )
    check_parts(items, PART_TYPES, "input", only=lambda item: item.get("type", "message") == "message")


def _content_shaped(content: Any) -> bool:
    # Missing content is the backend's to refuse (it answers a 400 the client gets as is).
    return (
        content is None
        or isinstance(content, str)
        or (isinstance(content, list) and all(isinstance(p, dict) for p in content))
    )


def usage_from(response: dict[str, Any]) -> Usage:
    u = response.get("usage") or {}
    return Usage(
        input_tokens=u.get("input_tokens"),
        output_tokens=u.get("output_tokens"),
        cache_read_tokens=(u.get("input_tokens_details") or {}).get("cached_tokens"),
        reasoning_tokens=(u.get("output_tokens_details") or {}).get("reasoning_tokens"),
        provider_model=response.get("model"),
        response_id=response.get("id"),
        # The Responses API has a status, not a finish reason; an incomplete one says why.
        finish_reasons=[str(ended)] if (ended := _ended_because(response)) else [],
        tool_calls=responses_calls(response.get("output"), response.get("tools")),
    )


def _ended_because(response: dict[str, Any]) -> Any:
    if response.get("status") == "incomplete":
        return (response.get("incomplete_details") or {}).get("reason") or "incomplete"
    return response.get("status") if response.get("status") != "in_progress" else None


#: The events that carry what the model writes (each a ``delta``): a stream cut before its usage
#: is charged for what they carried. A custom tool's input (Codex's apply_patch), a code
#: interpreter's code and a shell call's command are written output too: left out, a stream cut
#: while a patch was written was charged none of it.
_CONTENT_EVENTS = frozenset(
    {
        "response.output_text.delta",
        "response.function_call_arguments.delta",
        "response.custom_tool_call_input.delta",
        "response.code_interpreter_call_code.delta",
        "response.shell_call_command.delta",
        "response.reasoning_summary_text.delta",
        "response.reasoning_text.delta",
        "response.refusal.delta",
        "response.audio.transcript.delta",
    }
)


class StreamObserver:
    def __init__(self) -> None:
        self.usage = Usage()
        self.done = False
        self.error: str | None = None
        self.written: list[Any] = []
        #: The request's tools (as ``response.created`` echoes them) and the hosted calls begun:
        #: a stream cut before its final event is charged for those.
        self._tools: Any = None
        self._calls: set[tuple[str, str]] = set()

    def observe(self, event: str | None, data: bytes) -> bool:
        if event in _CONTENT_EVENTS:
            said = event_json(data)
            self.written.append(said.get("delta") if isinstance(said, dict) else None)
            return True
        if event == "error":
            self.error = error_message(event_json(data))
            return False
        if event in ("response.completed", "response.incomplete"):
            self.done = True
        if event == "response.output_item.added":
            said = event_json(data)
            if isinstance(said, dict) and (call := item_kind(said.get("item"), self._tools)) is not None:
                self._calls.add(call)
                self.usage.tool_calls = counted(self._calls)
        elif event in ("response.completed", "response.incomplete", "response.failed", "response.created"):
            try:
                resp = event_json(data).get("response") or {}
            except AttributeError:
                return False
            if event == "response.failed":
                # A failure, not an end: the client has the event, and the usage in it is billed.
                self.error = error_message(resp.get("error") or {"message": "the response failed"})
            if event == "response.created":
                self.usage.provider_model, self.usage.response_id = resp.get("model"), resp.get("id")
                self._tools = resp.get("tools")
            else:
                begun = self.usage.tool_calls
                self.usage = usage_from(resp)
                self.usage.tool_calls = most(self.usage.tool_calls, begun)
        return False


def error_frame(err: RouterError) -> bytes:
    body = {
        "type": "response.failed",
        "response": {
            "object": "response",
            "status": "failed",
            "error": {"code": err.code or err.openai_type, "message": err.message},
        },
    }
    return b"event: response.failed\ndata: " + orjson.dumps(body) + b"\n\n"


def untranslatable(body: dict[str, Any]) -> tuple[str, str] | None:
    """What of a Responses request its translation to a Chat Completions or Anthropic backend
    (litellm's) cannot carry, as ``openai_chat.untranslatable`` says it: a function call's
    arguments that are not JSON, or a tool of a type other than function. Read once a translation
    has failed."""
    items = body.get("input")
    for i, item in enumerate(items if isinstance(items, list) else ()):
        if isinstance(item, dict) and item.get("type") == "function_call" and not_json(item.get("arguments")):
            return f"input.{i}.arguments: function call arguments that are not JSON text", "input"
    for i, tool in enumerate(body.get("tools") or ()):
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind != "function":
            return f"tools.{i}.type: a tool of type {shown(kind)}", "tools"
    return None
