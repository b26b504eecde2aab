"""`router prune` and `router migrate`: the log store's upkeep."""

from __future__ import annotations

import argparse
import asyncio
import os
import time


def prune(args: argparse.Namespace) -> int:
    from router.store.window import opened, parse_duration

    before = time.time() - parse_duration(args.older_than)

    async def run() -> int:
        async with opened(args.store) as store:
            return await store.prune(before)

    deleted = asyncio.run(run())
    print(f"deleted {deleted} requests (and their outcomes) logged before "
          f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(before))}; their spend is kept per key and task")  # fmt: skip
    return 0


def migrate(args: argparse.Namespace) -> int:
    from router.store import mask_url, open_store
    from router.store.schema import SCHEMA_VERSION

    url = args.store or os.environ.get("ROUTER_STORE", "sqlite:///router.db")

    async def run() -> None:
        store = open_store(url)
        await store.open()  # applies pending migrations, each in its own transaction
        await store.close()

    asyncio.run(run())
    print(f"{mask_url(url)}: schema at version {SCHEMA_VERSION}")
    return 0
