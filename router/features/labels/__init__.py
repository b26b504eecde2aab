"""Outcome labels: a calibrated P(success | the conversation so far), read from an agent's messages.

``features`` reads each message once (into the conversation memo's slots) and sums the facts into
a vector; ``model`` is the versioned, hash-pinned artifact that turns it into a probability
(``default()`` is the one shipped, fitted on real SWE-bench agent runs); ``infer`` makes that a
``WeakLabel``. Fitting and cross-validating it is offline work, in ``router.learning.labels``.
"""

from router.features.labels.features import unread
from router.features.labels.infer import LabelReading, label, read
from router.features.labels.model import SOURCE, LabelModel, default

__all__ = ["SOURCE", "LabelModel", "LabelReading", "default", "label", "read", "unread"]
