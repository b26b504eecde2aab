"""The ``router`` command: its arguments, and the dispatch to each subcommand's body.

A body of more than a call lives in ``router.app.commands``, imported only when its command runs.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path

from router.app.logs import FORMATS, LEVELS, configure
from router.errors import ConfigError


def _fitting() -> None:
    """The commands that fit models need scikit-learn, the ``learn`` extra a serving install leaves out."""
    if importlib.util.find_spec("sklearn") is None:
        raise ConfigError(
            "fits models with scikit-learn, which this install leaves out: pip install 'router[learn]'"
        )


def cmd_serve(args: argparse.Namespace) -> int:
    from router.app.serve import serve
    from router.app.settings import from_flags

    serve(from_flags(args), args.log_level)
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    from router.app.commands.policy import check

    return check(args)


def cmd_schema(args: argparse.Namespace) -> int:
    from router.app.commands.policy import schema

    return schema(args)


def cmd_upstream(args: argparse.Namespace) -> int:
    from router.app.commands.upstream import run

    return run(args)


def cmd_demo(args: argparse.Namespace) -> int:
    from router.app.demo import run_demo

    env = os.environ.get("ROUTER_STORE")
    if env and env != args.store:
        # Kept apart on purpose (the demo's traffic is not a production log's), but `train`,
        # `tasks` and `preview` read ROUTER_STORE: without a word they read another log than this.
        print(f"note: router demo logs to {args.store} (its --store), not ROUTER_STORE ({env}); give "
              f"router train, tasks and preview --store {args.store} to read what it logs", file=sys.stderr)  # fmt: skip
    return run_demo(store=args.store, keep_serving=args.serve, port=args.port, upstream_port=args.upstream_port,
                    tasks=args.tasks, data=args.data, concurrency=args.concurrency)  # fmt: skip


def cmd_train(args: argparse.Namespace) -> int:
    _fitting()
    from router.app.commands.train import run

    return run(args)


def cmd_outcome(args: argparse.Namespace) -> int:
    from router.app.commands.outcome import run

    return run(args)


def cmd_prune(args: argparse.Namespace) -> int:
    from router.app.commands.store import prune

    return prune(args)


def cmd_promote(args: argparse.Namespace) -> int:
    from router.app.commands.rollout import promote

    return promote(args)


def cmd_rollback(args: argparse.Namespace) -> int:
    from router.app.commands.rollout import rollback

    return rollback(args)


def cmd_report(args: argparse.Namespace) -> int:
    if args.by == "arm":
        from router.rollout.arms import run_arm_report

        return run_arm_report(args)
    from router.app.commands.report import run_report

    return run_report(args)


def cmd_preview(args: argparse.Namespace) -> int:
    from router.app.commands.preview import run_preview

    return run_preview(args)


def cmd_tasks(args: argparse.Namespace) -> int:
    from router.app.commands.tasks import run

    return run(args)


def cmd_eval(args: argparse.Namespace) -> int:
    _fitting()
    from router.app.commands.evals import run_eval

    return run_eval(args)


def cmd_eval_labels(args: argparse.Namespace) -> int:
    _fitting()
    from router.app.commands.labels import run

    return run(args)


def cmd_eval_sizes(args: argparse.Namespace) -> int:
    from router.app.commands.sizes import run

    return run(args)


def cmd_migrate(args: argparse.Namespace) -> int:
    from router.app.commands.store import migrate

    return migrate(args)


STORE_HELP = "log store URL (env ROUTER_STORE; default sqlite:///router.db)"
CONFIG_HELP = "policy YAML (env ROUTER_CONFIG; default policies/default.yaml)"
REDIS_HELP = "also tell every replica sharing this Redis (env ROUTER_REDIS_URL; their key prefix: env ROUTER_REDIS_PREFIX)"


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("router")
    except PackageNotFoundError:
        return "unknown (not installed; run from a checkout)"


def _positive_int(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a positive whole number, got {text!r}")
    return n


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="router", formatter_class=argparse.RawDescriptionHelpFormatter,
        description=textwrap.fill("A cost-aware model router for coding agents: an OpenAI/Anthropic-compatible "
        "proxy that picks the backend model per request, logs what it cost, and learns from outcomes.", 78),
        epilog="Start with `router demo --serve` (all local), then `router serve --config YOUR.yaml`.\n"
        "`router COMMAND --help` shows each command's flags and an example.",
    )  # fmt: skip
    store = os.environ.get("ROUTER_STORE", "sqlite:///router.db")  # the commands that read the log
    p.add_argument("--version", action="version", version=f"router {_version()}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, summary: str, example: str, description: str = "") -> argparse.ArgumentParser:
        text = description or summary[0].upper() + summary[1:] + "."
        return sub.add_parser(
            name, help=summary, description=textwrap.fill(text, 78), epilog=f"example:\n  {example}",
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )  # fmt: skip

    serve = command("serve", "run the proxy", "ROUTER_MASTER_KEY=... router serve --config policies/default.yaml",
                    "Run the proxy: /v1/chat/completions, /v1/messages, /v1/responses, the dashboard at /ui, "
                    "/metrics, /healthz and /readyz. Flags override ROUTER_* environment variables.")  # fmt: skip
    serve.add_argument("--config", help=CONFIG_HELP)
    serve.add_argument("--host", help="bind address (env ROUTER_HOST; default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port (env ROUTER_PORT; default 8080)")
    serve.add_argument("--store", help=STORE_HELP)
    serve.add_argument("--allowed-hosts", metavar="NAMES",
                       help="open mode: names answered besides localhost and IP addresses, comma-separated or a JSON list (devbox.lan,*.lan; "
                            "env ROUTER_ALLOWED_HOSTS); a request for another Host is refused")  # fmt: skip
    serve.add_argument(
        "--redis", help="shared state for replicas (env ROUTER_REDIS_URL; default: in-process)"
    )
    serve.add_argument("--log-level", choices=LEVELS, default=os.environ.get("ROUTER_LOG_LEVEL", "info"),
                       help="info: one line per request; warning: fallbacks, breakers and problems only "
                       "(env ROUTER_LOG_LEVEL; default info)")  # fmt: skip
    serve.add_argument("--log-format", choices=FORMATS, default=os.environ.get("ROUTER_LOG_FORMAT", "text"),
                       help="text for people, json (one object per line) for log pipelines "
                       "(env ROUTER_LOG_FORMAT; default text)")  # fmt: skip
    serve.set_defaults(func=cmd_serve)

    check = command(
        "check", "validate a policy file and exit", "router check --config policies/examples/local.yaml"
    )
    check.add_argument("--config", help=CONFIG_HELP)
    check.set_defaults(func=cmd_check, host=None, port=None, store=None)

    schema = command("schema", "print the policy file's JSON Schema (for editors and CI)",
                     "router schema > policies/policy.schema.json",
                     "Print the JSON Schema of policy files. Editors with the YAML language server use it "
                     "through the first line of each shipped policy: # yaml-language-server: $schema=...")  # fmt: skip
    schema.set_defaults(func=cmd_schema)

    demo = command("demo", "local upstream + router + example requests, end to end", "router demo --serve --port 8080",
                   "Start a local fake provider and the router on the demo policy, send a few typical agent "
                   "requests in both protocols, and print what was decided. With --tasks N, work N real "
                   "SWE-bench tasks through it instead, each labelled with the outcome the real model its "
                   "backend stands for had: enough (N=300) to train on. With --serve, keep serving (and "
                   "print the dashboard's URL) until Ctrl-C.")  # fmt: skip
    demo.add_argument(
        "--store", default="sqlite:///router.db", help="log store URL (default sqlite:///router.db)"
    )
    demo.add_argument("--serve", action="store_true", help="keep serving after the demo requests")
    demo.add_argument(
        "--port", type=int, help="the router's port (default 8080, or a free one if taken; 0: any)"
    )
    demo.add_argument("--upstream-port", type=int, metavar="PORT",
                      help="the local fake provider's port (default 9100, or a free one if taken; 0: any)")  # fmt: skip
    demo.add_argument("--tasks", type=_positive_int, metavar="N",
                      help="instead of the example requests, work N SWE-bench agent tasks of several turns through "
                      "the router and post each one's outcome (from the shipped data): a log `router train` learns from")  # fmt: skip
    demo.add_argument("--data", type=Path, metavar="DIR",
                      help="the SWE-bench data for --tasks (default: the checkout's evals/data/swebench-verified, "
                      "else ../shared/data)")  # fmt: skip
    demo.add_argument("--concurrency", type=_positive_int, default=16, metavar="N",
                      help="tasks in flight at once with --tasks (default 16)")  # fmt: skip
    demo.set_defaults(func=cmd_demo)

    from router.app.commands import upstream as fake

    up = command("upstream", "run the local fake provider (OpenAI + Anthropic wire formats)", fake.EXAMPLE,
                 fake.DESCRIPTION)  # fmt: skip
    fake.add_arguments(up)
    up.set_defaults(func=cmd_upstream)

    def window(sp: argparse.ArgumentParser, since: str = "24h") -> None:
        sp.add_argument("--store", default=store, help=STORE_HELP)
        sp.add_argument(
            "--since", default=since, help=f"how far back: 90s, 15m, 2h, 7d, 1w (default {since})"
        )
        sp.add_argument("--json", action="store_true", help="print JSON instead of tables")

    tasks = command("tasks", "the task ledger: requests, tokens, cost and outcome per task",
                    "router tasks --recent", "The task ledger: requests, tokens, cost and verdict per task, "
                    "most recent first. --recent prints one plain line per task with its full id, for "
                    "`router outcome`.")  # fmt: skip
    window(tasks)
    tasks.add_argument("task_id", nargs="?", help="only this task id (the same as --task)")
    tasks.add_argument("--task", help="only this task id")
    tasks.add_argument("--recent", type=_positive_int, nargs="?", const=20, metavar="N",
                       help="the N most recent tasks (default 20), one plain line each, full ids")  # fmt: skip
    tasks.set_defaults(func=cmd_tasks)

    out = command("outcome", "record whether a task succeeded (the label training learns from)",
                  "router outcome t-4afc33bcc506b5d8c70da63f --success",
                  "Record the verdict on a task's latest attempt (or --attempt N) in the log, as POST "
                  "/v1/outcomes does. An explicit verdict overrides every signal the router inferred.")  # fmt: skip
    out.add_argument("task_id", help="the task's id as `router tasks --recent` prints it")
    verdict = out.add_mutually_exclusive_group(required=True)
    verdict.add_argument("--success", dest="success", action="store_true", help="the task was done")
    verdict.add_argument("--failure", dest="success", action="store_false", help="it was not")
    out.add_argument("--score", type=float, help="a score in [0, 1] besides the verdict (optional)")
    out.add_argument("--attempt", type=int, help="which attempt (default: the task's latest)")
    out.add_argument("--store", default=store, help=STORE_HELP)
    out.set_defaults(func=cmd_outcome)

    pru = command("prune", "delete old requests and outcomes from the log, keeping budgets right",
                  "router prune --older-than 30d",
                  "Delete the requests and outcomes logged before --older-than ago. Budgets restarted "
                  "from the log read the spend per key and task: it is kept as one summary row per key "
                  "and task (endpoint '(pruned)'), written in the same transaction as the deletion.")  # fmt: skip
    pru.add_argument("--older-than", required=True, metavar="DURATION", help="90s, 15m, 2h, 7d, 1w")
    pru.add_argument("--store", default=store, help=STORE_HELP)
    pru.set_defaults(func=cmd_prune)

    tr = command("train", "fit the learned policy from the log and evaluate it off-policy",
                 "router train --config policies/examples/local.yaml --out policies/learned/p1.json",
                 "Fit the learned policy from the labelled tasks in the log, evaluate it off-policy against "
                 "the policy that produced the log, and write a versioned artifact. While some model has too "
                 "few labelled attempts (--force trains anyway), the artifact holds only each backend's sizes of "
                 "a call, learned from the log's reported usage: promoted, the policy routes as with none, "
                 "priced and held by them.")  # fmt: skip
    tr.add_argument("--store", default=store, help=STORE_HELP)
    tr.add_argument("--config", help="the policy the artifact is for: its objective and models (env "
                    "ROUTER_CONFIG; default policies/default.yaml)")  # fmt: skip
    tr.add_argument("--out", required=True, help="artifact path, e.g. policies/learned/NAME.json")
    tr.add_argument(
        "--since", help="only requests this recent: 90s, 15m, 2h, 7d, 1w (default: the whole log)"
    )
    tr.add_argument("--min-attempts", type=int, default=10, metavar="N",
                    help="labelled attempts needed per model (default 10)")  # fmt: skip
    tr.add_argument("--force", action="store_true", help="learn routing even below --min-attempts")
    tr.add_argument("--min-scope-attempts", type=int, default=100, metavar="N",
                    help="labelled attempts a scope needs for its own learned effects (default 100)")  # fmt: skip
    tr.add_argument("--max-key-share", type=float, default=0.1, metavar="S",
                    help="largest share of the training weight one virtual key's labels may have, or 2/K "
                         "with K keys if larger; the keys over it are scaled down and listed (default 0.1)")  # fmt: skip
    tr.add_argument("--trajectories", metavar="PATH",
                    help="agent runs with known outcomes (a *.jsonl[.gz] file or a directory of them, the format "
                         "router eval reads) to learn each model's stop-loss from; without it the stop-loss is learned from the "
                         "log's attempts with explicit outcomes and the P(success) logged at each call")  # fmt: skip
    tr.set_defaults(func=cmd_train)

    pv = command("preview", "decide the logged requests again under a new policy: moves, cost, success, risks",
                 "router preview --config policies/default.candidate.yaml --since 7d")  # fmt: skip
    window(pv, since="7d")
    pv.add_argument("--config", required=True, help="the new policy YAML")
    pv.set_defaults(func=cmd_preview)

    pr = command("promote", "pin a trained artifact in a policy file (routers reload it)",
                 "router promote policies/learned/p1.json --config policies/default.yaml")  # fmt: skip
    pr.add_argument("artifact", help="the artifact `router train` wrote")
    pr.add_argument("--config", required=True, help="the policy file to pin it in")
    pr.add_argument("--redis", help=REDIS_HELP)
    pr.add_argument("--force", action="store_true",
                    help="pin an artifact trained for other models than the policy's (refused otherwise)")  # fmt: skip
    pr.set_defaults(func=cmd_promote)

    rb = command("rollback", "put an earlier policy revision back (routers reload it)",
                 "router rollback --config policies/default.yaml")  # fmt: skip
    rb.add_argument("--config", help=CONFIG_HELP)
    rb.add_argument(
        "--to",
        metavar="REVISION",
        help="the revision, or a prefix of its id (default: the one applied before)",
    )
    rb.add_argument("--redis", help=REDIS_HELP)
    rb.set_defaults(func=cmd_rollback)

    report = command("report", "phases, rates, cost and errors per group, from the log",
                     "router report --since 1h --by backend")  # fmt: skip
    window(report)
    from router.telemetry.report import GROUPS

    report.add_argument(
        "--by", choices=list(GROUPS), default="backend", help="how to group (default backend)"
    )
    report.add_argument("--plot", metavar="FILE.png", help="also write stacked phases and distributions")
    report.set_defaults(func=cmd_report)

    from router.app.commands.evals import add_arguments as add_eval

    ev = command("eval", "offline evaluation of the learned policy on recorded agent outcomes",
                 "router eval --folds 5")  # fmt: skip
    add_eval(ev)
    ev.set_defaults(func=cmd_eval)

    from router.app.commands.labels import add_arguments as add_eval_labels

    el = command("eval-labels", "measure the outcome label on replayed agent trajectories (both shapes)",
                 "router eval-labels")  # fmt: skip
    add_eval_labels(el)
    el.set_defaults(func=cmd_eval_labels)

    from router.app.commands.sizes import add_arguments as add_eval_sizes

    es = command("eval-sizes", "measure the prompt, output and cost estimates on replayed agent trajectories",
                 "router eval-sizes --json")  # fmt: skip
    add_eval_sizes(es)
    es.set_defaults(func=cmd_eval_sizes)

    mg = command("migrate", "create or upgrade the log store's schema, then exit",
                 "router migrate --store postgresql://router@db/router")  # fmt: skip
    mg.add_argument("--store", help=STORE_HELP)
    mg.set_defaults(func=cmd_migrate)

    from router.app.commands.keys import add_parser as add_keys

    add_keys(sub, store)
    return p


def _command_parser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    for action in parser._actions:  # argparse keeps its subcommands nowhere public
        if isinstance(action, argparse._SubParsersAction) and name in action.choices:
            found: argparse.ArgumentParser = action.choices[name]
            return found
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:
        # argparse says this with the top-level usage ("usage: router [-h] [--version] COMMAND"),
        # which shows none of the flags the command does take.
        _command_parser(parser, args.command).error(f"unrecognized arguments: {' '.join(extra)}")
    configure(getattr(args, "log_level", "info"), getattr(args, "log_format", "text"))
    try:
        return int(args.func(args))
    except ConfigError as exc:  # the message names the file or flag; no traceback
        print(f"router {args.command}: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # the reader left (`router report --json | head`): not an error to report
        with contextlib.suppress(OSError, ValueError):
            # Output still buffered would fail again at exit, printing an "Exception ignored" line.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # as a program killed by SIGPIPE: the shell's convention for a cut pipe
    except ConnectionError as exc:  # a store or Redis that does not answer: its URL and libpq's reason
        print(f"router {args.command}: {' '.join(str(exc).split())}", file=sys.stderr)
        return 1
    except OSError as exc:  # a path it cannot read or write ("File name too long"): a traceback before
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"router {args.command}: {where}{exc.strerror or exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # Ctrl-C: uvicorn has shut down cleanly and re-raised it; no traceback
        return 130


if __name__ == "__main__":
    sys.exit(main())
