"""A large request body is parsed with the cyclic garbage collector paused.

Parsing makes an object of every JSON value (and pydantic a model of every tool), and the
collector runs every few hundred new objects: as the body grew, its full collections went over it
again and again (the server freezes what it loaded at its start, so the body is most of what they
walk). A 17.7 MB body of 200,000 tool definitions took 4.9 s to parse, 1.6 s with the collector
paused; all of it on the event loop, which every other client waits on. Parsing makes no garbage
cycles worth collecting meanwhile: the first collection after it finds what there is.
"""

from __future__ import annotations

import functools
import gc
import threading
from collections.abc import Callable
from typing import Concatenate, ParamSpec, TypeVar

#: Below this a body parses in milliseconds, collections or not.
PAUSED_FROM_BYTES = 256 * 1024

P = ParamSpec("P")
R = TypeVar("R")


def collector_paused(parse: Callable[Concatenate[bytes, P], R]) -> Callable[Concatenate[bytes, P], R]:
    """``parse`` (of a raw body), run with the collector paused for a body of ``PAUSED_FROM_BYTES``
    or more. Other threads' allocations meanwhile go uncollected for as long, no more."""

    @functools.wraps(parse)
    def paused(raw: bytes, *args: P.args, **kwargs: P.kwargs) -> R:
        if len(raw) < PAUSED_FROM_BYTES or not _PAUSE.enter():
            return parse(raw, *args, **kwargs)
        try:
            return parse(raw, *args, **kwargs)
        finally:
            _PAUSE.leave()

    return paused


class _Pause:
    """The collector's pause, held by every parse in progress: the event loop parses bodies under
    1 MiB itself and a worker thread larger ones (``router.policy.pipeline.LARGE_BODY_BYTES``), so
    two parses overlap, and the first to end turned the collector back on under the other, whose
    body it then walked again and again. The collector is one per process, and so is this."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._holders = 0

    def enter(self) -> bool:
        """Pause the collector, or hold its pause; False when it was off already (not ours to pause)."""
        with self._lock:
            if self._holders == 0:
                if not gc.isenabled():
                    return False
                gc.disable()
            self._holders += 1
            return True

    def leave(self) -> None:
        with self._lock:
            self._holders -= 1
            if self._holders == 0:
                gc.enable()


_PAUSE = _Pause()
