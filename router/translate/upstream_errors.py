"""Map whatever litellm raises onto the router's error tree.

Messages name the provider, the status and the provider's own short error text; they never carry
the API key, litellm's request dump or the prompt.
"""

from __future__ import annotations

import asyncio
import email.utils
import re
import time
from collections.abc import Mapping
from typing import Any

import orjson

from router.errors import RouterError, UpstreamError, UpstreamTimeout, from_upstream_status
from router.translate.target import Target

_LITELLM_PREFIX = re.compile(r"^litellm\.\w+:\s*(?:\w+Exception\s*-\s*)?", re.ASCII)
_MAX_TEXT = 300


def to_router_error(exc: BaseException, target: Target) -> RouterError:
    """The router error for one failed litellm call (or for a translation that failed here)."""
    if isinstance(exc, RouterError):
        return exc
    provider = target.litellm_model.split("/", 1)[0] if "/" in target.litellm_model else "litellm"
    if isinstance(exc, TimeoutError | asyncio.TimeoutError) or _is_litellm(exc, "Timeout"):
        return UpstreamTimeout("overall", target.timeout)
    if _is_litellm(exc, "APIConnectionError"):
        cause = exc.__cause__ or exc.__context__
        reason = type(cause).__name__ if cause is not None else type(exc).__name__
        return UpstreamError(f"{provider} backend unreachable or failed before replying ({reason})")
    status = getattr(exc, "status_code", None)
    if isinstance(status, int) and 400 <= status < 600 and type(exc).__module__.startswith(("litellm", "openai")):
        text = _redact(_provider_text(exc), target.api_key)
        message = f"{provider} backend answered {status}: {text}" if text else f"{provider} backend answered {status}"
        err = from_upstream_status(status, message, retry_after(exc))
        if _is_litellm(exc, "ContextWindowExceededError"):
            # Lets the executor fall over to a larger window instead of failing the request.
            err.code = "context_length_exceeded"
        return err
    # Our own or litellm's translation failed: this backend cannot take the request, another may.
    err = UpstreamError(f"translation for the {provider} backend failed ({type(exc).__name__})")
    err.retryable = False
    err.next_candidate = True
    return err


def _is_litellm(exc: BaseException, name: str) -> bool:
    return any(cls.__name__ == name and cls.__module__.startswith("litellm") for cls in type(exc).__mro__)


def _provider_text(exc: BaseException) -> str | None:
    """The provider's error message from the exception's body or litellm's message string."""
    body = getattr(exc, "body", None)
    text = _message_of(body)
    if text is None:
        raw = getattr(exc, "message", None)
        raw = raw if isinstance(raw, str) else str(exc)
        raw = _LITELLM_PREFIX.sub("", raw.strip(), count=1)
        start = raw.find("{")
        if start >= 0:
            try:
                text = _message_of(orjson.loads(raw[start:]))
            except orjson.JSONDecodeError:
                text = None
        if text is None and start != 0:
            text = raw
    if not text:
        return None
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


def _redact(text: str | None, api_key: str | None) -> str | None:
    if text and api_key and len(api_key) >= 4:
        text = text.replace(api_key, "[redacted]")
    return text


def retry_after(exc: BaseException) -> float | None:
    """Seconds to wait from the provider's Retry-After (or retry-after-ms) header, if it sent one."""
    for headers in (getattr(exc, "litellm_response_headers", None), _response_headers(exc)):
        if headers is None:
            continue
        try:
            ms = headers.get("retry-after-ms")
            if ms is not None:
                return max(0.0, float(ms) / 1000)
            value = headers.get("retry-after")
        except (AttributeError, TypeError, ValueError):
            continue
        seconds = _parse_retry_after(value)
        if seconds is not None:
            return seconds
    return None


def _response_headers(exc: BaseException) -> Any:
    response = getattr(exc, "response", None)
    return getattr(response, "headers", None)


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
