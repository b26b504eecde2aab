"""Fixtures shared by the unit tests of the request path."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from router.fakeupstream import FakeUpstream
from router.features import signals


@pytest.fixture(scope="session")
def fake() -> Iterator[FakeUpstream]:
    """The local fake provider, in this process on an ephemeral port (its own thread and loop)."""
    with FakeUpstream() as up:
        yield up


@pytest.fixture(autouse=True)
def cold_signal_caches() -> None:
    """Tool results and call arguments are read once per process and remembered: each test starts
    cold, so what it checks is computed by the code under test, not by whatever test ran first.
    (Mutation testing depends on it: its workers fork from a process that ran the whole suite.)"""
    signals.clear_caches()
