"""The one auth decorator of the router's own endpoints (everything but the proxied paths, which
``Proxy.handle`` checks itself): the caller is checked before the handler runs, and a refusal or any
``RouterError`` the handler raises is rendered in the endpoint's protocol here, and only here.

A handler is a method of a class holding what it uses, ``auth`` among them, and takes the caller
(``Principal``) after the request: ``async def models(self, request, principal) -> Response``.
FastAPI sees the handler's own name, docstring and parameters without ``principal`` (so path
parameters such as ``{model_id}`` stay declared, and the OpenAPI document is what it was).
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable
from typing import Concatenate, ParamSpec, Protocol, TypeVar

from starlette.requests import Request
from starlette.responses import Response

from router.errors import RouterError
from router.http.auth import Auth, Principal
from router.http.replies import error_reply
from router.protocols import OPENAI_CHAT

log = logging.getLogger("router.http.endpoints")


class Keyed(Protocol):
    """A class of handlers: the one thing the decorator needs of it is the ``Auth`` it checks with."""

    @property
    def auth(self) -> Auth: ...


S = TypeVar("S", bound=Keyed)
P = ParamSpec("P")
Handler = Callable[Concatenate[S, Request, Principal, P], Awaitable[Response]]
Endpoint = Callable[Concatenate[S, Request, P], Awaitable[Response]]


def keyed(
    protocol: str | Callable[[Request], str] = OPENAI_CHAT, *, master_only: bool = False
) -> Callable[[Handler[S, P]], Endpoint[S, P]]:
    """``protocol``: the error shape of the endpoint's answers, or how to tell it from the request
    (``GET /v1/models/{id}`` answers each SDK in its own); ``master_only``: a virtual key is refused
    (403), for what shows every key's traffic or the router's configuration."""

    def decorate(handler: Handler[S, P]) -> Endpoint[S, P]:
        async def endpoint(self: S, request: Request, *args: P.args, **kwargs: P.kwargs) -> Response:
            try:
                principal = await self.auth.check(request, master_only=master_only)
                return await handler(self, request, principal, *args, **kwargs)
            except RouterError as err:
                return error_reply(err, protocol(request) if callable(protocol) else protocol)
            except Exception:
                # A bug, but answered in the endpoint's shape as the proxy answers its own (Starlette's
                # was a text/plain "Internal Server Error" no SDK reads); the traceback goes to the log.
                log.exception("unexpected failure in %s %s", request.method, request.url.path)
                internal = RouterError("internal error in the router")
                return error_reply(internal, protocol(request) if callable(protocol) else protocol)

        # Not functools.wraps: FastAPI reads the signature through ``__wrapped__``, and would take
        # ``principal`` for a query parameter. The annotations are resolved now (eval_str), in the
        # handler's module: FastAPI would look the strings up in this module's names instead.
        signature = inspect.signature(handler, eval_str=True)
        endpoint.__signature__ = signature.replace(  # type: ignore[attr-defined]
            parameters=[p for name, p in signature.parameters.items() if name != "principal"]
        )
        endpoint.__name__ = handler.__name__
        endpoint.__qualname__ = handler.__qualname__
        endpoint.__doc__ = handler.__doc__
        endpoint.__module__ = handler.__module__
        return endpoint

    return decorate
