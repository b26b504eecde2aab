"""When a request's weak label is read, when no decision waits for it (issue 34 #7).

The label (``router.features.task.context``'s ``weak_label``: the label model's P(success | the
conversation so far), with the signals that explain it) is read once a request has ended. Where
the task's next decision reads it (``escalate_below``, a stop-loss on the attempt's model) it is
read at once; elsewhere only the log reads it, the outcome row and the next call's ``p_success``,
and it waits (``Unread``) for the task's next request to be decided: it is then read while that
request's backend answers, instead of before the reply's end (a streamed reply's last chunk goes
out once the request's accounting has run, and clients read to the end). A task that sends
nothing within ``LABEL_WAIT_S`` has it read then, and shutdown reads the rest before the log
closes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from router.features import labels
from router.features.task.rules import TaskRules
from router.features.task.tracker import TaskState

#: A label no decision waits for is read at the latest this long after its request ended, when
#: the task sends nothing meanwhile (``Unread``).
LABEL_WAIT_S: Final = 0.05


@dataclass(slots=True, eq=False)
class Unread:
    """A request's weak label that no decision waits for: read once, by whichever comes first of
    the task's next request once it is decided (``TaskContext.read_soon``: the label's reading
    then runs while that request's backend answers, not before the reply's end, which the client
    waits for), ``LABEL_WAIT_S`` after the request ended, or anything
    that reads the label (``run``). The label and the log get the same values as when it was
    read at once: the next request's reading (``p_success``) is taken after it."""

    read: Callable[[], None] | None
    state: TaskState
    #: The context's labels not read yet (each leaves when read: shutdown reads the rest).
    owner: set[Unread]
    timer: asyncio.TimerHandle | None = None
    p: float | None = None

    def run(self) -> float | None:
        """Read the label (once); the stop-loss's reading after it."""
        if self.read is not None:
            read, self.read = self.read, None
            if self.timer is not None:
                self.timer.cancel()
            self.owner.discard(self)
            if self.state.unread is self:
                self.state.unread = None
            read()
            self.p = reading(self.state)
        return self.p


def later(read: Callable[[], None], state: TaskState, owner: set[Unread]) -> Unread:
    """``read`` (a request's label) kept with the task until its next request is decided, or
    ``LABEL_WAIT_S`` from now (on the running event loop)."""
    unread = Unread(read, state, owner)
    unread.timer = asyncio.get_running_loop().call_later(LABEL_WAIT_S, unread.run)
    owner.add(unread)
    state.unread = unread
    return unread


def stops_on_label(rules: TaskRules, state: TaskState) -> bool:
    """Whether ``stop`` reads the attempt's label: a stop-loss is on for its model."""
    control = rules.attempt_controls.get(state.pinned) if state.pinned is not None else None
    return control is not None and control.stop_below is not None


def reading(state: TaskState) -> float | None:
    """The label model's P(success) of the attempt's conversation so far: what the stop-loss reads
    (the latest stored label of the current attempt, read off the request path), else None."""
    label = state.last_label
    return label[2] if label is not None and label[0] == state.attempt and label[3] == labels.SOURCE else None
