"""Budgets in Redis: reserve across every scope in one Lua script, settle/release in another.

Per scope three keys (see ``router.shared`` for the layout): ``budget:spent:{scope}`` (hash:
``spent``, ``reserved``, integer nano-USD), ``budget:exp:{scope}`` (zset: reservation id -> expiry
in ms on the Redis clock) and ``budget:amt:{scope}`` (hash: reservation id -> nano-USD). Each
script first purges expired reservations of the scopes it touches (subtracting them from
``reserved``), so a crashed replica's holds stop counting once their TTL passes without anyone
having to clean up. Scripts run atomically, so the check-then-add of ``reserve`` cannot interleave
with another replica's. A task's keys expire once it has been idle for ``budget_idle_ttl_s``; a
key's never do (``router.shared.memory.lasting``): Redis must not evict them (``noeviction``).

Settles are idempotent: ``budget:done:{reservation}`` marks one that has landed, so a settle
retried after a lost reply (the script ran, the answer did not come back) is not counted twice.
``budget:restored:2`` (no TTL) says the counts are whole: Redis restarted without its data (or a
new prefix) lacks it, and ``reserve``/``spent`` then first restore every scope from the log
(``restore_from``) before they answer.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any

from redis.asyncio import Redis

from router.shared.memory import lasting, unique_scopes
from router.shared.redis_guard import RedisGuard
from router.shared.redis_keys import Keys
from router.shared.types import (
    NANO,
    BudgetExceeded,
    Reservation,
    Spend,
    SpendSource,
    StateConfig,
    StateUnavailable,
    to_nano,
)

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
  for _, k in ipairs({h, z, a}) do
    if idle == '0' then redis.call('PERSIST', k) else redis.call('PEXPIRE', k, idle) end
  end
end
"""

# KEYS: the restored marker, then (spent hash, exp zset, amt hash) per scope.
# ARGV: reservation id, ttl ms, then per scope its amount (a scope may hold more than another),
# its limit (-1 = no limit), its idle lifetime in ms ('0': kept, the scope lasts) and what it holds
# on top as far as its limit leaves room (``upto``).
# Returns {1, then per scope what it held of its ``upto``} when reserved, {2} when the counts must
# first be restored from the log, else {0, scope index (1-based), spent, reserved}.
RESERVE = (
    _PRELUDE
    + """
if redis.call('EXISTS', KEYS[1]) == 0 then return {2} end
local n = (#KEYS - 1) / 3
for i = 1, n do
  local h, z, a = KEYS[3*i-1], KEYS[3*i], KEYS[3*i+1]
  purge(h, z, a)
  local limit = tonumber(ARGV[4*i])
  if limit >= 0 then
    local spent = tonumber(redis.call('HGET', h, 'spent') or '0')
    local reserved = tonumber(redis.call('HGET', h, 'reserved') or '0')
    if spent + reserved + tonumber(ARGV[4*i - 1]) > limit then
      return {0, i, string.format('%d', spent), string.format('%d', reserved)}
    end
  end
end
local held = {1}
for i = 1, n do
  local h, z, a = KEYS[3*i-1], KEYS[3*i], KEYS[3*i+1]
  local amount, limit, extra = tonumber(ARGV[4*i - 1]), tonumber(ARGV[4*i]), tonumber(ARGV[4*i + 2])
  if extra > 0 and limit >= 0 then
    local used = tonumber(redis.call('HGET', h, 'spent') or '0') + tonumber(redis.call('HGET', h, 'reserved') or '0')
    extra = math.min(extra, math.max(0, limit - used - amount))
  end
  local total = string.format('%d', amount + extra)
  redis.call('HINCRBY', h, 'reserved', total)
  redis.call('ZADD', z, now + tonumber(ARGV[2]), ARGV[1])
  redis.call('HSET', a, ARGV[1], total)
  touch(h, z, a, ARGV[4*i + 1])
  held[i + 1] = string.format('%d', extra)
end
return held
"""
)

# KEYS: the reservation's done marker, then the scopes' triples as RESERVE.
# ARGV: reservation id, actual spend (0 for a release), done marker's lifetime ms, then one idle
# lifetime per scope as RESERVE.
# Drops the hold where it is still live and adds the actual spend to every scope. Returns how many
# scopes still held the reservation (0: it had expired; the spend is recorded anyway), or -1 when
# it had already been closed (a retry whose first try landed but whose reply was lost).
CLOSE = (
    _PRELUDE
    + """
if not redis.call('SET', KEYS[1], '1', 'NX', 'PX', ARGV[3]) then return -1 end
local live = 0
for i = 1, (#KEYS - 1) / 3 do
  local h, z, a = KEYS[3*i-1], KEYS[3*i], KEYS[3*i+1]
  purge(h, z, a)
  local amount = redis.call('HGET', a, ARGV[1])
  if amount then
    live = live + 1
    redis.call('HDEL', a, ARGV[1])
    redis.call('ZREM', z, ARGV[1])
    redis.call('HINCRBY', h, 'reserved', string.format('%d', -tonumber(amount)))
  end
  if ARGV[2] ~= '0' then redis.call('HINCRBY', h, 'spent', ARGV[2]) end
  touch(h, z, a, ARGV[3 + i])
end
return live
"""
)

