"""Where a translated call goes."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Target:
    #: litellm's ``provider/model`` string, e.g. ``anthropic/claude-sonnet-4-5`` or ``openai/gpt-4o-mini``.
    litellm_model: str
    api_base: str | None
    #: The secret, resolved from the environment by the caller. Never logged, never in a repr.
    api_key: str | None = field(repr=False)
    #: Seconds, for the whole call (a stream included).
    timeout: float
    #: Seconds to connect, and the longest silence while reading (between stream chunks, or
    #: before a whole reply): the relay path's ``connect`` and ``idle``. None: ``timeout``.
    connect: float | None = None
    idle: float | None = None
    #: The policy's id of the backend, for messages: the relay path's name it ("backend 'mini'").
    backend: str | None = None
    #: The output the backend's window leaves after this request's prompt (estimated), within the
    #: policy's output limit: the most a call may ask for where the client named no limit and the
    #: backend needs one. None: not known.
    output_room: int | None = None
