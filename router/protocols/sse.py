"""Server-sent events: split a byte stream into events without re-encoding them.

The relay forwards each event's original bytes; only the ``event:`` name and the ``data:``
payload are picked out so the router can time tokens and read usage as they pass.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass


@dataclass(slots=True)
class Event:
    name: str | None
    data: bytes
    #: The event as received, terminator included, ready to forward.
    raw: bytes
    #: More events of the same network read follow at once: a relay can send them together.
    more: bool = False


# ``needle in data`` on bytes first tries the needle as an integer (a byte value), and a bytes
# needle fails that with a TypeError made and cleared each time: ``find`` goes straight to the
# search. A stream's every event is tested a few times.


def parse_block(block: bytes, raw: bytes | None = None) -> Event:
    """``raw``: ``block`` and its terminating blank line, when the caller holds them already."""
    if raw is None:
        raw = block + b"\n\n"
    if block.startswith(b"data: ") and block.find(b"\n") < 0:
        # Most events of a chat stream are one data line: no splitting, no name.
        return Event(None, block[6:].lstrip(b" ").rstrip(b"\r"), raw)
    name = None
    data_lines = []
    for line in block.split(b"\n"):
        if line.startswith(b"data:"):
            data_lines.append(line[5:].lstrip(b" ").rstrip(b"\r"))
        elif line.startswith(b"event:"):
            name = line[6:].strip().decode("utf-8", "replace")
    return Event(name, b"\n".join(data_lines), raw)


async def close_quietly(source: object) -> None:
    """Close an async iterator now if it can be closed.

    A generator left to the garbage collector keeps its upstream connection open until it is
    collected, which under load (reference cycles, a frozen heap) may be never: whoever stops
    reading a stream closes it at once, and each wrapper closes what it wraps.
    """
    aclose = getattr(source, "aclose", None)
    if aclose is None:
        return
    # The stream is over either way; a failing close must not mask the real outcome.
    with contextlib.suppress(Exception):
        await aclose()


async def events(
    chunks: AsyncIterator[bytes], max_event_bytes: int = 16 * 1024 * 1024
) -> AsyncIterator[Event]:
    """Yield events as soon as their terminating blank line arrives; closing this closes ``chunks``."""
    buf = b""
    try:
        async for chunk in chunks:
            if not buf and chunk.endswith(b"\n\n") and chunk.find(b"\r") < 0 and chunk.count(b"\n\n") == 1:
                # The common case: one whole event per network read.
                yield parse_block(chunk[:-2], chunk)
                continue
            if chunk.find(b"\r") >= 0:
                chunk = chunk.replace(b"\r\n", b"\n")
            whole = buf + chunk if buf else chunk
            # One split per network read, in C: finding each event's end and slicing it out in
            # Python cost more than reading the event (a stream's 20-odd events pass here).
            blocks = whole.split(b"\n\n")
            buf = blocks.pop()  # the start of an event still arriving; b"" when the read ended one
            last = len(blocks) - 1
            for i, block in enumerate(blocks):
                if block.startswith(b"data: ") and block.find(b"\n") < 0:
                    # ``parse_block``'s common case, inline: most events are one data line.
                    yield Event(None, block[6:].lstrip(b" ").rstrip(b"\r"), block + b"\n\n", i < last)
                elif block.strip():
                    ev = parse_block(block, block + b"\n\n")
                    ev.more = i < last
                    yield ev
            if len(buf) > max_event_bytes:
                raise ValueError("an SSE event exceeded the size limit")
    finally:
        await close_quietly(chunks)
    if buf.strip():
        # A stream that ends without the final blank line still delivered this event.
        yield parse_block(buf.rstrip(b"\n"))
