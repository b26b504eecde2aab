"""Parts of a prompt the provider reads from elsewhere: a document or a file named by its URL, or by
the id of a file the provider keeps (an Anthropic ``document`` whose source is a ``url`` or a
``file``, a Chat Completions ``file`` with a ``file_id``, a Responses ``input_file`` with a
``file_id`` or a ``file_url``).

The router sees the name alone, so it cannot size what the provider bills for it: a PDF of a
hundred pages is a few hundred thousand tokens, where the name is twenty. Such a request may have
a prompt as long as its backend's window, which is what a key's budget holds for it at worst
(``router.policy.pricing``). An image is sized as any other (a flat estimate: its cost follows its
pixels, which the router does not read even when the image is in the body), so it is not one.
"""

from __future__ import annotations

from typing import Any

#: What the JSON of every such part holds (``ClientRequest.encoded`` is orjson's, without spaces):
#: a conversation without any of these is read no further.
_MARKS = (b'"file_id"', b'"file_url"', b'"type":"url"', b'"type":"file"')
_KINDS = ("document", "file", "input_file")


def names_unseen(encoded: tuple[Any, bytes] | None) -> bool:
    """Whether a conversation (its value and JSON, as ``ClientRequest.encoded`` keeps them) holds
    a part the provider fetches or keeps, at any depth (a tool's result may hold one)."""
    if encoded is None:
        return False
    value, blob = encoded
    if not any(mark in blob for mark in _MARKS):
        return False
    stack = [value]
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            stack.extend(node)
        elif isinstance(node, dict):
            if node.get("type") in _KINDS and _by_reference(node):
                return True
            stack.extend(v for v in node.values() if isinstance(v, list | dict))
    return False


def _by_reference(part: dict[str, Any]) -> bool:
    source, file = part.get("source"), part.get("file")
    if isinstance(source, dict) and source.get("type") in ("url", "file"):
        return True
    if isinstance(file, dict) and "file_id" in file:
        return True
    return "file_id" in part or "file_url" in part
