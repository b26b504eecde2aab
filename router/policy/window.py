"""The context-window rule of the decision: whether a call's prompt and output fit a backend.

Most providers refuse a call whose prompt and output limit (``max_tokens`` and its kin)
together overflow the model's window, however short the reply would be: such a backend must
hold the prompt and the whole limit. A model that stops at its window instead
(``Backend.stops_at_window``: Anthropic's Claude from Sonnet 4.5 on, which ends the reply with
``stop_reason: "model_context_window_exceeded"``) is refused only a prompt that does not fit;
a limit larger than the window leaves is no reason to exclude it. There the output the window
must leave room for is the limit clamped to the reserve (``Decider.reserve``: the room a call
with no limit needs), so that a reply has room to be written and the estimate of the prompt
some slack, as for a call with no limit on any backend.
"""

from __future__ import annotations

from router.policy.catalog import Backend


def wanted_output(backend: Backend, max_output_tokens: int | None, reserve: int) -> int:
    """The output ``backend``'s window must leave room for: the client's limit (``reserve`` when it
    sets none) within the backend's own; no more than ``reserve`` where the model stops at its window."""
    wanted = min(max_output_tokens or reserve, backend.max_output_tokens)
    return min(wanted, reserve) if backend.stops_at_window else wanted


def over_window(backend: Backend, max_output_tokens: int | None, reserve: int, prompt_tokens: int) -> bool:
    """Whether a prompt of ``prompt_tokens`` (in the backend's tokens) and the output it must leave
    room for overflow ``backend``'s window."""
    return prompt_tokens + wanted_output(backend, max_output_tokens, reserve) > backend.context_window
