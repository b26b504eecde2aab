"""How the fake upstream should misbehave (or behave) for one request.

A behaviour is written ``key=value`` pairs separated by ``,`` (``ttft_ms=200,chunks=20``). It can
come from the server defaults, a per-model setting, the model name after ``@`` and the
``x-fake-behaviour`` header; later sources override earlier ones field by field, so every source is
kept as an *overrides* mapping and only merged into a ``Behaviour`` at the end.

Keys: ``ttft_ms`` (pause before the first content; before the whole answer when not streaming),
``chunk_ms`` (pause between content deltas), ``chunks`` (number of text deltas), ``status`` (answer
with this error), ``retry_after`` (Retry-After seconds), ``fail_times`` (fail only the first N
requests per model string, 500 unless ``status`` says otherwise), ``break_after`` (drop the
connection after K content deltas), ``stall_after``/``stall_ms`` (pause once mid-stream),
``malformed`` (invalid JSON / SSE data), ``truncate`` (stream stops after its last content delta),
``big_kb`` (a reply of about that many KB), ``text`` (literal reply), ``tool`` (auto|never|always),
``tool_arg`` (the value of every string argument of a tool call, ``ls`` unless set: an agent whose
shell tool runs it can be made to run a given command, such as its own completion marker),
``cached`` (cached prompt tokens to report), ``context_window`` (answer the provider's own
context-length error, 400, when the prompt has more tokens than this), ``error_after`` (a stream
sends the provider's error event after K content deltas, then ends without its final event),
``echo_key`` (error messages, answered or streamed, end with the API key the request carried, as
some providers echo the key they refused, then with its start and last four characters and an
organization id, as OpenAI's do), ``no_usage`` (a whole reply comes without its usage, as
from some OpenAI-compatible servers), ``hosted_calls`` (the reply calls each hosted tool the request
declares, a web search and the like, that many times, as the provider would before answering),
``failed_event`` (a Responses stream's ``error_after`` event is ``response.failed`` carrying the
reply's usage, as OpenAI ends a response that failed after it began), ``ms_per_max_token`` (a
whole reply waits that long per output token the request allows, ``max_tokens`` or its kin: a
provider writing a reply that long sends nothing of it before it is done), ``window_holds_output``
(with ``context_window``, the prompt and the output the request allows must both fit, as
Anthropic's models before Claude 4.5 require: a 400 otherwise; without it only the prompt must,
as for the models that stop at their window, ``router.policy.window``), ``fetched_tokens`` (each
part the request names by a URL or a file id, a document the provider would fetch or keep, bills
that many prompt tokens, as the provider bills what it read: ``router.protocols.fetched``).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Literal

ToolMode = Literal["auto", "never", "always"]
Overrides = Mapping[str, Any]

#: Header that carries a behaviour for one request.
HEADER = "x-fake-behaviour"


class BehaviourError(ValueError):
    """A behaviour spec names an unknown key or has a bad value; the server answers 400."""


@dataclass(frozen=True, slots=True)
class Behaviour:
    ttft_ms: float = 0.0
    chunk_ms: float = 0.0
    chunks: int = 8
    status: int | None = None
    retry_after: float | None = None
    fail_times: int | None = None
    break_after: int | None = None
    stall_after: int | None = None
    stall_ms: float = 0.0
    malformed: bool = False
    truncate: bool = False
    big_kb: int = 0
    text: str | None = None
    tool: ToolMode = "auto"
    tool_arg: str | None = None
    cached: int | None = None
    context_window: int | None = None
    error_after: int | None = None
    echo_key: bool = False
    no_usage: bool = False
    hosted_calls: int = 0
    failed_event: bool = False
    ms_per_max_token: float = 0.0
    window_holds_output: bool = False
    fetched_tokens: int = 0

    def overrides(self) -> Overrides:
        """The fields that differ from the defaults: what this behaviour adds on top of another."""
        return MappingProxyType(
            {
                f.name: getattr(self, f.name)
                for f in dataclasses.fields(self)
                if getattr(self, f.name) != f.default
            }
        )

    def failing_status(self) -> int | None:
        """The error status this behaviour asks for, if any (``fail_times`` alone means 500)."""
        if self.status is not None:
            return self.status
        return 500 if self.fail_times else None


def _non_negative_float(value: Any) -> float:
    number = float(value)
    if number < 0 or number != number:
        raise ValueError("must be a non-negative number")
    return number


def _non_negative_int(value: Any) -> int:
    if isinstance(value, bool):
        raise ValueError("must be an integer")
    number = int(value)
    if number < 0:
        raise ValueError("must be a non-negative integer")
    return number


def _positive_int(value: Any) -> int:
    number = _non_negative_int(value)
    if number == 0:
        raise ValueError("must be at least 1")
    return number


def _status(value: Any) -> int:
    number = _non_negative_int(value)
    if not 400 <= number <= 599:
        raise ValueError("must be an HTTP error status (400-599)")
    return number


def _flag(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ValueError("must be 0 or 1")


def _tool(value: Any) -> str:
    if value not in ("auto", "never", "always"):
        raise ValueError("must be auto, never or always")
    return str(value)


def _text(value: Any) -> str:
    return str(value)


_CONVERTERS: dict[str, Callable[[Any], Any]] = {
    "ttft_ms": _non_negative_float,
    "chunk_ms": _non_negative_float,
    "chunks": _positive_int,
    "status": _status,
    "retry_after": _non_negative_float,
    "fail_times": _non_negative_int,
    "break_after": _non_negative_int,
    "stall_after": _non_negative_int,
    "stall_ms": _non_negative_float,
    "malformed": _flag,
    "truncate": _flag,
    "big_kb": _non_negative_int,
    "text": _text,
    "tool": _tool,
    "tool_arg": _text,
    "cached": _non_negative_int,
    "context_window": _non_negative_int,
    "error_after": _non_negative_int,
    "echo_key": _flag,
    "no_usage": _flag,
    "hosted_calls": _non_negative_int,
    "failed_event": _flag,
    "ms_per_max_token": _non_negative_float,
    "window_holds_output": _flag,
    "fetched_tokens": _non_negative_int,
}
KEYS = tuple(_CONVERTERS)


def validate(fields: Mapping[str, Any]) -> Overrides:
    """Check and convert raw field values (from JSON or a spec string) into overrides."""
    out: dict[str, Any] = {}
    for key, raw in fields.items():
        convert = _CONVERTERS.get(key)
        if convert is None:
            raise BehaviourError(f"unknown behaviour key {key!r}; known keys: {', '.join(KEYS)}")
        try:
            out[key] = None if raw is None else convert(raw)
        except (TypeError, ValueError) as exc:
            raise BehaviourError(f"bad value {raw!r} for behaviour key {key!r}: {exc}") from None
    return MappingProxyType(out)


# Specs repeat across requests (a model name, a test's header), so parsing is memoised.
@functools.lru_cache(maxsize=1024)
def parse_spec(spec: str) -> Overrides:
    """Parse ``key=value,key=value`` into overrides; raise ``BehaviourError`` if it is not valid."""
    fields: dict[str, str] = {}
    for part in spec.split(","):
        part = part.strip()
        if not part:
            continue
        key, sep, value = part.partition("=")
        if not sep:
            raise BehaviourError(f"behaviour item {part!r} is not key=value")
        fields[key.strip()] = value.strip()
    return validate(fields)


def split_model(model: str) -> tuple[str, str]:
    """``small@ttft_ms=200`` -> (``small``, ``ttft_ms=200``); the first part is the reported model."""
    name, _, spec = model.partition("@")
    return name, spec


def merge(base: Behaviour, *layers: Overrides) -> Behaviour:
    """Apply override layers in order; a layer-free call returns ``base`` itself (the hot path)."""
    combined: dict[str, Any] = {}
    for layer in layers:
        combined.update(layer)
    return dataclasses.replace(base, **combined) if combined else base
