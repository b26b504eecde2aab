"""The router's one error tree.

Every error a client can see is a ``RouterError``. Each class knows its HTTP status, the
error ``type`` string of both wire protocols, and whether another attempt (a retry, or the
next candidate) may succeed where this one failed::

    RouterError                      500  api_error             (not retryable)
    ├── BadRequest                   400  invalid_request_error
    │   ├── ContextTooLarge          400  invalid_request_error (code context_length_exceeded)
    │   ├── AttemptStopped           400  invalid_request_error (code attempt_stopped)
    │   ├── Untranslatable           400  invalid_request_error next candidate may work
    │   ├── UnknownModel             404  not_found_error       (code model_not_found)
    │   └── TaskNotFound             404  not_found_error       (code task_not_found)
    ├── PayloadTooLarge              413  request_too_large
    ├── AuthenticationFailed         401  authentication_error
    ├── PermissionDenied             403  permission_error
    ├── RateLimited                  429  rate_limit_error      retryable
    ├── ServiceUnavailable           503  api_error             (the router itself cannot serve now)
    ├── MissingCredentials           500  api_error             next candidate may work
    └── UpstreamError                502  api_error             retryable unless the status says not
        ├── UpstreamTimeout          504  timeout_error         retryable, names the timeout
        └── UpstreamOverloaded       529  overloaded_error      retryable

``ConfigError`` is separate: it stops startup and never reaches a client.
"""

from __future__ import annotations

import re
from typing import Any


class ConfigError(Exception):
    """A policy file or setting is invalid. The message names the file and the field path."""


class RouterError(Exception):
    status: int = 500
    openai_type: str = "server_error"
    anthropic_type: str = "api_error"
    #: Whether trying again (same backend after a pause, or the next candidate) may help.
    retryable: bool = False
    #: Whether the next candidate may succeed even though this backend will not.
    next_candidate: bool = False
    #: Answered with ``Connection: close``: refused before its body was read, a request's client
    #: could otherwise hold the connection as long as it takes to send the rest.
    close_connection: bool = False

    def __init__(self, message: str, *, code: str | None = None, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.param = param

    @property
    def kind(self) -> str:
        """A short stable name for the log's ``error_type`` column."""
        return type(self).__name__

    def openai_body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.openai_type,
                "param": self.param,
                "code": self.code,
            }
        }

    def anthropic_body(self) -> dict[str, Any]:
        return {"type": "error", "error": {"type": self.anthropic_type, "message": self.message}}


class BadRequest(RouterError):
    status = 400
    openai_type = "invalid_request_error"
    anthropic_type = "invalid_request_error"


class ContextTooLarge(BadRequest):
    """No candidate's context window holds the prompt plus the requested output."""

    def __init__(self, message: str) -> None:
        super().__init__(message, code="context_length_exceeded")


class AttemptStopped(BadRequest):
    """The router ended the task's attempt (its model's call cap, or the stop-loss): the agent should
    start the task over, and the next attempt goes to the next model of the plan. A 400, so that an
    SDK does not resend the same request (it would be stopped again); ``param`` names the rule, and
    ``next`` what comes after (``router.policy.following``: ``retry``, ``model``, and the plan's
    ``expected_success`` and ``expected_cost_usd`` when a learned one made it), in every protocol's
    error body beside the message that says it in words."""

    def __init__(
        self, message: str, reason: str, next: dict[str, Any] | None = None, *, attempt: int | None = None,
        p_success: float | None = None,
    ) -> None:  # fmt: skip
        super().__init__(message, code="attempt_stopped", param=reason)
        self.next = next
        #: For the log's row of the refused call: the attempt it belonged to and what the stop rule read.
        self.attempt, self.p_success = attempt, p_success

    def openai_body(self) -> dict[str, Any]:
        body = super().openai_body()
        body["error"]["next"] = self.next
        return body

    def anthropic_body(self) -> dict[str, Any]:
        body = super().anthropic_body()
        # Anthropic's error names neither code nor param: the rule goes beside ``next`` here.
        body["error"] |= {"code": self.code, "param": self.param, "next": self.next}
        return body


class Untranslatable(BadRequest):
    """The request's own content cannot be translated for one backend (litellm, to another wire
    family): a backend it is relayed to, or translated for otherwise, may take it, so the next
    candidate is tried; when no candidate took it, the client gets this 400 naming the field."""

    next_candidate = True


class UnknownModel(BadRequest):
    status = 404
    anthropic_type = "not_found_error"

    def __init__(self, message: str) -> None:
        super().__init__(message, code="model_not_found", param="model")


class TaskNotFound(BadRequest):
    """No request of this task is known (to the tracker or in the log)."""

    status = 404
    anthropic_type = "not_found_error"

    def __init__(self, task_id: str) -> None:
        super().__init__(
            f"no request of task {task_id!r} is in the log", code="task_not_found", param="task_id"
        )


