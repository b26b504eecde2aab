"""What `router train` says around the fitting: a wrong path before the log is read, and what to run
next, for the log it read, as its last lines."""

from __future__ import annotations

from pathlib import Path

import pytest

from router.app.cli import main
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