# KEYS: the scopes' triples as RESERVE. ARGV: reservation id, ttl ms, then one idle lifetime per
# scope as RESERVE. Moves the hold's expiry to now + ttl in every scope that still holds it (a
# lapsed, settled or released one is not held again). Returns how many scopes did.
EXTEND = (
    _PRELUDE
    + """
local live = 0
for i = 1, #KEYS / 3 do
  local h, z, a = KEYS[3*i-2], KEYS[3*i-1], KEYS[3*i]
  purge(h, z, a)
  if redis.call('HEXISTS', a, ARGV[1]) == 1 then
    live = live + 1
    redis.call('ZADD', z, 'XX', now + tonumber(ARGV[2]), ARGV[1])
    touch(h, z, a, ARGV[2 + i])
  end
end
return live
"""
)

# KEYS: the restored marker, one scope's triple. Returns {spent, reserved} after purging expired
# holds, or {} when the counts must first be restored from the log.
USAGE = (
    _PRELUDE
    + """
if redis.call('EXISTS', KEYS[1]) == 0 then return {} end
purge(KEYS[2], KEYS[3], KEYS[4])
local v = redis.call('HMGET', KEYS[2], 'spent', 'reserved')
return {v[1] or '0', v[2] or '0'}
"""
)

# KEYS: the restored marker, then one spent hash per scope. ARGV: whether to set the marker ('1'
# on the last slice), then per scope its spend in the log (nano-USD) and its idle lifetime as
# RESERVE. A scope's spend
# becomes the larger of the two: a settle that landed since Redis came back is in both or only in
# Redis, never counted twice, and replicas restoring at once write the same values. The marker,
# set last, says the counts are whole again.
RESTORE = """
for i = 2, #KEYS do
  local logged, idle = ARGV[2 * i - 2], ARGV[2 * i - 1]
  if tonumber(logged) > tonumber(redis.call('HGET', KEYS[i], 'spent') or '0') then
    redis.call('HSET', KEYS[i], 'spent', logged)
  end
  if idle == '0' then redis.call('PERSIST', KEYS[i]) else redis.call('PEXPIRE', KEYS[i], idle) end
end
if ARGV[1] == '1' then redis.call('SET', KEYS[1], redis.call('TIME')[1]) end
return #KEYS - 1
"""

#: How long a settle's done marker outlives it: the longest a retry may follow the try that landed
#: unanswered (the outage that cut its reply) and still count nothing again. A marker is ~100 bytes
#: of Redis memory per request for this long: an hour at 100 requests/s is ~36 MB.
DONE_TTL_MS = 3_600_000

log = logging.getLogger(__name__)


