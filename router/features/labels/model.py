"""The outcome label model: a calibrated P(success | the conversation so far), as data.

The artifact is JSON (``router-labels/1``): the features it reads (names from
``router.features.labels.features``), their standardisation, logistic coefficients, a Platt
calibration fitted on out-of-fold scores, and what it was fitted on and how well it did. It is
pinned by sha256, like the routing artifact; nothing is unpickled. The package ships a default
fitted on real agent trajectories (``default.json``, pinned by ``DEFAULT_SHA256``).
"""

from __future__ import annotations

import functools
import hashlib
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import orjson

from router.errors import ConfigError
from router.features.labels.features import NAMES

FORMAT: Final = "router-labels/1"
DEFAULT_PATH: Final = Path(__file__).with_name("default.json")
#: The shipped default, as `router eval-labels --fit` wrote it (a changed file is refused).
DEFAULT_SHA256: Final = "92bd40c3008ad8b0a7932687464e1a9cb0bff3aa2b4f32771c21e0c136cb86fd"
#: The label's source in the outcomes table.
SOURCE: Final = "outcome_model"


def _sigmoid(z: float) -> float:
    if z >= 0:
        return 1.0 / (1.0 + math.exp(-z))
    e = math.exp(z)
    return e / (1.0 + e)


@dataclass(frozen=True)
class LabelModel:
    sha256: str
    features: tuple[str, ...]
    mean: tuple[float, ...]
    scale: tuple[float, ...]
    coef: tuple[float, ...]
    intercept: float
    #: Calibration of the logit: P = sigmoid(a·z + b).
    platt: tuple[float, float]
    #: P(success) at or above which the label says "success".
    threshold: float = 0.5
    meta: dict[str, Any] = field(default_factory=dict)

    def logit(self, x: Mapping[str, float]) -> float:
        z = self.intercept
        for name, m, s, c in zip(self.features, self.mean, self.scale, self.coef, strict=True):
            z += c * (float(x.get(name, 0.0)) - m) / s
        return z

    def p_success(self, x: Mapping[str, float]) -> float:
        a, b = self.platt
        return _sigmoid(a * self.logit(x) + b)

    @classmethod
    def from_bytes(cls, raw: bytes, *, source: str, expected_sha256: str | None) -> LabelModel:
        digest = hashlib.sha256(raw).hexdigest()
        if expected_sha256 is not None and digest != expected_sha256.lower():
            raise ConfigError(
                f"{source}: sha256 mismatch: expected {expected_sha256[:12]}…, the file is {digest[:12]}…"
            )
        try:
            obj = orjson.loads(raw)
            if obj.get("format") != FORMAT:
                raise ValueError(f"format is {obj.get('format')!r}, expected {FORMAT!r}")
            feats = tuple(str(f) for f in obj["features"])
            unknown = [f for f in feats if f not in NAMES]
            if unknown:
                raise ValueError(f"unknown features {unknown} (this router reads {list(NAMES)})")
            vectors = [tuple(float(v) for v in obj[k]) for k in ("mean", "scale", "coef")]
            if any(len(v) != len(feats) for v in vectors) or any(s <= 0 for s in vectors[1]):
                raise ValueError("mean, scale and coef must have one entry per feature, scales > 0")
            a, b = (float(v) for v in obj["platt"])
            return cls(
                digest, feats, vectors[0], vectors[1], vectors[2], float(obj["intercept"]), (a, b),
                float(obj.get("threshold", 0.5)), dict(obj.get("meta") or {}),
            )  # fmt: skip
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ConfigError(f"{source}: not a label model artifact: {exc}") from exc

    @classmethod
    def load(cls, path: str | Path, sha256: str | None) -> LabelModel:
        p = Path(path)
        try:
            raw = p.read_bytes()
        except OSError as exc:
            raise ConfigError(f"{p}: cannot read the label model: {exc.strerror}") from exc
        return cls.from_bytes(raw, source=str(p), expected_sha256=sha256)


@functools.cache
def default() -> LabelModel:
    """The label model shipped with the router."""
    return LabelModel.load(DEFAULT_PATH, DEFAULT_SHA256)
