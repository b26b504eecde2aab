"""Splitting server-sent events without re-encoding them."""

from __future__ import annotations

from collections.abc import AsyncIterator

from router.protocols import sse


async def _chunks(*parts: bytes) -> AsyncIterator[bytes]:
    for p in parts:
        yield p


async def _collect(*parts: bytes) -> list[sse.Event]:
    return [ev async for ev in sse.events(_chunks(*parts))]


async def test_one_event_per_read_and_events_split_across_reads() -> None:
    evs = await _collect(b"data: 1\n\n", b"event: x\nda", b"ta: 2\n\n")
    assert [(e.name, e.data) for e in evs] == [(None, b"1"), ("x", b"2")]
    assert evs[1].raw == b"event: x\ndata: 2\n\n"


async def test_events_of_one_read_are_marked_for_one_write() -> None:
    evs = await _collect(b"data: a\n\ndata: b\n\ndata: c\n\n", b"data: d\n\n")
    assert [e.more for e in evs] == [True, True, False, False]
    assert b"".join(e.raw for e in evs) == b"data: a\n\ndata: b\n\ndata: c\n\ndata: d\n\n"


async def test_a_read_of_whole_events_and_the_start_of_the_next() -> None:
    # Read by position within the buffer: the partial event is carried into the next read, blank
    # blocks (a third newline) are skipped, and each event's bytes are its own.
    evs = await _collect(b"data: a\n\n\n\nevent: y\ndata: b\n\n\ndata: c\n\nda", b"ta: d\n\ndata: e\n\n")
    assert [(e.name, e.data, e.more) for e in evs] == [
        (None, b"a", True),
        ("y", b"b", True),
        (None, b"c", False),
        (None, b"d", True),
        (None, b"e", False),
    ]
    assert [e.raw for e in evs] == [
        b"data: a\n\n",
        b"event: y\ndata: b\n\n",
        b"\ndata: c\n\n",
        b"data: d\n\n",
        b"data: e\n\n",
    ]


async def test_crlf_multiline_data_and_a_missing_final_blank_line() -> None:
    evs = await _collect(b"event: m\r\ndata: x\r\ndata: y\r\n\r\n", b"data: last")
    assert [(e.name, e.data) for e in evs] == [("m", b"x\ny"), (None, b"last")]


def test_a_single_data_line_reads_as_any_other_event() -> None:
    # One data line takes a shorter path: the same payload, name and bytes as the general one.
    for block in (b'data: {"a": 1}', b"data:   spaced\r", b"data: ", b"data:tight", b": comment"):
        ev = sse.parse_block(block)
        multi = sse.parse_block(b": keep\n" + block)  # a comment line first: the general path
        assert (ev.name, ev.data, ev.raw) == (multi.name, multi.data, block + b"\n\n"), block
    assert sse.parse_block(b'data: {"a": 1}').data == b'{"a": 1}'
    assert sse.parse_block(b"data:   spaced\r").data == b"spaced"


def test_usage_only_chunks_are_told_apart_without_parsing_every_chunk() -> None:
    from router.protocols.openai_chat import is_usage_only

    usage = b'{"id":"c","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":1}}'
    assert is_usage_only(usage)
    assert is_usage_only(b'{"choices": [], "usage": {"prompt_tokens": 3}}')  # spaced JSON is parsed
    assert not is_usage_only(b'{"choices":[{"delta":{"content":"hi"}}],"usage":null}')
    # Text that mentions usage inside a string is escaped and cannot pass for the field.
    assert not is_usage_only(b'{"choices":[{"delta":{"content":"\\"usage\\":{}"}}],"usage":null}')
    assert not is_usage_only(b'{"choices":[{"delta":{"content":"x"}}],"usage":{"prompt_tokens":3}}')


async def test_the_events_of_one_read_read_as_parse_block_reads_them() -> None:
    # A read of several events is split once and its one-data-line events read inline: the same
    # names, payloads and bytes as ``parse_block`` gives each block.
    blocks = [
        b'data: {"a": 1}',
        b"data:   spaced",
        b"data: ",
        b"data:tight",
        b": comment",
        b"event: e\ndata: x",
    ]
    evs = await _collect(b"".join(b + b"\n\n" for b in blocks) + b"data: nex", b"t\n\n")
    want = [sse.parse_block(b) for b in [*blocks, b"data: next"]]
    assert [(e.name, e.data, e.raw) for e in evs] == [(w.name, w.data, w.raw) for w in want]
    assert [e.more for e in evs] == [True] * 5 + [False, False]