class RedisBudgets:
    """Fails closed: when Redis cannot answer, every method raises ``StateUnavailable``."""

    def __init__(self, client: Redis, guard: RedisGuard, keys: Keys, config: StateConfig) -> None:
        self._client = client
        self._guard = guard
        self._keys = keys
        self._default_ttl = config.reservation_ttl_s
        self._idle_s = max(config.budget_idle_ttl_s, config.reservation_ttl_s)
        self._idle_ms = str(int(self._idle_s * 1000) + 60_000)
        self._reserve = client.register_script(RESERVE)
        self._close = client.register_script(CLOSE)
        self._extend = client.register_script(EXTEND)
        self._usage = client.register_script(USAGE)
        self._restore = client.register_script(RESTORE)
        self._source: SpendSource | None = None
        self._restoring = asyncio.Lock()

    def restore_from(self, source: SpendSource) -> None:
        """Where spend comes from when Redis is found without its counts (restarted empty)."""
        self._source = source

    def _idles(self, scopes: Sequence[str]) -> list[str]:
        """Each scope's idle lifetime in ms for the scripts: '0' for one that lasts (a key's)."""
        return ["0" if lasting(s) else self._idle_ms for s in scopes]

    def _triples(self, scopes: Sequence[str]) -> list[str]:
        return [k for s in scopes for k in self._keys.budget(s)]

    async def reserve(
        self,
        scope_keys: Sequence[str],
        amount_usd: float,
        limits: Mapping[str, float],
        *,
        ttl_s: float | None = None,
        more: Mapping[str, float] | None = None,
        upto: Mapping[str, float] | None = None,
    ) -> Reservation:
        more, upto = dict(more or {}), upto or {}
        ttl = self._default_ttl if ttl_s is None else ttl_s
        if not ttl > 0:
            raise ValueError(f"ttl_s must be > 0, got {ttl!r}")
        scopes = unique_scopes(scope_keys)
        rid = uuid.uuid4().hex
        if not scopes:
            return Reservation(rid, scopes, amount_usd, time.time() + ttl, ttl, more=more)
        args: list[Any] = [rid, str(int(ttl * 1000))]
        for scope, idle in zip(scopes, self._idles(scopes), strict=True):
            limit = limits.get(scope)
            args += [
                str(to_nano(amount_usd + more.get(scope, 0.0))),
                str(to_nano(limit)) if limit is not None else "-1",
                idle,
                str(max(0, to_nano(upto.get(scope, 0.0)))),
            ]
        keys = [self._keys.budget_restored, *self._triples(scopes)]
        result = await self._guard.fail_closed("budgets", "budget check", lambda: self._reserve(keys, args))
        if int(result[0]) == 2:
            await self._restore_counts()
            result = await self._guard.fail_closed(
                "budgets", "budget check", lambda: self._reserve(keys, args)
            )
        if int(result[0]) == 2:
            raise StateUnavailable("budget check", "the budget counts could not be restored from the log")
        if int(result[0]) != 1:
            i = int(result[1]) - 1
            spent, reserved = int(result[2]) / NANO, int(result[3]) / NANO
            raise BudgetExceeded(
                scopes[i], limits[scopes[i]], spent, reserved, amount_usd + more.get(scopes[i], 0.0)
            )
        for scope, extra in zip(scopes, result[1:], strict=True):
            if int(extra):
                more[scope] = more.get(scope, 0.0) + int(extra) / NANO
        # Timed from the answer: a restore before it may have taken a while.
        return Reservation(rid, scopes, amount_usd, time.time() + ttl, ttl, more=more)

    async def settle(self, reservation: Reservation, actual_usd: float) -> None:
        """Raises ``StateUnavailable`` if Redis is down: the reservation stays open, so the same
        call may be retried (it is counted once however many tries reach Redis)."""
        await self._finish(reservation, to_nano(actual_usd))

    async def release(self, reservation: Reservation) -> None:
        await self._finish(reservation, 0)

    async def _finish(self, reservation: Reservation, actual: int) -> None:
        if reservation.closed:
            return
        if reservation.scopes:
            keys = [self._keys.budget_done(reservation.id), *self._triples(reservation.scopes)]
            args = [reservation.id, str(actual), str(DONE_TTL_MS), *self._idles(reservation.scopes)]
            await self._guard.fail_closed("budgets", "budget accounting", lambda: self._close(keys, args))
        reservation.closed = True

    async def extend(self, reservation: Reservation) -> bool:
        if reservation.closed or not reservation.scopes:
            return False
        keys = self._triples(reservation.scopes)
        args = [reservation.id, str(int(reservation.ttl_s * 1000)), *self._idles(reservation.scopes)]
        live = await self._guard.fail_closed("budgets", "budget hold", lambda: self._extend(keys, args))
        if int(live) > 0:
            reservation.expires_at = time.time() + reservation.ttl_s
        return int(live) > 0

    async def spent(self, scope: str) -> Spend:
        keys = [self._keys.budget_restored, *self._keys.budget(scope)]
        found = await self._guard.fail_closed("budgets", "budget check", lambda: self._usage(keys))
        if not found:
            await self._restore_counts()
            found = await self._guard.fail_closed("budgets", "budget check", lambda: self._usage(keys))
        if not found:
            raise StateUnavailable("budget check", "the budget counts could not be restored from the log")
        return Spend(int(found[0]) / NANO, int(found[1]) / NANO)

    async def _restore_counts(self) -> None:
        """Redis has lost its counts (restarted empty): every scope's spend from the log, once
        per replica at a time (the others wait for it and then find the marker)."""
        async with self._restoring:
            marker = self._keys.budget_restored
            if await self._guard.fail_closed("budgets", "budget check", lambda: self._exists(marker)):
                return  # restored meanwhile, here or by another replica
            spent: Mapping[str, float] = {}
            if self._source is not None:
                try:
                    spent = await self._source(time.time() - self._idle_s)
                except Exception as exc:  # counts restored from nothing would reset every budget
                    raise StateUnavailable(
                        "budget check", f"the log could not be read to restore budgets: {exc}"
                    ) from None
            scopes = [s for s, usd in spent.items() if usd > 0]
            log.warning("shared state: Redis has no budget counts (restarted empty?): restoring %d "
                        "scopes from the log", len(scopes))  # fmt: skip
            # In slices: one script call holds Redis for its whole run. The last sets the marker.
            for start in range(0, max(len(scopes), 1), _RESTORE_SLICE):
                part = scopes[start : start + _RESTORE_SLICE]
                last = "1" if start + _RESTORE_SLICE >= len(scopes) else "0"
                keys = [marker, *(self._keys.budget(s)[0] for s in part)]
                args = [last]
                for scope, idle in zip(part, self._idles(part), strict=True):
                    args += [str(to_nano(spent[scope])), idle]
                await self._guard.fail_closed("budgets", "budget check", partial(self._restore, keys, args))

    async def _exists(self, key: str) -> bool:
        return bool(await self._client.exists(key))


#: Scopes written per restore script call.
_RESTORE_SLICE = 2_000
