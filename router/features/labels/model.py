"""The outcome label model: a calibrated P(success | the conversation so far), as one typed value.

On disk it is JSON (``router-labels/1``): the features it reads (names from
``router.features.labels.features``), their standardisation, logistic coefficients, a Platt
calibration fitted on out-of-fold scores, and what it was fitted on and how well it did (``meta``,
for people). Fitting (``router.learning.labels.fit``) builds the value and ``to_json`` writes it;
the router reads a file once (``load``), pinned by sha256 like the routing artifact, and any bad
field is refused in one line naming the file and the field. Nothing is unpickled. The package
ships a default fitted on real agent trajectories (``default.json``, pinned by ``DEFAULT_SHA256``).
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
from router.jsondoc import Node

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
    features: tuple[str, ...]
    mean: tuple[float, ...]
    scale: tuple[float, ...]
    coef: tuple[float, ...]
    intercept: float
    #: Calibration of the logit: P = sigmoid(a·z + b).
    platt: tuple[float, float]
    #: P(success) at or above which the label says "success".
    threshold: float = 0.5
    #: What it was fitted on and how (samples, groups, c, ...): for people, never read to label.
    meta: Mapping[str, Any] = field(default_factory=dict)
    #: The sha256 of the bytes it was read from ("" for one built in memory).
    digest: str = field(default="", compare=False, repr=False)

    @functools.cached_property
    def sha256(self) -> str:
        """What a policy pins: the file's digest, or that of ``to_json()`` for a value not read from one."""
        return self.digest or hashlib.sha256(self.to_json()).hexdigest()

    def logit(self, x: Mapping[str, float]) -> float:
        z = self.intercept
        for name, m, s, c in zip(self.features, self.mean, self.scale, self.coef, strict=True):
            z += c * (float(x.get(name, 0.0)) - m) / s
        return z

    def p_success(self, x: Mapping[str, float]) -> float:
        a, b = self.platt
        return _sigmoid(a * self.logit(x) + b)

    def to_json(self) -> bytes:
        """The file: reading it back gives an equal value (fitting rounds what it builds)."""
        doc = {
            "format": FORMAT, "features": self.features, "mean": self.mean, "scale": self.scale,
            "coef": self.coef, "intercept": self.intercept, "platt": self.platt,
            "threshold": self.threshold, "meta": self.meta,
        }  # fmt: skip
        return orjson.dumps(doc, option=orjson.OPT_INDENT_2)

    @classmethod
    def from_json(cls, raw: bytes, *, source: str, expected_sha256: str | None = None) -> LabelModel:
        """The model in ``raw`` (``source`` names it in errors); ``expected_sha256``: the pin."""
        digest = hashlib.sha256(raw).hexdigest()
        if expected_sha256 is not None and digest != expected_sha256.lower():
            raise ConfigError(
                f"{source}: sha256 mismatch: expected {expected_sha256[:12]}…, the file is {digest[:12]}…"
            )
        try:
            obj = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise ConfigError(f"{source}: not a label model artifact: not JSON: {exc}") from None
        if not isinstance(obj, dict) or obj.get("format") != FORMAT:
            got = obj.get("format") if isinstance(obj, dict) else None
            raise ConfigError(f"{source}: not a label model artifact: format is {got!r}, expected {FORMAT!r}")
        return _read(Node(obj, source), digest)

    @classmethod
    def load(cls, path: str | Path, sha256: str | None) -> LabelModel:
        p = Path(path)
        try:
            raw = p.read_bytes()
        except OSError as exc:
            raise ConfigError(f"{p}: cannot read the label model: {exc.strerror}") from exc
        return cls.from_json(raw, source=str(p), expected_sha256=sha256)


def _read(doc: Node, digest: str) -> LabelModel:
    names = doc.need("features").items()
    features = tuple(n.text() for n in names)
    for n, name in zip(names, features, strict=True):
        if name not in NAMES:
            n.fail(f"a feature this router reads ({', '.join(NAMES)})")
    k = len(features)
    mean, coef = doc.need("mean").numbers(k), doc.need("coef").numbers(k)
    scale = tuple(n.number(0, math.inf, open_=True) for n in doc.need("scale").items(k))
    a, b = doc.need("platt").numbers(2)
    threshold, meta = doc.get("threshold"), doc.get("meta")
    return LabelModel(
        features, mean, scale, coef, doc.need("intercept").number(), (a, b),
        threshold=0.5 if threshold is None else threshold.number(0, 1),
        meta={} if meta is None else {k: v.value for k, v in meta.mapping().items()},
        digest=digest,
    )  # fmt: skip


@functools.cache
def default() -> LabelModel:
    """The label model shipped with the router."""
    return LabelModel.load(DEFAULT_PATH, DEFAULT_SHA256)
