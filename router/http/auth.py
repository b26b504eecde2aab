"""Who may call the router: the master key, virtual keys, or anyone (open mode).

Modes, decided when the app starts (and logged then):

* **master key** — ``ROUTER_MASTER_KEY`` is set (only ever from the environment): callers
  present it or a virtual key;
* **virtual keys** — no master key, but the store holds keys (revoked ones count: revoking every
  key must not open the router): callers present a valid virtual key;
* **open** — neither: anyone may call, for a laptop. While open, the store is asked again at most
  every ``ttl`` seconds (in the background, never delaying a request), so a key created with
  ``router keys create`` closes the router without a restart.

A presented key (``Authorization: Bearer`` or ``x-api-key``) is format-checked before anything
else, then hashed, looked up by hash, and the stored hash compared in constant time. Results,
misses included, are cached in-process for ``ttl`` seconds (so a revocation takes effect within
that time) in a bounded LRU. Keys are never echoed in errors or logs.
"""

from __future__ import annotations

import asyncio
import fnmatch
import hashlib
import hmac
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from pydantic import SecretStr
from starlette.requests import Request

from router.errors import AuthenticationFailed, PermissionDenied, ServiceUnavailable
from router.http.browsers import Browsers
from router.http.keys import hash_key, looks_like_key
from router.policy.scopes import TEAM_HEADER
from router.store import KeyRecord, Store

log = logging.getLogger("router.http.auth")

