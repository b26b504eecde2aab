"""Property-based fuzzing of the CLI: every subcommand with bad arguments, missing or unreadable files,
bad YAML and JSON, and store or Redis URLs that cannot connect, gets one clear line on stderr and a
non-zero exit, never a traceback.

In-process (``router.app.cli.main``), as the console script calls it: an exception escaping ``main``
is exactly what prints a traceback. Derandomized and bounded (a fixed number of examples), and each
command is given ``LIMIT`` seconds (``time_limit``).
"""

from __future__ import annotations

import faulthandler
import os
import shutil
import signal
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

from router.app.cli import main

ROOT = Path(__file__).resolve().parents[2]

# {cfg} a good policy, {store} a good (empty, migrated) log; {FILE} {STORE} {REDIS} {DUR} {NUM} {TEXT}
# are the bad values drawn for an example.
TEMPLATES = [
    "check --config {FILE}",
    "serve --config {FILE} --port 0",
    "preview --config {FILE} --store {store}",
    "preview --config {cfg} --store {STORE}",
    "preview --config {cfg} --store {store} --since {DUR}",
    "tasks --store {STORE}",
    "tasks --store {store} --since {DUR}",
    "tasks --store {store} --recent {NUM}",
    "report --store {STORE}",
    "report --store {store} --since {DUR}",
    "outcome t-1 --success --store {STORE}",
    "outcome t-1 --failure --store {store} --score {NUM}",
    "outcome t-1 --failure --store {store} --attempt {NUM}",
    "outcome {TEXT} --success --store {store}",
    "prune --older-than {DUR} --store {store}",
    "prune --older-than 7d --store {STORE}",
    "train --store {STORE} --config {cfg} --out {tmp}/a.json",
    "train --store {store} --config {FILE} --out {tmp}/a.json",
    "train --store {store} --config {cfg} --out {FILE}",
    "train --store {store} --config {cfg} --out {tmp}/a.json --since {DUR}",
    "train --store {store} --config {cfg} --out {tmp}/a.json --trajectories {FILE} --force",
    "train --store {store} --config {cfg} --out {tmp}/a.json --max-key-share {NUM} --force",
    "promote {FILE} --config {cfg}",
    "promote {FILE} --config {FILE}",
    "rollback --config {FILE}",
    "rollback --config {cfg} --to {TEXT}",
    "rollback --config {cfg} --redis {REDIS}",
    "migrate --store {STORE}",
    "keys create --name ci --store {STORE}",
    "keys create --name {TEXT} --budget {NUM} --store {store}",
    "keys create --name ci --rpm {NUM} --models {TEXT} --team {TEXT} --store {store}",
    "keys list --store {STORE}",
    "keys revoke {TEXT} --store {store}",
    "keys revoke key_1 --store {STORE}",
    "eval --train {FILE}",
    "eval --config {FILE} --train {FILE}",
    "eval-labels --trajectories {FILE}",
    "eval-sizes --trajectories {FILE}",
    "demo --tasks {NUM} --data {FILE} --port 0 --upstream-port 0 --store {STORE}",
]
# Not `upstream --behaviour {TEXT}`: an example it accepts starts the fake provider, in-process,
# and serves until killed (a CI run hung there). Its bad specs are pinned in test_cli.py.
BAD_FILES = ["missing.yaml", "adir", "empty.yaml", "garbage.bin", "badyaml.yaml", "list.yaml", "scalar.yaml",
             "badjson.json", "latin1.yaml", "deep.yaml", "unknown.yaml", "x" * 300, "garbage.bin/child",
             "missingdir/x.json"]  # fmt: skip
BAD_STORES = ["sqlite:///{tmp}/missingdir/x.db", "sqlite:///{tmp}/adir", "sqlite:///{tmp}/garbage.bin",
              "postgresql://nobody@127.0.0.1:1/x", "postgresql://127.0.0.1:5432/surely_no_such_db",
              "mysql://u@h/db", "nonsense", "", "sqlite://", "postgresql://[::1",
              "postgresql://h:99999/x", "redis://127.0.0.1:6379"]  # fmt: skip
