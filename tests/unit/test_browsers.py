"""``router.http.browsers``: which ``Host`` and ``Origin`` an open router answers."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from router.app.settings import Settings
from router.http.browsers import Browsers, allowed_hosts


@pytest.mark.parametrize(
    "host",
    ["localhost", "LOCALHOST:8080", "localhost.", "127.0.0.1", "127.9.9.9:1", "[::1]", "[::1]:8080"],
)
def test_loopback_hosts_are_answered(host: str) -> None:
    assert Browsers().refusal({"host": host}) is None


@pytest.mark.parametrize(
    "host",
    [
        "evil.example", "evil.example:8080", "localhost.evil.example", "127.0.0.1.evil.example",
        "evil.example@127.0.0.1", "127.0.0.1/x", "[::1", "", " ", "::1", "10.0.0.5.evil.example",
    ],
)  # fmt: skip
def test_any_other_host_is_refused_and_named(host: str) -> None:
    reason = Browsers().refusal({"host": host})
    assert reason is not None and "ROUTER_ALLOWED_HOSTS" in reason


@pytest.mark.parametrize("host", ["10.0.0.5:8080", "192.168.1.20", "[fd00::5]:8080", "172.17.0.2:8080"])
def test_an_address_is_answered(host: str) -> None:
    # `docker run -p 8080:8080` or a laptop's router reached by its LAN address was a 403 until its
    # operator named the address: rebinding needs a name. Another site's page calling the address
    # sends its Origin, and is still refused.
    assert Browsers().refusal({"host": host}) is None
    assert Browsers().refusal({"host": "10.0.0.5:8080", "origin": "http://10.0.0.5:3000"}) is not None


def test_the_operator_names_hosts_and_subdomains() -> None:
    b = Browsers(allowed_hosts(" DevBox.lan, *.corp.example ,,"))
    assert b.allowed == ("devbox.lan", "*.corp.example")
    assert b.refusal({"host": "devbox.lan:8080"}) is None
    assert b.refusal({"host": "a.b.corp.example"}) is None
    for other in ("corp.example", "xcorp.example", "devbox.lan.evil.example"):
        assert b.refusal({"host": other}) is not None, other
    assert Browsers(("*",)).refusal({"host": "anything.example"}) is None


def test_a_quoted_host_is_cut() -> None:
    reason = Browsers().refusal({"host": "a" * 5000})
    assert reason is not None and len(reason) < 500


def test_no_host_is_a_script_not_a_browser() -> None:
    assert Browsers().refusal({}) is None


def test_a_page_of_the_routers_own_origin_is_its_own() -> None:
    b = Browsers(("devbox.lan",))
    assert b.refusal({"host": "devbox.lan:8080", "origin": "http://devbox.lan:8080"}) is None
    assert b.refusal({"host": "devbox.lan:8080", "origin": "http://localhost:3000"}) is None
    for origin in ("http://devbox.lan:8081", "http://evil.example:8080", "null", "http://devbox.lan:8080@x"):
        assert b.refusal({"host": "devbox.lan:8080", "origin": origin}) is not None, origin


@pytest.mark.parametrize(
    "given",
    ['["DevBox.lan", "*.corp.example"]', " devbox.lan , *.corp.example", '[ "devbox.lan","*.corp.example" ]'],
)
def test_allowed_hosts_from_the_environment_as_a_json_list_or_with_commas(
    given: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pydantic-settings reads a list-valued setting as JSON, and the router read this one comma by
    comma alone: ``["devbox.lan"]`` allowed the host '["devbox.lan"]', which never matches."""
    monkeypatch.setenv("ROUTER_ALLOWED_HOSTS", given)
    assert Settings().allowed_hosts == ("devbox.lan", "*.corp.example")


@pytest.mark.parametrize("given", ['["devbox.lan", 5]', '["devbox.lan"', '{"host": "devbox.lan"}'])
def test_allowed_hosts_that_are_not_a_list_of_names_are_refused_saying_so(
    given: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ROUTER_ALLOWED_HOSTS", given)
    with pytest.raises(ValidationError, match="allowed_hosts"):
        Settings()
