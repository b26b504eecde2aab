"""The learned artifact as one typed value (router.policy.artifact): what is written reads back
equal, an artifact written before the type existed still loads, and a bad field is refused in one
line naming the file and the field."""

from __future__ import annotations

import dataclasses
import hashlib
import math
from pathlib import Path
from typing import Any

import orjson
import pytest

from router.errors import ConfigError
from router.features.task import vector as taskfeatures
from router.features.task.attempt import AttemptControl
from router.learning.training.fit import fit
from router.policy.artifact import FORMAT, Artifact, ModelParams, OutputTokens, ScopeEffects
from router.policy.estimates import BackendEstimates, Estimates
from router.policy.prior import FixedPlan, Point

WIDTH = len(taskfeatures.NUMERIC) + taskfeatures.HASH_DIM
#: Written by 9ff3fcd's training code (``fit`` and the blocks ``router train`` adds), before the
#: artifact had a type; its weights zeroed and its operating points thinned to keep it small.
OLD = Path(__file__).parent / "samples" / "learned-9ff3fcd.json"


def full() -> Artifact:
    """Every field set, none at its default."""
    params = ModelParams(
        tuple(0.25 * (i % 3) for i in range(WIDTH)), (1.5, -0.25), (-3.0, 0.1), 12.5, 40, 0.6, 0.012
    )
    return Artifact(
        models={"cheap": params, "strong": dataclasses.replace(params, n=7, success_rate=None, mean_cost=None)},
        task_sd=0.75,
        frontiers={1: (FixedPlan(("cheap",), 0.6, 0.01),), 2: (FixedPlan(("cheap", "strong"), 0.9, 0.03), FixedPlan((), 0.0, 0.0))},
        points={2: (Point(0.5, None, math.inf, 0.9, 0.03), Point(0.2, 0.8, 0.1, 0.8, 0.02, 0.125, 0.001))},
        noise=(0.05, 0.1),
        scopes={"acme": ScopeEffects({"repo": "acme/*"}, -0.3, {"cheap": -0.5})},
        controls={"strong": AttemptControl(max_calls=12), "cheap": AttemptControl(stop_below=0.3, min_calls=5)},
        estimates=Estimates({"cheap": BackendEstimates(1.1, 300.0, 900.0, 0.8, 40), "strong": BackendEstimates(1.2)}),
        output_tokens={"cheap": OutputTokens((4.1, 0.2), (5.3, 0.25), 40)},
        report={"trained_at": 1.5e9, "metrics": {"brier": 0.1}, "offpolicy": {"logged": {"success": None}}},
    )  # fmt: skip


def test_what_is_written_reads_back_equal() -> None:
    art = full()
    raw = art.to_json()
    back = Artifact.from_json(raw, source="a.json", expected_sha256=hashlib.sha256(raw).hexdigest())
    assert back == art
    assert back.to_json() == raw and back.sha256 == art.sha256 == hashlib.sha256(raw).hexdigest()
    assert Artifact.from_json(raw.decode(), source="a.json") == art  # text as well as bytes
    # Nothing is left at a default, so equality checked every field.
    assert all(getattr(art, f.name) != f.default for f in dataclasses.fields(Artifact) if f.compare)
    assert back.value_curves == {2: ((0.5, 0.9, 0.03),)}


def test_what_training_builds_is_what_the_router_reads() -> None:
    """``router train`` goes on with the value it built (the off-policy estimate, the prior plan it
    prints): reading the written bytes must give the same, so nothing is left unrounded."""
    from tests.unit.test_plan import rows_for

    fitted = fit(rows_for(20), max_attempts=2, target=0.8, noise=(0.05, 0.1))
    assert fitted.frontiers and fitted.points and fitted.noise == (0.05, 0.1)
    assert Artifact.from_json(fitted.to_json(), source="new.json") == fitted


def test_the_policy_pin_is_checked_against_the_bytes() -> None:
    raw = full().to_json()
    with pytest.raises(ConfigError, match=r"^a\.json: sha256 mismatch: the policy pins 000000000000…"):
        Artifact.from_json(raw, source="a.json", expected_sha256="0" * 64)
    upper = hashlib.sha256(raw).hexdigest().upper()
    assert Artifact.from_json(raw, source="a.json", expected_sha256=upper).sha256 == upper.lower()