BAD_REDIS = ["redis://127.0.0.1:1", "nonsense", "", "redis://h:99999", "http://127.0.0.1:9"]
BAD_DURATIONS = ["", "7x", "-1d", "1e999d", "nan", "0s", "99999999999999999999w", "d", "1.5h", " "]
BAD_NUMBERS = ["-1", "nan", "inf", "0", "1e999", "x", "", "99999999999999999999", "-0", "1.5"]
BAD_TEXTS = ["", " ", "-", "--", "x" * 5000, "\u00e9", "*", "../..", "a,b,,", "key_\n"]


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("fuzzcli")
    (tmp / "adir").mkdir()
    (tmp / "empty.yaml").write_text("")
    (tmp / "garbage.bin").write_bytes(bytes(range(256)) * 4)
    (tmp / "badyaml.yaml").write_text("models: [a\n  b: : c\n\t- x")
    (tmp / "list.yaml").write_text("- 1\n- 2\n")
    (tmp / "scalar.yaml").write_text("42\n")
    (tmp / "badjson.json").write_text('{"a": ')
    (tmp / "latin1.yaml").write_bytes("name: caf\u00e9\n".encode("latin-1"))
    (tmp / "deep.yaml").write_text("[" * 5000 + "]" * 5000)
    (tmp / "unknown.yaml").write_text("nonsense_field: 1\n")
    shutil.copy(ROOT / "policies/examples/local.yaml", tmp / "good.yaml")
    assert main(["migrate", "--store", f"sqlite:///{tmp}/good.db"]) == 0
    return tmp


def fill(template: str, tmp: Path, draw: st.DrawFn) -> list[str]:
    values = {
        "FILE": lambda: str(tmp / draw(st.sampled_from(BAD_FILES))),
        "STORE": lambda: draw(st.sampled_from(BAD_STORES)).format(tmp=tmp),
        "REDIS": lambda: draw(st.sampled_from(BAD_REDIS)),
        "DUR": lambda: draw(st.sampled_from(BAD_DURATIONS)),
        "NUM": lambda: draw(st.sampled_from(BAD_NUMBERS)),
        "TEXT": lambda: draw(st.sampled_from(BAD_TEXTS)),
    }
    argv = []
    for word in template.split():
        for name, value in values.items():
            if "{" + name + "}" in word:
                word = word.replace("{" + name + "}", value())
        argv.append(word.format(cfg=tmp / "good.yaml", store=f"sqlite:///{tmp}/good.db", tmp=tmp))
    return argv


@st.composite
def commands(draw: st.DrawFn, tmp: Path) -> list[str]:
    return fill(draw(st.sampled_from(TEMPLATES)), tmp, draw)


# The commands run in this process: one that an example lets start serving (`upstream`, `serve` or
# `demo --serve` given values that turn out good) would serve until killed, and a CI run hung at 40%
# on one. So each gets LIMIT seconds, many times the slowest example's (~8 s on a loaded machine),
# and then is stopped as Ctrl-C stops it and fails the test naming its arguments.
LIMIT = 60.0
#: Past LIMIT + GRACE a command that ignored the interrupt has every thread's stack dumped and the
#: process exited: a failed run, never a hung one.
GRACE = 30.0


class Blocked(BaseException):
    """A command still running at its limit. Not an Exception: ``main`` and the code under it catch
    those, and Hypothesis would shrink it, running blocking examples again for minutes; a
    BaseException ends the test at once, with the arguments in its message."""


@contextmanager
def time_limit(seconds: float, what: str, capsys: pytest.CaptureFixture[str]) -> Iterator[None]:
    """Interrupt the body after ``seconds`` with SIGINT, then raise ``Blocked``.

    SIGINT rather than raising from the SIGALRM handler: uvloop (the fake provider's loop) runs
    Python signal handlers inside a callback of its own and logs what they raise, so the server
    kept serving; uvicorn, aiohttp and plain Python code all stop on SIGINT. Main thread only.
    """
    expired: list[bool] = []
    with capsys.disabled():  # the stacks go to the real stderr: captured output is lost at exit
        stderr = os.dup(2)

    def expire(signum: int, frame: object) -> None:
        expired.append(True)
        signal.raise_signal(signal.SIGINT)

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    faulthandler.dump_traceback_later(seconds + GRACE, exit=True, file=stderr)
    try:
        yield
    except KeyboardInterrupt:
        if not expired:
            raise
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        faulthandler.cancel_dump_traceback_later()
        os.close(stderr)
        signal.signal(signal.SIGALRM, previous)
    if expired:
        raise Blocked(f"{what}: still running after {seconds:g} s (stopped as Ctrl-C stops it)")


