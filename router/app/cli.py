"""The ``router`` command: serve, demo, upstream (the local fake provider), check, report, tasks."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from router.app.logs import FORMATS, LEVELS, configure
from router.errors import ConfigError


def _settings(args: argparse.Namespace) -> Any:
    from router.app.settings import Settings

    given = {k: v for k, v in {"config": args.config, "host": args.host, "port": args.port,
                               "store": args.store, "redis_url": getattr(args, "redis", None)}.items()
             if v is not None}  # fmt: skip
    return Settings(**given)


def cmd_serve(args: argparse.Namespace) -> int:
    from router.app.serve import serve

    serve(_settings(args), args.log_level)
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    from router.policy.catalog import build_catalog
    from router.policy.config import load_policy

    settings = _settings(args)
    policy = load_policy(settings.config)
    catalog = build_catalog(policy)
    print(f"{settings.config}: ok — {len(catalog.backends)} models, {len(policy.routes)} routes, "
          f"{len(policy.rules)} rules")  # fmt: skip
    return 0


def cmd_upstream(args: argparse.Namespace) -> int:
    from router.fakeupstream import run

    run(host=args.host or "127.0.0.1", port=args.port or 9100)
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from router.app.demo import run_demo

    return run_demo(store=args.store, keep_serving=args.serve, port=args.port)


def cmd_train(args: argparse.Namespace) -> int:
    from router.learning.training.commands import train

    since = time.time() - _duration(args.since) if args.since else 0.0
    train(args.store, args.config, args.out, since=since)
    return 0


def cmd_promote(args: argparse.Namespace) -> int:
    from router.learning.training.commands import promote

    sha = promote(args.artifact, args.config, args.redis or os.environ.get("ROUTER_REDIS_URL"))
    print(
        f"{args.config}: now pins {args.artifact} (sha256 {sha}); running routers reload it within a second"
    )
    return 0


def cmd_rollback(args: argparse.Namespace) -> int:
    from router.learning.training.commands import _publish
    from router.policy.revisions import Archive, rollback
    from router.policy.runtime import load_runtime

    config = args.config or os.environ.get("ROUTER_CONFIG", "policies/default.yaml")
    done = rollback(Archive(Path(config)), args.to, "router rollback", time.time())
    assert done is not None  # without ``expect`` it rolls back or raises
    old, new = done
    load_runtime(config)  # the restored files load as they did when that revision was applied
    redis = args.redis or os.environ.get("ROUTER_REDIS_URL")
    if redis:
        asyncio.run(_publish(redis, os.environ.get("ROUTER_REDIS_PREFIX", "router:"), new))
    print(f"{config}: rolled back from revision {old} to {new}; running routers reload it within a second")
    return 0


def _duration(text: str) -> float:
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    try:
        return float(text[:-1]) * units[text[-1]] if text[-1] in units else float(text)
    except (ValueError, IndexError):
        raise SystemExit(f"router: bad duration {text!r} (e.g. 30m, 24h, 7d)") from None


def cmd_report(args: argparse.Namespace) -> int:
    if args.by == "arm":
        from router.learning.arms import run_arm_report

        return run_arm_report(args)
    from router.telemetry.report import run_report

    return run_report(args)


def cmd_preview(args: argparse.Namespace) -> int:
    from router.learning.preview import run_preview

    return run_preview(args)


def cmd_tasks(args: argparse.Namespace) -> int:
    from router.telemetry.ledger import run_tasks

    return run_tasks(args)


def cmd_eval(args: argparse.Namespace) -> int:
    from router.learning.evals.commands import run_eval

    return run_eval(args)


def cmd_eval_labels(args: argparse.Namespace) -> int:
    from router.learning.labels.commands import run

    return run(args)


def cmd_migrate(args: argparse.Namespace) -> int:
    import asyncio

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


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="router", description="A cost-aware model router for coding agents.")
    sub = p.add_subparsers(dest="command", required=True)

    def common(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--config", help="policy YAML (env ROUTER_CONFIG; default policies/default.yaml)")
        sp.add_argument("--host", help="bind address (env ROUTER_HOST; default 127.0.0.1)")
        sp.add_argument("--port", type=int, help="port (env ROUTER_PORT; default 8080)")
        sp.add_argument("--store", help="log store URL (env ROUTER_STORE; default sqlite:///router.db)")
        sp.add_argument(
            "--redis", help="shared state for replicas (env ROUTER_REDIS_URL; default: in-process)"
        )

    serve = sub.add_parser("serve", help="run the proxy")
    common(serve)
    serve.add_argument("--log-level", choices=LEVELS, default=os.environ.get("ROUTER_LOG_LEVEL", "info"),
                       help="info: one line per request; warning: fallbacks, breakers and problems only "
                       "(env ROUTER_LOG_LEVEL; default info)")  # fmt: skip
    serve.add_argument("--log-format", choices=FORMATS, default=os.environ.get("ROUTER_LOG_FORMAT", "text"),
                       help="text for people, json (one object per line) for log pipelines "
                       "(env ROUTER_LOG_FORMAT; default text)")  # fmt: skip
    serve.set_defaults(func=cmd_serve)

    check = sub.add_parser("check", help="validate a policy file and exit")
    common(check)
    check.set_defaults(func=cmd_check)

    up = sub.add_parser("upstream", help="run the local fake provider (OpenAI + Anthropic wire formats)")
    up.add_argument("--host")
    up.add_argument("--port", type=int)
    up.set_defaults(func=cmd_upstream)

    tr = sub.add_parser("train", help="fit the learned policy from the log and evaluate it off-policy")
    tr.add_argument("--store", default=os.environ.get("ROUTER_STORE", "sqlite:///router.db"))
    tr.add_argument("--config", default=os.environ.get("ROUTER_CONFIG", "policies/default.yaml"))
    tr.add_argument("--out", required=True, help="artifact path, e.g. policies/learned/NAME.json")
    tr.add_argument("--since", help="only requests this recent (e.g. 7d)")
    tr.set_defaults(func=cmd_train)

    mg = sub.add_parser("migrate", help="create or upgrade the log store's schema, then exit")
    mg.add_argument("--store", help="log store URL (env ROUTER_STORE)")
    mg.set_defaults(func=cmd_migrate)

    pr = sub.add_parser("promote", help="pin a trained artifact in a policy file (routers reload it)")
    pr.add_argument("artifact")
    pr.add_argument("--config", required=True)
    pr.add_argument("--redis", help="also tell every replica sharing this Redis (env ROUTER_REDIS_URL)")
    pr.set_defaults(func=cmd_promote)

    rb = sub.add_parser("rollback", help="put an earlier policy revision back (routers reload it)")
    rb.add_argument("--config", help="policy YAML (env ROUTER_CONFIG; default policies/default.yaml)")
    rb.add_argument("--to", metavar="REVISION", help="the revision (default: the one applied before)")
    rb.add_argument("--redis", help="also tell every replica sharing this Redis (env ROUTER_REDIS_URL)")
    rb.set_defaults(func=cmd_rollback)

    demo = sub.add_parser("demo", help="local upstream + router + example requests, end to end")
    demo.add_argument("--store", default="sqlite:///router.db")
    demo.add_argument("--serve", action="store_true", help="keep serving after the demo requests")
    demo.add_argument(
        "--port", type=int, help="the router's port (default 8080, or a free one if taken; 0: any)"
    )
    demo.set_defaults(func=cmd_demo)

    def window(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--store", default=os.environ.get("ROUTER_STORE", "sqlite:///router.db"),
                        help="log store URL (env ROUTER_STORE; default sqlite:///router.db)")  # fmt: skip
        sp.add_argument("--since", default="24h", help="how far back: 90s, 15m, 2h, 7d, 1w (default 24h)")
        sp.add_argument("--json", action="store_true", help="print JSON instead of tables")

    report = sub.add_parser("report", help="phases, rates, cost and errors per group, from the log")
    window(report)
    report.add_argument("--by", choices=["backend", "route", "task", "policy", "arm"], default="backend")
    report.add_argument("--plot", metavar="FILE.png", help="also write stacked phases and distributions")
    report.set_defaults(func=cmd_report)

    pv = sub.add_parser("preview", help="decide the logged requests again under a new policy: moves, cost, "
                        "success, risks")  # fmt: skip
    window(pv)
    pv.set_defaults(since="7d")
    pv.add_argument("--config", required=True, help="the new policy YAML")
    pv.set_defaults(func=cmd_preview)

    tasks = sub.add_parser("tasks", help="the task ledger: requests, tokens, cost and outcome per task")
    window(tasks)
    tasks.add_argument("--task", help="only this task id")
    tasks.set_defaults(func=cmd_tasks)

    from router.learning.evals.commands import add_arguments as add_eval

    ev = sub.add_parser("eval", help="offline evaluation of the learned policy on recorded agent outcomes")
    add_eval(ev)
    ev.set_defaults(func=cmd_eval)

    from router.learning.labels.commands import add_arguments as add_eval_labels

    el = sub.add_parser(
        "eval-labels", help="measure the outcome label on replayed agent trajectories (both shapes)"
    )
    add_eval_labels(el)
    el.set_defaults(func=cmd_eval_labels)

    from router.http.keys import add_parser as add_keys

    add_keys(sub, os.environ.get("ROUTER_STORE", "sqlite:///router.db"))
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    configure(getattr(args, "log_level", "info"), getattr(args, "log_format", "text"))
    try:
        return int(args.func(args))
    except ConfigError as exc:
        print(f"router: configuration error:\n{exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C: uvicorn has shut down cleanly and re-raised it; no traceback
        return 130


if __name__ == "__main__":
    sys.exit(main())
