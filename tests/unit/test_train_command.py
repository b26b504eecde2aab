"""What `router train` says around the fitting: a wrong path before the log is read, and what to run
next, for the log it read, as its last lines."""

from __future__ import annotations

import hashlib
import io
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from router.app.cli import main
from router.app.commands.train import train
from tests.unit.test_cli import _log as _tasks_log
from tests.unit.test_cli import _trained
from tests.unit.test_sizes_only import LOCAL, _log


def _policy(tmp_path: Path) -> Path:
    config = tmp_path / "policy.yaml"
    config.write_bytes(LOCAL.read_bytes())
    return config


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (
            ["--out", "{tmp}/learned"],
            "--out {tmp}/learned is a directory: name the artifact's file, e.g. --out {tmp}/learned/v1.json",
        ),
        (
            ["--out", "{tmp}/p.json", "--trajectories", "{tmp}/nope"],
            "--trajectories {tmp}/nope: no such trajectory file or directory",
        ),
    ],
)
def test_a_wrong_path_is_said_before_the_log_is_read(
    flags: list[str], said: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # `--out policies/learned/` failed with "policies/learned: Is a directory" once training had
    # read the log and fitted (45 s on `router demo --tasks 300` twice); a missing --trajectories
    # was found only when the stop-loss was fitted, and never on a log of too few labels.
    (tmp_path / "learned").mkdir()
    store = _log(tmp_path / "log.db")
    argv = [
        "train",
        "--store",
        store,
        "--config",
        str(_policy(tmp_path)),
        *(f.format(tmp=tmp_path) for f in flags),
    ]
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == ""  # nothing read, nothing fitted
    assert err == f"router train: {said.format(tmp=tmp_path)}\n"


def test_the_next_commands_are_the_last_lines_and_read_the_log_trained_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The preview line said no --store: after `router train --store X` it previewed the default
    # log, router.db, not the one the artifact was trained on.
    monkeypatch.delenv("ROUTER_STORE", raising=False)
    store = _log(tmp_path / "log.db")
    config, out = _policy(tmp_path), tmp_path / "sizes.json"
    assert main(["train", "--store", store, "--config", str(config), "--out", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    candidate = config.with_suffix(".candidate.yaml")
    assert lines[-4:] == [
        f"  cp {config} {candidate}",
        f"  router promote {out} --config {candidate}",
        f"  router preview --config {candidate} --since 7d --store {store}",
        f"  router promote {out} --config {config}",
    ]
    # The log a bare `router preview` reads needs no --store.
    monkeypatch.setenv("ROUTER_STORE", store)
    assert main(["train", "--config", str(config), "--out", str(out)]) == 0
    assert f"  router preview --config {candidate} --since 7d" in capsys.readouterr().out.splitlines()


def test_a_learned_policys_next_commands_come_after_the_label_models_lines(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # They came before the prior plan's, call caps', stop-loss's and label model's lines: a dozen
    # lines up, off an 80x24 terminal's top when training ended.
    capsys.readouterr()
    config, artifact = _trained(tmp_path)
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1] == f"  router promote {artifact} --config {config}", lines
    # Where the artifact went is said once it is written, before the label model is fitted (an
    # interrupted fit leaves it whole).
    labels = next(i for i, line in enumerate(lines) if line.startswith("label model:"))
    assert lines.index(f"wrote {artifact}") < labels


class _CtrlC(Console):
    """A terminal whose user presses Ctrl-C as the line starting with ``at`` is printed."""

    def __init__(self, at: str) -> None:
        super().__init__(file=io.StringIO())
        self.at = at

    def print(self, *objects: Any, **kwargs: Any) -> None:
        if objects and str(objects[0]).startswith(self.at):
            raise KeyboardInterrupt
        super().print(*objects, **kwargs)


def _labelled_log(tmp_path: Path) -> str:
    """Six labelled tasks, as `_trained` trains on (forced: too few to train on otherwise)."""
    store = _tasks_log(
        tmp_path / "labelled.db", {f"t{i}": ["local-nano" if i % 3 else "local-large"] for i in range(6)}
    )
    for i in range(6):
        assert main(["outcome", f"t{i}", "--success" if i % 2 else "--failure", "--store", store]) == 0
    return store


def test_ctrl_c_before_the_artifact_is_written_says_so_and_leaves_the_old_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A Ctrl-C said nothing at all (exit 130): whether --out held a new artifact, the old one or
    # half of one was left to guess.
    store, config, out = _labelled_log(tmp_path), _policy(tmp_path), tmp_path / "v1.json"
    out.write_text("the artifact from before")
    capsys.readouterr()
    with pytest.raises(KeyboardInterrupt):
        train(store, str(config), str(out), console=_CtrlC("labelled attempts per model"), force=True)
    assert capsys.readouterr().err == (
        f"router train: interrupted while reading the log: {out} was not written (the file there is the one "
        "from before); run the same command again to train\n"
    )
    assert out.read_text() == "the artifact from before"


def test_ctrl_c_after_the_artifact_is_written_says_it_is_whole_and_what_to_run_next(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("ROUTER_STORE", raising=False)
    store, config, out = _labelled_log(tmp_path), _policy(tmp_path), tmp_path / "v1.json"
    console = _CtrlC("prior plan")
    with pytest.raises(KeyboardInterrupt):
        train(store, str(config), str(out), console=console, force=True)
    sha = hashlib.sha256(out.read_bytes()).hexdigest()
    assert capsys.readouterr().err == (
        f"router train: interrupted while fitting the label model: {out} is whole (sha256 {sha}), preview and "
        f"promote it as below; the label model ({tmp_path / 'v1.labels.json'}) was not refitted\n"
    )
    assert isinstance(console.file, io.StringIO)
    said = console.file.getvalue().splitlines()
    assert said[-1] == f"  router promote {out} --config {config}"
    assert (
        f"  router preview --config {config.with_suffix('.candidate.yaml')} --since 7d --store {store}"
        in said
    )


def test_trained_for_a_candidate_it_says_to_preview_that_file_and_put_it_in_place(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Training with --config the candidate (its objective edited after a preview's warning) said
    # "cp policy.candidate.yaml policy.candidate.candidate.yaml" and ended promoting into the copy;
    # then promoting into the live file, whose objective is not the one previewed (the demo's
    # artifact ran at -0.071 per attempt there, previewed at +0.269 in the candidate).
    monkeypatch.delenv("ROUTER_STORE", raising=False)
    store = _log(tmp_path / "log.db")
    candidate, out = tmp_path / "policy.candidate.yaml", tmp_path / "sizes.json"
    candidate.write_bytes(LOCAL.read_bytes())
    assert main(["train", "--store", store, "--config", str(candidate), "--out", str(out)]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == (
        f"  cp {candidate} THE_POLICY_YOUR_ROUTERS_SERVE.yaml   # what the preview showed: its objective and this "
        "artifact"
    )
    (tmp_path / "policy.yaml").write_bytes(LOCAL.read_bytes())
    assert main(["train", "--store", store, "--config", str(candidate), "--out", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-4:] == [
        "preview it on a copy of the policy, then put the previewed file in place:",
        f"  router promote {out} --config {candidate}",
        f"  router preview --config {candidate} --since 7d --store {store}",
        f"  cp {candidate} {tmp_path / 'policy.yaml'}   # what the preview showed: its objective and this artifact",
    ]
