"""Virtual keys: format, hashing, the store's keys table, ``Auth`` modes and caching, the CLI."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import logging
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from pydantic import SecretStr
from starlette.requests import Request

from router.app.cli import main
from router.errors import AuthenticationFailed, PermissionDenied, ServiceUnavailable
from router.http import keys
from router.http.auth import MASTER, OPEN, Auth, Principal
from router.store import KeyRecord, Store, StoreDataError
from router.store.sqlite import SQLiteStore
from tests.unit.olddb import database_at
from tests.unit.test_store import stored


def request(key: str | None = None, header: str = "authorization") -> Request:
    headers = []
    if key is not None:
        value = f"Bearer {key}" if header == "authorization" else key
        headers.append((header.encode(), value.encode("latin-1")))
    return Request({"type": "http", "method": "POST", "path": "/", "headers": headers})


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SQLiteStore]:
    s = SQLiteStore(str(tmp_path / "keys.db"))
    await s.open()
    yield s
    await s.close()


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Spy:
    """A store wrapper counting key lookups; ``fail`` makes them raise."""

    def __init__(self, inner: Store) -> None:
        self.inner = inner
        self.lookups = 0
        self.lists = 0
        self.fail = False

    async def get_key_by_hash(self, key_hash: str) -> KeyRecord | None:
        self.lookups += 1
        if self.fail:
            raise ConnectionError("database is down")
        return await self.inner.get_key_by_hash(key_hash)

    async def list_keys(self) -> list[KeyRecord]:
        self.lists += 1
        return await self.inner.list_keys()


# --- format and hash --------------------------------------------------------------------------


def test_generated_keys_have_the_documented_format() -> None:
    made = {keys.generate_key() for _ in range(200)}
    assert len(made) == 200
    for key in made:
        assert key.startswith("rk-") and len(key) == keys.KEY_LENGTH == 43
        assert keys.looks_like_key(key)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "rk-",
        "rk-" + "a" * 39,
        "rk-" + "a" * 41,
        "sk-" + "a" * 40,
        "RK-" + "a" * 40,
        "rk-" + "a" * 39 + "=",
        "rk-" + "a" * 39 + "é",
        "rk-" + "a" * 39 + "\n",
        "rk-" + "a" * 20 + "' OR '1'='1" + "a" * 9,
    ],
)
def test_malformed_keys_fail_the_format_check(text: str) -> None:
    assert not keys.looks_like_key(text)


def test_the_hash_is_plain_sha256_of_the_whole_key() -> None:
    key, rec = keys.new_key("ci", budget_usd=2.5, rpm=10, tpm=1000, models=["auto"], now=5.0)
    assert rec.key_hash == hashlib.sha256(key.encode()).hexdigest() == keys.hash_key(key)
    assert rec.prefix == key[: keys.DISPLAY_CHARS] and rec.key_id.startswith("key_")
    assert key not in repr(rec) and rec.created_at == 5.0 and rec.revoked_at is None


# --- store ------------------------------------------------------------------------------------


async def check_keys(store: Store) -> None:
    """Shared with the PostgreSQL integration test."""
    assert await store.list_keys() == []
    k1, r1 = keys.new_key("alice", budget_usd=5.0, rpm=60, tpm=10_000, models=["auto", "claude-*"], now=1.0)
    k2, r2 = keys.new_key("bob", now=2.0)
    await store.create_key(r1)
    await store.create_key(r2)
    assert await store.get_key_by_hash(keys.hash_key(k1)) == r1
    assert await store.get_key_by_hash(keys.hash_key(k2)) == r2
    assert await store.get_key_by_hash(keys.hash_key(keys.generate_key())) is None
    assert await store.get_key_by_hash("' OR '1'='1") is None
    assert [k.key_id for k in await store.list_keys()] == [r1.key_id, r2.key_id]
    assert await store.revoke_key(r1.key_id, 9.0) is True
    assert await store.revoke_key(r1.key_id, 10.0) is False  # the first revocation time stays
    assert await store.revoke_key("key_nope", 10.0) is False
    got = await store.get_key_by_hash(r1.key_hash)
    assert got is not None and got.revoked_at == 9.0 and got.models == ["auto", "claude-*"]
    with pytest.raises(StoreDataError):
        await store.create_key(r2)  # same id
    dup_hash = KeyRecord("key_other", r2.key_hash, "rk-x", "dup", 3.0)
    with pytest.raises(StoreDataError):
        await store.create_key(dup_hash)
    assert len(await store.list_keys()) == 2


async def test_keys_table(store: SQLiteStore) -> None:
    await check_keys(store)


async def test_a_version_2_database_gains_the_keys_table(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    with contextlib.closing(database_at(path, 2)) as conn, conn:
        conn.execute("INSERT INTO requests (request_id, ts) VALUES ('old', 1.0)")
    s = SQLiteStore(str(path))
    await s.open()
    try:
        old = await stored(s, "old")
        assert old is not None and old.key_id is None
        await check_keys(s)
    finally:
        await s.close()


# --- Auth -------------------------------------------------------------------------------------


async def test_open_mode_without_master_key_or_keys(store: SQLiteStore) -> None:
    auth = Auth(None, store)
    await auth.start()
    assert auth.open and auth.mode == "open"
    assert await auth.check(request()) is OPEN
    assert await auth.check(request("anything at all")) is OPEN
    assert await auth.check(request(), master_only=True) is OPEN


async def test_open_mode_says_the_master_key_closes_it_and_keys_alone_lock_the_dashboard(
    store: SQLiteStore, caplog: pytest.LogCaptureFixture
) -> None:
    # It said only "create a key with `router keys create` to close it": doing that locked /ui
    # (virtual keys only: 403, "The dashboard needs a master key"), which it did not say.
    with caplog.at_level(logging.WARNING, logger="router.http.auth"):
        await Auth(None, store).start()
    [said] = [r.getMessage() for r in caplog.records]
    assert "set ROUTER_MASTER_KEY to close it" in said and "alone closes it and locks the dashboard" in said


async def test_an_empty_master_key_is_no_master_key(store: SQLiteStore) -> None:
    auth = Auth(SecretStr(""), store)
    await auth.start()
    assert auth.open


async def test_creating_a_key_ends_open_mode_within_the_ttl(store: SQLiteStore) -> None:
    clock = Clock()
    spy = Spy(store)
    auth = Auth(None, spy, ttl=30, clock=clock)  # type: ignore[arg-type]
    await auth.start()
    key, rec = keys.new_key("late")
    await store.create_key(rec)
    assert await auth.check(request()) is OPEN  # not re-read yet
    clock.now += 31
    # The store is re-read in the background: this request still passes, later ones do not.
    assert await auth.check(request()) is OPEN
    async with asyncio.timeout(5):
        while auth.open:  # noqa: ASYNC110 - polling a flag the background refresh sets
            await asyncio.sleep(0.01)
    assert spy.lists == 2
    with pytest.raises(AuthenticationFailed):
        await auth.check(request())
    assert not auth.open and auth.mode == "virtual keys"
    assert (await auth.check(request(key))).key_id == rec.key_id
    # Revoking every key does not reopen the router.
    await store.revoke_key(rec.key_id, 1.0)
    clock.now += 31
    with pytest.raises(AuthenticationFailed):
        await auth.check(request(key))
    assert not auth.open


async def test_open_mode_is_said_to_end_only_where_this_process_served_open(
    store: SQLiteStore, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # `router keys create`, then `router serve` without ROUTER_MASTER_KEY: startup warned "virtual
    # keys exist now; open mode has ended" of a process that never was open.
    _, rec = keys.new_key("before")
    await store.create_key(rec)
    caplog.set_level(logging.INFO, logger="router.http.auth")
    await Auth(None, store).start()
    assert [r.getMessage() for r in caplog.records] == [
        "auth: virtual keys mode - callers need a virtual key (no master key is set)"
    ]
    # A key created while a process served open does end its open mode, and it says so.
    caplog.clear()
    clock = Clock()
    empty = SQLiteStore(str(tmp_path / "empty.db"))
    await empty.open()
    try:
        auth = Auth(None, empty, ttl=30, clock=clock)
        await auth.start()
        await empty.create_key(keys.new_key("late")[1])
        clock.now += 31
        await auth.check(request())
        async with asyncio.timeout(5):
            while auth.open:  # noqa: ASYNC110 - polling a flag the background refresh sets
                await asyncio.sleep(0.01)
    finally:
        await empty.close()
    said = [r.getMessage() for r in caplog.records]
    assert (
        said[0].startswith("auth: OPEN MODE")
        and said[1] == "auth: virtual keys exist now; open mode has ended"
    )


async def test_master_key_mode(store: SQLiteStore) -> None:
    auth = Auth(SecretStr("the-master-key"), store)
    await auth.start()
    assert auth.mode == "master key"
    assert await auth.check(request("the-master-key")) is MASTER
    assert await auth.check(request("the-master-key", header="x-api-key"), master_only=True) is MASTER
    for bad in (None, "the-master-ke", "the-master-keyX", "x" * 300, "Bearer the-master-key"):
        with pytest.raises(AuthenticationFailed) as err:
            await auth.check(request(bad))
        assert (bad or "\0") not in err.value.message
    # A client still set up with its provider's key was told only "invalid API key".
    with pytest.raises(AuthenticationFailed) as err:
        await auth.check(request("sk-proj-0123456789abcdef"))
    assert err.value.message == (
        "invalid API key: send the router's key (ROUTER_MASTER_KEY or a virtual key), not a provider's"
    )


async def test_a_short_master_key_is_warned_of_without_showing_it(
    store: SQLiteStore, caplog: pytest.LogCaptureFixture
) -> None:
    """Nothing limits how many keys a client may try: a master key such as ``sk-1234`` (litellm's
    proxy's example) was accepted without a word."""
    caplog.set_level(logging.INFO, logger="router.http.auth")
    await Auth(SecretStr("sk-1234"), store).start()
    await Auth(SecretStr("0123456789abcdef" * 3), store).start()
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1 and "only 7 characters" in warned[0] and "sk-1234" not in caplog.text


async def test_virtual_keys_carry_their_limits(store: SQLiteStore) -> None:
    key, rec = keys.new_key("alice", budget_usd=5.0, rpm=60, tpm=1000, models=["auto", "claude-*"])
    await store.create_key(rec)
    auth = Auth(SecretStr("m"), store)
    await auth.start()
    p = await auth.check(request(key, header="x-api-key"))
    assert p == Principal(rec.key_id, "alice", 5.0, 60, 1000, ("auto", "claude-*"))
    p.authorize_model("auto")
    p.authorize_model("claude-sonnet-4")
    with pytest.raises(PermissionDenied) as err:
        p.authorize_model("local-large")
    assert err.value.status == 403 and key not in err.value.message
    with pytest.raises(PermissionDenied):
        await auth.check(request(key), master_only=True)
    MASTER.authorize_model("anything")
    OPEN.authorize_model("anything")


async def test_malformed_keys_never_reach_the_store(store: SQLiteStore) -> None:
    key, rec = keys.new_key("k")
    await store.create_key(rec)
    spy = Spy(store)
    auth = Auth(None, spy)  # type: ignore[arg-type]
    await auth.start()
    hostile = [
        "' OR '1'='1",
        "rk-' OR 1=1; DROP TABLE keys; --aaaaaaaaaa",
        key[:-1] + "'",
        key + "a",
        "rk-" + "a" * 5000,
        "\x00" * 43,
    ]
    for bad in hostile:
        with pytest.raises(AuthenticationFailed):
            await auth.check(request(bad))
    assert spy.lookups == 0
    assert len(await store.list_keys()) == 1


async def test_lookups_are_cached_for_the_ttl_and_bounded(store: SQLiteStore) -> None:
    key, rec = keys.new_key("k")
    await store.create_key(rec)
    clock = Clock()
    spy = Spy(store)
    auth = Auth(None, spy, ttl=30, cache_size=3, clock=clock)  # type: ignore[arg-type]
    await auth.start()
    for _ in range(5):
        await auth.check(request(key))
    assert spy.lookups == 1
    unknown = keys.generate_key()
    for _ in range(3):
        with pytest.raises(AuthenticationFailed):
            await auth.check(request(unknown))
    assert spy.lookups == 2  # misses are cached too
    await store.revoke_key(rec.key_id, 1.0)
    await auth.check(request(key))  # still cached
    clock.now += 30
    with pytest.raises(AuthenticationFailed) as err:
        await auth.check(request(key))
    assert "revoked" in err.value.message
    for _ in range(10):
        with pytest.raises(AuthenticationFailed):
            await auth.check(request(keys.generate_key()))
    assert len(auth._cache) == 3


async def test_a_store_outage_is_a_503_not_a_pass(store: SQLiteStore) -> None:
    key, rec = keys.new_key("k")
    await store.create_key(rec)
    spy = Spy(store)
    auth = Auth(None, spy)  # type: ignore[arg-type]
    await auth.start()
    spy.fail = True
    with pytest.raises(ServiceUnavailable):
        await auth.check(request(key))


# --- CLI --------------------------------------------------------------------------------------


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_create_list_revoke(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    code, out, _ = run_cli(capsys, "keys", "create", "--name", "ci bot", "--budget", "12.5", "--rpm", "30",
                           "--tpm", "9000", "--models", "auto, claude-*", "--store", url, "--json")  # fmt: skip
    assert code == 0
    made: dict[str, Any] = orjson.loads(out)
    key = made["key"]
    assert keys.looks_like_key(key)
    assert made["models"] == ["auto", "claude-*"] and made["budget_usd"] == 12.5 and made["rpm"] == 30
    code, out, _ = run_cli(capsys, "keys", "create", "--name", "plain", "--store", url)
    assert code == 0 and "key: rk-" in out and "only time" in out
    assert "first key" not in out  # said of the first key alone, which ends open mode
    first = run_cli(capsys, "keys", "create", "--name", "one", "--store", f"sqlite:///{tmp_path / 'new.db'}")[
        1
    ]
    assert (
        "The log's first key: a router logging here that has no ROUTER_MASTER_KEY leaves open mode" in first
    )
    code, out, _ = run_cli(capsys, "keys", "list", "--store", url)
    assert code == 0 and "ci bot" in out and "plain" in out and key not in out
    assert keys.hash_key(key) not in out
    code, out, _ = run_cli(capsys, "keys", "list", "--store", url, "--json")
    listed = orjson.loads(out)
    assert [k["name"] for k in listed] == ["ci bot", "plain"] and all("key_hash" not in k for k in listed)
    code, out, _ = run_cli(capsys, "keys", "revoke", made["key_id"], "--store", url)
    assert code == 0 and "revoked" in out
    code, _, err = run_cli(capsys, "keys", "revoke", made["key_id"], "--store", url)
    assert code == 1 and "already revoked" in err
    code, _, err = run_cli(capsys, "keys", "revoke", "key_nope", "--store", url)
    assert code == 1 and "no such key" in err
    code, out, _ = run_cli(capsys, "keys", "list", "--store", url, "--json")
    assert orjson.loads(out)[0]["revoked"] is not None
    with sqlite3.connect(tmp_path / "cli.db") as conn:
        dump = "\n".join(conn.iterdump())
    assert key not in dump and keys.hash_key(key) in dump


def test_cli_list_says_what_each_key_has_spent(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # A key's budget was listed, and what it had spent nowhere on the command line.
    from router.store.records import RequestRecord

    url = f"sqlite:///{tmp_path / 'cli.db'}"
    made = [orjson.loads(run_cli(capsys, "keys", "create", "--name", n, "--budget", "1", "--store", url,
                                 "--json")[1]) for n in ("spender", "idle")]  # fmt: skip

    async def spend() -> None:
        store = SQLiteStore(str(tmp_path / "cli.db"))
        await store.open()
        await store.write_requests([RequestRecord(request_id=f"r{i}", ts=1.0 + i, task_id="t", key_id=made[0]["key_id"],
                                                  status=200, cost_usd=0.125) for i in range(3)])  # fmt: skip
        await store.close()

    asyncio.run(spend())
    listed = orjson.loads(run_cli(capsys, "keys", "list", "--store", url, "--json")[1])
    assert [(k["name"], k["spent_usd"], k["budget_usd"]) for k in listed] == [
        ("spender", 0.375, 1.0),
        ("idle", 0.0, 1.0),
    ]
    lines = run_cli(capsys, "keys", "list", "--store", url)[1].splitlines()
    assert lines[0].split()[4:6] == ["spent_usd", "budget_usd"] and lines[1].split()[4:6] == ["0.375", "1"]


def test_cli_list_writes_small_sums_as_dollars(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # A key that had spent $0.0000432 of a $0.00005 budget was listed as 4.3e-05 of 5e-05.
    from router.store.records import RequestRecord

    url = f"sqlite:///{tmp_path / 'cli.db'}"
    made = orjson.loads(run_cli(capsys, "keys", "create", "--name", "n", "--budget", "0.00005", "--store", url,
                                "--json")[1])  # fmt: skip

    async def spend() -> None:
        store = SQLiteStore(str(tmp_path / "cli.db"))
        await store.open()
        await store.write_requests([RequestRecord(request_id="r", ts=1.0, task_id="t", key_id=made["key_id"],
                                                  status=200, cost_usd=0.0000432)])  # fmt: skip
        await store.close()

    asyncio.run(spend())
    lines = run_cli(capsys, "keys", "list", "--store", url)[1].splitlines()
    assert lines[1].split()[4:6] == ["0.000043", "0.00005"]  # rounded to the micro-dollar, as --json


@pytest.mark.parametrize(
    "flags", [["--rpm", "0"], ["--budget", "-1"], ["--budget", "nan"], ["--models", ","], ["--name", ""]]
)
def test_cli_refuses_bad_limits(tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str]) -> None:
    argv = ["keys", "create", "--name", "x", *flags, "--store", f"sqlite:///{tmp_path / 'c.db'}"]
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2


def test_cli_revoke_json_gives_the_revoked_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # `keys revoke --json` took the flag and printed "revoked key_…" as text.
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    made = orjson.loads(run_cli(capsys, "keys", "create", "--name", "ci", "--store", url, "--json")[1])
    code, out, _ = run_cli(capsys, "keys", "revoke", made["key_id"], "--store", url, "--json")
    assert code == 0
    revoked = orjson.loads(out)
    assert (revoked["key_id"], revoked["name"]) == (made["key_id"], "ci") and revoked["revoked"] is not None
    assert "key" not in revoked and "key_hash" not in revoked
    code, out, err = run_cli(capsys, "keys", "revoke", made["key_id"], "--store", url, "--json")
    assert code == 1 and not out and "already revoked" in err


async def test_the_master_key_sent_where_a_name_goes_is_kept_nowhere(tmp_path, caplog, fake) -> None:  # type: ignore[no-untyped-def]
    # The master key has no format a pattern could find (sk-, rk-): sent as the model name, the
    # X-Router-Task-Id or the session (prompt_cache_key), it was kept in plain text in the log, the
    # console line and the reply's x-router-task-id (found by the hostile probe).
    from tests.unit.inprocess import MASTER, serving
    from tests.unit.requestpath import model

    with caplog.at_level(logging.INFO):
        async with serving(tmp_path, [model("a", fake.url)], master_key=MASTER) as r:
            as_model = await r.post(key=MASTER, model=MASTER)
            assert as_model.status_code == 404, as_model.text
            assert MASTER not in as_model.text and "master key" in as_model.json()["error"]["message"]
            for sent in ({"headers": {"x-router-task-id": MASTER}}, {"prompt_cache_key": MASTER}):
                served = await r.post(key=MASTER, **sent)  # type: ignore[arg-type]
                assert served.status_code == 200, served.text
                assert MASTER not in served.headers["x-router-task-id"]
            rows = await r.records()
    assert len(rows) == 3
    assert not [row for row in rows if MASTER in repr(dataclasses.asdict(row))]
    assert not [m for m in caplog.messages if MASTER in m]


async def test_a_key_sent_in_a_header_the_log_keeps_is_kept_nowhere(tmp_path, caplog, fake) -> None:  # type: ignore[no-untyped-def]
    # The repository header, the user agent and a header a rule reads are kept in the log as the
    # client sent them (cut at 256 characters): a provider's key, a virtual key or the master key
    # there was kept in plain text in the log, its console line and the spans (found by the hostile
    # probe). The model name, the task id and the session were already guarded.
    from tests.unit.inprocess import MASTER, serving
    from tests.unit.requestpath import model

    provider = "sk-proj-" + "Q" * 48
    rule = {"name": "tier", "when": {"headers.x-router-tier": "premium"}, "prefer": ["a"]}
    with caplog.at_level(logging.INFO):
        async with serving(
            tmp_path, [model("a", fake.url)], master_key=MASTER, policy={"rules": [rule]}
        ) as r:
            virtual, _ = await r.key()
            for n, secret in enumerate((MASTER, provider, virtual)):
                for header in ("x-router-repo", "user-agent", "x-router-tier"):
                    served = await r.post(
                        key=MASTER,
                        headers={header: secret},
                        messages=[{"role": "user", "content": f"{n} {header}"}],
                    )
                    assert served.status_code == 200, served.text
            rows = await r.records()
    assert len(rows) == 9
    kept = [repr(dataclasses.asdict(row)) for row in rows]
    assert all("[redacted]" in row for row in kept)
    for secret in (MASTER, provider, virtual):
        assert not [row for row in kept if secret in row]
        assert not [m for m in caplog.messages if secret in m]
