"""`router train` on a log with reported usage but no (or too few) labelled attempts: it learns
each backend's sizes of a call anyway, `router promote` pins them, and the router prices and
holds by them while routing as with no artifact (issue 33: no flat 1,024 once the log has data)."""

from __future__ import annotations

import asyncio
import hashlib
import time
from pathlib import Path

import orjson
import pytest

from router.app.cli import main
from router.features.request import Features
from router.policy.active import load_active_policy
from router.policy.artifact import Artifact
from router.store.records import Estimate, RequestRecord
from router.store.sqlite import SQLiteStore

LOCAL = Path(__file__).resolve().parents[2] / "policies/examples/local.yaml"
#: Replies per backend: local-nano writes long ones, local-mini short ones (25 calls each).
OUTPUTS = {"local-nano": [3_000] * 20 + [4_000] * 5, "local-mini": [40] * 20 + [90] * 5}


def _log(path: Path) -> str:
    """A log the router wrote while nobody reported outcomes: each call decided at the priors
    (local-nano, the cheapest at the flat 1,024 output), some explored to local-mini."""

    async def write() -> None:
        store = SQLiteStore(str(path))
        await store.open()
        now = time.time() - 600
        candidates = [Estimate(m, 1_000, 1_024, 0, 0.0) for m in ("local-nano", "local-mini")]
        await store.write_requests([
            RequestRecord(
                f"r-{model}-{i}", now + i + (100 if model == "local-mini" else 0), task_id=f"t-{model}-{i}",
                attempt=1, status=200, chosen_model=model, decision_id=f"d-{model}-{i}", requested_model="auto",
                protocol="openai_chat", input_tokens=1_000, prompt_tokens_est=1_000, output_tokens=out,
                cost_usd=0.001, candidates=candidates, propensity=0.5,
            )
            for model, outs in OUTPUTS.items()
            for i, out in enumerate(outs)
        ])  # fmt: skip
        await store.close()

    asyncio.run(write())
    return f"sqlite:///{path}"


def _trained(tmp_path: Path) -> tuple[str, Path, Path]:
    """The log, a copy of local.yaml and the artifact `router train` wrote from them."""
    store = _log(tmp_path / "log.db")
    config = tmp_path / "policy.yaml"
    config.write_bytes(LOCAL.read_bytes())
    out = tmp_path / "sizes.json"
    assert main(["train", "--store", store, "--config", str(config), "--out", str(out)]) == 0
    return store, config, out


def _feats() -> Features:
    return Features(protocol="openai_chat", requested_model="auto", prompt_tokens=1_000, max_output_tokens=None,
                    tools=False, n_tools=0, thinking=False, vision=False, stream=False, n_messages=2)  # fmt: skip


def test_train_without_labels_learns_the_sizes_the_router_then_prices_and_holds_by(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # It refused: "no labelled attempts in the log to train on", and every call stayed priced at
    # the flat 1,024 output for as long as nobody reported an outcome.
    store, config, out = _trained(tmp_path)
    captured = capsys.readouterr()
    said = [line for line in captured.out.splitlines() if line.startswith(("routing", "the artifact"))]
    assert said[0].startswith(
        "routing is not learned (no labelled attempts in the log to train on): label"
    ), captured.out
    assert len(said) == 2 and not captured.err, captured
    artifact = Artifact.load(out)
    assert not artifact.models
    nano, mini = artifact.estimates.of("local-nano"), artifact.estimates.of("local-mini")
    assert (nano.output_mean, nano.output_p90, mini.output_mean, mini.output_p90) == (3_200, 4_000, 50, 90)

    assert main(["promote", str(out), "--config", str(config)]) == 0
    rt = load_active_policy(config)
    sha = hashlib.sha256(out.read_bytes()).hexdigest()
    assert rt.decider.scorer.name == f"cheapest:{sha[:12]}"
    d = rt.decider.decide(_feats())
    by = {c.model: c for c in d.candidates}
    assert by["local-nano"].output_tokens == 3_200 and by["local-mini"].output_tokens == 50
    assert by["local-nano"].hold_usd == pytest.approx((1_000 * 0.05 + 4_000 * 0.40) / 1e6)
    assert by["local-large"].output_tokens == 1_024  # nothing learned of it: the policy's default
    # Routing is the policy's own, the cheapest, now at the learned sizes: local-mini.
    assert d.order[0] == "local-mini" and d.reason.startswith("cheapest expected cost"), d

    # The preview decides the log again at those sizes: the calls local-nano took move.
    capsys.readouterr()
    assert main(["preview", "--store", store, "--config", str(config), "--since", "1d", "--json"]) == 0
    report = orjson.loads(capsys.readouterr().out)
    assert report["policy"]["scorer"] == f"cheapest:{sha[:12]}"
    assert report["moves"] == {"local-nano -> local-mini": 25}, report


def test_too_little_usage_for_sizes_is_still_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = _log(tmp_path / "log.db")
    out = tmp_path / "sizes.json"
    since = "1s"  # no request in the window: nothing to learn from at all
    assert main(["train", "--store", store, "--config", str(LOCAL), "--out", str(out), "--since", since]) == 2
    err = capsys.readouterr().err
    assert err.startswith("router train: no labelled attempts in the log") and err.count("\n") == 1, err
    assert f"nor has any backend of {LOCAL} the 20 calls with reported usage" in err and not out.exists()


def test_promote_keeps_a_learned_routing_from_being_replaced_by_sizes_only_unless_forced(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from router.features.task.vector import HASH_DIM, NUMERIC, schema
    from router.policy.artifact import FORMAT

    _, config, sizes = _trained(tmp_path)
    routed = tmp_path / "routed.json"
    width = len(NUMERIC) + HASH_DIM
    model = {"weights": [0.0] * width, "platt": [1.0, 0.0], "cost_weights": [0.0]}
    routed.write_bytes(orjson.dumps({"format": FORMAT, "feature_schema": schema(), "models": dict.fromkeys(
        ("local-nano", "local-mini", "local-large", "local-claude"), model)}))  # fmt: skip
    assert main(["promote", str(routed), "--config", str(config)]) == 0
    capsys.readouterr()
    assert main(["promote", str(sizes), "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert "has no learned routing" in err and "--force" in err and err.count("\n") == 1, err
    assert load_active_policy(config).decider.scorer.name.startswith("learned:")
    assert main(["promote", str(sizes), "--config", str(config), "--force"]) == 0
    assert load_active_policy(config).decider.scorer.name.startswith("cheapest:")


def test_promote_refuses_sizes_of_no_model_the_policy_has_unless_forced(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Sizes learned on the demo's log (local-nano, local-mini) were pinned in team-tiers.yaml
    # (haiku, sonnet, mini) without a word: nothing of them applies there, and the README says
    # promote refuses an artifact trained for other models than the policy's.
    _, _, sizes = _trained(tmp_path)
    other = tmp_path / "tiers.yaml"
    other.write_bytes((LOCAL.parent / "team-tiers.yaml").read_bytes())
    capsys.readouterr()
    assert main(["promote", str(sizes), "--config", str(other)]) == 2
    err = capsys.readouterr().err
    assert f"{sizes} does not match the models of {other}: " in err and "--force" in err, err
    assert "models the policy does not have: local-nano, local-mini" in err and err.count("\n") == 1, err
    assert "learned" not in other.read_text()
    assert main(["promote", str(sizes), "--config", str(other), "--force"]) == 0
