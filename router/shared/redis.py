"""Shared state in Redis (redis-py asyncio): ``RedisState`` and its task pins / affinity part.

One pooled client with short socket timeouts and no client-side retries (the guard's back-off
replaces them); every call also runs under ``op_timeout_s``. The other components live in the
``redis_*`` modules next to this one.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping
from typing import cast

from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.commands.core import AsyncScript
from redis.maint_notifications import MaintNotificationsConfig

from router.errors import ConfigError
from router.shared.memory import MemorySessions, MemoryState
from router.shared.redis_breaker import RedisBreakers
from router.shared.redis_budgets import RedisBudgets
from router.shared.redis_guard import RedisDown, RedisGuard
from router.shared.redis_keys import Keys
from router.shared.redis_limits import RedisRateLimits
from router.shared.redis_version import RedisPolicyVersion
from router.shared.types import AttemptMark, Pin, StateConfig, Warm
from router.store import mask_url

# A task's latest attempt (``AttemptMark``), as a hash: attempt, calls, failed, why, rule. Both
# scripts move it as ``AttemptMark.counted`` / ``.marked`` do; a mark of a later attempt than the
# one written stays as it is. ARGV[1]: the attempt, ARGV[2]: the expiry in ms.
COUNT_CALL = """
local have = tonumber(redis.call('HGET', KEYS[1], 'attempt') or '0')
local n = tonumber(ARGV[1])
if n < have then return 0 end
if n > have then
  redis.call('DEL', KEYS[1])
  redis.call('HSET', KEYS[1], 'attempt', n, 'calls', 1, 'failed', 0)
else
  redis.call('HINCRBY', KEYS[1], 'calls', 1)
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
"""
# ARGV[3]: 1 failed, 0 not; ARGV[4], ARGV[5]: the stop's why and rule ('' when not stopped).
MARK_ATTEMPT = """
local have = tonumber(redis.call('HGET', KEYS[1], 'attempt') or '0')
local n = tonumber(ARGV[1])
if n < have or (n > have and ARGV[5] == '') then return 0 end
if n > have then
  redis.call('DEL', KEYS[1])
  redis.call('HSET', KEYS[1], 'attempt', n, 'calls', 0)
