"""The learned artifact: what ``router train`` builds and writes, and what the router loads, as one
typed value (the scorer that uses it: ``router.policy.learned``).

On disk it is JSON (format ``router-learned/3``): per model, logistic weights over the task features
(``router.features.task.vector``) with a Platt calibration for P(success), and a log-linear model of
an attempt's cost; the spread of the unseen task difficulty; per retry limit, the fixed orders no
other beats on the training log (``prior_plans``) and the operating points measured on it; the
learned scopes' effects, attempt controls, call estimates and output sizes; and what training
measured, for people (``trained_at``, ``data``, ``metrics``, ...: ``Artifact.report``). The policy
file pins the bytes by sha256; a changed file, an older format, a different feature schema or any
bad field is refused in one line naming the file and the field. Nothing is unpickled, ever.

``to_json`` writes exactly what the value holds (training rounds what it builds), so reading the
bytes back gives an equal value.
"""

from __future__ import annotations

import functools
import hashlib
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from router.errors import ConfigError
from router.features.task.attempt import MIN_CALLS, AttemptControl
from router.features.task.vector import HASH_DIM, NUMERIC, arrays, dot, schema
from router.jsondoc import Node, attempts_key
from router.policy.estimates import BOUNDS, BackendEstimates, Estimates
from router.policy.prior import FixedPlan, Point

FORMAT = "router-learned/3"
#: Top-level keys the artifact's typed fields are written under; any other key is ``report``.
_TYPED = frozenset({
    "format", "feature_schema", "task_effect_sd", "models", "prior_plans", "operating_points",
    "verifier_noise", "value_curve", "scopes", "output_tokens", "attempt_control", "estimates",
})  # fmt: skip


@dataclass(frozen=True, slots=True)
class ModelParams:
    #: Thousands of numbers: left out of the repr, which a failed comparison prints.
    weights: tuple[float, ...] = field(repr=False)
    platt: tuple[float, float]
    #: log(attempt cost in USD) = cost_weights · numeric features (dense part only).
    cost_weights: tuple[float, ...]
    calls_per_attempt: float = 1.0
    n: int = 0
    #: On the training log, for people (not used to score).
    success_rate: float | None = None
    mean_cost: float | None = None

    def p_success(self, vec: Mapping[int, float]) -> float:
        z = dot(self.weights, vec)
        a, b = self.platt
        return sigmoid(a * z + b)

    def attempt_cost(self, vec: Mapping[int, float]) -> float:
        k = len(self.cost_weights)
        return math.exp(sum(self.cost_weights[i] * v for i, v in vec.items() if i < k))


@dataclass(frozen=True, slots=True)
class ScopeEffects:
    """A scope's shift of the success logit: ``common`` for every model plus each model's own."""

    #: The scope's ``match`` it was trained under (a scope matching other tasks now is not given it).
    match: Mapping[str, str]
    common: float
    models: Mapping[str, float]

    def of(self, model: str) -> float:
        return self.common + self.models.get(model, 0.0)


@dataclass(frozen=True, slots=True)
class OutputTokens:
    """log1p(output tokens) = a + b·log1p(prompt tokens), per quantile (``router.learning.training.outputs``)."""

    q50: tuple[float, float]
    q90: tuple[float, float]
    n: int = 0

    def median(self, prompt_tokens: int) -> int:
        a, b = self.q50
        # A fitted median below one token is still a call that answers: one token.
        return max(1, round(math.expm1(a + b * math.log1p(prompt_tokens))))


