"""``router keys create | list | revoke``: virtual keys made, listed and revoked in the log store.

What a key is (its format and hash) is ``router.http.keys``, which authentication reads too.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
import textwrap
import time
from datetime import UTC, datetime
from typing import Any

import orjson

from router.http.keys import new_key
from router.store import KeyRecord, Store, open_store
from router.store.window import opened
from router.telemetry.ledger import usd

_MODEL_NAME = re.compile(r"[A-Za-z0-9._:/*?\[\]@-]{1,256}")
_TEAM = re.compile(r"[A-Za-z0-9._-]{1,64}")
_MAX_INT = 2**63 - 1


def _positive(kind: type[int] | type[float]) -> Any:
    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a {kind.__name__}, got {text!r}") from None
        if not value > 0 or value != value or value == float("inf"):
            raise argparse.ArgumentTypeError(f"expected a positive finite number, got {text!r}")
        if value > _MAX_INT:  # the store's integer columns: a StoreDataError traceback before
            raise argparse.ArgumentTypeError(f"expected at most {_MAX_INT}, got {text!r}")
        return value

    return parse


def _models(text: str) -> list[str]:
    names = [m.strip() for m in text.split(",") if m.strip()]
    bad = [m for m in names if not _MODEL_NAME.fullmatch(m)]
    if not names or bad:
        raise argparse.ArgumentTypeError(f"expected comma-separated model names or globs, got {text!r}")
    return names


def _name(text: str) -> str:
    if not 1 <= len(text) <= 200 or not text.isprintable():
        raise argparse.ArgumentTypeError("a key name is 1-200 printable characters")
    return text


def _team(text: str) -> str:
    # Scopes match teams by glob: a team with glob characters in it would match patterns by accident.
    if not _TEAM.fullmatch(text):
        raise argparse.ArgumentTypeError(f"a team is 1-64 letters, digits, '.', '_' or '-', got {text!r}")
    return text


def add_parser(sub: Any, default_store: str) -> None:
    """Register ``router keys ...`` on the top-level subparsers."""

    def described(parent: Any, name: str, summary: str, description: str, example: str) -> Any:
        return parent.add_parser(
            name, help=summary, description=textwrap.fill(description, 78), epilog=f"example:\n  {example}",
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )  # fmt: skip

    keys = described(sub, "keys", "virtual keys: create, list, revoke",
                     "Virtual keys for clients: each with its own name, budget, rate limits and allowed "
                     "models, kept in the log store (only a hash of the key). Once a key was ever created, "
                     "the router is out of open mode: clients need a key or the master key.",
                     "router keys create --name ci --budget 50 --rpm 60")  # fmt: skip
    keys.set_defaults(func=run_keys)
    actions = keys.add_subparsers(dest="action", required=True, metavar="ACTION")

    def store_flag(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--store", default=default_store,
                        help="store URL (env ROUTER_STORE; default sqlite:///router.db)")  # fmt: skip
        sp.add_argument("--json", action="store_true", help="print JSON")

    create = described(actions, "create", "create a key (printed once; only its hash is stored)",
                       "Create a virtual key and print it once: only its hash is stored.",
                       "router keys create --name alice --budget 20 --models 'claude-*,auto'")  # fmt: skip
    create.add_argument(
        "--name", required=True, type=_name, help="who or what the key is for (shown in listings)"
    )
    create.add_argument("--budget", type=_positive(float), help="spend limit in USD")
    create.add_argument("--rpm", type=_positive(int), help="requests per minute")
    create.add_argument("--tpm", type=_positive(int), help="tokens per minute")
    create.add_argument("--models", type=_models, help="comma-separated requested-model names or globs")
    create.add_argument("--team", type=_team,
                        help="the team whose scopes apply to the key's requests (its callers cannot choose one)")  # fmt: skip
    store_flag(create)
    store_flag(described(actions, "list", "list keys (never the keys themselves)",
                         "List the virtual keys: id, name, what each has spent (as the log sums it), limits, "
                         "when created and revoked (never the keys).",
                         "router keys list"))  # fmt: skip
    revoke = described(actions, "revoke", "revoke a key by id (routers notice within 30 s)",
                       "Revoke a virtual key by its id (as `router keys list` shows it); running routers "
                       "refuse it within 30 s.", "router keys revoke key_3f9c0a1b2c3d")  # fmt: skip
    revoke.add_argument("key_id", help="the key's id, as `router keys list` prints it (not the key)")
    store_flag(revoke)


def run_keys(args: argparse.Namespace) -> int:
    return asyncio.run(_run(args))


async def _run(args: argparse.Namespace) -> int:
    if args.action != "create":
        # Listing or revoking in a store that does not exist is a typo, not a new empty store.
        async with opened(args.store) as existing:
            return await (_list if args.action == "list" else _revoke)(existing, args)
    store = open_store(args.store)
    await store.open()
    try:
        return await _create(store, args)
    finally:
        await store.close()


async def _create(store: Store, args: argparse.Namespace) -> int:
    key, rec = new_key(
        args.name, budget_usd=args.budget, rpm=args.rpm, tpm=args.tpm, models=args.models, team=args.team
    )
    first = not await store.list_keys()
    await store.create_key(rec)
    if args.json:
        print(orjson.dumps({"key": key, **_public(rec)}).decode())
    else:
        print(f"created {rec.key_id} ({rec.name})")
        print(f"key: {key}")
        print("This is the only time the key is shown: only its hash is stored.")
        if first:
            # It closed open mode for every client of a router logging here, unannounced (the
            # demo's agents got 401s, and without a master key the dashboard locked).
            print("The log's first key: a router logging here that has no ROUTER_MASTER_KEY leaves open mode "
                  "within 30 s, and then refuses clients without a key and locks its dashboard.")  # fmt: skip
    return 0


async def _list(store: Store, args: argparse.Namespace) -> int:
    # What a key has spent, beside its budget: the log's sum, which budgets restart from (without
    # what requests in flight hold). Listing limits without it left no command to say how near one is.
    spent = await store.spend_by("key_id", 0.0)
    rows = [{**_public(k), "spent_usd": round(spent.get(k.key_id, 0.0), 6)} for k in await store.list_keys()]
    if args.json:
        print(orjson.dumps(rows).decode())
        return 0
    if not rows:
        print("no keys")
        return 0
    cols = (
        "key_id",
        "prefix",
        "name",
        "team",
        "spent_usd",
        "budget_usd",
        "rpm",
        "tpm",
        "models",
        "created",
        "revoked",
    )
    # Dollars as dollars: a key's spend is often fractions of a cent, which str() wrote as 4.3e-05.
    table = [[usd(v) if c.endswith("_usd") and isinstance(v := r.get(c), float) else _cell(r.get(c)) for c in cols]
             for r in rows]  # fmt: skip
    widths = [max(len(c), *(len(row[i]) for row in table)) for i, c in enumerate(cols)]
    for line in [list(cols), *table]:
        print("  ".join(v.ljust(w) for v, w in zip(line, widths, strict=True)).rstrip())
    return 0


async def _revoke(store: Store, args: argparse.Namespace) -> int:
    if await store.revoke_key(args.key_id, time.time()):
        if args.json:
            rec = next(k for k in await store.list_keys() if k.key_id == args.key_id)
            print(orjson.dumps(_public(rec)).decode())
        else:
            print(f"revoked {args.key_id}")
        return 0
    known = {k.key_id for k in await store.list_keys()}
    why = "already revoked" if args.key_id in known else "no such key"
    print(f"router keys revoke: cannot revoke {args.key_id!r}: {why}", file=sys.stderr)
    return 1


def _public(rec: KeyRecord) -> dict[str, Any]:
    """A key's record for display: everything but the hash."""
    return {
        "key_id": rec.key_id,
        "prefix": rec.prefix + "…",
        "name": rec.name,
        "team": rec.team,
        "budget_usd": rec.budget_usd,
        "rpm": rec.rpm,
        "tpm": rec.tpm,
        "models": rec.models,
        "created": _iso(rec.created_at),
        "revoked": _iso(rec.revoked_at),
    }


def _iso(ts: float | None) -> str | None:
    return None if ts is None else datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, list):
        return ",".join(value)
    return str(value)
