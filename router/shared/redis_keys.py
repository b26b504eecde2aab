"""Redis key names of the state layer, in one place (the layout is documented in ``router.shared``)."""

from __future__ import annotations

import hashlib

# Ids come from clients (task ids) and operators (key names); a long one is hashed so that key
# size stays bounded whatever a header carries.
_MAX_ID = 200


def _part(ident: str) -> str:
    if len(ident) <= _MAX_ID:
        return ident
    return "sha256:" + hashlib.sha256(ident.encode("utf-8", "surrogatepass")).hexdigest()


class Keys:
    def __init__(self, prefix: str) -> None:
        self.prefix = prefix

    def pin(self, task_id: str) -> str:
        return f"{self.prefix}pin:{_part(task_id)}"

    def warm(self, task_id: str) -> str:
        return f"{self.prefix}warm:{_part(task_id)}"

    def attempt(self, task_id: str) -> str:
        """The hash of the task's latest attempt (``router.shared.types.AttemptMark``)."""
        return f"{self.prefix}attempt:{_part(task_id)}"

    def budget(self, scope: str) -> tuple[str, str, str]:
        """The scope's totals hash, reservation-expiry zset and reservation-amount hash.

        The kind comes before the id so that no scope name can collide with another's keys.
        """
        s = _part(scope)
        return (
            f"{self.prefix}budget:spent:{s}",
            f"{self.prefix}budget:exp:{s}",
            f"{self.prefix}budget:amt:{s}",
        )

    @property
    def budget_restored(self) -> str:
        """Present while the budget counts are whole (absent in a Redis that lost its data).

        The second layout's: a Redis written before keys' counts lasted (``budget:restored``) gave
        each a 40-day lifetime, so it is restored once as if empty, which makes them last."""
        return f"{self.prefix}budget:restored:2"

    def budget_done(self, reservation_id: str) -> str:
        """Marks a reservation whose settle (or release) has landed."""
        return f"{self.prefix}budget:done:{_part(reservation_id)}"

    def rate(self, key: str) -> tuple[str, str]:
        """The window's event log (zset) and its running sums (hash)."""
        k = _part(key)
        return f"{self.prefix}rl:log:{k}", f"{self.prefix}rl:sum:{k}"

    def breaker(self, backend: str) -> tuple[str, str]:
        """The breaker's state hash and its half-open probe lock."""
        b = _part(backend)
        return f"{self.prefix}breaker:state:{b}", f"{self.prefix}breaker:probe:{b}"

    @property
    def policy_version(self) -> str:
        return f"{self.prefix}policy:version"

    @property
    def policy_channel(self) -> str:
        return f"{self.prefix}policy:events"
