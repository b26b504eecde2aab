"""``python -m router.fakeupstream --host H --port P [--behaviour SPEC]``."""

from __future__ import annotations

import argparse
import dataclasses

from router.fakeupstream.behaviour import Behaviour, BehaviourError, parse_spec
from router.fakeupstream.server import run


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m router.fakeupstream", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9100)
    parser.add_argument("--behaviour", default="", help="default behaviour, e.g. 'ttft_ms=100,chunk_ms=5'")
    args = parser.parse_args(argv)
    try:
        default = dataclasses.replace(Behaviour(), **parse_spec(args.behaviour))
    except BehaviourError as exc:
        parser.error(str(exc))
    run(args.host, args.port, default)


if __name__ == "__main__":
    main()