class AttemptNotFound(TaskNotFound):
    """The task is known, but not this attempt of it: none of its requests ran in it."""

    def __init__(self, task_id: str, attempt: int, latest: int) -> None:
        BadRequest.__init__(
            self,
            f"task {task_id!r} has no attempt {attempt}: its latest is attempt {latest}",
            code="attempt_not_found",
            param="attempt",
        )


class PayloadTooLarge(RouterError):
    status = 413
    close_connection = True
    openai_type = "invalid_request_error"
    anthropic_type = "request_too_large"


class AuthenticationFailed(RouterError):
    status = 401
    close_connection = True
    openai_type = "authentication_error"
    anthropic_type = "authentication_error"


class PermissionDenied(RouterError):
    status = 403
    openai_type = "permission_error"
    anthropic_type = "permission_error"


class RateLimited(RouterError):
    status = 429
    openai_type = "rate_limit_error"
    anthropic_type = "rate_limit_error"
    retryable = True
    next_candidate = True

    def __init__(self, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(message, code="rate_limit_exceeded")
        self.retry_after = retry_after


class ServiceUnavailable(RouterError):
    status = 503
    openai_type = "server_error"
    anthropic_type = "api_error"


class MissingCredentials(RouterError):
    """A backend's key variable is unset: this backend cannot work, another may."""

    next_candidate = True


class UpstreamError(RouterError):
    """A backend failed. ``upstream_status`` decides whether trying elsewhere may help."""

    status = 502
    openai_type = "server_error"
    anthropic_type = "api_error"
    #: What the provider reported billing for the call that failed, when it said (a Responses
    #: ``response.failed`` carries its usage): a ``router.protocols.Usage``, which this module,
    #: below the protocols, does not import. The failed try is charged it.
    usage: object | None = None

    def __init__(
        self,
        message: str,
        *,
        upstream_status: int | None = None,
        retry_after: float | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message, code=code)
        self.upstream_status = upstream_status
        self.retry_after = retry_after
        s = upstream_status
        self.retryable = s is None or s in (408, 409, 429) or s >= 500
        self.next_candidate = self.retryable


class UpstreamTimeout(UpstreamError):
    status = 504
    openai_type = "timeout_error"
    anthropic_type = "timeout_error"

    def __init__(self, which: str, seconds: float) -> None:
        super().__init__(f"upstream {which} timeout fired after {seconds:g}s", code=f"{which}_timeout")
        self.which = which


class UpstreamOverloaded(UpstreamError):
    status = 529
    openai_type = "server_error"
    anthropic_type = "overloaded_error"


def from_upstream_status(status: int, message: str, retry_after: float | None = None) -> RouterError:
    """Map a backend's HTTP failure onto the tree, keeping the client-facing status honest.

    4xx other than 408/409/429 and a refused key are the request's fault and pass through with
    their status so the agent sees what the provider said; the rest become upstream errors.
    """
    if status == 429:
        return RateLimited(message, retry_after=retry_after)
    if status == 529:
        return UpstreamOverloaded(message, upstream_status=status, retry_after=retry_after)
    if status in _REFUSED_KEY:
        # The provider refused the router's key for it (or its account): the operator's to fix,
        # never the client's, whose key the router accepted. Passed on, a 401 read to agents as
        # "your API key is invalid" (Claude Code asks to log in again) and no other backend was
        # tried; now another is, and a client that gets it sees a 502 saying whose key it was.
        err = UpstreamError(f"{message} (the provider refused this backend's key: see its api_key_env)",
                            upstream_status=status)  # fmt: skip
        err.retryable = False
        err.next_candidate = True
        return err
    if 400 <= status < 500 and status not in (408, 409):
        err = UpstreamError(message, upstream_status=status)
        err.status = status
        err.openai_type = "invalid_request_error"
        err.anthropic_type = _ANTHROPIC_4XX.get(status, "invalid_request_error")
        return err
    return UpstreamError(message, upstream_status=status, retry_after=retry_after)


#: A provider's refusal of the key the router sent it (402: an account out of credit, OpenRouter's).
_REFUSED_KEY = frozenset({401, 402, 403})

_ANTHROPIC_4XX = {
    404: "not_found_error",
    413: "request_too_large",
}


#: What providers quote of a key and of its account in their errors: OpenAI's "Incorrect API key
#: provided: sk-proj-****...abcd" (its start and last four characters, enough to tell which key the
#: operator has) and "in organization org-..." / "project proj_..."; Anthropic-style and Google keys.
_QUOTED_SECRET = re.compile(
    r"\b(?:sk|rk|pk)-(?:[A-Za-z0-9_*\-]|\.\.\.|\u2026)+"
    r"|\b(?:org|proj)[-_][A-Za-z0-9]{8,}"
    r"|\bAIza[0-9A-Za-z_\-]{20,}",
    re.ASCII,
)


def redact_key(text: str, key: str | None) -> str:
    """``text`` without ``key``, or any key or account id a provider quoted in its error message.

    The one filter of a provider's words before they reach a client, the log or the store."""
    if key:
        text = text.replace(key, "[redacted]")
    return _QUOTED_SECRET.sub("[redacted]", text)
