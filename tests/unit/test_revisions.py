"""Policy revisions: the id, the archive, refused reloads, and putting an earlier revision back."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import yaml

from router.errors import ConfigError
from router.policy.active import PolicyHistory, PolicyWatcher, load_active_policy
from router.policy.revisions import Archive, revision_of

MODEL = {"id": "m", "litellm_model": "openai/m", "protocol": "openai", "prices": {"input": 1, "output": 2},
         "context_window": 1000, "max_output_tokens": 100}  # fmt: skip


def write(path: Path, name: str, candidates: list[str] | None = None) -> Path:
    models = [MODEL, {**MODEL, "id": "n", "litellm_model": "openai/n"}]
    path.write_text(yaml.safe_dump({"version": 1, "name": name, "models": models,
                                    "routes": [{"match": "auto", "candidates": candidates or ["m", "n"]}]}))  # fmt: skip
    return path


def bump(path: Path) -> None:
    # The watcher compares mtimes: a rewrite within one clock tick must still look changed.
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))


def test_revision_is_a_framed_content_hash() -> None:
    assert revision_of([b"ab", b"c"]) != revision_of([b"a", b"bc"])
    assert revision_of([b"x", b""]) == revision_of([b"x", b""])
    assert len(revision_of([b"x"])) == 12


def test_the_revision_follows_the_bytes_not_the_file(tmp_path: Path) -> None:
    a = load_active_policy(write(tmp_path / "p.yaml", "one"))
    b = load_active_policy(write(tmp_path / "q.yaml", "one"))
    c = load_active_policy(write(tmp_path / "p.yaml", "two"))
    assert a.revision == b.revision != c.revision


def test_a_refused_reload_is_remembered_until_a_good_one(tmp_path: Path) -> None:
    path = write(tmp_path / "p.yaml", "one")
    first = load_active_policy(path)
    history = PolicyHistory(Archive(path))
    history.applied(first)
    installed = []
    watcher = PolicyWatcher(path, installed.append, first, history)

    path.write_text("version: 1\nmodels: []\nroutes: [{match: auto}]\n")
    bump(path)
    assert watcher.check(first) is False and installed == []
    assert history.rejected_reloads == 1
    assert history.last_rejected is not None and "routes[0]" in history.last_rejected.error
    assert history.describe(first)["last_rejected"]["error"] == history.last_rejected.error

    write(path, "two")
    bump(path)
    assert watcher.check(first) is True
    second = installed[-1]
    assert second.revision != first.revision and history.last_rejected is None
    described = history.describe(second)
    assert described["revision"] == second.revision and described["name"] == "two"
    assert [p["revision"] for p in described["previous"]] == [first.revision]


def test_a_file_put_back_after_a_refused_edit_says_it_loads_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # The console's last line on the file stayed its error, though /readyz was back to ok.
    path = write(tmp_path / "p.yaml", "one")
    rt = load_active_policy(path)
    good = path.read_bytes()
    watcher = PolicyWatcher(path, [].append, rt)
    path.write_text("version: 1\nmodels: []\nroutes: [{match: auto}]\n")
    bump(path)
    assert watcher.check(rt) is False
    path.write_bytes(good)
    bump(path)
    with caplog.at_level("INFO", logger="router.policy"):
        assert watcher.check(rt) is False and watcher.history.last_rejected is None
        bump(path)
        assert watcher.check(rt) is False  # touched again: nothing more to say
    assert [r.getMessage() for r in caplog.records if r.levelname == "INFO"] == [
        f"policy file loads again: one revision {rt.revision}, the one running, stays"
    ]


def test_a_touched_file_keeps_its_revision(tmp_path: Path) -> None:
    path = write(tmp_path / "p.yaml", "one")
    rt = load_active_policy(path)
    installed = []
    watcher = PolicyWatcher(path, installed.append, rt)
    bump(path)
    assert watcher.check(rt) is False and installed == []


def test_restore_puts_the_policy_and_its_artifact_back(tmp_path: Path) -> None:
    path = write(tmp_path / "p.yaml", "one")
    artifact = tmp_path / "art.json"
    artifact.write_bytes(b"old artifact")
    archive = Archive(path)
    from router.policy.revisions import PolicyFiles

    old = PolicyFiles(path.resolve(), path.read_bytes(), artifact, artifact.read_bytes())
    archive.keep(old, "one", 1.0)
    write(path, "two")
    artifact.write_bytes(b"new artifact")
    new = PolicyFiles(path.resolve(), path.read_bytes(), artifact, artifact.read_bytes())
    archive.keep(new, "two", 2.0)

    assert [m["revision"] for m in archive.previous(new.revision)] == [old.revision]
    archive.restore(old.revision)
    assert path.read_bytes() == old.policy and artifact.read_bytes() == b"old artifact"
    archive.mark_rolled_back(old.revision, 3.0, "test")
    assert archive.previous(new.revision, skip_rolled_back=True) == []
    with pytest.raises(ConfigError, match="no archived policy revision 'nope'"):
        archive.restore("nope")


def test_rollback_goes_to_the_revision_before_and_not_back_again(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from router.app.cli import main
    from router.rollout.rollback import rollback

    path = write(tmp_path / "p.yaml", "one")
    history = PolicyHistory(Archive(path))
    first = load_active_policy(path)
    history.applied(first)
    write(path, "two", ["n"])
    second = load_active_policy(path)
    history.applied(second)

    at = time.time() + 1
    assert rollback(history.archive, None, "worse", at) == (second.revision, first.revision)
    assert load_active_policy(path).revision == first.revision
    assert history.describe(load_active_policy(path))["last_rollback"] == {
        "from": second.revision,
        "to": first.revision,
        "at": at,
        "reason": "worse",
    }
    # The revision rolled back from is not a target for the next automatic rollback ...
    with pytest.raises(ConfigError, match="no earlier revision"):
        rollback(history.archive, None, "again", at + 1)
    # ... but an operator may name it.
    assert main(["rollback", "--config", str(path), "--to", second.revision]) == 0
    assert f"rolled back from revision {first.revision} to {second.revision}" in capsys.readouterr().out
    assert load_active_policy(path).revision == second.revision
    assert main(["rollback", "--config", str(path), "--to", "feedfeedfeed"]) == 2


def test_applying_a_policy_warns_of_key_variables_that_are_not_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "p.yaml"
    models = [
        {**MODEL, "api_key_env": "ROUTER_TEST_KEY_M"},
        {**MODEL, "id": "n", "api_key_env": "ROUTER_TEST_KEY_M"},
    ]
    path.write_text(yaml.safe_dump({"version": 1, "name": "keys", "models": models,
                                    "routes": [{"match": "auto", "candidates": ["m", "n"]}]}))  # fmt: skip
    monkeypatch.delenv("ROUTER_TEST_KEY_M", raising=False)
    with caplog.at_level("WARNING", logger="router"):
        PolicyHistory(Archive(path)).applied(load_active_policy(path))
    assert [r.getMessage() for r in caplog.records] == [
        "policy keys: ROUTER_TEST_KEY_M is not set: m, n cannot be called until it is (requests fall over to other models)"
    ]


def test_a_revision_applied_again_after_another_starts_a_new_trial(tmp_path: Path) -> None:
    # The guard judges a revision on what arrived since ``since``. Put back by hand (the file
    # edited back after another revision), it kept the time of its first application.
    path = tmp_path / "p.yaml"
    archive = Archive(path)
    one, two = (
        load_active_policy(write(path, "one")).files,
        load_active_policy(write(tmp_path / "q.yaml", "two")).files,
    )
    assert one is not None and two is not None
    archive.keep(one, "one", 100.0)
    archive.keep(one, "one", 105.0)  # another replica, or a restart: the same trial
    assert archive.since(one.revision) == 100.0
    archive.keep(two, "two", 200.0)
    archive.keep(one, "one", 300.0)  # back by hand
    archive.keep(one, "one", 301.0)  # the other replica follows
    assert archive.since(one.revision) == 300.0 and archive.since(two.revision) == 200.0


def test_a_label_model_changed_under_its_pin_is_noticed_by_the_watcher(tmp_path: Path) -> None:
    """Issue 30: the watcher stamped the policy, its artifact and its control file, not the label
    model, so a label model rewritten under its pin went unnoticed until some other change."""
    import hashlib

    from tests.unit.test_labels import _artifact

    raw = _artifact()
    labels = tmp_path / "labels.json"
    labels.write_bytes(raw)
    path = write(tmp_path / "p.yaml", "one")
    spec = yaml.safe_load(path.read_text())
    spec["tasks"] = {"label_model": {"artifact": "labels.json", "sha256": hashlib.sha256(raw).hexdigest()}}
    path.write_text(yaml.safe_dump(spec))
    first = load_active_policy(path)
    history = PolicyHistory(Archive(path))
    watcher = PolicyWatcher(path, [].append, first, history)
    labels.write_bytes(raw.replace(b"log_steps", b"log_turns"))
    bump(labels)
    assert watcher.check(first) is False
    assert history.last_rejected is not None and "sha256 mismatch" in history.last_rejected.error


def test_replicas_writing_one_archive_file_at_once_leave_it_whole(tmp_path: Path) -> None:
    # Two replicas applying the same revision write its meta.json at once. The temporary file was
    # named by the process id alone: replicas in one process (or one per container, each its pid
    # 1, on a shared volume) wrote one temporary file, one's rename failed ('not archived') and the
    # other's file could be cut, the revision then missing from the history (the guard's test saw
    # a rollback refused as 'already in force').
    import threading

    from router.policy.revisions import _atomic_write

    target = tmp_path / "meta.json"
    payloads = [bytes([65 + i]) * 200_000 for i in range(6)]
    errors: list[BaseException] = []

    def write(data: bytes) -> None:
        try:
            for _ in range(40):
                _atomic_write(target, data)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(p,)) for p in payloads]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert target.read_bytes() in payloads
    assert [p.name for p in tmp_path.iterdir()] == ["meta.json"]  # no temporary file left behind
