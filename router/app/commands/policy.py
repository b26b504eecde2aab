"""``router check`` and ``router schema``: a policy file validated as a router would load it, and the
JSON Schema editors check policy files against."""

from __future__ import annotations

import argparse
import sys


def check(args: argparse.Namespace) -> int:
    from router.app.settings import from_flags
    from router.policy.active import load_active_policy

    settings = from_flags(args)
    # As a router would load it: the learned artifact, the control arm's reference and the scopes too.
    rt = load_active_policy(settings.config)
    policy = rt.policy
    extra = f", control arm {rt.control.share:.0%} of tasks" if rt.control else ""
    extra += f", {len(rt.scopes)} scope{'s' * (len(rt.scopes) != 1)}" if rt.scopes else ""
    counts = ", ".join(f"{n} {what}{'s' * (n != 1)}" for n, what in ((len(rt.catalog.backends), "model"),
                       (len(policy.routes), "route"), (len(policy.rules), "rule")))  # fmt: skip
    print(f"{settings.config}: ok — revision {rt.revision}, {counts}{extra}")
    for line in rt.warnings():  # valid, but will not work as the file reads
        print(f"{settings.config}: warning: {line}", file=sys.stderr)
    return 0


def schema(args: argparse.Namespace) -> int:
    import orjson

    from router.policy.loading import json_schema

    sys.stdout.write(orjson.dumps(json_schema(), option=orjson.OPT_INDENT_2).decode() + "\n")
    return 0
