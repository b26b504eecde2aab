"""What the three client protocols have in common once parsed.

Each protocol module turns raw body bytes into a ``ClientRequest``: the validated body reduced to
the fields a provider may receive (an allow-list, so a client can never steer the upstream URL,
key or headers), plus the few facts the router needs for routing, task identity and the log.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from itertools import islice
from typing import Annotated, Any, TypeVar

import orjson
from pydantic import BaseModel, Field, ValidationError

from router.errors import BadRequest, UpstreamError

M = TypeVar("M", bound=BaseModel)

OPENAI_CHAT = "openai_chat"
ANTHROPIC = "anthropic"
OPENAI_RESPONSES = "openai_responses"

#: The backend protocol family that can take each client protocol without translation.
FAMILY = {OPENAI_CHAT: "openai", ANTHROPIC: "anthropic", OPENAI_RESPONSES: "openai_responses"}

MAX_TOKENS_CAP = 10_000_000
#: The most tools a request may offer. OpenAI refuses more than 128 (``array_above_max_length``),
#: and clients with many MCP servers have sent 150-400; every tool is validated, sized, hashed and
#: read for hosted kinds, and 120,000 of them (20 MB) held the event loop, or the thread that
#: parses large bodies, for seconds (pydantic validates the list in one call that never lets go).
MAX_TOOLS = 4096
# Strict: the body is forwarded as the client sent it, so a value the router reads as a number
# or a flag must already be one ("1000" or true for max_tokens would reach the provider as such).
MaxTokens = Annotated[int, Field(gt=0, le=MAX_TOKENS_CAP, strict=True)]
Flag = Annotated[bool, Field(strict=True)]


@dataclass(slots=True)
class ClientRequest:
    protocol: str
    #: The allow-listed body; ``model`` is still the client's requested name.
    body: dict[str, Any]
    model: str
    stream: bool
    #: Conversation items in protocol shape (messages, or Responses input items).
    messages: list[Any]
    system: Any
    tools: list[Any]
    max_output_tokens: int | None
    temperature: float | None
    top_p: float | None
    reasoning_effort: str | None = None
    thinking_budget: int | None = None
    thinking: bool = False
    vision: bool = False
    #: The conversation names a part the provider fetches or keeps, which the router cannot size
    #: (``router.protocols.fetched``).
    unseen: bool = False
    #: The first user message's text: with the system prompt, the default task identity.
    first_user_text: str = ""
    #: The system prompt's text, whatever its protocol's shape (a string, blocks, system messages).
    system_text: str = ""
    #: A session id the client sent (Claude Code's metadata.user_id, Responses prompt_cache_key).
    session_hint: str | None = None
    #: OpenAI chat only: whether the client asked for the usage chunk.
    include_usage: bool = False
    #: Anthropic only: whether an assistant message carries a signed block, as read when parsed
    #: (``scan_messages``); None: not read there.
    signed_blocks: bool | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    #: Each top-level value of the client's body and its JSON, made when the body was parsed (the
    #: nesting check encodes it anyway): the relay sends these bytes for a value it forwards as it
    #: is (``forward.upstream.provider_json``) instead of encoding the conversation a second time.
    #: So nothing changes a parsed value in place: a changed one is a new object.
    encoded: dict[str, tuple[Any, bytes]] = field(default_factory=dict)
    #: ``system_sha256``, once made: the task's identity and the log record both read it.
    _system_sha256: str | None = field(default=None, init=False, repr=False, compare=False)
    #: ``tools_sha256``, once made (for a large body, on the thread that parsed it).
    _tools_sha256: str | None = field(default=None, init=False, repr=False, compare=False)

    def tools_sha256(self) -> str | None:
        if not self.tools:
            return None
        if self._tools_sha256 is None:
            self._tools_sha256 = sha256_json(self.tools)
        return self._tools_sha256

    def system_sha256(self) -> str | None:
        if not self.system:
            return None
        if self._system_sha256 is None:
            self._system_sha256 = sha256_json(self.system)
        return self._system_sha256


@dataclass(slots=True)
class Usage:
    """Token counts as the provider reported them, and what it said about its reply.

    ``input_tokens`` counts every prompt token, cached ones included (OpenAI's convention);
    Anthropic's split counts are added up into it so that every protocol logs alike.
    """

    input_tokens: int | None = None
    output_tokens: int | None = None
    cache_read_tokens: int | None = None
    cache_write_tokens: int | None = None
    #: Of ``cache_write_tokens``, those cached for an hour (Anthropic's ``ttl: "1h"``), which cost
    #: more to write than the five-minute ones.
    cache_write_1h_tokens: int | None = None
    reasoning_tokens: int | None = None
    provider_model: str | None = None
    #: The provider's id of its reply.
    response_id: str | None = None
    #: Why the reply ended, in the protocol's words (``stop``, ``length``, ``end_turn``, ``completed``, ...).
    finish_reasons: list[str] = field(default_factory=list)
    #: Calls of hosted tools the reply shows, by kind (``router.protocols.hosted``): billed per call.
    tool_calls: dict[str, int] = field(default_factory=dict)

    @property
    def known(self) -> bool:
        return self.input_tokens is not None or self.output_tokens is not None


def one_hour_writes(breakdown: Any) -> int | None:
    """The prompt tokens written to the cache for an hour, from Anthropic's ``cache_creation``
    breakdown (litellm's translation calls it ``cache_creation_token_details``)."""
    value = breakdown.get("ephemeral_1h_input_tokens") if isinstance(breakdown, dict) else None
    return value if isinstance(value, int) else None


def sha256_json(value: Any) -> str:
    return hashlib.sha256(orjson.dumps(value, option=orjson.OPT_SORT_KEYS)).hexdigest()


def load_json(raw: bytes) -> dict[str, Any]:
    return load_body(raw)[0]


def load_body(raw: bytes) -> tuple[dict[str, Any], dict[str, tuple[Any, bytes]]]:
    """The body as a JSON object, and each top-level value with its JSON (``ClientRequest.encoded``)."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"request body is not valid JSON: {exc.args[0]}") from None
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    tools = body.get("tools")
    if type(tools) is list and len(tools) > MAX_TOOLS:
        raise BadRequest(f"tools: at most {MAX_TOOLS} tools, got {len(tools)}", param="tools")
    encoded = {}
    try:
        # The body is encoded again on its way to a provider, and orjson writes at most 255 levels
        # (it reads 1024): a deeper body is refused here, not with a 500 at forwarding time. Each
        # value is encoded inside a list, one level down as in the body, so exactly the bodies
        # orjson could not write whole are refused.
        for key, value in body.items():
            encoded[key] = value, orjson.dumps((value,))[1:-1]
    except orjson.JSONEncodeError:
        raise BadRequest(
            "request body is nested too deeply (at most 255 levels of arrays and objects)"
        ) from None
    return body, encoded


def validated(model: type[M], body: dict[str, Any]) -> M:
    """The body validated against ``model``, or a 400 naming the first few bad fields."""
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        # ``param`` names the first bad field, as the checks by hand do and as OpenAI's errors do.
        loc = exc.errors()[0]["loc"] if exc.errors() else ()
        raise BadRequest(validation_message(exc), param=str(loc[0]) if loc else None) from None


#: How pydantic names the member of a union (``str | list[...]``) an error came from, inside its location.
_UNION_MEMBER = re.compile(r"(str|int|float|bool|list|dict)(\[.*\])?")
_OUR_CLASS = re.compile(r" or instance of \w+$")


def validation_message(exc: ValidationError) -> str:
    """The first few pydantic errors as ``field.path: message`` without echoing input values.

    A field that takes one of two shapes (the Responses ``input``, Anthropic's ``system``) failed
    each, and said so in pydantic's words: "input.str: Input should be a valid string;
    input.list[dict[str,any]].0: Input should be a valid dictionary". Where the value had one of
    the shapes, only that shape's errors are said; where it had none, one line names them all."""
    members: dict[tuple[Any, ...], list[tuple[tuple[Any, ...], str, str]]] = {}
    plain: list[tuple[tuple[Any, ...], str]] = []
    for err in exc.errors():
        loc = tuple(err["loc"])
        at = next(
            (i for i, p in enumerate(loc) if i and isinstance(p, str) and _UNION_MEMBER.fullmatch(p)), None
        )
        if at is None:
            plain.append((loc, err["msg"]))
        else:
            members.setdefault(loc[:at], []).append((loc[:at] + loc[at + 1 :], err["type"], err["msg"]))
    for name, errs in members.items():
        # A member's type error at the field itself: the value is not of that shape.
        shaped = [(loc, msg) for loc, kind, msg in errs if not (loc == name and kind.endswith("_type"))]
        if shaped:
            plain.extend(shaped)
        else:
            shapes = " or ".join(m.removeprefix("Input should be ") for _, _, m in errs)
            plain.append((name, f"Input should be {shapes}"))
    parts = []
    for loc, given in plain[:3]:
        # "a valid dictionary or instance of _Function": the class is ours, not the client's to know.
        msg = _OUR_CLASS.sub("", given)
        where = ".".join(str(p) for p in loc)
        parts.append(f"{where}: {msg}" if where else msg)
    return "invalid request: " + "; ".join(parts)


def shown(value: Any) -> str:
    """A client's value in an error message: its repr, cut short (never a whole payload)."""
    text = repr(value)
    return text if len(text) <= 40 else text[:39] + "…"


#: OpenAI's service tiers billed at most at the standard prices the catalog holds ("auto": the
#: project's own setting). "priority" costs about twice as much, and budgets count catalog prices.
CATALOG_TIERS = ("auto", "default", "flex")


def not_json(value: Any) -> bool:
    """Whether ``value``, present, is not text that parses as JSON (a tool call's arguments; read
    as litellm reads them: no text, or only white space, is no arguments)."""
    if value is None:
        return False
    if not isinstance(value, str):
        return True
    if not value.strip():
        return False
    try:
        json.loads(value)
    except ValueError:
        return True
    return False


def check_service_tier(tier: Any) -> None:
    """A client may not pick a tier billed above the catalog's prices: a key would spend about
    twice what its budget counted."""
    if tier is not None and tier not in CATALOG_TIERS:
        raise BadRequest(
            f"invalid request: service_tier: {shown(tier)} is not accepted here: this router prices "
            f"calls at standard rates, which its budgets count; use one of {', '.join(CATALOG_TIERS)}",
            param="service_tier",
        )


def allow(body: dict[str, Any], allowed: frozenset[str]) -> dict[str, Any]:
    return {k: v for k, v in body.items() if k in allowed}


#: Gemini CLI and Qwen Code (its fork) open every session with a context turn before the task: a
#: user message with the date, the system and the folder's listing, and a reply the client writes
#: itself. Taken for the task's opening, it made every session in one folder on one day one task.
_CONTEXT_TURN = "We are setting up the context for our chat."
_CONTEXT_REPLY = "Got it. Thanks for the context!"


def first_user_text(messages: list[Any]) -> str:
    """The text of the message that opens the task: the first user message, or the one after a
    client's context turn (``_CONTEXT_TURN`` answered by its canned ``_CONTEXT_REPLY``)."""
    # The first two user messages only: a long agent conversation passes here on every request.
    users = list(
        islice((i for i, m in enumerate(messages) if isinstance(m, dict) and m.get("role") == "user"), 2)
    )
    if not users:
        return ""
    first = text_of(messages[users[0]].get("content"))
    after = users[0] + 1
    if (
        len(users) > 1
        and _CONTEXT_TURN in first[:200]
        and isinstance(messages[after], dict)
        and messages[after].get("role") == "assistant"
        and text_of(messages[after].get("content")).strip() == _CONTEXT_REPLY
    ):
        return text_of(messages[users[1]].get("content"))
    return first


def text_of(content: Any) -> str:
    """Plain text of a message's content in any of the three protocols' shapes."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        out = []
        for part in content:
            if isinstance(part, dict):
                t = part.get("text")
                if isinstance(t, str):
                    out.append(t)
            elif isinstance(part, str):
                out.append(part)
        return "\n".join(out)
    return ""


def has_image(content: Any) -> bool:
    if not isinstance(content, list):
        return False
    return any(isinstance(p, dict) and p.get("type") in _IMAGES for p in content)


_IMAGES = ("image", "image_url", "input_image")


#: A protocol's content part types, each with what a part of that type must carry: a field and
#: the type(s) its value must have (None: nothing checked beyond the type).
PartKinds = Mapping[str, tuple[str, type | tuple[type, ...]] | None]


def part_problem(part: dict[str, Any], kinds: PartKinds, noun: str = "content part") -> str | None:
    """What is wrong with one content part, as ``.type: ...`` or ``.field: ...`` (None: nothing).

    A part of a type the protocol does not have, or without the field its type is for, failed at
    the backend (a 400 in the provider's words, or a 500 from translation) or was dropped there."""
    kind = part.get("type")
    if not isinstance(kind, str) or kind not in kinds:
        return ".type: required" if kind is None else f".type: unknown {noun} type {shown(kind)}"
    need = kinds[kind]
    if need is not None and not isinstance(part.get(need[0]), need[1]):
        return f".{need[0]}: required in a {noun} of type {kind}, as {_json_type(need[1])}"
    return None


def _json_type(t: type | tuple[type, ...]) -> str:
    kinds = t if isinstance(t, tuple) else (t,)
    return " or ".join("a string" if x is str else "an object" if x is dict else x.__name__ for x in kinds)


def check_parts(
    items: list[Any],
    kinds: PartKinds,
    field: str,
    noun: str = "content part",
    only: Callable[[Any], bool] | None = None,
) -> None:
    """Every content part of every item (``only``: of those it accepts) is one ``kinds`` knows,
    shaped as its type needs; the first that is not is a 400 naming it."""
    for i, item in enumerate(items):
        content = item.get("content") if isinstance(item, dict) and (only is None or only(item)) else None
        if isinstance(content, list):
            for j, part in enumerate(content):
                if isinstance(part, dict) and (problem := part_problem(part, kinds, noun)) is not None:
                    raise BadRequest(f"invalid request: {field}.{i}.content.{j}{problem}", param=field)


def scan_messages(
    messages: Any, roles: frozenset[str], *, content_optional: bool, kinds: PartKinds | None = None
) -> tuple[bool, bool] | None:
    """Whether a message's content holds an image (``has_image``), and whether an assistant message
    holds a signed block (Anthropic's ``thinking`` with a signature, ``redacted_thinking``), read in
    the pass that checks what ``check_messages`` checks (and with ``kinds``, what ``check_parts``
    checks): a conversation is walked once, not once per question. None when any check fails: the
    caller then runs the checks themselves, which say what is wrong (as they always did, first
    failure first)."""
    if not isinstance(messages, list) or not messages:
        return None
    vision = signed = False
    try:
        for m in messages:
            role = m.get("role") if isinstance(m, dict) else None
            if role not in roles:
                return None
            content = m.get("content")
            if content is None:
                if not content_optional:
                    return None
            elif isinstance(content, list):
                for part in content:
                    if not isinstance(part, dict):
                        return None
                    kind = part.get("type")
                    if kinds is not None:
                        if not isinstance(kind, str) or kind not in kinds:
                            return None
                        need = kinds[kind]
                        if need is not None and not isinstance(part.get(need[0]), need[1]):
                            return None
                    if kind in _IMAGES:
                        vision = True
                    elif role == "assistant" and (
                        kind == "redacted_thinking" or (kind == "thinking" and part.get("signature"))
                    ):
                        signed = True
            elif not isinstance(content, str):
                return None
    except TypeError:  # an unhashable role or type: the checks report it as they always did
        return None
    return vision, signed


def check_messages(
    messages: Any, roles: frozenset[str], *, content_optional: bool, field: str = "messages"
) -> None:
    """Validate a conversation's shape by hand: on a long agent conversation this runs on every
    request, and a loop over plain dicts costs a fraction of building a model per message."""
    if not isinstance(messages, list) or not messages:
        raise BadRequest(f"invalid request: {field}: must be a non-empty list", param=field)
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise BadRequest(f"invalid request: {field}.{i}: must be an object", param=field)
        # A role of a list or an object cannot be looked up in a set: a TypeError, a 500, before.
        if not isinstance(role := m.get("role"), str) or role not in roles:
            allowed = ", ".join(sorted(roles))
            raise BadRequest(f"invalid request: {field}.{i}.role: must be one of {allowed}", param=field)
        content = m.get("content")
        if content is None:
            if not content_optional:
                raise BadRequest(f"invalid request: {field}.{i}.content: required", param=field)
        elif not isinstance(content, str) and not (
            isinstance(content, list) and all(isinstance(p, dict) for p in content)
        ):
            raise BadRequest(
                f"invalid request: {field}.{i}.content: must be a string or a list of content blocks",
                param=field,
            )


def error_message(said: Any) -> str:
    """The message of an error a backend put in its stream (``{"message": ...}`` in every protocol)."""
    if isinstance(said, dict) and isinstance(said.get("message"), str):
        return str(said["message"])
    return orjson.dumps(said).decode()[:500]


def event_json(data: bytes) -> Any:
    """A stream event's JSON payload; a payload that is not JSON is the backend's failure.

    Relayed as it was, it would reach the client as a success it cannot parse; raised, it is
    fallen back from before the commit point and ends the stream with an error event after it.
    """
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        raise UpstreamError(f"the backend sent a stream event that is not JSON ({len(data)} bytes)") from None
