"""Map whatever litellm raises onto the router's error tree.

litellm wraps failures several layers deep and its outer status is not always the provider's
(an Anthropic 529 surfaces as a 500, a refused connection as a 500 too), so the exception chain is
read: transport failures and timeouts by their type, HTTP failures by the innermost status.
Messages name the provider, the status and the provider's own short error text; they never carry
the API key, litellm's request dump or the prompt.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import re
import time
from collections.abc import Iterator, Mapping
from typing import Any

from router.errors import RouterError, UpstreamError, UpstreamTimeout, from_upstream_status, redact_key
from router.forward.translate.target import Target

_PREFIX = re.compile(r"^(?:litellm\.)?\w+(?:Error|Exception)\s*(?::|-)\s*", re.ASCII)
_HANDLE_WITH = re.compile(r"\.?\s*Handle with `[^`]*`\.?\s*$")
_MAX_TEXT = 300
_DECODER = json.JSONDecoder()


def to_router_error(exc: BaseException, target: Target) -> RouterError:
    """The router error for one failed litellm call (or for a translation that failed here)."""
    if isinstance(exc, RouterError):
        return exc
    provider = target.litellm_model.split("/", 1)[0] if "/" in target.litellm_model else "litellm"
    # Named as the relay path names it, the wire format beside: "openai backend answered 500" left a
    # policy of three openai backends to guess which one.
    who = f"backend {target.backend!r} ({provider})" if target.backend else f"the {provider} backend"
    chain = list(_chain(exc))
    if any(_is_connect_timeout(e) for e in chain):
        return UpstreamTimeout("connect", target.connect or target.timeout)
    if any(_is_read_timeout(e) for e in chain):
        return UpstreamTimeout("idle", target.idle or target.timeout)
    if any(_is_timeout(e) for e in chain):
        return UpstreamTimeout("overall", target.timeout)
    if _converting(chain):
        # Named by litellm's own error under its wrapper, which says nothing of a connection (an
        # APIConnectionError) or of a provider (a BadRequestError around a request's arguments
        # that are not JSON: read as a reply that is not JSON, it was retried and counted against
        # the backend's breaker).
        return _translation_failed(who, _root(chain))
    if any(isinstance(e, json.JSONDecodeError) for e in chain):
        # The backend's reply or stream event did not parse: litellm calls that a 500; it is not.
        return UpstreamError(f"{who} sent a reply or stream event that is not JSON")
    status = _status(chain)
    transport = next((e for e in chain if _is_transport(e)), None)
    if transport is not None and (status is None or status == 500):
        # litellm reports a refused connection or a cut stream as a 500; it is neither.
        root = next((e for e in reversed(chain) if _is_transport(e)), transport)
        what = "unreachable" if _is_connect(chain) else "broke off its reply"
        return UpstreamError(f"{who} {what} ({type(root).__name__})")
    if status is not None:
        text = _provider_text(chain, target.api_key)
        message = f"{who} answered {status}: {text}" if text else f"{who} answered {status}"
        err = from_upstream_status(status, message, _retry_after_of(chain))
        if any(type(e).__name__ == "ContextWindowExceededError" for e in chain):
            # Lets the executor fall over to a larger window instead of failing the request.
            err.code = "context_length_exceeded"
        return err
    return _translation_failed(who, exc)


def converting(exc: BaseException) -> bool:
    """Whether litellm failed converting the request, before it sent anything (``_converting``)."""
    return _converting(list(_chain(exc)))


def root_error(exc: BaseException) -> str:
    """The type name of the Python error under litellm's wrappers, of a failed conversion."""
    return type(_root(list(_chain(exc)))).__name__


def _root(chain: list[BaseException]) -> BaseException:
    return next(
        (e for e in reversed(chain) if type(e).__module__ == "builtins" and not _is_transport(e)), chain[-1]
    )


def _converting(chain: list[BaseException]) -> bool:
    # A provider's answer comes through an HTTP client, whose error litellm's then carries.
    modules = {type(e).__module__.split(".")[0] for e in chain}
    return "litellm" in modules and not modules & {"httpx", "aiohttp"} and _failed_before_sending(chain)


def _translation_failed(who: str, exc: BaseException) -> RouterError:
    # The translation failed here or inside litellm: this backend cannot take the request as it
    # is, another backend may; trying this one again would fail the same way.
    err = UpstreamError(f"translation for {who} failed ({type(exc).__name__})")
    err.retryable = False
    err.next_candidate = True
    return err


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen and len(seen) < 16:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _names(exc: BaseException) -> set[str]:
    return {f"{cls.__module__.split('.')[0]}.{cls.__name__}" for cls in type(exc).__mro__}


