"""Task identity: which agent task a request belongs to.

A task is what an agent was asked to do; it spans many requests. The client may name it
(``X-Router-Task-Id``); Claude Code and Codex carry a session id (``metadata.user_id``,
``prompt_cache_key``); otherwise the task is a stable hash of who asked (a hash of their key)
and how the conversation began (system prompt and first user message), which does not change
as the conversation grows.

Tasks belong to the key that made them: under a virtual key every task id is kept as
``{key_id}/{id}`` (``scoped``), so one key can neither send requests into another's task (with
``X-Router-Task-Id`` or a session id) nor post outcomes to it nor read its ledger. The master
key and open mode see ids as they are.
"""

from __future__ import annotations

import hashlib
import re
from typing import TypeGuard

from router.protocols.common import ClientRequest

_CLIENT_TASK_ID = re.compile(r"^[A-Za-z0-9._:@/-]{1,128}$")
#: A provider's or the router's key where a task id was expected (OpenAI's and Anthropic's keys are
#: ``sk-`` and 48 characters or more, Google's ``AIza`` and 35): a client that pasted one into
#: ``X-Router-Task-Id`` had it kept in the log, the console, traces and /ui as the task's name.
_KEY_LIKE = re.compile(r"(?:^|[^A-Za-z0-9])(?:(?:sk|rk)-[A-Za-z0-9_-]{32,}|AIza[0-9A-Za-z_-]{30,})")


def client_key_hash(presented_key: str) -> str:
    """A short hash of the caller's credential (as ``auth.presented_key`` reads it); never the key."""
    if not presented_key:
        return "anonymous"
    return hashlib.sha256(("router-key:" + presented_key).encode()).hexdigest()[:16]


def _a_name(text: str | None) -> TypeGuard[str]:
    return text is not None and _CLIENT_TASK_ID.match(text) is not None and not _KEY_LIKE.search(text)


def task_id_of(req: ClientRequest, header_value: str | None, key_hash: str) -> str:
    """The client's name for the task, else a session id, else a hash of the opening. A name that
    is not one (too long, odd characters, a key) is ignored as if not sent: the reply's
    ``x-router-task-id`` says the id the router used."""
    if _a_name(header_value):
        return header_value
    if _a_name(req.session_hint):  # OpenAI's prompt_cache_key, Claude Code's session: keys too
        return f"session-{req.session_hint}"
    h = hashlib.sha256()
    h.update(key_hash.encode())
    h.update(b"\0")
    h.update((req.system_sha256() or "").encode())
    h.update(b"\0")
    h.update(req.first_user_text.encode("utf-8", "replace"))
    return "t-" + h.hexdigest()[:24]


def scoped(key_id: str | None, task: str) -> str:
    """The task id as stored for a caller: ``{key_id}/{task}`` under a virtual key (idempotent,
    so the id the router echoed back works as well as the one the client chose)."""
    if key_id is None or task.startswith(key_id + "/"):
        return task
    return f"{key_id}/{task}"
