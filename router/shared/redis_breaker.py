"""Circuit breakers in Redis, shared by every replica: one replica's failures open it for all.

``breaker:state:{backend}`` (hash): ``failures`` (consecutive retryable failures while closed, the
backend's own), ``suspect`` / ``suspect_first`` / ``suspect_many`` (those a request may have caused:
how many, the first tenant's name, and whether another tenant's did too; one tenant's count once,
as ``router.shared.memory.MemoryBreakers`` says) and ``open_until`` (ms, Redis clock; absent = closed). Open and past ``open_until`` is half-open: the
first caller to win ``SET breaker:probe:{backend} NX PX probe_ttl`` is the one probe. Every
transition is one Lua script, so two replicas cannot both take the probe or half-apply a change.
Fails open to a local breaker, which also mirrors this replica's results while Redis is up.
"""

from __future__ import annotations

from redis.asyncio import Redis

from router.shared.memory_breaker import MemoryBreakers
from router.shared.redis_guard import RedisGuard
from router.shared.redis_keys import Keys
from router.shared.types import BreakerConfig, BreakerState

_NOW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local open_until = tonumber(redis.call('HGET', KEYS[1], 'open_until') or '-1')
"""

# KEYS: state hash, probe lock. ARGV: probe ttl ms. Returns 1 admitted (closed), 2 admitted as the
# half-open probe, 0 refused.
BEFORE_CALL = (
    _NOW
    + """
if open_until < 0 then return 1 end
if now < open_until then return 0 end
if redis.call('SET', KEYS[2], '1', 'NX', 'PX', ARGV[1]) then return 2 end
return 0
"""
)

# KEYS: state hash, probe lock. ARGV: outcome ('ok' | 'fail' | 'suspect' | 'neutral'), threshold,
# cooldown ms, idle ms, the suspect's tenant. Returns the state after the event.
RECORD = (
    _NOW
    + """
local outcome = ARGV[1]
if open_until < 0 then
  if outcome == 'ok' then
    redis.call('HDEL', KEYS[1], 'failures', 'suspect', 'suspect_first', 'suspect_many')
  elseif outcome == 'fail' or outcome == 'suspect' then
    if outcome == 'fail' then
      redis.call('HINCRBY', KEYS[1], 'failures', 1)
    else
      redis.call('HINCRBY', KEYS[1], 'suspect', 1)
      local first = redis.call('HGET', KEYS[1], 'suspect_first')
      if not first then
        redis.call('HSET', KEYS[1], 'suspect_first', ARGV[5])
      elseif first ~= ARGV[5] then
        redis.call('HSET', KEYS[1], 'suspect_many', '1')
      end
    end
    local f = tonumber(redis.call('HGET', KEYS[1], 'failures') or '0')
    local s = tonumber(redis.call('HGET', KEYS[1], 'suspect') or '0')
    if not redis.call('HGET', KEYS[1], 'suspect_many') then s = math.min(s, 1) end
    if f + s >= tonumber(ARGV[2]) then
      redis.call('HDEL', KEYS[1], 'failures', 'suspect', 'suspect_first', 'suspect_many')
      redis.call('HSET', KEYS[1], 'open_until', now + tonumber(ARGV[3]))
      redis.call('PEXPIRE', KEYS[1], ARGV[4])
      return 'open'
    end
    redis.call('PEXPIRE', KEYS[1], ARGV[4])
  end
  return 'closed'
end
-- A result arriving during the cool-down comes from a call started before the breaker opened:
-- the cool-down stands.
if now < open_until then return 'open' end
if outcome == 'ok' then
  redis.call('DEL', KEYS[1], KEYS[2])
  return 'closed'
elseif outcome == 'fail' then
  redis.call('HSET', KEYS[1], 'open_until', now + tonumber(ARGV[3]))
  redis.call('PEXPIRE', KEYS[1], ARGV[4])
  redis.call('DEL', KEYS[2])
  return 'open'
end
redis.call('DEL', KEYS[2])
return 'half_open'
"""
)

# KEYS: state hash. Returns the state name.
STATE = (
    _NOW
    + """
if open_until < 0 then return 'closed' end
if now < open_until then return 'open' end
return 'half_open'
"""
)


class RedisBreakers:
    def __init__(
        self, client: Redis, guard: RedisGuard, keys: Keys, config: BreakerConfig, local: MemoryBreakers
    ) -> None:
        self._guard = guard
        self._keys = keys
        self._local = local
        self._probe_ms = str(int(config.probe_ttl_s * 1000))
        self._threshold = str(config.failure_threshold)
        self._cooldown_ms = str(int(config.cooldown_s * 1000))
        # Long enough to outlive any cool-down; a forgotten breaker is simply closed.
        self._idle_ms = str(int(max(config.cooldown_s * 10, 3600) * 1000))
        self._before = client.register_script(BEFORE_CALL)
        self._record = client.register_script(RECORD)
        self._state = client.register_script(STATE)

    async def before_call(self, backend: str) -> bool:
        keys = list(self._keys.breaker(backend))

        async def remote() -> bool:
            return int(await self._before(keys, [self._probe_ms])) != 0

        return await self._guard.fail_open("breakers", remote, lambda: self._local.before_call(backend))

    async def record_success(self, backend: str) -> None:
        await self._local.record_success(backend)
        await self._send(backend, "ok")

    async def record_failure(self, backend: str, retryable: bool, *, caused_by: str | None = None) -> None:
        """Non-retryable failures (the backend answered, e.g. 400) neither count nor reset the
        count; in half-open such an answer frees the probe slot for another probe. So does a
        probe's failure its request may have caused (``caused_by``)."""
        await self._local.record_failure(backend, retryable, caused_by=caused_by)
        outcome = "neutral" if not retryable else "fail" if caused_by is None else "suspect"
        await self._send(backend, outcome, caused_by or "")

    async def state(self, backend: str) -> BreakerState:
        keys = [self._keys.breaker(backend)[0]]

        async def remote() -> BreakerState:
            return BreakerState(await self._state(keys))

        return await self._guard.fail_open("breakers", remote, lambda: self._local.state(backend))

    def local_states(self) -> dict[str, BreakerState]:
        """The local mirror: this replica's results (other replicas' opens show on their own)."""
        return self._local.local_states()

    async def _send(self, backend: str, outcome: str, tenant: str = "") -> None:
        keys = list(self._keys.breaker(backend))
        args = [outcome, self._threshold, self._cooldown_ms, self._idle_ms, tenant]

        async def remote() -> None:
            await self._record(keys, args)

        async def local() -> None:
            return None  # already applied to the local mirror above

        await self._guard.fail_open("breakers", remote, local)
