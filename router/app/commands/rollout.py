"""`router promote` and `router rollback`: a policy's learned artifact pinned, or an earlier
revision restored, on disk and (with Redis) on every replica."""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from pathlib import Path


def promote(args: argparse.Namespace) -> int:
    from router.rollout import promote as promoting

    # The replicas' prefix, as `router rollback` publishes under: with the default alone, replicas
    # of another prefix heard nothing (they reloaded at their next poll of the file).
    sha = promoting.promote(
        args.artifact, args.config, args.redis or os.environ.get("ROUTER_REDIS_URL"),
        os.environ.get("ROUTER_REDIS_PREFIX", "router:"), force=args.force,
    )  # fmt: skip
    # "running routers reload it" read as if every router would, also for a candidate no router serves.
    print(
        f"{args.config}: now pins {args.artifact} (sha256 {sha}); routers serving it reload it within a second"
    )
    return 0


def rollback(args: argparse.Namespace) -> int:
    from router.app.settings import config_given
    from router.policy.active import load_active_policy
    from router.policy.revisions import Archive
    from router.rollout import rollback as rolling
    from router.rollout.promote import publish

    config = config_given(args.config)
    archive = Archive(Path(config))
    to = archive.resolve(args.to) if args.to else None
    # Read before: putting a revision back clears the mark of its own rollback.
    undone = ((archive.meta(to) or {}).get("rolled_back") or {}) if to else {}
    done = rolling.rollback(archive, to, "router rollback", time.time())
    assert done is not None  # without ``expect`` it rolls back or raises
    old, new = done
    load_active_policy(config)  # the restored files load as they did when that revision was applied
    redis = args.redis or os.environ.get("ROUTER_REDIS_URL")
    if redis:
        asyncio.run(publish(redis, os.environ.get("ROUTER_REDIS_PREFIX", "router:"), new))
    print(f"{config}: rolled back from revision {old} to {new}; routers serving it reload it within a second")
    if undone.get("reason"):
        # `--to` a revision the guard (or a hand) took out said nothing of why it had been.
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(float(undone.get("at") or 0)))
        print(f"note: {new} had been rolled back at {when} ({undone['reason']}); a guard judges it again "
              "from now, on new tasks only")  # fmt: skip
    return 0
