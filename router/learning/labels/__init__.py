"""Fitting and checking the outcome label model offline (``router eval-labels``); the model and
its inference run on the request path from ``router.features.labels``."""