def run(argv: list[str], capsys: pytest.CaptureFixture[str], limit: float = LIMIT) -> tuple[int, str]:
    capsys.readouterr()
    try:
        with time_limit(limit, f"router {' '.join(argv)}", capsys):
            code = main(argv)
    except SystemExit as exc:  # argparse's refusals
        code = exc.code if isinstance(exc.code, int) else 1
    return code, capsys.readouterr().err


def assert_clear_refusal(argv: list[str], code: int, err: str) -> None:
    assert "Traceback" not in err, err
    if code == 0:
        return  # a value that turned out acceptable
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert lines, f"exit {code} and nothing on stderr for {argv}"
    # Argparse's refusals end in one "router CMD: error: ..." after the command's usage; ours are one
    # line "router CMD: ...", or one per problem of a policy file, each naming the file.
    assert lines[-1 if "usage:" in err else 0].startswith("router "), err


@settings(
    max_examples=300, deadline=None, database=None, derandomize=True, suppress_health_check=list(HealthCheck)
)
@given(data=st.data())
def test_bad_cli_input_is_one_line_and_a_non_zero_exit(
    workspace: Path, capsys: pytest.CaptureFixture[str], data: st.DataObject
) -> None:
    argv = data.draw(commands(workspace))
    note(repr(argv))
    cwd = os.getcwd()
    try:
        code, err = run(argv, capsys)
    finally:
        os.chdir(cwd)
    assert_clear_refusal(argv, code, err)


# Found by the fuzzing above, pinned: each was a traceback.
FOUND = [
    # PyYAML composes recursively: RecursionError.
    ("check --config {tmp}/deep.yaml", "router check: {tmp}/deep.yaml: the document is nested too deeply"),
    # A file that is not UTF-8 text: UnicodeDecodeError.
    ("train --store {store} --config {tmp}/latin1.yaml --out {tmp}/a.json",
     "router train: {tmp}/latin1.yaml: not a UTF-8 text file (byte 9: invalid continuation byte)"),
    # A store URL naming a file that is not a SQLite database: sqlite3.DatabaseError.
    ("tasks --store sqlite:///{tmp}/garbage.bin",
     "router tasks: cannot open SQLite log store '{tmp}/garbage.bin': file is not a database"),
    # A duration reaching before year 1: OverflowError.
    ("prune --older-than 99999999999999999999w --store {store}",
     "router prune: duration '99999999999999999999w' is longer than 50 years"),
    # A path too long for the file system: OSError.
    ("rollback --config {tmp}/" + "x" * 300, "router rollback: {tmp}/" + "x" * 300 + ": File name too long"),
    # A limit beyond the store's 64-bit integers: StoreDataError.
    ("keys create --name ci --rpm 99999999999999999999 --store {store}",
     "router keys create: error: argument --rpm: expected at most 9223372036854775807, got '99999999999999999999'"),
    # A trajectories file without a trajectory: scikit-learn's ValueError.
    ("eval-labels --trajectories {tmp}/empty.yaml", "router eval-labels: {tmp}/empty.yaml: holds no trajectories"),
]  # fmt: skip


@pytest.mark.parametrize(("command", "says"), FOUND)
def test_found_bad_input_is_one_line(
    workspace: Path, capsys: pytest.CaptureFixture[str], command: str, says: str
) -> None:
    values = {"tmp": workspace, "store": f"sqlite:///{workspace}/good.db"}
    code, err = run(command.format(**values).split(), capsys)
    assert code != 0 and err.strip().splitlines()[-1] == says.format(**values)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


def test_a_command_that_serves_is_stopped_at_its_limit(capsys: pytest.CaptureFixture[str]) -> None:
    """The command that hung CI: the fake provider, started in-process, serves until killed."""
    port = free_port()
    started = time.monotonic()
    with pytest.raises(Blocked, match=f"router upstream --port {port}: still running after 2 s"):
        run(["upstream", "--port", str(port)], capsys, limit=2)
    assert time.monotonic() - started < 2 + 15  # stopped as on Ctrl-C, not by the last resort
    with socket.socket() as s:  # it stopped serving: the port is free again
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))


def test_plain_code_that_blocks_is_stopped_at_its_limit(capsys: pytest.CaptureFixture[str]) -> None:
    started = time.monotonic()
    with pytest.raises(Blocked, match="waiting: still running after 1 s"), time_limit(1, "waiting", capsys):
        threading.Event().wait()
    assert time.monotonic() - started < 1 + 15