end
redis.call('HSET', KEYS[1], 'failed', ARGV[3])
if ARGV[5] ~= '' then redis.call('HSET', KEYS[1], 'why', ARGV[4], 'rule', ARGV[5]) end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
"""


def connect(url: str, config: StateConfig) -> Redis:
    """A client over a blocking pool: waiting for a connection is bounded by ``pool_timeout_s``."""
    try:
        pool = BlockingConnectionPool.from_url(
            url,
            max_connections=config.pool_size,
            timeout=config.pool_timeout_s,
            socket_timeout=config.socket_timeout_s,
            socket_connect_timeout=config.connect_timeout_s,
            retry=Retry(NoBackoff(), 0),
            decode_responses=True,
            # With maintenance notifications on (redis-py's "auto"), the pool skips its check for
            # connections the server closed while idle, so the first call after a Redis restart
            # would fail on each stale pooled connection.
            maint_notifications_config=MaintNotificationsConfig(enabled=False),
            # No CLIENT SETINFO round trips on connect: a burst opens many connections at once.
            driver_info=None,
        )
    except ValueError as exc:
        raise ConfigError(f"invalid Redis URL {mask_url(url)!r}: {exc}") from None
    return Redis.from_pool(pool)


class RedisSessions:
    """Pins and warm prefixes are plain keys with a PX expiry; ``until`` comes from PTTL, so it
    does not depend on the writer's clock; a task's latest attempt is a hash moved by a script.
    Writes are mirrored to this replica's local maps, which answer when Redis is down (counted) or
    has never heard of the task (pinned during an outage, or Redis restarted empty)."""

    def __init__(self, client: Redis, guard: RedisGuard, keys: Keys, local: MemorySessions) -> None:
        self._client = client
        self._guard = guard
        self._keys = keys
        self._local = local
        self._count_call = client.register_script(COUNT_CALL)
        self._mark_attempt = client.register_script(MARK_ATTEMPT)

    async def pin(self, task_id: str) -> Pin | None:
        found = await self._read(self._keys.pin(task_id), lambda: self._local.pin(task_id))
        return Pin(*found) if found is not None else await self._local.pin(task_id)

    async def set_pin(self, task_id: str, model: str, ttl_s: float) -> None:
        await self._local.set_pin(task_id, model, ttl_s)
        await self._write(self._keys.pin(task_id), model, ttl_s)

    async def warm(self, task_id: str) -> Warm | None:
        found = await self._read(self._keys.warm(task_id), lambda: self._local.warm(task_id))
        return Warm(*found) if found is not None else await self._local.warm(task_id)

    async def mark_warm(self, task_id: str, model: str, ttl_s: float) -> None:
        await self._local.mark_warm(task_id, model, ttl_s)
        await self._write(self._keys.warm(task_id), model, ttl_s)

    async def attempt(self, task_id: str) -> AttemptMark | None:
        async def remote() -> AttemptMark | None:
            # The client decodes responses: the hash's keys and values are str.
            h = cast(dict[str, str], await self._client.hgetall(self._keys.attempt(task_id)))
            if not h.get("attempt"):
                return await self._local.attempt(task_id)
            stop = (h.get("why", ""), h["rule"]) if h.get("rule") else None
            return AttemptMark(int(h["attempt"]), int(h.get("calls", 0)), h.get("failed") == "1", stop)

        return await self._guard.fail_open("sessions", remote, lambda: self._local.attempt(task_id))

    async def count_call(self, task_id: str, attempt: int, ttl_s: float) -> None:
        await self._local.count_call(task_id, attempt, ttl_s)
        await self._script(self._count_call, task_id, [attempt, _ms(ttl_s)])

    async def mark_attempt(
        self, task_id: str, attempt: int, ttl_s: float, *, failed: bool, stop: tuple[str, str] | None = None
    ) -> None:
        await self._local.mark_attempt(task_id, attempt, ttl_s, failed=failed, stop=stop)
        why, rule = stop or ("", "")
        await self._script(self._mark_attempt, task_id, [attempt, _ms(ttl_s), int(failed), why, rule])

    async def _script(self, script: AsyncScript, task_id: str, args: list[str | int]) -> None:
        async def remote() -> None:
            await script([self._keys.attempt(task_id)], args)

        async def local() -> None:
            return None  # already mirrored

        await self._guard.fail_open("sessions", remote, local)

    async def _read(
        self, key: str, fallback: Callable[[], Awaitable[tuple[str, float] | None]]
    ) -> tuple[str, float] | None:
        async def remote() -> tuple[str, float] | None:
            async with self._client.pipeline(transaction=True) as pipe:
                pipe.get(key)
                pipe.pttl(key)
                model, pttl = await pipe.execute()
            if model is None or pttl < 0:
                return None
            return model, time.time() + pttl / 1000

        return await self._guard.fail_open("sessions", remote, fallback)

    async def _write(self, key: str, model: str, ttl_s: float) -> None:
        async def remote() -> None:
            await self._client.set(key, model, px=_ms(ttl_s))

        async def local() -> None:
            return None  # already mirrored

        await self._guard.fail_open("sessions", remote, local)


def _ms(ttl_s: float) -> int:
    return max(1, int(ttl_s * 1000))


class RedisState:
    """All components over one Redis, with ``local`` (a ``MemoryState``) as the fail-open fallback."""

    def __init__(self, url: str, config: StateConfig | None = None) -> None:
        self.config = config or StateConfig()
        self._client = connect(url, self.config)
        self._guard = RedisGuard(self.config.op_timeout_s, self.config.backoff_s)
        self.local = MemoryState(self.config)
        keys = Keys(self.config.prefix)
        c, g = self._client, self._guard
        self.sessions = RedisSessions(c, g, keys, self.local.sessions)
        self.budgets = RedisBudgets(c, g, keys, self.config)
        self.limits = RedisRateLimits(c, g, keys, self.config, self.local.limits)
        self.breakers = RedisBreakers(c, g, keys, self.config.breaker, self.local.breakers)
        self.policy = RedisPolicyVersion(c, g, keys, self.config)

    @property
    def degraded(self) -> bool:
        return self._guard.degraded

    @property
    def fail_open_counts(self) -> Mapping[str, int]:
        return self._guard.fail_open_counts

    @property
    def fail_closed_counts(self) -> Mapping[str, int]:
        return self._guard.fail_closed_counts

    @property
    def last_error(self) -> str | None:
        return self._guard.last_error

    async def ping(self) -> bool:
        """True when Redis answers now (outside a back-off window); never raises."""
        try:
            await self._guard.run(self._client.ping)
        except RedisDown:
            return False
        return True

    async def aclose(self) -> None:
        await self._client.aclose()
