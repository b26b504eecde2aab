"""Who may call the proxy.

Open mode (no master key configured) is for a laptop and says so at startup. With
``ROUTER_MASTER_KEY`` set, every proxy call must present it as a bearer token or ``x-api-key``;
the comparison is constant-time and the presented key is never echoed or logged.
"""

from __future__ import annotations

import hmac
import logging

from pydantic import SecretStr
from starlette.requests import Request

from router.errors import AuthenticationFailed

log = logging.getLogger("router.auth")

MAX_KEY_LENGTH = 256


class Auth:
    def __init__(self, master_key: SecretStr | None) -> None:
        secret = master_key.get_secret_value() if master_key is not None else ""
        self._master = secret.encode() or None

    @property
    def open(self) -> bool:
        return self._master is None

    def announce(self) -> None:
        if self.open:
            log.warning("auth: OPEN MODE - no ROUTER_MASTER_KEY set; any local client may use the router")

    def check(self, request: Request) -> None:
        if self._master is None:
            return
        presented = request.headers.get("x-api-key") or ""
        if not presented:
            auth = request.headers.get("authorization") or ""
            presented = auth[7:].strip() if auth[:7].lower() == "bearer " else ""
        if not presented:
            raise AuthenticationFailed(
                "missing API key: send it as 'Authorization: Bearer <key>' or 'x-api-key'"
            )
        if len(presented) > MAX_KEY_LENGTH or not hmac.compare_digest(presented.encode(), self._master):
            raise AuthenticationFailed("invalid API key")
