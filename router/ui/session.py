"""The dashboard's login: the master key, typed once into a form, becomes a signed session cookie.

The cookie holds an expiry and an HMAC of it under a secret derived from the master key, never
the key itself; it is ``HttpOnly`` (no script reads it), ``SameSite=Strict`` (no other site's
form can use it) and scoped to ``/ui``. Every replica sharing the master key accepts it, and
changing the key ends every session.
"""

from __future__ import annotations

import hashlib
import hmac
import time

COOKIE = "router_ui"
TTL_S = 12 * 3600


def issue(secret: bytes, now: float | None = None) -> str:
    expires = int((time.time() if now is None else now) + TTL_S)
    return f"{expires}.{_mac(secret, expires)}"


def valid(secret: bytes, token: str | None, now: float | None = None) -> bool:
    if not token:
        return False
    expires, _, mac = token.partition(".")
    if not expires.isdigit() or int(expires) < (time.time() if now is None else now):
        return False
    return hmac.compare_digest(mac, _mac(secret, int(expires)))


def _mac(secret: bytes, expires: int) -> str:
    return hmac.new(secret, f"router-ui-session:{expires}".encode(), hashlib.sha256).hexdigest()


def safe_next(target: str | None) -> str:
    """Where to go after logging in: only a dashboard path, so the form cannot redirect off-site."""
    if target and target.startswith("/ui") and "//" not in target and "\\" not in target:
        return target
    return "/ui"
