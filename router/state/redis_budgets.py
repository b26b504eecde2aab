"""Budgets in Redis: reserve across every scope in one Lua script, settle/release in another.

Per scope three keys (see ``router.state`` for the layout): ``budget:spent:{scope}`` (hash:
``spent``, ``reserved``, integer nano-USD), ``budget:exp:{scope}`` (zset: reservation id -> expiry
in ms on the Redis clock) and ``budget:amt:{scope}`` (hash: reservation id -> nano-USD). Each
script first purges expired reservations of the scopes it touches (subtracting them from
``reserved``), so a crashed replica's holds stop counting once their TTL passes without anyone
having to clean up. Scripts run atomically, so the check-then-add of ``reserve`` cannot interleave
with another replica's.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from redis.asyncio import Redis

from router.state.memory import unique_scopes
from router.state.redis_guard import RedisGuard
from router.state.redis_keys import Keys
from router.state.types import NANO, BudgetExceeded, Reservation, Spend, StateConfig, to_nano

# Shared prelude: Redis-clock "now" in ms, and the purge of one scope's expired reservations
# (bounded per call; leftovers go next time and meanwhile still count, i.e. err on the safe side).
_PRELUDE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local function purge(h, z, a)
  local ids = redis.call('ZRANGEBYSCORE', z, '-inf', now, 'LIMIT', 0, 256)
  if #ids == 0 then return end
  local freed = 0
  for _, id in ipairs(ids) do
    freed = freed + tonumber(redis.call('HGET', a, id) or '0')
    redis.call('HDEL', a, id)
    redis.call('ZREM', z, id)
  end
  redis.call('HINCRBY', h, 'reserved', string.format('%d', -freed))
end
local function touch(h, z, a, idle)
  redis.call('PEXPIRE', h, idle)
  redis.call('PEXPIRE', z, idle)
  redis.call('PEXPIRE', a, idle)
end
"""

# KEYS: (spent hash, exp zset, amt hash) per scope.
# ARGV: amount, reservation id, ttl ms, idle ms, then one limit per scope (-1 = no limit).
# Returns {1} when reserved, else {0, scope index (1-based), spent, reserved}.
RESERVE = (
    _PRELUDE
    + """
local amount = tonumber(ARGV[1])
local n = #KEYS / 3
for i = 1, n do
  local h, z, a = KEYS[3*i-2], KEYS[3*i-1], KEYS[3*i]
  purge(h, z, a)
  local limit = tonumber(ARGV[4 + i])
  if limit >= 0 then
    local spent = tonumber(redis.call('HGET', h, 'spent') or '0')
    local reserved = tonumber(redis.call('HGET', h, 'reserved') or '0')
    if spent + reserved + amount > limit then
      return {0, i, string.format('%d', spent), string.format('%d', reserved)}
    end
  end
end
for i = 1, n do
  local h, z, a = KEYS[3*i-2], KEYS[3*i-1], KEYS[3*i]
  redis.call('HINCRBY', h, 'reserved', ARGV[1])
  redis.call('ZADD', z, now + tonumber(ARGV[3]), ARGV[2])
  redis.call('HSET', a, ARGV[2], ARGV[1])
  touch(h, z, a, ARGV[4])
end
return {1}
"""
)

# KEYS as RESERVE. ARGV: reservation id, actual spend (0 for a release), idle ms.
# Drops the hold where it is still live and adds the actual spend to every scope. Returns how many
# scopes still held the reservation (0: it had expired; the spend is recorded anyway).
CLOSE = (
    _PRELUDE
    + """
local live = 0
for i = 1, #KEYS / 3 do
  local h, z, a = KEYS[3*i-2], KEYS[3*i-1], KEYS[3*i]
  purge(h, z, a)
  local amount = redis.call('HGET', a, ARGV[1])
  if amount then
    live = live + 1
    redis.call('HDEL', a, ARGV[1])
    redis.call('ZREM', z, ARGV[1])
    redis.call('HINCRBY', h, 'reserved', string.format('%d', -tonumber(amount)))
  end
  if ARGV[2] ~= '0' then redis.call('HINCRBY', h, 'spent', ARGV[2]) end
  touch(h, z, a, ARGV[3])
end
return live
"""
)

# KEYS: one scope's triple. Returns {spent, reserved} after purging expired holds.
USAGE = (
    _PRELUDE
    + """
purge(KEYS[1], KEYS[2], KEYS[3])
local v = redis.call('HMGET', KEYS[1], 'spent', 'reserved')
return {v[1] or '0', v[2] or '0'}
"""
)


class RedisBudgets:
    """Fails closed: when Redis cannot answer, every method raises ``StateUnavailable``."""

    def __init__(self, client: Redis, guard: RedisGuard, keys: Keys, config: StateConfig) -> None:
        self._guard = guard
        self._keys = keys
        self._default_ttl = config.reservation_ttl_s
        self._idle_ms = str(int(max(config.budget_idle_ttl_s, config.reservation_ttl_s) * 1000) + 60_000)
        self._reserve = client.register_script(RESERVE)
        self._close = client.register_script(CLOSE)
        self._usage = client.register_script(USAGE)

    def _triples(self, scopes: Sequence[str]) -> list[str]:
        return [k for s in scopes for k in self._keys.budget(s)]

    async def reserve(
        self,
        scope_keys: Sequence[str],
        amount_usd: float,
        limits: Mapping[str, float],
        *,
        ttl_s: float | None = None,
    ) -> Reservation:
        amount = to_nano(amount_usd)
        ttl = self._default_ttl if ttl_s is None else ttl_s
        if not ttl > 0:
            raise ValueError(f"ttl_s must be > 0, got {ttl!r}")
        scopes = unique_scopes(scope_keys)
        rid = uuid.uuid4().hex
        reservation = Reservation(rid, scopes, amount_usd, time.time() + ttl)
        if not scopes:
            return reservation
        lims = [str(to_nano(limits[s])) if limits.get(s) is not None else "-1" for s in scopes]
        args: list[Any] = [str(amount), rid, str(int(ttl * 1000)), self._idle_ms, *lims]
        keys = self._triples(scopes)
        result = await self._guard.fail_closed("budgets", "budget check", lambda: self._reserve(keys, args))
        if int(result[0]) != 1:
            i = int(result[1]) - 1
            spent, reserved = int(result[2]) / NANO, int(result[3]) / NANO
            raise BudgetExceeded(scopes[i], limits[scopes[i]], spent, reserved, amount_usd)
        return reservation

    async def settle(self, reservation: Reservation, actual_usd: float) -> None:
        """Raises ``StateUnavailable`` if Redis is down: the hold then expires by itself and this
        spend goes unrecorded in Redis (the request log still has it)."""
        await self._finish(reservation, to_nano(actual_usd))

    async def release(self, reservation: Reservation) -> None:
        await self._finish(reservation, 0)

    async def _finish(self, reservation: Reservation, actual: int) -> None:
        if reservation.closed:
            return
        reservation.closed = True
        if not reservation.scopes:
            return
        keys = self._triples(reservation.scopes)
        args = [reservation.id, str(actual), self._idle_ms]
        await self._guard.fail_closed("budgets", "budget accounting", lambda: self._close(keys, args))

    async def spent(self, scope: str) -> Spend:
        keys = list(self._keys.budget(scope))
        spent, reserved = await self._guard.fail_closed("budgets", "budget check", lambda: self._usage(keys))
        return Spend(int(spent) / NANO, int(reserved) / NANO)
