"""The promoted policy version in Redis: one key, a pub/sub channel, and a watcher that reads both.

Publishing is ``SET`` + ``PUBLISH`` in one MULTI. A watcher treats a message only as a nudge to
re-read the key, and also re-reads it every ``poll_interval_s``: the key is the truth, so a
replica that missed a message (not yet subscribed, disconnected, Redis restarted) still converges
within one poll, and because reads are serialised a late poll cannot undo a newer version.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from redis.asyncio import Redis
from redis.exceptions import RedisError

from router.shared.memory import deliver_version
from router.shared.redis_guard import RedisDown, RedisGuard
from router.shared.redis_keys import Keys
from router.shared.types import StateConfig, VersionCallback

log = logging.getLogger(__name__)

#: How long ``get_message`` blocks before looping (it returns None on silence, not an error).
_LISTEN_S = 1.0


class RedisPolicyVersion:
    def __init__(self, client: Redis, guard: RedisGuard, keys: Keys, config: StateConfig) -> None:
        self._client = client
        self._guard = guard
        self._key = keys.policy_version
        self._channel = keys.policy_channel
        self._poll_s = config.poll_interval_s
        self._op_timeout = config.op_timeout_s
        self._retry_s = config.backoff_s
        #: The last version read from Redis: what ``current_version`` answers while Redis is down.
        self._last_seen: str | None = None

    async def current_version(self) -> str | None:
        async def remote() -> str | None:
            version = _text(await self._client.get(self._key))
            if version is not None:
                self._last_seen = version
            return version

        async def local() -> str | None:
            return self._last_seen

        return await self._guard.fail_open("policy", remote, local)

    async def publish_version(self, version: str) -> None:
        """Raises ``StateUnavailable`` when Redis is down: a promotion that only this replica saw
        would be worse than a failed one."""

        async def remote() -> None:
            async with self._client.pipeline(transaction=True) as pipe:
                pipe.set(self._key, version)
                pipe.publish(self._channel, version)
                await pipe.execute()

        await self._guard.fail_closed("policy", "policy publication", remote)
        self._last_seen = version

    async def watch(self, callback: VersionCallback, *, known: str | None = None) -> None:
        """Call ``callback(version)`` whenever the published version differs from the last one
        seen (initially ``known``). Runs until cancelled; survives Redis outages and restarts."""
        nudge = asyncio.Event()
        nudge.set()  # read once at start
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self._listen(nudge), name="policy-version-subscriber")
            await self._check(nudge, callback, known)

    async def _check(self, nudge: asyncio.Event, callback: VersionCallback, known: str | None) -> None:
        last = known
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._poll_s):
                    await nudge.wait()
            nudge.clear()
            try:
                version = _text(await self._guard.run(lambda: self._client.get(self._key)))
            except RedisDown:
                # Not a fail-open (no caller got a local answer). Try again once the guard's
                # back-off is over rather than at the next poll: a nudge must not be lost.
                await asyncio.sleep(self._retry_s)
                nudge.set()
                continue
            if version is None:
                continue
            self._last_seen = version
            if version != last:
                last = version
                await deliver_version(callback, version)

    async def _listen(self, nudge: asyncio.Event) -> None:
        while True:
            pubsub = self._client.pubsub()
            try:
                async with asyncio.timeout(self._op_timeout):
                    await pubsub.subscribe(self._channel)
                nudge.set()  # a message may have gone by while we were not subscribed
                while True:
                    message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=_LISTEN_S)
                    if message is not None:
                        nudge.set()
            except (RedisError, OSError, TimeoutError) as exc:
                log.debug("policy version subscriber: %s; resubscribing", exc)
            finally:
                with contextlib.suppress(RedisError, OSError, TimeoutError):
                    async with asyncio.timeout(self._op_timeout):
                        await pubsub.aclose()
            await asyncio.sleep(self._retry_s)


def _text(value: str | bytes | None) -> str | None:
    # The client decodes replies; this only narrows the type redis-py declares.
    return value.decode() if isinstance(value, bytes) else value
