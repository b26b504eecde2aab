"""Which prompts name a part the provider fetches or keeps (``router.protocols.fetched``), in each
protocol's shape, as each parser reads them."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from router.protocols import anthropic, openai_chat, responses
from router.protocols.fetched import names_unseen


def _messages(*content: Any, text: str = "text") -> list[dict[str, Any]]:
    return [{"role": "user", "content": [*content, {"type": text, "text": "read it"}]}]


def chat(*content: Any) -> bool:
    return openai_chat.parse(orjson.dumps({"model": "auto", "messages": _messages(*content)})).unseen


def messages(*content: Any) -> bool:
    body = {"model": "claude-x", "max_tokens": 10, "messages": _messages(*content)}
    return anthropic.parse(orjson.dumps(body)).unseen


def responses_(*content: Any) -> bool:
    return responses.parse(
        orjson.dumps({"model": "auto", "input": _messages(*content, text="input_text")})
    ).unseen


def test_documents_and_files_by_url_or_id_are_unseen() -> None:
    assert messages({"type": "document", "source": {"type": "url", "url": "https://x.example/a.pdf"}})
    assert messages({"type": "document", "source": {"type": "file", "file_id": "file_011"}})
    assert chat({"type": "file", "file": {"file_id": "file-abc"}})
    assert responses_({"type": "input_file", "file_id": "file-abc"})
    assert responses_({"type": "input_file", "file_url": "https://x.example/a.pdf"})


def test_a_document_inside_a_tool_result_is_unseen() -> None:
    call = {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "fetch", "input": {}}]}
    result = {"type": "tool_result", "tool_use_id": "t1",
              "content": [{"type": "document", "source": {"type": "url", "url": "https://x.example/a.pdf"}}]}  # fmt: skip
    body = {"model": "claude-x", "max_tokens": 10,
            "messages": [*_messages(), call, {"role": "user", "content": [result]}]}  # fmt: skip
    assert anthropic.parse(orjson.dumps(body)).unseen


@pytest.mark.parametrize(
    "parse, part",
    [
        (messages, {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBERi0="}}),
        (messages, {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "hello"}}),
        (messages, {"type": "image", "source": {"type": "url", "url": "https://x.example/a.png"}}),
        (chat, {"type": "file", "file": {"file_data": "data:application/pdf;base64,JVBERi0=", "filename": "a.pdf"}}),
        (chat, {"type": "image_url", "image_url": {"url": "https://x.example/a.png"}}),
        (responses_, {"type": "input_file", "file_data": "data:application/pdf;base64,JVBERi0=", "filename": "a.pdf"}),
        (chat, {"type": "text", "text": 'the JSON {"file_id": "x", "type":"url"} in a text'}),
    ],
)  # fmt: skip
def test_parts_the_request_carries_whole_are_seen(parse: Any, part: dict[str, Any]) -> None:
    """Sized from the body (images at their flat estimate), as before."""
    assert not parse(part)


def test_a_key_named_like_a_reference_elsewhere_is_no_part() -> None:
    value = [
        {"role": "assistant", "content": [{"type": "tool_use", "input": {"file_id": "x", "type": "url"}}]}
    ]
    assert not names_unseen((value, orjson.dumps(value)))
    assert not names_unseen(None)
