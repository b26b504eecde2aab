"""The ``router`` command itself: help for every command and flag, one-line errors, the learning
loop's commands (outcome, tasks --recent, train's minimum), and no empty log left behind."""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import sys
import time
from pathlib import Path

import orjson
import pytest

from router.app.cli import build_parser, main
from router.app.settings import DEFAULT_CONFIG
from router.store.records import Estimate, RequestRecord
from router.store.sqlite import SQLiteStore
from tests.unit.requestpath import closed_port

LONG_TASK = "acme/widgets#1234-fix-the-flaky-retry-test-in-the-payment-service-" + "x" * 30


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.startswith("router ")


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    [sub] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


def test_every_command_has_a_description_an_example_and_help_for_each_flag() -> None:
    commands = _subcommands(build_parser())
    assert {"serve", "demo", "outcome", "tasks", "train", "schema", "report", "promote"} <= set(commands)
    # `keys` is a group of its own subcommands: each of them is held to the same standard.
    keys = {f"keys {n}": sp for n, sp in _subcommands(commands["keys"]).items()}
    for name, sp in {**commands, **keys}.items():
        assert sp.description and sp.epilog and sp.epilog.startswith("example:\n  "), name
        assert "router " + name in sp.epilog, name
        for action in sp._actions:
            if action.dest != "help" and not isinstance(action, argparse._SubParsersAction):
                assert action.help, f"router {name} {(action.option_strings or [action.dest])[0]} has no help"


def test_check_offers_only_the_flag_it_uses() -> None:
    flags = {s for a in _subcommands(build_parser())["check"]._actions for s in a.option_strings}
    assert flags == {"-h", "--help", "--config"}


def test_check_warns_of_key_variables_that_are_not_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "p.yaml"
    model = {"litellm_model": "openai/x", "protocol": "openai", "context_window": 1000, "max_output_tokens": 100,
             "prices": {"input": 1, "output": 1}}  # fmt: skip
    path.write_text(orjson.dumps({"version": 1, "name": "p", "routes": [{"match": "auto", "candidates": ["a", "b"]}],
                                  "models": [{**model, "id": "a", "api_key_env": "ROUTER_TEST_KEY_A"},
                                             {**model, "id": "b", "api_key_env": "ROUTER_TEST_KEY_B"}]}).decode())  # fmt: skip
    monkeypatch.delenv("ROUTER_TEST_KEY_A", raising=False)
    monkeypatch.setenv("ROUTER_TEST_KEY_B", "set")
    assert main(["check", "--config", str(path)]) == 0  # valid: the serving environment may have the key
    out, err = capsys.readouterr()
    assert "2 models, 1 route, 0 rules" in out  # said "1 routes"
    assert "ROUTER_TEST_KEY_A is not set: a cannot be called" in err and "ROUTER_TEST_KEY_B" not in err


