"""Whole numbers someone else wrote: read as ASCII digits up to a cap, anything else refused, never
an exception from int()."""

from __future__ import annotations

import pytest

from router.digits import whole_number
from router.errors import ConfigError
from router.jsondoc import Node, attempts_key


@pytest.mark.parametrize(
    ("text", "read"),
    [
        ("7", 7),
        ("0007", 7),
        ("0", 0),
        ("1000", 1000),
        ("1001", 1000),
        ("9" * 5000, 1000),
        ("0" * 5000 + "3", 3),
    ],
)
def test_ascii_digits_are_read_up_to_the_cap(text: str, read: int) -> None:
    assert whole_number(text, 1000) == read


@pytest.mark.parametrize("text", [None, "", "³", "٣", "1_000", "-1", "+1", " 1", "1.0", "0x10"])
def test_anything_but_ascii_digits_is_none(text: str | None) -> None:
    assert whole_number(text, 1000) is None


@pytest.mark.parametrize("key", ["³", "0", "x", "9" * 5000 + "x"])
def test_an_artifacts_retry_limit_key_that_is_not_one_is_a_config_error(key: str) -> None:
    # '³' passed str.isdigit() and int() refused it: a ValueError with a traceback on loading the
    # artifact, where every other bad field is a ConfigError naming its path.
    with pytest.raises(ConfigError, match="retry limit"):
        attempts_key(key, Node({key: []}, "artifact.json", "prior_plans"))


def test_an_artifacts_retry_limit_key_is_read() -> None:
    assert attempts_key("3", Node({}, "artifact.json")) == 3
