"""Request → Features: the facts every routing decision is made from, built once per request."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import orjson

#: The features a policy's rules may name (``headers.<name>`` reads a request header, lower-case).
RULE_FIELDS = (
    "protocol",
    "requested_model",
    "prompt_tokens",
    "max_output_tokens",
    "tools",
    "n_tools",
    "thinking",
    "vision",
    "stream",
    "n_messages",
    "side_call",
)


@dataclass(frozen=True, slots=True)
class Features:
    protocol: str
    requested_model: str
    #: The prompt's estimate: ``prompt_anchor`` tokens counted by ``anchor_model``'s provider, the
    #: rest in o200k tokens (each backend's count: ``router.policy.estimates``).
    prompt_tokens: int
    #: What the client allows the reply to use, if it said.
    max_output_tokens: int | None
    tools: bool
    n_tools: int
    thinking: bool
    vision: bool
    stream: bool
    n_messages: int
    side_call: bool = False
    headers: Mapping[str, str] = field(default_factory=dict)
    # The task's context (from ``router.features.task.context``; the defaults describe a fresh task).
    task_vector: Mapping[int, float] | None = None
    attempt: int = 1
    failed_models: tuple[str, ...] = ()
    #: The model this attempt is pinned to, if it has started.
    pinned: str | None = None
    #: Why the pinned model should be left (a loop, repeated tool failures), if anything says so.
    switch_reason: str | None = None
    #: The models this attempt left before: a switch goes on to another while one can take it.
    left_models: tuple[str, ...] = ()
    #: The history carries provider-signed state (thinking signatures, encrypted reasoning) that
    #: only this protocol family's pinned backend may receive back.
    signed_history: str | None = None
    #: What is left of the task's budget, and of the calling key's, after the money held in flight.
    task_budget_left: float | None = None
    key_budget_left: float | None = None
    #: The backend holding this task's warm prompt prefix, and how many tokens of it; what that
    #: backend reported cached of the call that left it warm (None: not reported, or not known here).
    warm_model: str | None = None
    warm_tokens: int = 0
    warm_cached: int | None = None
    #: The part of ``prompt_tokens`` in ``anchor_model``'s provider tokens (the rest is o200k);
    #: None: the whole estimate is taken as any backend's count (nothing is converted).
    prompt_anchor: int | None = None
    anchor_model: str | None = None
    #: Characters of what the model is answering (the items after its last turn) and of that
    #: last turn (None: it has not spoken yet); None: not measured. The expected output reads them.
    turn_chars: tuple[int, int | None] | None = None
    #: The program the model's last turn ran (``turn_verb``); None: none, or not measured.
    turn_verb: str | None = None
    #: The kinds of the hosted tools the request declares (``router.protocols.hosted``), which
    #: the provider bills per call.
    hosted_tools: tuple[str, ...] = ()
    #: The most calls of those kinds the request allows, (kind, calls), where it caps them
    #: (``hosted.max_uses``).
    hosted_max_uses: tuple[tuple[str, int], ...] = ()
    #: The prompt names a part the provider fetches or keeps (``router.protocols.fetched``): its
    #: size is not in ``prompt_tokens``, and may be up to a backend's whole window.
    unseen: bool = False

    def for_rules(self) -> dict[str, Any]:
        """The mapping that rule conditions read (names as in the policy file)."""
        facts: dict[str, Any] = {name: getattr(self, name) for name in RULE_FIELDS}
        facts["headers"] = self.headers
        return facts


#: The Responses items the model wrote (Chat's and Messages' are the assistant's messages).
#: A tuple, not a set: a client's "type" may be a list or an object (a chat message's is not read by
#: its parser), which a set cannot look up (a TypeError, a 500).
_MODEL_TYPES: Final = ("function_call", "reasoning")


def turn_shape(messages: Sequence[Any]) -> tuple[int, int | None, str | None]:
    """``turn_chars`` and ``turn_verb`` of a request, in one walk of its tail (what the pipeline
    reads). The model-item test is inlined: on every request, its calls were a fifth of the walk."""
    if not isinstance(messages, list):
        # As PromptSizer.measure takes it: one item (a string walked as a sequence is one call a character).
        messages = [messages]
    new, k = 0, len(messages) - 1
    while k >= 0:
        item = messages[k]
        if isinstance(item, dict) and (item.get("role") == "assistant" or item.get("type") in _MODEL_TYPES):
            break
        new += _chars(item)
        k -= 1
    if k < 0:
        return new, None, None
    reply, verb = 0, None
    while k >= 0:
        item = messages[k]
        if not isinstance(item, dict) or (
            item.get("role") != "assistant" and item.get("type") not in _MODEL_TYPES
        ):
            break
        content = item.get("content")
        if isinstance(content, str) and not item.get("tool_calls"):
            # A text turn, the text protocol's every turn: measured and read here, once.
            reply += len(content)
            if verb is None:
                verb = _text_verb(content)
        else:
            reply += _chars(item)
            if verb is None:
                verb = _item_verb(item)
        k -= 1
    return new, reply, verb


def turn_chars(messages: Sequence[Any]) -> tuple[int, int | None]:
    """(characters of the items after the model's last turn, characters of that turn or None).

    What an agent's next reply length follows: a short tool result (an edit went through) gets a
    short reply, a long one (a file was read) a longer one, and a long last reply (a script was
    written) is often followed by another. Only the tail is read: it costs the same on any history.
    """
    new, reply, _ = turn_shape(messages)
    return new, reply


def turn_verb(messages: Sequence[Any]) -> str | None:
    """The program the model's last turn ran: the first word of its shell command (a text turn's
    ``bash`` block, a tool call's ``command`` argument), else the name of the tool it called.

    What it does next follows: after ``cat`` or ``sed -n`` (a file read) it often writes an edit, a
    long reply; after ``grep`` or ``ls`` it reads on, a short one. None: it ran nothing, or has not
    spoken. Only the last turn is read."""
    return turn_shape(messages)[2]


#: A command's program: after up to 4 environment assignments (``PYTHONPATH=. python x.py``), its
#: first word, the directory dropped (``/usr/bin/python3`` is ``python3``). A verb keys a learned
#: table and the log, so it is a short plain word or nothing: whatever else a client wrote stays out.
_PROGRAM: Final = re.compile(r"\s*(?:[^\s=]*=\S*\s+){0,4}(?:\S*/)?([\w.+-]{1,32})(?:\s|$)", re.ASCII)
#: How far into a command its program is looked for (a bound on the match's work on any input).
_PROGRAM_CHARS: Final = 400
_NAME: Final = re.compile(r"[\w.+-]{1,32}", re.ASCII)
#: The start of a JSON key's value: a string's quote or a list's bracket.
_JSON_VALUE: Final = re.compile(r'\s*:\s*(["[])')


def _item_verb(item: dict[str, Any]) -> str | None:
    calls = item.get("tool_calls")
    if isinstance(calls, list) and calls and isinstance(calls[0], dict):  # Chat
        fn = calls[0].get("function")
        if isinstance(fn, dict):
            return _call_verb(fn.get("name"), fn.get("arguments"))
    if item.get("type") == "function_call":  # Responses
        return _call_verb(item.get("name"), item.get("arguments"))
    content = item.get("content")
    if isinstance(content, str):
        return _text_verb(content)
    if isinstance(content, list):  # Messages: text and tool_use blocks
        for block in content:
            if isinstance(block, dict):
                if block.get("type") == "tool_use":
                    return _call_verb(block.get("name"), block.get("input"))
                if block.get("type") == "text" and isinstance(block.get("text"), str):
                    verb = _text_verb(block["text"])
                    if verb is not None:
                        return verb
    return None


def _call_verb(name: Any, arguments: Any) -> str | None:
    if isinstance(arguments, str):  # Chat and Responses send the arguments as JSON text
        arguments = _json_command(arguments)
    command = arguments.get("command") if isinstance(arguments, dict) else None
    if isinstance(command, list) and command:  # exec-style tools: ["bash", "-lc", "..."]
        command = command[-1] if command[0] in ("bash", "sh") else command[0]
    verb = _command_verb(command) if isinstance(command, str) else None
    return verb if verb is not None else _clean(name)


def _json_command(arguments: str) -> dict[str, Any] | None:
    """``{"command": ...}`` of a call's JSON arguments. A string command is read in place: a tool
    call can carry a whole file (a heredoc), and parsing all of it would cost more than the rest of
    the request's features."""
    at = arguments.find('"command"')
    if at < 0:
        return None
    m = _JSON_VALUE.match(arguments, at + 9)
    if m is None:
        return None
    if m[1] == '"':
        return {"command": arguments[m.end() : m.end() + _PROGRAM_CHARS]}
    try:
        parsed = orjson.loads(arguments)
    except orjson.JSONDecodeError:
        return None
    return parsed if isinstance(parsed, dict) else None


def _text_verb(text: str) -> str | None:
    """The program of a text turn's last ``bash`` (or ``sh``) block, searched from the end, where an
    agent's command follows its thought."""
    start = text.rfind("```bash")
    if start < 0:
        start = text.rfind("```sh")
        if start < 0:
            return None
    end = start + _PROGRAM_CHARS
    line = text.find("\n", start, end)  # the fence's line ends within the bound, as _FENCED's does
    return None if line < 0 else _program(text, line + 1, min(end, len(text)))


def _command_verb(command: str) -> str | None:
    return _program(command, 0, min(_PROGRAM_CHARS, len(command)))


def _program(text: str, at: int, end: int) -> str | None:
    """``_PROGRAM``'s program of the command at ``text[at:end]``. Most commands start with a plain
    word and a space (``cat a.py``, ``sed -n 1,9p``): that word is the program, taken without the
    regular expression, whose match cost more than the rest of the turn's features together."""
    head, space, _ = text[at : min(at + 33, end)].partition(" ")
    if (space or at + len(head) == end) and len(head) <= 32 and head.isascii() and head.isalnum():
        return head
    m = _PROGRAM.match(text, at, end)
    return m[1] if m else None


def _clean(name: Any) -> str | None:
    return name if isinstance(name, str) and _NAME.fullmatch(name) else None


def _chars(item: Any) -> int:
    # Chat's messages are measured as they are: joining their text as the token counter does
    # (tool calls dumped to JSON) cost a fifth of the memo's whole measure of a request.
    if isinstance(item, dict):
        content, calls = item.get("content"), item.get("tool_calls")
        if isinstance(content, str) and not calls:
            return len(content)
        if (
            (content is None or isinstance(content, str))
            and isinstance(calls, list)
            and all(isinstance(c, dict) and isinstance(c.get("function"), dict) for c in calls)
        ):
            fns = [c["function"] for c in calls]
            return len(content or "") + sum(
                len(str(f.get("name") or "")) + len(str(f.get("arguments") or "")) for f in fns
            )
    from router.features.tokens import item_text  # tiktoken loads with the counter, not with Features

    return len(item_text(item)[1])
