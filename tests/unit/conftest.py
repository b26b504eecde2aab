"""Fixtures shared by the unit tests of the request path."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from router.fakeupstream import FakeUpstream


@pytest.fixture(scope="session")
def fake() -> Iterator[FakeUpstream]:
    """The local fake provider, in this process on an ephemeral port (its own thread and loop)."""
    with FakeUpstream() as up:
        yield up