MAX_KEY_LENGTH = 256
DEFAULT_TTL_S = 30.0
#: Longest a key lookup may wait for the store (a slow store answers 503, never a hung request).
STORE_TIMEOUT_S = 2.0
DEFAULT_CACHE_SIZE = 10_000
#: A master key shorter than this is said to be guessable at startup: nothing limits how many keys
#: a client may try (each refusal costs it a connection, no more).
MIN_MASTER_KEY_CHARS = 24


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is calling, and the limits that go with their key (enforced by the state layer)."""

    key_id: str | None
    name: str
    budget_usd: float | None = None
    rpm: int | None = None
    tpm: int | None = None
    #: Requested-model names or globs this key may ask for; None means any.
    models: tuple[str, ...] | None = None
    master: bool = False
    #: The key's team (``router keys create --team``), which team scopes match on.
    team: str | None = None

    @classmethod
    def of(cls, rec: KeyRecord) -> Principal:
        return cls(
            key_id=rec.key_id, name=rec.name, budget_usd=rec.budget_usd, rpm=rec.rpm, tpm=rec.tpm,
            models=tuple(rec.models) if rec.models is not None else None, team=rec.team,
        )  # fmt: skip

    def own_team(self, headers: dict[str, str]) -> dict[str, str]:
        """``headers`` with the team that scopes and rules read set by the key: a virtual key's
        caller cannot name one (the master key and open mode are the operator's: their header stands)."""
        if self.key_id is None:
            return headers
        out = {k: v for k, v in headers.items() if k != TEAM_HEADER}
        if self.team is not None:
            out[TEAM_HEADER] = self.team
        return out

    def may_use(self, requested: str) -> bool:
        return self.models is None or any(fnmatch.fnmatchcase(requested, m) for m in self.models)

    def authorize_model(self, requested: str) -> None:
        """Raise ``PermissionDenied`` if this key may not ask for ``requested``."""
        if self.may_use(requested):
            return
        raise PermissionDenied(f"this key may not use model {requested!r}", param="model")


OPEN = Principal(key_id=None, name="open-mode")
MASTER = Principal(key_id=None, name="master", master=True)

_MISSING = "missing API key: send it as 'Authorization: Bearer <key>' or 'x-api-key'"
# Clients are often still set up with a provider's key: say which key the router takes.
_INVALID = "invalid API key: send the router's key (ROUTER_MASTER_KEY or a virtual key), not a provider's"


def presented_key(headers: Mapping[str, str]) -> str:
    # Both stripped alike (HTTP servers strip a header value's ends already; the Bearer form's
    # inner spaces are the router's to strip).
    key = (headers.get("x-api-key") or "").strip()
    if not key:
        auth = headers.get("authorization") or ""
        key = auth[7:].strip() if auth[:7].lower() == "bearer " else ""
    return key


class Auth:
    def __init__(
        self,
        master_key: SecretStr | None,
        store: Store | None = None,
        *,
        ttl: float = DEFAULT_TTL_S,
        cache_size: int = DEFAULT_CACHE_SIZE,
        clock: Callable[[], float] = time.monotonic,
        browsers: Browsers | None = None,
    ) -> None:
        secret = master_key.get_secret_value() if master_key is not None else ""
        # Only the master key's hash is kept: equal-length digests make the comparison constant-time.
        self._master = hashlib.sha256(secret.encode()).digest() if secret else None
        self._master_chars = len(secret)
        self._store = store
        self._ttl = ttl
        self._cache_size = cache_size
        self._clock = clock
        self._browsers = browsers or Browsers()
        self._cache: OrderedDict[str, tuple[float, KeyRecord | None]] = OrderedDict()
        self._keys_exist = False
        #: The mode has been said (``start``): from then on, keys found end an open mode this
        #: process served, which is worth a warning; found at startup, they are just its mode.
        self._announced = False
        self._mode_checked = float("-inf")
        self._refreshing: asyncio.Task[None] | None = None

    @property
    def open(self) -> bool:
        return self._master is None and not self._keys_exist

    @property
    def mode(self) -> str:
        if self._master is not None:
            return "master key"
        return "virtual keys" if self._keys_exist else "open"

    @property
    def has_master(self) -> bool:
        return self._master is not None

    def is_master(self, key: str) -> bool:
        """Whether ``key`` is the master key (constant time)."""
        if self._master is None or len(key) > MAX_KEY_LENGTH:
            return False
        return hmac.compare_digest(
            hashlib.sha256(key.encode("utf-8", "surrogatepass")).digest(), self._master
        )

    def session_secret(self) -> bytes | None:
        """A secret for signing dashboard sessions, derived from the master key (None without one)."""
        if self._master is None:
            return None
        return hmac.new(self._master, b"router-ui-session", hashlib.sha256).digest()

    async def start(self) -> None:
        """Decide the mode (the store must be open) and say which it is."""
        await self._refresh_mode()
        self.announce()
        self._announced = True

    def announce(self) -> None:
        if self.open:
            log.warning(
                "auth: OPEN MODE - no ROUTER_MASTER_KEY and no virtual keys; any client that can reach "
                "the router may use it (set ROUTER_MASTER_KEY to close it and keep the dashboard behind a "
                "login; a key from `router keys create` alone closes it and locks the dashboard)"
            )
        elif self._master is not None:
            log.info("auth: master key mode - callers need ROUTER_MASTER_KEY or a virtual key")
            if self._master_chars < MIN_MASTER_KEY_CHARS:
                log.warning(
                    "auth: ROUTER_MASTER_KEY is only %d characters: a short key can be guessed, and "
                    "nothing limits how many a client may try; use a random one (openssl rand -hex 24)",
                    self._master_chars,
                )
        else:
            log.info("auth: virtual keys mode - callers need a virtual key (no master key is set)")

    async def _refresh_mode(self) -> None:
        self._mode_checked = self._clock()
        if self._master is not None or self._store is None or self._keys_exist:
            return
        try:
            # Bounded: a store that is down must not stall startup, nor leave a refresh hanging.
            async with asyncio.timeout(STORE_TIMEOUT_S):
                self._keys_exist = bool(await self._store.list_keys())
        except Exception as exc:  # the mode stays as it was until the store answers again
            log.warning("auth: cannot read virtual keys from the store: %s", type(exc).__name__)
            return
        if self._keys_exist and self._announced:
            log.warning("auth: virtual keys exist now; open mode has ended")

    def _refreshed(self, _: asyncio.Task[None]) -> None:
        self._refreshing = None

    def admit_browser(self, headers: Mapping[str, str]) -> None:
        """In open mode, ``PermissionDenied`` for what a web page not this machine's sends (see
        ``router.http.browsers``): every open endpoint, the dashboard's pages too, checks here."""
        if self.open and (reason := self._browsers.refusal(headers)) is not None:
            raise PermissionDenied(reason)

    async def check(self, request: Request, *, master_only: bool = False) -> Principal:
        """The caller, or ``AuthenticationFailed`` (401) / ``PermissionDenied`` (403)."""
        if self.open:
            self.admit_browser(request.headers)
            if self._clock() - self._mode_checked >= self._ttl and self._refreshing is None:
                # In the background: a slow or unreachable store must not hold up open-mode traffic.
                self._mode_checked = self._clock()
                self._refreshing = asyncio.create_task(self._refresh_mode(), name="auth-mode")
                self._refreshing.add_done_callback(self._refreshed)
            return OPEN
        key = presented_key(request.headers)
        if not key:
            raise AuthenticationFailed(_MISSING)
        if len(key) > MAX_KEY_LENGTH:
            raise AuthenticationFailed(_INVALID)
        if self.is_master(key):
            return MASTER
        if not looks_like_key(key):
            raise AuthenticationFailed(_INVALID)
        rec = await self._lookup(hash_key(key))
        if rec is None:
            raise AuthenticationFailed(_INVALID)
        if rec.revoked_at is not None:
            raise AuthenticationFailed("this API key has been revoked")
        if master_only:
            raise PermissionDenied("this endpoint needs the master key (ROUTER_MASTER_KEY)")
        return Principal.of(rec)

    async def _lookup(self, digest: str) -> KeyRecord | None:
        now = self._clock()
        hit = self._cache.get(digest)
        if hit is not None and hit[0] > now:
            self._cache.move_to_end(digest)
            rec = hit[1]
        else:
            if self._store is None:
                return None
            try:
                async with asyncio.timeout(STORE_TIMEOUT_S):
                    rec = await self._store.get_key_by_hash(digest)
            except Exception as exc:
                log.error("auth: key lookup failed: %s", type(exc).__name__)
                raise ServiceUnavailable("cannot check the API key right now; try again") from None
            self._cache[digest] = (now + self._ttl, rec)
            self._cache.move_to_end(digest)
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        # The index found the row by hash; comparing the digests again costs nothing and keeps the
        # final decision constant-time whatever the database's comparison does.
        if rec is None or not hmac.compare_digest(rec.key_hash.encode(), digest.encode()):
            return None
        return rec