_TIMEOUTS = {
    "httpx.TimeoutException",
    "openai.APITimeoutError",
    "litellm.Timeout",
    "aiohttp.ServerTimeoutError",
}
_CONNECT_TIMEOUTS = {"httpx.ConnectTimeout", "aiohttp.ConnectionTimeoutError"}
_TRANSPORT = {
    "httpx.TransportError",
    "openai.APIConnectionError",
    "aiohttp.ClientConnectionError",
    "aiohttp.ClientPayloadError",
    "builtins.ConnectionError",
}
_CONNECT = {"httpx.ConnectError", "aiohttp.ClientConnectorError", "builtins.ConnectionRefusedError"}


def _is_timeout(exc: BaseException) -> bool:
    return isinstance(exc, TimeoutError | asyncio.TimeoutError) or bool(_names(exc) & _TIMEOUTS)


def _is_read_timeout(exc: BaseException) -> bool:
    """A timeout of the HTTP client's own (it is given the idle limit as its read timeout);
    the overall deadline is an asyncio ``TimeoutError``."""
    return bool(_names(exc) & _TIMEOUTS) and not _is_connect_timeout(exc)


def _is_connect_timeout(exc: BaseException) -> bool:
    return bool(_names(exc) & _CONNECT_TIMEOUTS)


def _is_transport(exc: BaseException) -> bool:
    return bool(_names(exc) & _TRANSPORT)


def _failed_before_sending(chain: list[BaseException]) -> bool:
    """litellm raises its APIConnectionError for a request it could not convert (a content part
    of a type it does not know, a field of the wrong type), or its BadRequestError (a tool call's
    arguments that are not JSON), with that error as the cause: no transport error of an HTTP
    client's in the chain, and a Python error of litellm's own under its wrapper. Counted as the
    backend breaking off, a client's malformed request was retried and opened the backend's
    breaker for every client."""
    wrappers = [e for e in chain if _is_transport(e)]
    if any(not type(e).__module__.startswith("litellm") for e in wrappers):
        return False
    return any(
        type(e).__module__ == "builtins" and not isinstance(e, OSError)
        and not _is_transport(e) and not _is_timeout(e)
        for e in chain
    )  # fmt: skip


def _is_connect(chain: list[BaseException]) -> bool:
    return any(_names(e) & _CONNECT for e in chain)


def _status(chain: list[BaseException]) -> int | None:
    """The provider's HTTP status: the innermost one recorded, not litellm's outer wrapper's."""
    found: int | None = None
    for exc in chain:
        for attr in ("provider_status_code", "status_code"):
            value = getattr(exc, attr, None)
            if isinstance(value, int) and 400 <= value < 600:
                found = value
                break
    return found


def _provider_text(chain: list[BaseException], key: str | None) -> str | None:
    """The provider's own error message, from a parsed body or the JSON inside litellm's text,
    without ``key`` (redacted before it is cut: a key that straddled the cut left its start)."""

    def short(text: str) -> str:
        return _cut(redact_key(text, key))

    for exc in chain:
        text = _message_of(getattr(exc, "body", None))
        if text:
            return short(text)
    raw = getattr(chain[0], "message", None)
    raw = raw if isinstance(raw, str) else str(chain[0])
    start = raw.find("{")
    if start >= 0:
        try:
            text = _message_of(_DECODER.raw_decode(raw, start)[0])
        except ValueError:
            text = None
        if text:
            return short(text)
    cleaned = raw.strip()
    for _ in range(4):  # litellm stacks its prefixes: "litellm.X: XError: OpenAIException - ..."
        cleaned = _PREFIX.sub("", cleaned, count=1)
    cleaned = _HANDLE_WITH.sub("", cleaned)
    return short(cleaned) if cleaned and "{" not in cleaned else None


def _cut(text: str) -> str:
    text = " ".join(text.split())
    return text[:_MAX_TEXT] + ("..." if len(text) > _MAX_TEXT else "")


def _message_of(body: Any) -> str | None:
    if isinstance(body, Mapping):
        err = body.get("error")
        if isinstance(err, Mapping) and isinstance(err.get("message"), str):
            return str(err["message"])
        if isinstance(err, str):
            return err
        if isinstance(body.get("message"), str):
            return str(body["message"])
    return None


def _retry_after_of(chain: list[BaseException]) -> float | None:
    for exc in chain:
        seconds = retry_after(exc)
        if seconds is not None:
            return seconds
    return None


def retry_after(exc: BaseException) -> float | None:
    """Seconds to wait from the provider's retry-after-ms or Retry-After header, if it sent one."""
    response = getattr(exc, "response", None)
    for headers in (getattr(exc, "litellm_response_headers", None), getattr(response, "headers", None)):
        if headers is None:
            continue
        try:
            ms = headers.get("retry-after-ms")
            value = headers.get("retry-after")
        except (AttributeError, TypeError):
            continue
        try:
            if ms is not None:
                return max(0.0, float(ms) / 1000)
        except (TypeError, ValueError):
            pass
        seconds = _parse_retry_after(value)
        if seconds is not None:
            return seconds
    return None


def _parse_retry_after(value: Any) -> float | None:
    if not isinstance(value, str) or not value.strip():
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())
