"""Rate limits in Redis: a sliding-window log per key, checked and consumed in one Lua script.

``rl:log:{key}`` is a zset of events ``"{id}:{requests}:{tokens}"`` scored by time (ms, Redis
clock); ``rl:sum:{key}`` holds the running sums ``req`` and ``tok`` of the events in the window, so
a check costs O(expired events) rather than a scan of the window. Fails open to the local limiter.
"""

from __future__ import annotations

import math
import uuid

from redis.asyncio import Redis

from router.shared.memory import MemoryRateLimits
from router.shared.redis_guard import RedisGuard
from router.shared.redis_keys import Keys
from router.shared.types import Allowed, StateConfig

# KEYS: log zset, sum hash. ARGV: window ms, requests, tokens, rpm (-1 none), tpm (-1 none), event id.
# Returns {1 allowed / 0 refused, retry-after ms as a string, reason}.
CHECK_AND_CONSUME = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
local window = tonumber(ARGV[1])
local requests, tokens = tonumber(ARGV[2]), tonumber(ARGV[3])
local rpm, tpm = tonumber(ARGV[4]), tonumber(ARGV[5])
if (rpm >= 0 and requests > rpm) or (tpm >= 0 and tokens > tpm) then
  return {0, 'inf', 'too_large'}
end
local function parse(m)
  local r, tk = string.match(m, ':(%-?%d+):(%-?%d+)$')
  return tonumber(r), tonumber(tk)
end
local cutoff = now - window
local old = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', cutoff)
if #old > 0 then
  local dr, dt = 0, 0
  for _, m in ipairs(old) do
    local r, tk = parse(m)
    dr, dt = dr + r, dt + tk
  end
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', cutoff)
  redis.call('HINCRBY', KEYS[2], 'req', string.format('%d', -dr))
  redis.call('HINCRBY', KEYS[2], 'tok', string.format('%d', -dt))
end
if redis.call('ZCARD', KEYS[1]) == 0 then
  -- The sums describe the log; with no log (expired, evicted) they must be zero.
  redis.call('DEL', KEYS[2])
end
local req = tonumber(redis.call('HGET', KEYS[2], 'req') or '0')
local tok = tonumber(redis.call('HGET', KEYS[2], 'tok') or '0')
-- ms until the oldest events have freed `need` of field `which` (1 requests, 2 tokens).
local function wait_for(need, which)
  local freed, start, last = 0, 0, nil
  while true do
    local batch = redis.call('ZRANGE', KEYS[1], start, start + 99, 'WITHSCORES')
    if #batch == 0 then break end
    for j = 1, #batch, 2 do
      local r, tk = parse(batch[j])
      if which == 1 then freed = freed + r else freed = freed + tk end
      last = tonumber(batch[j + 1])
      if freed >= need then return last + window - now end
    end
    start = start + 100
  end
  if last then return last + window - now end
  return 0
end
local wait, reason = -1, ''
if rpm >= 0 and req + requests > rpm then
  wait, reason = wait_for(req + requests - rpm, 1), 'rpm'
end
if tpm >= 0 and math.max(tok, 0) + tokens > tpm then
  local w = wait_for(tok + tokens - tpm, 2)
  if w > wait then wait, reason = w, 'tpm' end
end
if reason ~= '' then
  return {0, tostring(math.max(wait, 0)), reason}
end
redis.call('ZADD', KEYS[1], now, ARGV[6] .. ':' .. ARGV[2] .. ':' .. ARGV[3])
redis.call('HINCRBY', KEYS[2], 'req', ARGV[2])
redis.call('HINCRBY', KEYS[2], 'tok', ARGV[3])
redis.call('PEXPIRE', KEYS[1], math.ceil(window) + 1000)
redis.call('PEXPIRE', KEYS[2], math.ceil(window) + 1000)
return {1, '0', ''}
"""


class RedisRateLimits:
    def __init__(
        self, client: Redis, guard: RedisGuard, keys: Keys, config: StateConfig, local: MemoryRateLimits
    ) -> None:
        self._guard = guard
        self._keys = keys
        self._local = local
        self._window_ms = str(int(config.rate_window_s * 1000))
        self._script = client.register_script(CHECK_AND_CONSUME)

    async def check_and_consume(
        self, key: str, *, requests: int = 1, tokens: int = 0, rpm: int | None, tpm: int | None
    ) -> Allowed:
        if requests < 0 or tokens < 0:
            raise ValueError("requests and tokens must be >= 0")
        return await self._guard.fail_open(
            "rate_limits",
            lambda: self._run(key, requests, tokens, rpm, tpm),
            lambda: self._local.check_and_consume(key, requests=requests, tokens=tokens, rpm=rpm, tpm=tpm),
        )

    async def adjust(self, key: str, delta_tokens: int) -> None:
        """Correct the token estimate once the real count is known (negative gives tokens back)."""
        await self._guard.fail_open(
            "rate_limits",
            lambda: self._run(key, 0, delta_tokens, None, None),
            lambda: self._local.adjust(key, delta_tokens),
        )

    async def _run(self, key: str, requests: int, tokens: int, rpm: int | None, tpm: int | None) -> Allowed:
        args = [
            self._window_ms,
            str(requests),
            str(tokens),
            "-1" if rpm is None else str(rpm),
            "-1" if tpm is None else str(tpm),
            uuid.uuid4().hex[:16],
        ]
        ok, wait_ms, reason = await self._script(list(self._keys.rate(key)), args)
        if int(ok) == 1:
            return Allowed(True)
        wait = math.inf if wait_ms == "inf" else float(wait_ms) / 1000
        return Allowed(False, wait, reason)
