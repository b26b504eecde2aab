"""The dashboard's login: the master key, typed once into a form, becomes a signed session cookie.

The cookie holds an expiry and an HMAC of it under a secret derived from the master key, never
the key itself; it is ``HttpOnly`` (no script reads it), ``SameSite=Strict`` (no other site's
form can use it) and scoped to ``/ui``. Every replica sharing the master key accepts it, and
changing the key ends every session.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections.abc import Mapping

from router.digits import whole_number

COOKIE = "router_ui"
TTL_S = 12 * 3600


class Sessions:
    """Issues and checks session cookies, and remembers the ones logged out until they expire.

    A cookie is ``{expires}.{nonce}.{mac}``: the random nonce names the session, so logging out
    ends that session (a copy of the cookie kept from before stops working too), on this router
    (replicas keep their own list: a session logged out on one still works on another until it
    expires)."""

    #: Logged-out sessions remembered at most (the oldest expiring are forgotten first).
    MAX_REVOKED = 10_000

    def __init__(self) -> None:
        self._revoked: dict[str, int] = {}

    def issue(self, secret: bytes, now: float | None = None) -> str:
        expires = int((time.time() if now is None else now) + TTL_S)
        nonce = secrets.token_hex(16)
        return f"{expires}.{nonce}.{_mac(secret, expires, nonce)}"

    def valid(self, secret: bytes, token: str | None, now: float | None = None) -> bool:
        parsed = _parse(token)
        if parsed is None:
            return False
        expires, nonce, mac = parsed
        if expires < (time.time() if now is None else now) or nonce in self._revoked:
            return False
        return hmac.compare_digest(mac.encode(), _mac(secret, expires, nonce).encode())

    def revoke(self, secret: bytes, token: str | None, now: float | None = None) -> None:
        """End the session ``token`` names (if it is a valid one)."""
        now = time.time() if now is None else now
        if not self.valid(secret, token, now):
            return
        parsed = _parse(token)
        assert parsed is not None
        self._revoked = {n: e for n, e in self._revoked.items() if e >= now}
        if len(self._revoked) >= self.MAX_REVOKED:
            del self._revoked[min(self._revoked, key=self._revoked.__getitem__)]
        self._revoked[parsed[1]] = parsed[0]


def _parse(token: str | None) -> tuple[int, str, str] | None:
    """``(expires, nonce, mac)`` of a cookie, or None for anything else (whatever a client sends:
    a non-ASCII or oversized cookie is not a session, never a 500)."""
    if not token or len(token) > 200 or not token.isascii():
        return None
    parts = token.split(".")
    if len(parts) != 3 or len(parts[0]) > 12 or (expires := whole_number(parts[0], 10**12)) is None:
        return None
    return expires, parts[1], parts[2]


def _mac(secret: bytes, expires: int, nonce: str) -> str:
    return hmac.new(secret, f"router-ui-session:{expires}:{nonce}".encode(), hashlib.sha256).hexdigest()


def same_origin(headers: Mapping[str, str], scheme: str) -> bool:
    """Whether a form POST comes from the dashboard's own pages: its ``Origin`` (or, without one,
    ``Referer``) names this host, and the browser does not call it cross-site. Requests without
    either header (curl, scripts) hold no cookie a page could have lent them."""
    host = headers.get("host", "")
    if headers.get("sec-fetch-site") in ("cross-site", "same-site"):
        return False
    origin = headers.get("origin")
    if origin is None and (referer := headers.get("referer")):
        origin = "/".join(referer.split("/", 3)[:3])
    if origin is None:
        return True
    return origin in (f"{scheme}://{host}", f"http://{host}", f"https://{host}") and bool(host)


def safe_next(target: str | None) -> str:
    """Where to go after logging in: only a dashboard path, so the form cannot redirect off-site."""
    if target and target.startswith("/ui") and "//" not in target and "\\" not in target:
        return target
    return "/ui"