@dataclass(frozen=True)
class Artifact:
    models: Mapping[str, ModelParams]
    schema: Mapping[str, Any] = field(default_factory=schema)
    #: Spread of the unseen per-task difficulty on the logit scale (0: failures independent).
    task_sd: float = 0.0
    #: max_attempts → the fixed orders no other beats on the training log (``router.policy.prior``).
    frontiers: Mapping[int, tuple[FixedPlan, ...]] = field(default_factory=dict)
    #: max_attempts → operating points (prior plan, deviation margin) measured by ``router train``.
    points: Mapping[int, tuple[Point, ...]] = field(default_factory=dict)
    #: (false accept, false reject) of the verifier the prior plans were chosen under.
    noise: tuple[float, float] = (0.0, 0.0)
    #: Scope name → its learned effects (``router.learning.training.scopes``): only the kept ones.
    scopes: Mapping[str, ScopeEffects] = field(default_factory=dict)
    #: Per model, the call cap and stop-loss threshold ``router train`` learned (``router.features.task.attempt``).
    controls: Mapping[str, AttemptControl] = field(default_factory=dict)
    #: Per backend: provider tokens per o200k token, output mean and 90th percentile, cached share.
    estimates: Estimates = field(default_factory=Estimates)
    #: Per model, the size of a call's output.
    output_tokens: Mapping[str, OutputTokens] = field(default_factory=dict)
    #: What training measured, for people and reports (written at the top level; never read to route).
    report: Mapping[str, Any] = field(default_factory=dict)
    #: The sha256 of the bytes it was read from ("" for one built in memory).
    digest: str = field(default="", compare=False, repr=False)

    @functools.cached_property
    def sha256(self) -> str:
        """What a policy pins: the file's digest, or that of ``to_json()`` for a value not read from one."""
        return self.digest or hashlib.sha256(self.to_json()).hexdigest()

    @property
    def value_curves(self) -> dict[int, tuple[tuple[float, float, float], ...]]:
        """max_attempts → (value, expected share of training tasks completed, cost per task), value
        ascending: the operating points measured at a value rather than a target."""
        return {
            k: tuple(sorted((p.value, p.success, p.cost) for p in pts if p.target is None))
            for k, pts in self.points.items()
        }

    def expected_output(self, model: str, prompt_tokens: int) -> int | None:
        """The median output tokens of a call, learned from the log (None: no history)."""
        fitted = self.output_tokens.get(model)
        return fitted.median(prompt_tokens) if fitted is not None else None

    @functools.cached_property
    def arrays(self) -> Stacked:
        """Every model's parameters stacked, so scoring all candidates is one product."""
        k = len(NUMERIC)
        names = tuple(self.models)
        cost = np.zeros((len(names), k))
        for i, m in enumerate(self.models.values()):
            cost[i, : min(k, len(m.cost_weights))] = m.cost_weights[:k]
        return Stacked(
            names=names,
            weights=np.array([m.weights for m in self.models.values()]).reshape(len(names), -1),
            platt=np.array([m.platt for m in self.models.values()]).reshape(len(names), 2),
            cost_weights=cost,
        )

    def to_json(self) -> bytes:
        return orjson.dumps(_write(self), option=orjson.OPT_INDENT_2)

    @classmethod
    def from_json(cls, raw: bytes | str, *, source: str, expected_sha256: str | None = None) -> Artifact:
        """The artifact in ``raw`` (``source`` names it in errors); ``expected_sha256``: the pin."""
        data = raw.encode() if isinstance(raw, str) else raw
        digest = hashlib.sha256(data).hexdigest()
        if expected_sha256 is not None and digest != expected_sha256.lower():
            raise ConfigError(
                f"{source}: sha256 mismatch: the policy pins {expected_sha256[:12]}…, the file is "
                f"{digest[:12]}… (promote the new artifact with `router promote`)"
            )
        try:
            obj = orjson.loads(data)
        except orjson.JSONDecodeError as exc:
            raise ConfigError(f"{source}: not JSON: {exc}") from None
        if not isinstance(obj, dict) or not str(obj.get("format", "")).startswith("router-learned/"):
            raise ConfigError(f"{source}: not a learned-policy artifact (format {FORMAT!r} expected)")
        if obj["format"] != FORMAT:
            raise ConfigError(
                f"{source}: artifact format {obj['format']!r}, this router reads {FORMAT!r} "
                "(a prior plan from the training log and per-task deviation margins); retrain with `router train`"
            )
        if obj.get("feature_schema") != schema():
            raise ConfigError(
                f"{source}: feature schema mismatch: artifact has {obj.get('feature_schema')!r}, this "
                f"router computes {schema()!r}; retrain with `router train`"
            )
        return _read(Node(obj, source), digest)

    @classmethod
    def load(cls, path: str | Path, expected_sha256: str | None = None) -> Artifact:
        try:
            raw = Path(path).read_bytes()
        except OSError as exc:
            raise ConfigError(f"{path}: cannot read learned artifact: {exc.strerror}") from None
        return cls.from_json(raw, source=str(path), expected_sha256=expected_sha256)