def test_check_warns_of_a_protocol_its_provider_does_not_speak(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``protocol: anthropic`` on an ``openai/`` model was "ok": Anthropic clients were relayed to
    it as Anthropic Messages, which a server of OpenAI's protocol alone refuses."""
    path = tmp_path / "p.yaml"
    model = {"context_window": 1000, "max_output_tokens": 100, "prices": {"input": 1, "output": 1}}
    models = [{**model, "id": "mixed", "litellm_model": "openai/x", "protocol": "anthropic"},
              {**model, "id": "fine", "litellm_model": "anthropic/y", "protocol": "anthropic"},
              {**model, "id": "resp", "litellm_model": "openai/z", "protocol": "openai_responses"}]  # fmt: skip
    routes = [{"match": "auto", "candidates": ["mixed", "fine", "resp"]}]
    path.write_text(orjson.dumps({"version": 1, "name": "p", "routes": routes, "models": models}).decode())
    assert main(["check", "--config", str(path)]) == 0  # valid: a server may speak both
    err = capsys.readouterr().err
    assert err.splitlines() == [
        f"{path}: warning: models.mixed: protocol anthropic but litellm_model 'openai/x' is openai's (openai or "
        "openai_responses): anthropic clients are relayed as is and the others translated to openai's protocol, "
        "so the server must speak both"
    ]


def test_check_warns_of_a_litellm_name_near_one_it_knows(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A misspelt litellm_model given its prices and window checked "ok" without a word, and every call
    to it failed at the provider."""
    path = tmp_path / "p.yaml"
    model = {"id": "sonnet", "litellm_model": "anthropic/claude-sonet-4-5", "protocol": "anthropic",
             "context_window": 200000, "prices": {"input": 3, "output": 15}}  # fmt: skip
    path.write_text(
        orjson.dumps(
            {"version": 1, "models": [model], "routes": [{"match": "auto", "passthrough": "sonnet"}]}
        ).decode()
    )
    assert main(["check", "--config", str(path)]) == 0  # valid: the file gives all the map would
    assert capsys.readouterr().err.splitlines() == [
        f"{path}: warning: models.sonnet.litellm_model: litellm knows no 'anthropic/claude-sonet-4-5': did you mean "
        "'anthropic/claude-sonnet-4-5'? (a name the provider does not know fails every call)"
    ]


def test_check_warns_of_a_model_no_route_names(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A model added to ``models`` and to no route got no request and ``router check`` said "ok"."""
    path = tmp_path / "p.yaml"
    model = {"litellm_model": "openai/x", "protocol": "openai", "context_window": 1000, "max_output_tokens": 100,
             "prices": {"input": 1, "output": 1}}  # fmt: skip
    routes = [{"match": "auto", "candidates": ["a"], "fallbacks": ["b"]}, {"match": "c*", "passthrough": "c"}]
    ids = ["a", "b", "c", "forgotten"]
    path.write_text(orjson.dumps({"version": 1, "name": "p", "routes": routes,
                                  "models": [{**model, "id": i} for i in ids]}).decode())  # fmt: skip
    assert main(["check", "--config", str(path)]) == 0  # valid: only a warning
    out, err = capsys.readouterr()
    assert "4 models, 2 routes, 0 rules" in out
    assert err.splitlines() == [
        f"{path}: warning: models.forgotten: no route names it (in candidates, passthrough or fallbacks), "
        "so no request reaches it"
    ]


def _log(path: Path, tasks: dict[str, list[str]], policy: str | None = None) -> str:
    """A log with one request per (task, model), as the router writes them (decided by ``policy``,
    "NAME/SCORER")."""

    async def write() -> None:
        store = SQLiteStore(str(path))
        await store.open()
        now = time.time() - 60
        records = [
            RequestRecord(
                request_id=f"r{i}-{j}",
                ts=now + i + j / 100,
                task_id=task,
                attempt=1,
                status=200,
                chosen_model=model,
                cost_usd=0.001,
                input_tokens=10,
                output_tokens=5,
                total_ms=5.0,
                candidates=[Estimate("cheap", 0, 0, 0, 0.0), Estimate("strong", 0, 0, 0, 0.0)],
                propensity=0.5,
                task_features={"3": 1.0},
                policy=policy,
            )
            for i, (task, models) in enumerate(tasks.items())
            for j, model in enumerate(models)
        ]
        await store.write_requests(records)
        await store.close()

    asyncio.run(write())
    return f"sqlite:///{path}"


def test_outcome_and_recent_tasks(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = _log(tmp_path / "log.db", {LONG_TASK: ["cheap"], "short": ["strong"]})
    assert main(["tasks", "--recent", "--store", store]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == ["short", LONG_TASK]  # full ids, newest first
    assert main(["outcome", LONG_TASK, "--success", "--score", "0.9", "--store", store]) == 0
    assert capsys.readouterr().out == f"task {LONG_TASK} attempt 1: success recorded\n"
    assert main(["tasks", "--recent", "1", "--store", store]) == 0
    assert capsys.readouterr().out.split()[0] == "short"
    assert main(["tasks", "--task", LONG_TASK, "--json", "--store", store]) == 0
    assert '"source": "explicit"' in capsys.readouterr().out
    assert main(["outcome", "no-such-task", "--failure", "--store", store]) == 2
    err = capsys.readouterr().err
    assert err.startswith("router outcome: no request of task 'no-such-task'") and err.count("\n") == 1
    assert main(["outcome", "short", "--failure", "--score", "2", "--store", store]) == 2
    assert "--score: expected a number in [0, 1]" in capsys.readouterr().err


def test_tasks_takes_the_task_id_as_outcome_does(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # `router tasks ID` was "router: error: unrecognized arguments: ID" under the top-level usage.
    store = _log(tmp_path / "log.db", {LONG_TASK: ["cheap"], "short": ["strong"]})
    assert main(["tasks", "short", "--json", "--store", store]) == 0
    assert [t["task_id"] for t in orjson.loads(capsys.readouterr().out)["tasks"]] == ["short"]
    assert main(["tasks", "short", "--task", LONG_TASK, "--store", store]) == 2
    assert "two task ids" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "usage"),
    [(["tasks", "a", "b"], "usage: router tasks "), (["serve", "--bogus"], "usage: router serve ")],
)
def test_an_unknown_argument_shows_the_commands_usage(
    argv: list[str], usage: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # It showed "usage: router [-h] [--version] COMMAND ...": none of the command's own flags.
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(usage) and "error: unrecognized arguments: " in err, err


@pytest.mark.parametrize("attempt", ["0", "-3", "2"])
def test_outcome_refuses_an_attempt_the_task_never_had(
    attempt: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # 0 was taken for "the latest" and -3 or 2 (the task has one attempt) were written as given.
    store = _log(tmp_path / "log.db", {"short": ["cheap"]})
    assert main(["outcome", "short", "--failure", "--attempt", attempt, "--store", store]) == 2
    err = capsys.readouterr().err
    assert "--attempt" in err and "attempt 1" in err and err.count("\n") == 1, err
    assert main(["tasks", "--task", "short", "--json", "--store", store]) == 0
    assert '"source": "explicit"' not in capsys.readouterr().out  # nothing was recorded


@pytest.mark.parametrize("n", ["0", "-3"])
def test_recent_takes_a_positive_count(n: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # 0 printed the whole table instead, -3 all but the last three tasks.
    store = _log(tmp_path / "log.db", {"a": ["cheap"], "b": ["cheap"]})
    with pytest.raises(SystemExit) as exc:
        main(["tasks", "--recent", n, "--store", store])
    assert exc.value.code == 2
    assert "--recent: expected a positive" in capsys.readouterr().err


def _cheap_and_strong(tmp_path: Path, *extra: str) -> Path:
    """A policy of the models ``_log`` writes (cheap, strong), and ``extra`` ones."""
    model = "{{id: {0}, litellm_model: openai/{0}, protocol: openai, prices: {{input: 1, output: 2}}, " \
            "context_window: 100000, max_output_tokens: 1000}}"  # fmt: skip
    ids = ["cheap", "strong", *extra]
    path = tmp_path / "cs.yaml"
    path.write_text("version: 1\nname: cs\nmodels:\n" + "".join(f"  - {model.format(m)}\n" for m in ids)
                    + f"routes: [{{match: auto, candidates: [{', '.join(ids)}]}}]\n")  # fmt: skip
    return path


def test_train_refuses_too_few_labels_and_says_how_many(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = _log(tmp_path / "log.db", {f"t{i}": ["cheap" if i % 3 else "strong"] for i in range(6)})
    for i in range(6):
        assert main(["outcome", f"t{i}", "--success" if i % 2 else "--failure", "--store", store]) == 0
    capsys.readouterr()
    config = _cheap_and_strong(tmp_path, "unseen")
    out = tmp_path / "p.json"
    code = main(["train", "--store", store, "--config", str(config), "--out", str(out)])
    captured = capsys.readouterr()
    assert code == 2 and not out.exists()
    assert "labelled attempts per model: cheap 4, strong 2" in captured.out
    assert "with no labelled attempt in the log (an even chance until it has some): unseen" in " ".join(
        captured.out.split()
    )
    assert captured.err.startswith("router train: too few labelled attempts to train on (cheap 4, strong 2;")
    assert "--force" in captured.err and captured.err.count("\n") == 1


def test_train_is_not_held_back_by_a_model_the_policy_no_longer_has(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # One request once sent to a model since dropped from the file ("local-deep 1") kept routing
    # from being learned for models with hundreds of labelled attempts each, without --force.
    tasks = {f"t{i}": ["cheap" if i % 2 else "strong"] for i in range(24)}
    store = _log(tmp_path / "log.db", {**tasks, "tried-once": ["gone"]})
    for i, task in enumerate([*tasks, "tried-once"]):
        assert main(["outcome", task, "--success" if i % 3 else "--failure", "--store", store]) == 0
    capsys.readouterr()
    config = _cheap_and_strong(tmp_path)
    out = tmp_path / "p.json"
    assert main(["train", "--store", store, "--config", str(config), "--out", str(out)]) == 0
    said = " ".join(capsys.readouterr().out.split())
    assert "labelled attempts per model: cheap 12, strong 12, gone 1" in said
    assert f"warning: not models of {config} (learned, but this policy never routes to them): gone" in said
    assert "routing is not learned" not in said and orjson.loads(out.read_bytes())["models"], said


def test_train_without_config_reads_the_policy_serve_reads_from_any_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # serve and check read the default policy from any directory; train looked for
    # ./policies/default.yaml and, outside the repository, said it was not there.
    store = _log(tmp_path / "log.db", {f"t{i}": ["cheap"] for i in range(3)})
    for i in range(3):
        assert main(["outcome", f"t{i}", "--success", "--store", store]) == 0
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("ROUTER_CONFIG", raising=False)
    assert main(["train", "--store", store, "--out", str(tmp_path / "p.json")]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith("router train: the log's labelled attempts are all of models"), (
        captured.err
    )
    assert f"models of {DEFAULT_CONFIG}" in " ".join(captured.out.split())


def test_train_at_80_columns_cuts_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The off-policy table's intervals ended in "…" (50.0%-100.…) in an 80-column terminal.
    monkeypatch.setenv("COLUMNS", "80")
    store = _log(tmp_path / "log.db", {f"t{i}": ["cheap" if i % 3 else "strong"] for i in range(6)})
    for i in range(6):
        assert main(["outcome", f"t{i}", "--success" if i % 2 else "--failure", "--store", store]) == 0
    config = Path(__file__).resolve().parents[2] / "policies/examples/local.yaml"
    capsys.readouterr()
    assert (
        main(
            ["train", "--store", store, "--config", str(config), "--out", str(tmp_path / "p.json"), "--force"]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "off-policy estimate" in out
    assert not [line for line in out.splitlines() if line.startswith("│") and "…" in line], out
    # Only a command to paste runs past the edge: cut in two, it would paste as two.
    commands = ("  router ", "  cp ")
    assert max(len(line) for line in out.splitlines() if not line.startswith(commands)) <= 80


def test_train_refuses_a_log_of_none_of_the_policys_models(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # After `router demo --tasks 300`, `router train --out X` (the default policy's real models) wrote
    # an artifact knowing none of them, which `router promote` then refused.
    monkeypatch.delenv("ROUTER_CONFIG", raising=False)
    store = _log(tmp_path / "log.db", {f"t{i}": ["cheap" if i % 2 else "strong"] for i in range(6)})
    for i in range(6):
        assert main(["outcome", f"t{i}", "--success" if i % 3 else "--failure", "--store", store]) == 0
    capsys.readouterr()
    out = tmp_path / "p.json"
    assert main(["train", "--store", store, "--out", str(out), "--min-attempts", "2"]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"router train: the log's labelled attempts are all of models {DEFAULT_CONFIG} does not have "
        "(cheap, strong): train with --config the policy that served the log, or pass --force; nor has any "
        f"backend of {DEFAULT_CONFIG} the 20 calls with reported usage a call's size is learned from\n"
    )
    assert not out.exists()
    # Which file served the log, by the name it keeps: "the policy that served the log" alone left
    # it to guess after `router demo --tasks 300` (policies/examples/local.yaml, named local-demo).
    named = _log(tmp_path / "named.db", {f"t{i}": ["cheap"] for i in range(3)}, policy="local-demo/cheapest")
    for i in range(3):
        assert main(["outcome", f"t{i}", "--success", "--store", named]) == 0
    assert main(["train", "--store", named, "--out", str(out), "--min-attempts", "2"]) == 2
    assert (
        "train with --config the policy that served the log (the log's requests were decided by the policy "
        "named 'local-demo' in its file), or pass --force" in capsys.readouterr().err
    )


def _trained(tmp_path: Path) -> tuple[Path, Path]:
    """A copy of local.yaml and an artifact trained (forced) on a log of six labelled tasks of
    another catalog's models, `cheap` and `strong`."""
    store = _log(tmp_path / "log.db", {f"t{i}": ["cheap" if i % 3 else "strong"] for i in range(6)})
    for i in range(6):
        assert main(["outcome", f"t{i}", "--success" if i % 2 else "--failure", "--store", store]) == 0
    config = tmp_path / "policy.yaml"
    config.write_bytes((Path(__file__).resolve().parents[2] / "policies/examples/local.yaml").read_bytes())
    artifact = tmp_path / "v1.json"
    assert main(["train", "--store", store, "--config", str(config), "--out", str(artifact), "--force"]) == 0
    return config, artifact


def test_train_says_the_artifacts_hash_on_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    capsys.readouterr()
    _, artifact = _trained(tmp_path)
    out = capsys.readouterr().out
    sha = hashlib.sha256(artifact.read_bytes()).hexdigest()
    # It was "wrote PATH (sha256 HASH)", broken inside at 80 columns (test_train_at_80_columns_cuts_nothing).
    assert f"\n  sha256 {sha}\n" in out, out


def test_train_says_the_promote_command_whole_with_the_policy_it_trained_for(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # It said "--config <policy.yaml>", wrapped at 80 columns onto a line of its own.
    monkeypatch.setenv("COLUMNS", "80")
    capsys.readouterr()
    config, artifact = _trained(tmp_path)
    lines = capsys.readouterr().out.splitlines()
    assert f"  router promote {artifact} --config {config}" in lines, lines
    # A preview on a copy first: it said only to promote into the policy routers serve.
    candidate = Path(config).with_suffix(".candidate.yaml")
    at = lines.index(
        f"  router preview --config {candidate} --since 7d --store sqlite:///{tmp_path / 'log.db'}"
    )
    assert lines[at - 1] == f"  router promote {artifact} --config {candidate}"
    assert lines.index(f"  router promote {artifact} --config {config}") > at


def test_promote_says_only_the_routers_serving_the_file_reload(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # "running routers reload it within a second", also said of a candidate no router serves.
    config, artifact = _trained(tmp_path)
    capsys.readouterr()
    assert main(["promote", str(artifact), "--config", str(config), "--force"]) == 0
    assert capsys.readouterr().out.endswith("; routers serving it reload it within a second\n")
    assert main(["rollback", "--config", str(config)]) == 0
    assert capsys.readouterr().out.endswith("; routers serving it reload it within a second\n")


def test_rollback_undoes_a_promotion_with_no_router_serving(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Revisions were archived only by a serving router: promote, then rollback, said "no policy
    # revision has been applied yet" (README step 8).
    config, artifact = _trained(tmp_path)
    original = config.read_bytes()
    assert main(["promote", str(artifact), "--config", str(config), "--force"]) == 0  # another catalog's
    assert config.read_bytes() != original
    capsys.readouterr()
    assert main(["rollback", "--config", str(config)]) == 0, capsys.readouterr().err
    assert config.read_bytes() == original


def test_rollback_to_a_revision_the_guard_took_out_says_why_it_was(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # `router rollback --to` the revision the guard had rolled back put it back without a word of why.
    from router.policy.revisions import Archive
    from router.rollout.rollback import rollback

    config, artifact = _trained(tmp_path)
    assert main(["promote", str(artifact), "--config", str(config), "--force"]) == 0
    archive = Archive(config)
    reason = "guard: success 0.0% treated vs 83.3% control: more than 5.0% worse (mSPRT Λ=838 ≥ 40)"
    done = rollback(archive, None, reason, time.time())
    assert done is not None
    worse, _ = done
    capsys.readouterr()
    # A prefix of the id names it, as git's do (all twelve characters were needed).
    assert main(["rollback", "--config", str(config), "--to", worse[:5]]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1].startswith(f"note: {worse} had been rolled back at "), lines
    assert lines[-1].endswith(f" ({reason}); a guard judges it again from now, on new tasks only"), lines
    # A revision never rolled back is put back without a note.
    (tmp_path / "b").mkdir()
    config, artifact = _trained(tmp_path / "b")
    assert main(["promote", str(artifact), "--config", str(config), "--force"]) == 0
    assert main(["rollback", "--config", str(config)]) == 0
    assert "note:" not in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv",
    [
        ["train", "--config", "policies/examples/local.yaml", "--out", "{tmp}/p.json"],
        ["report"],
        ["tasks"],
        ["preview", "--config", "policies/examples/local.yaml"],
        ["outcome", "t1", "--success"],
    ],
)
def test_a_missing_store_is_one_line_and_no_new_file(
    argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "typo.db"
    args = [a.replace("{tmp}", str(tmp_path)) for a in argv] + ["--store", f"sqlite:///{missing}"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"router {argv[0]}: log store sqlite:///{missing}: no such file"), err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert not missing.exists()


@pytest.mark.parametrize(
    "argv",
    [
        ["train", "--config", "policies/examples/local.yaml", "--out", "{tmp}/p.json"],
        ["report"],
        ["tasks"],
        ["preview", "--config", "policies/examples/local.yaml"],
        ["outcome", "t1", "--success"],
        ["migrate"],
        ["keys", "list"],
        # A 20-line traceback from uvicorn's start-up, then "Application startup failed. Exiting."
        ["serve", "--config", "policies/examples/local.yaml", "--port", "0"],
    ],
)
def test_an_unreachable_store_is_one_line(
    argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"postgresql://router@127.0.0.1:{closed_port()}/router"
    args = [a.replace("{tmp}", str(tmp_path)) for a in argv] + ["--store", url]
    assert main(args) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"router {argv[0]}: cannot connect to PostgreSQL log store"), err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_an_invalid_setting_is_one_line_naming_where_it_was_set(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A pydantic ValidationError with its traceback before; then "(set by a flag or ROUTER_PORT)"
    # whichever had set it, and for settings no flag sets.
    assert main(["serve", "--config", "policies/examples/local.yaml", "--port", "99999"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("router serve: port: ") and "65535" in err and err.endswith("(set by --port)\n"), (
        err
    )
    assert err.count("\n") == 1 and "Traceback" not in err
    monkeypatch.setenv("ROUTER_PORT", "99999")
    assert main(["serve", "--config", "policies/examples/local.yaml"]) == 2
    assert capsys.readouterr().err.endswith("(set by ROUTER_PORT)\n")


def test_demo_with_an_invalid_setting_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # The demo built its Settings itself: ROUTER_DRAIN_TIMEOUT=-1 was a ValidationError's traceback.
    monkeypatch.setenv("ROUTER_DRAIN_TIMEOUT", "-1")
    ports = ["--port", str(closed_port()), "--upstream-port", str(closed_port())]
    assert main(["demo", "--store", f"sqlite:///{tmp_path / 'router.db'}", *ports]) == 2
    err = capsys.readouterr().err
    assert err.startswith("router demo: drain_timeout: ") and err.endswith(
        "(set by ROUTER_DRAIN_TIMEOUT)\n"
    ), err
    assert err.count("\n") == 1


@pytest.mark.parametrize("argv", [["keys", "list"], ["keys", "revoke", "key_x"]])
def test_keys_on_a_missing_store_leave_no_new_file(
    argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Listing a misspelled store answered "no keys" and left an empty database behind.
    missing = tmp_path / "typo.db"
    assert main([*argv, "--store", f"sqlite:///{missing}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"router keys: log store sqlite:///{missing}: no such file"), err
    assert not missing.exists()


def test_promote_refuses_an_artifact_of_other_models_unless_forced(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Promoting an artifact trained on other models' log (here `cheap`/`strong`, into local.yaml's
    # catalog) pinned it with a warning: every model the policy routes to then scored blind.
    config, artifact = _trained(tmp_path)
    original = config.read_bytes()
    capsys.readouterr()
    assert main(["promote", str(artifact), "--config", str(config)]) == 2
    out, err = capsys.readouterr()
    assert config.read_bytes() == original and not out
    assert (
        err.startswith(f"router promote: {artifact} does not match the models of {config}: ")
        and err.count("\n") == 1
    )
    assert "no attempt of local-nano, local-mini, local-large, local-claude" in err, err
    assert "models the policy does not have: cheap, strong" in err and "--force" in err, err
    # Forced: pinned, with the same facts said as warnings.
    assert main(["promote", str(artifact), "--config", str(config), "--force"]) == 0
    out, err = capsys.readouterr()
    assert "now pins" in out
    assert "no labelled attempt of catalog models" in err, err
    assert "local-nano, local-mini, local-large, local-claude" in err, err
    assert "cheap, strong" in err and "not in the catalog" in err, err


def test_promote_pins_the_artifact_by_a_path_relative_to_the_policy_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # An artifact outside the policy's folder (README step 8 on policies/examples/local.yaml with
    # policies/learned/v1.json) was pinned by its absolute path: a moved or cloned checkout broke.
    config, artifact = _trained(tmp_path)
    (tmp_path / "examples").mkdir()
    moved = tmp_path / "examples" / "policy.yaml"
    config.rename(moved)
    monkeypatch.chdir(tmp_path)
    assert main(["promote", artifact.name, "--config", "examples/policy.yaml", "--force"]) == 0
    assert "  artifact: ../v1.json\n" in moved.read_text()
    capsys.readouterr()
    assert main(["check", "--config", str(moved)]) == 0, capsys.readouterr().err


def test_promote_a_missing_artifact_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "p.yaml"
    config.write_text((Path(__file__).resolve().parents[2] / "policies/examples/local.yaml").read_text())
    assert main(["promote", str(tmp_path / "nope.json"), "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("router promote: ") and "nope.json" in err and err.count("\n") == 1
    # Promoting before training said "No such file or directory" and no more.
    assert err.endswith(f"no such file; `router train --config {config} --out {tmp_path / 'nope.json'}` writes "
                        "it from the log\n"), err  # fmt: skip


def test_promote_to_a_missing_policy_file_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A FileNotFoundError's traceback.
    store = _log(tmp_path / "log.db", {f"t{i}": ["cheap"] for i in range(3)})
    for i in range(3):
        assert main(["outcome", f"t{i}", "--success", "--store", store]) == 0
    artifact = tmp_path / "v1.json"
    local = str(Path(__file__).resolve().parents[2] / "policies/examples/local.yaml")
    assert main(["train", "--store", store, "--config", local, "--out", str(artifact), "--force"]) == 0
    capsys.readouterr()
    assert main(["promote", str(artifact), "--config", str(tmp_path / "typo.yaml")]) == 2
    err = capsys.readouterr().err
    assert (
        err
        == f"router promote: {tmp_path / 'typo.yaml'}: cannot read policy file: No such file or directory\n"
    )
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("typo")]


def test_rollback_of_a_missing_policy_file_says_so_and_creates_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # It said "no policy revision has been applied yet" and left an empty .revisions/typo behind.
    assert main(["rollback", "--config", str(tmp_path / "typo.yaml")]) == 2
    err = capsys.readouterr().err
    assert (
        err
        == f"router rollback: {tmp_path / 'typo.yaml'}: cannot read policy file: No such file or directory\n"
    )
    assert list(tmp_path.iterdir()) == []


def test_rollback_with_nothing_applied_creates_no_archive(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "p.yaml"
    config.write_text((Path(__file__).resolve().parents[2] / "policies/examples/local.yaml").read_text())
    assert main(["rollback", "--config", str(config)]) == 2
    assert "no policy revision has been applied yet" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == [config]


def test_train_forced_on_no_labelled_attempt_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # --force on a log with requests and no outcome: a ValueError's traceback from the fit.
    store = _log(tmp_path / "log.db", {"t1": ["cheap"]})
    local = str(Path(__file__).resolve().parents[2] / "policies/examples/local.yaml")
    out = tmp_path / "v1.json"
    assert main(["train", "--store", store, "--config", local, "--out", str(out), "--force"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("router train: no labelled attempts in the log") and err.count("\n") == 1, err
    assert not out.exists()


def test_a_reader_that_leaves_is_no_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # `router report --json | head -1` ended with "router report: [Errno 32] Broken pipe": a
    # BrokenPipeError is a ConnectionError, the store's failure to the handler that printed it.
    read_end, write_end = os.pipe()
    os.close(read_end)
    with os.fdopen(write_end, "w", buffering=1) as out:
        monkeypatch.setattr(sys, "stdout", out)
        assert main(["schema"]) == 141
    assert capsys.readouterr().err == ""


def test_serve_on_a_port_in_use_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    # uvicorn found out after start-up ("router ready" printed), logged three lines and exited 3.
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        argv = [
            "serve",
            "--config",
            "policies/examples/local.yaml",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ]
        assert main(argv) == 2
    err = capsys.readouterr().err
    assert (
        err
        == f"router serve: cannot listen on 127.0.0.1:{port}: address already in use (another router? --port or ROUTER_PORT)\n"
    )


def test_recent_tasks_say_one_request(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = _log(tmp_path / "log.db", {"one": ["cheap"], "two": ["cheap", "strong"]})
    assert main(["tasks", "--recent", "--store", store]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "  2 requests  $0.002  " in lines[0] and "  1 request  $0.001  " in lines[1], lines


def test_upstream_behaviour_with_an_unknown_key_is_one_line_naming_the_known_ones(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A typo in `router upstream --behaviour` is refused before the server starts, not ignored."""
    assert main(["upstream", "--port", str(closed_port()), "--behaviour", "tool_args=ls"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("router upstream: --behaviour: unknown behaviour key 'tool_args'"), err
    assert "tool_arg," in err and err.count("\n") == 1


def test_demo_on_a_log_with_virtual_keys_and_no_master_key_says_why_before_starting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # After `router keys create` in the checkout, `make demo` printed seven 401s and no reason.
    monkeypatch.delenv("ROUTER_MASTER_KEY", raising=False)
    store = f"sqlite:///{tmp_path / 'router.db'}"
    assert main(["keys", "create", "--name", "ci", "--store", store]) == 0
    capsys.readouterr()
    assert (
        main(["demo", "--store", store, "--port", str(closed_port()), "--upstream-port", str(closed_port())])
        == 2
    )
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1, out + err
    assert (
        "holds virtual keys" in err
        and "export ROUTER_MASTER_KEY" in err
        and "--store sqlite:///demo.db" in err
    )


def test_demo_says_it_does_not_log_to_router_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # `export ROUTER_STORE=...; router demo --tasks 300; router train` trained on another log than
    # the demo's, without a word (the new-user pass).
    monkeypatch.delenv("ROUTER_MASTER_KEY", raising=False)
    store = f"sqlite:///{tmp_path / 'router.db'}"
    monkeypatch.setenv("ROUTER_STORE", f"sqlite:///{tmp_path / 'other.db'}")
    assert main(["keys", "create", "--name", "ci", "--store", store]) == 0  # stops the demo at once
    capsys.readouterr()
    ports = ["--port", str(closed_port()), "--upstream-port", str(closed_port())]
    assert main(["demo", "--store", store, *ports]) == 2
    first = capsys.readouterr().err.splitlines()[0]
    assert first.startswith(f"note: router demo logs to {store} (its --store), not ROUTER_STORE"), first
    assert first.endswith(f"give router train, tasks and preview --store {store} to read what it logs")
    monkeypatch.setenv("ROUTER_STORE", store)  # the same log: nothing to say
    assert main(["demo", "--store", store, *ports]) == 2
    assert "note:" not in capsys.readouterr().err
