"""The JSON replies of the router's own endpoints; an error is rendered by its protocol's one function."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

import orjson
from starlette.responses import Response

from router.errors import RouterError
from router.protocols import OPENAI_CHAT, WIRES

R = TypeVar("R", bound=Response)


def json_reply(obj: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(obj), status, media_type="application/json")


def error_reply(
    err: RouterError, protocol: str = OPENAI_CHAT, headers: Mapping[str, str] | None = None,
    kind: type[R] = Response,  # type: ignore[assignment]
) -> R:  # fmt: skip
    """``err`` in ``protocol``'s error shape, with its status and, when it has one, ``Retry-After``."""
    h = dict(headers or {})
    retry_after = getattr(err, "retry_after", None)
    if retry_after is not None:
        h["retry-after"] = str(int(retry_after + 0.999))
    if err.close_connection:
        h["connection"] = "close"
    return kind(orjson.dumps(WIRES[protocol].error_body(err)), err.status, h, "application/json")