@dataclass(frozen=True)
class Stacked:
    names: tuple[str, ...]
    weights: np.ndarray
    platt: np.ndarray
    cost_weights: np.ndarray

    def score(
        self, vec: Mapping[int, float], offsets: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
        """(P(success), attempt cost) of every model, as ``ModelParams`` computes them one by one;
        ``offsets``: a scope's shift of each model's calibrated logit."""
        idx, vals = arrays(vec)
        z = self.weights[:, idx] @ vals if len(idx) else np.zeros(len(self.names))
        t = self.platt[:, 0] * z + self.platt[:, 1]
        if offsets is not None:
            t = t + offsets
        e = np.exp(-np.abs(t))  # the stable sigmoid, as sigmoid()
        p = np.where(t >= 0, 1.0 / (1.0 + e), e / (1.0 + e))
        dense = idx < self.cost_weights.shape[1]
        cost = np.exp(self.cost_weights[:, idx[dense]] @ vals[dense])
        return p, cost


def sigmoid(z: float) -> float:
    if z >= 0:
        return 1.0 / (1.0 + math.exp(-z))
    e = math.exp(z)
    return e / (1.0 + e)


def _write(a: Artifact) -> dict[str, Any]:
    def point(p: Point) -> dict[str, Any]:
        out = {"value": p.value, "target": p.target, "margin": None if math.isinf(p.margin) else p.margin,
               "success": p.success, "cost": p.cost, "deviations": p.deviations, "gain": p.gain}  # fmt: skip
        # Where a target's prior plan is chosen, when not at the target among orders of any length
        # (what their absence reads as: a file written before them says the same written again).
        chosen = p.target is not None and (p.above != 0.0 or p.longest is not None)
        return out | ({"above": p.above, "longest": p.longest} if chosen else {})

    def params(m: ModelParams) -> dict[str, Any]:
        out: dict[str, Any] = {"weights": m.weights, "platt": m.platt, "cost_weights": m.cost_weights,
                               "calls_per_attempt": m.calls_per_attempt, "n": m.n}  # fmt: skip
        return out | {
            k: v for k, v in (("success_rate", m.success_rate), ("mean_cost", m.mean_cost)) if v is not None
        }

    def backend(e: BackendEstimates) -> dict[str, Any]:
        return {
            name: v
            for name in (*(b[0] for b in BOUNDS), "n", "output_cells", "cache_cells")
            if (v := getattr(e, name)) is not None
        }

    return {
        "format": FORMAT,
        "feature_schema": a.schema,
        **a.report,
        "task_effect_sd": a.task_sd,
        "models": {m: params(p) for m, p in a.models.items()},
        "prior_plans": {
            str(k): [[p.models, p.success, p.cost] for p in plans] for k, plans in a.frontiers.items()
        },
        "operating_points": {str(k): [point(p) for p in pts] for k, pts in a.points.items()},
        "verifier_noise": a.noise,
        # For readers of the file (evaluation reports); derived from the points, so not read back.
        "value_curve": {str(k): curve for k, curve in a.value_curves.items()},
        "scopes": {
            n: {"match": s.match, "common": s.common, "models": s.models} for n, s in a.scopes.items()
        },
        "output_tokens": {m: {"q50": o.q50, "q90": o.q90, "n": o.n} for m, o in a.output_tokens.items()},
        "attempt_control": {
            m: {"max_calls": c.max_calls, "stop_below": c.stop_below, "min_calls": c.min_calls}
            for m, c in a.controls.items()
        },
        "estimates": {b: backend(e) for b, e in a.estimates.learned.items()},
    }


def _read(doc: Node, digest: str) -> Artifact:
    top = doc.mapping()
    width = len(NUMERIC) + HASH_DIM

    def each(key: str) -> dict[str, Node]:
        node = doc.get(key)
        return node.mapping() if node is not None else {}

    def model(m: Node) -> ModelParams:
        weights = m.need("weights").numbers()
        if len(weights) != width:
            raise ConfigError(f"{doc.source}: {m.path}.weights: expected {width} values, got {len(weights)}")
        platt = m.need("platt").numbers(2)
        calls, n, rate, cost = (m.get(k) for k in ("calls_per_attempt", "n", "success_rate", "mean_cost"))
        return ModelParams(
            weights, (platt[0], platt[1]), m.need("cost_weights").numbers(),
            calls_per_attempt=calls.number(0) if calls is not None else 1.0,
            n=n.whole() if n is not None else 0,
            success_rate=rate.number(0, 1) if rate is not None else None,
            mean_cost=cost.number(0) if cost is not None else None,
        )  # fmt: skip

    def plan(p: Node) -> FixedPlan:
        models, success, cost = p.items(3)
        return FixedPlan(tuple(m.text() for m in models.items()), success.number(0, 1), cost.number(0))

    def point(p: Node) -> Point:
        target, margin, share, gain = (p.get(k) for k in ("target", "margin", "deviations", "gain"))
        above, longest = p.get("above"), p.get("longest")
        return Point(
            p.need("value").number(0, math.inf, open_=True),
            None if target is None else target.number(0, 1),
            math.inf if margin is None else margin.number(0),  # null: never leave the prior plan
            p.need("success").number(0, 1),
            p.need("cost").number(0),
            0.0 if share is None else share.number(0, 1),
            0.0 if gain is None else gain.number(),
            # Written before the margin was learned: at the target itself, among orders of any length.
            0.0 if above is None else above.number(0, 1),
            None if longest is None else longest.whole(1),
        )

    def control(c: Node) -> AttemptControl:
        cap, below, least = c.get("max_calls"), c.get("stop_below"), c.get("min_calls")
        return AttemptControl(
            max_calls=None if cap is None else cap.whole(1),
            stop_below=None if below is None else below.number(0, 1, open_=True),
            min_calls=MIN_CALLS if least is None else least.whole(1),
        )

    def backend(e: Node) -> BackendEstimates:
        ratio, mean, p90, share = (
            None if (n := e.get(name)) is None else n.number(low, high) for name, low, high in BOUNDS
        )
        n, cells, shares = e.get("n"), e.get("output_cells"), e.get("cache_cells")
        return BackendEstimates(
            ratio, mean, p90, share, n=None if n is None else n.whole(),
            output_cells=None if cells is None else {k: v.number(0.0, 10_000_000.0) for k, v in cells.mapping().items()},
            cache_cells=None if shares is None else {k: v.number(0.0, 1.0) for k, v in shares.mapping().items()},
        )  # fmt: skip

    def scope(s: Node) -> ScopeEffects:
        match = {k: v.text() for k, v in s.need("match").mapping().items()}
        models = {k: v.number() for k, v in s.need("models").mapping().items()}
        return ScopeEffects(match, s.need("common").number(), models)

    def output(o: Node) -> OutputTokens:
        q50, q90 = o.need("q50").numbers(2), o.need("q90").numbers(2)
        n = o.get("n")
        return OutputTokens((q50[0], q50[1]), (q90[0], q90[1]), 0 if n is None else n.whole())

    sd = doc.get("task_effect_sd")
    noise = doc.get("verifier_noise")
    fa, fr = (n.number(0, 1) for n in noise.items(2)) if noise is not None else (0.0, 0.0)
    return Artifact(
        models={m: model(n) for m, n in each("models").items()},
        schema=schema(),
        task_sd=sd.number(0, 10) if sd is not None else 0.0,
        frontiers={
            attempts_key(k, n): tuple(plan(p) for p in n.items()) for k, n in each("prior_plans").items()
        },
        points={
            attempts_key(k, n): tuple(point(p) for p in n.items())
            for k, n in each("operating_points").items()
        },
        noise=(fa, fr),
        scopes={name: scope(n) for name, n in each("scopes").items()},
        controls={m: control(n) for m, n in each("attempt_control").items()},
        estimates=Estimates({b: backend(n) for b, n in each("estimates").items()}),
        output_tokens={m: output(n) for m, n in each("output_tokens").items()},
        report={k: v.value for k, v in top.items() if k not in _TYPED},
        digest=digest,
    )
