"""Virtual keys: their format, their hash, and a new key's record (``router keys`` is
``router.app.commands.keys``).

A key is ``rk-`` followed by 40 URL-safe characters from ``secrets`` (240 random bits). The
store keeps only ``sha256(key)``: a plain, unsalted hash is enough because the key is not a
password. Salts, peppers and slow KDFs exist to make guessing *low-entropy* secrets from a
stolen hash expensive; guessing a 240-bit random key is out of reach at any hash speed, and an
unsalted hash is what lets authentication find the key with one indexed lookup.
"""

from __future__ import annotations

import hashlib
import re
import secrets
import time

from router.store import KeyRecord

KEY_PREFIX = "rk-"
#: ``secrets.token_urlsafe(30)`` is exactly 40 characters: 30 random bytes in unpadded base64url.
_RANDOM_BYTES = 30
KEY_LENGTH = len(KEY_PREFIX) + 40
KEY_FORMAT = re.compile(r"rk-[A-Za-z0-9_-]{40}")
#: How much of a key listings show: enough to tell keys apart, far too little to guess the rest.
DISPLAY_CHARS = 8


def generate_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(_RANDOM_BYTES)


def looks_like_key(text: str) -> bool:
    """The format check made before any lookup: length, prefix and alphabet."""
    return len(text) == KEY_LENGTH and KEY_FORMAT.fullmatch(text) is not None


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode("ascii")).hexdigest()


def new_key(
    name: str,
    *,
    budget_usd: float | None = None,
    rpm: int | None = None,
    tpm: int | None = None,
    models: list[str] | None = None,
    team: str | None = None,
    now: float | None = None,
) -> tuple[str, KeyRecord]:
    """A fresh key and the record to store for it. The key is returned once and kept nowhere."""
    key = generate_key()
    rec = KeyRecord(
        key_id="key_" + secrets.token_hex(6),
        key_hash=hash_key(key),
        prefix=key[:DISPLAY_CHARS],
        name=name,
        created_at=time.time() if now is None else now,
        budget_usd=budget_usd,
        rpm=rpm,
        tpm=tpm,
        models=models,
        team=team,
    )
    return key, rec
