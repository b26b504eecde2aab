"""`router eval-sizes`: the router's estimates replayed against what a provider reported, held out."""

from __future__ import annotations

import gzip
from pathlib import Path
from typing import Any

import orjson
import pytest

from router.app.cli import main
from router.features.tokens import TokenCounter
from router.learning.evals import sizes
from router.learning.labels.replay import Trajectory, load

OUTPUT = 120  # every call's reported output
TASKS = 30
SHARE = 0.5  # the share of the warm prefix's whole 2,048-token blocks the provider reports cached


def trajectory(i: int, counter: TokenCounter, turns: int = 4, ratio: float = 1.2) -> Trajectory:
    """A conversation whose provider counts ``ratio`` tokens per o200k token and caches ``SHARE`` of
    the previous prompt's whole blocks."""
    msgs: list[dict[str, Any]] = [
        {"role": "system", "content": "You run one bash command a turn. " * 300},
        {"role": "user", "content": f"Fix issue {i}: the parser drops the last line. " * (5 + i)},
    ]
    warm = 0
    for turn in range(turns):
        prompt = round(ratio * (3 + sum(counter.count_item({"role": m["role"], "content": m["content"]})
                                        for m in msgs)))  # fmt: skip
        cached = round(SHARE * (warm // 2048 * 2048))
        warm = prompt
        usage = {"prompt_tokens": prompt, "completion_tokens": OUTPUT, "cached_tokens": cached,
                 "cost": (prompt - cached) * 2e-6 + cached * 0.2e-6 + OUTPUT * 12e-6}  # fmt: skip
        msgs.append(
            {"role": "assistant", "content": f"THOUGHT: look.\n```bash\ncat f{turn}.py\n```", "usage": usage}
        )
        code = "".join(f"def f{j}(x):\n    return x + {j * turn}\n" for j in range(20 * turn + i))
        msgs.append({"role": "user", "content": f"<returncode>0</returncode>\n<output>\n{code}</output>"})
    return Trajectory(f"task-{i}", True, msgs)


@pytest.fixture(scope="module")
def runs() -> list[Trajectory]:
    counter = TokenCounter()
    return [trajectory(i, counter) for i in range(TASKS)]


def test_the_report_has_the_issues_keys_and_the_baselines(runs: list[Trajectory]) -> None:
    report, rows = sizes.cross_validate(runs, folds=3)
    assert report["requests"] == len(rows) == TASKS * 4
    for part in ("anchored", "unanchored"):
        assert report["prompt"][part]["median_ape"] is not None
    for key in ("output", "cost"):
        assert set(report[key]) >= {"sum_ratio", "median_ape"}
    assert (
        set(report["fit"]["false_fits"])
        == set(report["fit"]["false_excludes"])
        == {"16384", "32768", "65536", "131072"}
    )
    assert set(report["baselines"]) == {"chars4", "o200k", "prev_chars4"}
    # o200k of the whole prompt misses the provider's 1.2 by the ratio, on every request.
    assert report["baselines"]["o200k"]["prompt"]["anchored"]["median_error"] == pytest.approx(
        1 / 1.2 - 1, abs=0.01
    )


def test_output_and_cache_are_learned_on_the_other_folds(runs: list[Trajectory]) -> None:
    report, rows = sizes.cross_validate(runs, folds=3)
    # Each call after the first is told what the provider cached of the one before it.
    assert all(r.cache_cell is not None for r in rows if r.cacheable) and any(r.cacheable for r in rows)
    # Learned: the held-out calls' output is the train folds' mean, the cache their share.
    assert report["output"]["median_ape"] == 0.0 and report["output"]["sum_ratio"] == 1.0
    assert report["cache"]["share_est"] == pytest.approx(report["cache"]["share"], rel=0.05)
    assert all(f["output_mean"] == OUTPUT and f["cache_share"] == pytest.approx(SHARE, abs=0.01)
               for f in report["setup"]["fitted"])  # fmt: skip
    # Before any log: the policy's flat default and the whole warm prefix cached.
    assert report["priors"]["output"]["sum_ratio"] == pytest.approx(1024 / OUTPUT, rel=0.01)
    assert report["priors"]["cache"]["sum_ratio"] > 1.1
    assert report["cache"]["share_est"] == pytest.approx(report["cache"]["share"], rel=0.05)
    assert abs(report["cost"]["sum_ratio"] - 1) < abs(report["priors"]["cost"]["sum_ratio"] - 1)
    # Every call's output is the same here: each turn cell's mean is the overall one, and the
    # candidate priced by the overall mean is the router's own estimate.
    assert set(report["cost_candidates"]) == set(sizes.CANDIDATES)
    assert all(0.5 < c["sum_ratio"] < 1.5 for c in report["cost_candidates"].values())
    plain = report["cost_candidates"]["mean_output"]
    assert plain["sum_ratio"] == pytest.approx(report["cost"]["sum_ratio"], rel=1e-3)
    assert plain["median_ape"] == pytest.approx(report["cost"]["median_ape"], abs=1e-3)


def test_the_provider_tokens_ratio_corrects_the_estimate_without_an_anchor(runs: list[Trajectory]) -> None:
    report, _ = sizes.cross_validate(runs, folds=3)
    assert all(f["tokens_ratio"] > 1 for f in report["setup"]["fitted"])
    # Without it the estimate would be about 10 % low (chars / 3.6 against 1.2x o200k here).
    assert report["prompt"]["unanchored"]["median_ape"] < 0.05


def test_the_command_on_a_file(
    tmp_path: Path, runs: list[Trajectory], capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "runs.jsonl.gz"
    with gzip.open(path, "wb") as f:
        for t in runs:
            f.write(
                orjson.dumps({"instance_id": t.instance_id, "resolved": t.resolved, "messages": t.messages})
                + b"\n"
            )
    assert len(load(path)) == len(runs)
    per = tmp_path / "rows.jsonl"
    assert (
        main(["eval-sizes", "--trajectories", str(path), "--folds", "3", "--json", "--per-request", str(per)])
        == 0
    )
    report = orjson.loads(capsys.readouterr().out)
    assert report["requests"] == TASKS * 4 == len(per.read_text().splitlines())
    assert main(["eval-sizes", "--trajectories", str(path), "--folds", "3"]) == 0
    table = capsys.readouterr().out
    assert "| router (learned, held out) |" in table and "| o200k |" in table
    assert main(["eval-sizes", "--trajectories", str(tmp_path / "none.jsonl"), "--json"]) != 0


def test_the_command_on_a_directory(
    tmp_path: Path, runs: list[Trajectory], capsys: pytest.CaptureFixture[str]
) -> None:
    # `router eval` takes the trajectories' directory: the replays took only a file ("no such trajectories file").
    for name, part in (("a.jsonl.gz", runs[:20]), ("b.jsonl", runs[20:])):
        with (gzip.open if name.endswith(".gz") else open)(tmp_path / name, "wb") as f:
            for t in part:
                f.write(
                    orjson.dumps(
                        {"instance_id": t.instance_id, "resolved": t.resolved, "messages": t.messages}
                    )
                    + b"\n"
                )
    (tmp_path / "README.md").write_text("not a trajectory")
    assert main(["eval-sizes", "--trajectories", str(tmp_path), "--folds", "3", "--json"]) == 0
    assert orjson.loads(capsys.readouterr().out)["requests"] == TASKS * 4  # both files, in order
    assert (
        main(["eval-sizes", "--trajectories", str(tmp_path), "--folds", "3", "--json", "--limit", "25"]) == 0
    )
    assert orjson.loads(capsys.readouterr().out)["tasks"] == 25
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["eval-sizes", "--trajectories", str(empty), "--json"]) != 0
    assert "no *.jsonl or *.jsonl.gz trajectories file" in capsys.readouterr().err
