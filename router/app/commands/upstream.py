"""`router upstream`: the local fake provider the demo policy's backends call, with the behaviour it
answers every request with.

Only the argument definitions load with the CLI; the server's imports wait until the command runs.
"""

from __future__ import annotations

import argparse

from router.errors import ConfigError

EXAMPLE = "router upstream --port 9100 --behaviour 'tool_arg=echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT'"
DESCRIPTION = (
    "Run the local fake provider (OpenAI + Anthropic wire formats) that the demo policy's backends call; "
    "serve a policy in front of it with ROUTER_LOCAL_UPSTREAM=http://127.0.0.1:9100 router serve --config "
    "policies/examples/local.yaml. A reply calls a tool the request offers, every string argument `ls`, "
    "or answers in text: an agent that works until it runs its completion command (mini-swe-agent) runs "
    "`ls` forever unless --behaviour sets tool_arg to that command."
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", help="bind address (default 127.0.0.1)")
    p.add_argument("--port", type=int, help="port (default 9100)")
    p.add_argument(
        "--behaviour",
        default="",
        metavar="SPEC",
        help="how it answers every request: key=value pairs joined by commas, e.g. 'ttft_ms=200,chunks=20' "
        "or 'tool_arg=COMMAND' (the value of every string argument of its tool calls); an unknown key's "
        "error lists them all",
    )


def run(args: argparse.Namespace) -> int:
    import dataclasses

    from router.fakeupstream import Behaviour, BehaviourError, parse_spec
    from router.fakeupstream import run as serve

    try:
        default = dataclasses.replace(Behaviour(), **parse_spec(args.behaviour))
    except BehaviourError as exc:  # before binding the port: a typo is one line, not a server that ignores it
        raise ConfigError(f"--behaviour: {exc}") from None
    serve(host=args.host or "127.0.0.1", port=args.port or 9100, default=default)
    return 0
