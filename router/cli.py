"""The ``router`` command: serve, demo, upstream (the local fake provider), check."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

from router.errors import ConfigError


def _settings(args: argparse.Namespace) -> Any:
    from router.settings import Settings

    given = {k: v for k, v in {"config": args.config, "host": args.host, "port": args.port,
                               "store": args.store}.items() if v is not None}  # fmt: skip
    return Settings(**given)


def cmd_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from router.app import create_app

    settings = _settings(args)
    app = create_app(settings)
    uvicorn.run(
        app, host=settings.host, port=settings.port, log_level=args.log_level, access_log=False,
        timeout_graceful_shutdown=int(settings.drain_timeout) or None,
    )  # fmt: skip
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    from router.catalog import build_catalog
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
    from router.demo import run_demo

    return run_demo(store=args.store, keep_serving=args.serve)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="router", description="A cost-aware model router for coding agents.")
    sub = p.add_subparsers(dest="command", required=True)

    def common(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--config", help="policy YAML (env ROUTER_CONFIG; default policies/default.yaml)")
        sp.add_argument("--host", help="bind address (env ROUTER_HOST; default 127.0.0.1)")
        sp.add_argument("--port", type=int, help="port (env ROUTER_PORT; default 8080)")
        sp.add_argument("--store", help="log store URL (env ROUTER_STORE; default sqlite:///router.db)")

    serve = sub.add_parser("serve", help="run the proxy")
    common(serve)
    serve.add_argument("--log-level", default=os.environ.get("ROUTER_LOG_LEVEL", "info"))
    serve.set_defaults(func=cmd_serve)

    check = sub.add_parser("check", help="validate a policy file and exit")
    common(check)
    check.set_defaults(func=cmd_check)

    up = sub.add_parser("upstream", help="run the local fake provider (OpenAI + Anthropic wire formats)")
    up.add_argument("--host")
    up.add_argument("--port", type=int)
    up.set_defaults(func=cmd_upstream)

    demo = sub.add_parser("demo", help="local upstream + router + example requests, end to end")
    demo.add_argument("--store", default="sqlite:///router.db")
    demo.add_argument("--serve", action="store_true", help="keep serving after the demo requests")
    demo.set_defaults(func=cmd_demo)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except ConfigError as exc:
        print(f"router: configuration error:\n{exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