def test_an_artifact_written_before_the_type_loads_as_it_was_written() -> None:
    raw = OLD.read_bytes()
    obj = orjson.loads(raw)
    art = Artifact.load(OLD, hashlib.sha256(raw).hexdigest())
    assert art.sha256 == hashlib.sha256(raw).hexdigest()
    assert {m: (p.platt, p.n, p.success_rate) for m, p in art.models.items()} == {
        m: (tuple(p["platt"]), p["n"], p["success_rate"]) for m, p in obj["models"].items()
    }
    assert art.task_sd == obj["task_effect_sd"] and art.noise == tuple(obj["verifier_noise"])
    assert {
        str(k): [[list(p.models), p.success, p.cost] for p in v] for k, v in art.frontiers.items()
    } == obj["prior_plans"]
    # The curve is no longer read: the points it was written from give it back.
    assert {str(k): [list(p) for p in c] for k, c in art.value_curves.items()} == obj["value_curve"]
    assert art.scopes["acme"].of("cheap") == pytest.approx(-0.8)
    assert art.controls == {"strong": AttemptControl(max_calls=12)}
    assert art.estimates.of("cheap") == BackendEstimates(1.1, 310.5, 900.0, 0.8, 40)
    assert art.expected_output("cheap", 100) == round(math.expm1(4.1 + 0.2 * math.log1p(100)))
    assert set(art.report) == {"trained_at", "data", "metrics", "shared_score", "scope_report", "dominant_keys",
                               "offpolicy"}  # fmt: skip
    # Written again, every block of the old file is there with what it said.
    again = orjson.loads(art.to_json())
    assert {k: v for k, v in again.items() if k != "attempt_control"} == {
        k: v for k, v in obj.items() if k != "attempt_control"
    }


def good() -> dict[str, Any]:
    return orjson.loads(full().to_json())  # type: ignore[no-any-return]


def changed(path: str, value: Any) -> bytes:
    """``good()`` with the value at ``path`` (dots, and [i] for list items) replaced (``...``: removed)."""
    obj = good()
    *parents, last = path.replace("[", ".[").split(".")
    node: Any = obj
    for part in parents:
        node = node[int(part[1:-1])] if part.startswith("[") else node[part]
    key: Any = int(last[1:-1]) if last.startswith("[") else last
    if value is ...:
        del node[key]
    else:
        node[key] = value
    return orjson.dumps(obj)


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        # Each of these was a KeyError, TypeError or AttributeError out of the loader (a traceback
        # at `router serve` or `router promote`), or, for the output sizes, at the first request scored.
        ("models.cheap.platt", ..., r"models\.cheap\.platt: missing$"),
        ("models.cheap.platt", [1.0], r"models\.cheap\.platt: expected a list of 2, got a list of 1$"),
        ("models.cheap.weights", "zeros", r"models\.cheap\.weights: expected a list, got 'zeros'$"),
        ("models.cheap.cost_weights", [1.0, "x"], r"models\.cheap\.cost_weights\[1\]: expected a number, got 'x'$"),
        ("models", [], r"models: expected an object, got a list of 0$"),
        ("models.strong", 3, r"models\.strong: expected an object, got 3$"),
        ("models.strong.n", 2.5, r"models\.strong\.n: expected a whole number ≥ 0, got 2\.5$"),
        ("output_tokens.cheap.q50", [1.0], r"output_tokens\.cheap\.q50: expected a list of 2, got a list of 1$"),
        ("output_tokens.cheap.q90", ..., r"output_tokens\.cheap\.q90: missing$"),
        ("prior_plans.2[0][1]", 1.5, r"prior_plans\.2\[0\]\[1\]: expected a number in \[0, 1\], got 1\.5$"),
        ("prior_plans.2[0][0]", "cheap", r"prior_plans\.2\[0\]\[0\]: expected a list, got 'cheap'$"),
        ("prior_plans.x", [], r"prior_plans\.x: expected a retry limit \(a whole number ≥ 1\) as the key$"),
        ("operating_points.2[0].value", 0, r"operating_points\.2\[0\]\.value: expected a number in \(0, inf\), got 0$"),
        ("operating_points.2[1].margin", -1, r"operating_points\.2\[1\]\.margin: expected a number in \[0, inf\]"),
        ("attempt_control.strong.max_calls", 0, r"attempt_control\.strong\.max_calls: expected a whole number ≥ 1, got 0$"),
        ("attempt_control.cheap.stop_below", 1.5, r"attempt_control\.cheap\.stop_below: expected a number in \(0, 1\)"),
        ("attempt_control.cheap", 3, r"attempt_control\.cheap: expected an object, got 3$"),
        ("estimates.cheap.cache_share", 1.5, r"estimates\.cheap\.cache_share: expected a number in \[0, 1\], got 1\.5$"),
        ("estimates.cheap.tokens_ratio", True, r"estimates\.cheap\.tokens_ratio: expected a number in \[0\.2, 5\], got True$"),
        ("scopes.acme.models", {"cheap": "-0.5"}, r"scopes\.acme\.models\.cheap: expected a number, got '-0\.5'$"),
        ("verifier_noise", [0.1], r"verifier_noise: expected a list of 2, got a list of 1$"),
        ("task_effect_sd", 11, r"task_effect_sd: expected a number in \[0, 10\], got 11$"),
    ],
)  # fmt: skip
def test_a_bad_field_is_refused_naming_the_file_and_the_field(path: str, value: Any, message: str) -> None:
    with pytest.raises(ConfigError, match=r"^learned/a\.json: " + message) as err:
        Artifact.from_json(changed(path, value), source="learned/a.json")
    assert "\n" not in str(err.value)


def test_optional_blocks_may_be_absent_or_null() -> None:
    obj = {"format": FORMAT, "feature_schema": taskfeatures.schema(), "models": None, "scopes": None}
    art = Artifact.from_json(orjson.dumps(obj), source="a.json")
    assert art == Artifact(models={})
