"""The console's request and fallback lines, and the JSON log format."""

from __future__ import annotations

import logging

import orjson

from router.app.logs import JsonFormatter
from router.store.records import RequestRecord, TryRecord
from router.telemetry import console


def _rec(**kw: object) -> RequestRecord:
    base = dict(request_id="r1", ts=0.0, protocol="anthropic", task_id="t-9", requested_model="claude-x",
                chosen_model="local-mini", decision_reason="cheapest expected cost among the candidates that fit the prompt and its output",
                status=200, input_tokens=1200, output_tokens=34, cost_usd=0.000368, total_ms=812.4)  # fmt: skip
    base.update(kw)
    return RequestRecord(**base)  # type: ignore[arg-type]


def test_request_line_tells_the_story() -> None:
    line = console.request_line(_rec())
    assert line.startswith("messages task t-9: claude-x → local-mini (cheapest expected cost")
    assert line.endswith(" 200 1200/34 tok $0.000368 812 ms")
    long = console.request_line(_rec(decision_reason="preferred by rule long-prompts; then " * 4))
    reason = long[long.index("(") + 1 : long.index(")")]
    assert len(reason) == console.REASON_CHARS and reason.endswith("…")


def test_a_learned_plan_keeps_its_cost_and_success_on_the_line() -> None:
    # Cut at 60 characters, a promoted policy's line read "(plan local-nano: expected $0.0021 per
    # completed task, succe…)": the numbers the reason is for were the part cut off.
    for plan in ("local-nano", "local-nano → local-mini → local-claude"):
        reason = f"plan {plan}: expected $0.0021 per completed task, success 41%"
        line = console.request_line(_rec(chosen_model="local-nano", decision_reason=reason))
        assert f"({reason})" in line


def test_a_refused_request_says_what_was_refused_and_why() -> None:
    # It read "task -: - → - (authentication_error) 401 authentication_error - tok $- 3 ms".
    line = console.request_line(_rec(task_id=None, chosen_model=None, decision_reason=None, status=401,
                                     error_type="AuthenticationFailed", error_message="missing API key",
                                     input_tokens=None, cost_usd=None, total_ms=3.2))  # fmt: skip
    assert line == "messages refused 401 AuthenticationFailed: missing API key (model claude-x) 3 ms"
    limited = console.request_line(_rec(chosen_model=None, status=429, error_type="RateLimited",
                                        error_message="rpm limit of key k1 reached: " + "x" * 80))  # fmt: skip
    assert limited.startswith("messages refused 429 RateLimited: rpm limit of key k1 reached")
    assert limited.endswith("… (task t-9, model claude-x) 812 ms")
    bare = console.request_line(RequestRecord(request_id="r2", ts=0.0, status=400, error_type="BadRequest"))
    assert bare == "request refused 400 BadRequest"


def test_a_client_cannot_forge_a_line_or_reach_the_terminal() -> None:
    """The model name is the client's: ``"x\\n2026-12-04 00:14:59 WARNING ..."`` wrote a second,
    forged line to the console, and an escape sequence went to the operator's terminal as it was."""
    forged = "nope\n2026-12-04 00:14:59,389 WARNING router.policy: FORGED\x1b[2J"
    for rec in (_rec(requested_model=forged), _rec(requested_model=forged, chosen_model=None, status=404,
                                                   error_type="UnknownModel", error_message="not served")):  # fmt: skip
        line = console.request_line(rec)
        assert "\n" not in line and "\x1b" not in line
        assert "nope\\n2026-12-04" in line and "\\x1b[2J" in line
    assert console.request_line(_rec(requested_model="модель")).startswith("messages task t-9: модель →")


def test_a_request_that_reached_a_backend_and_failed_keeps_its_routing() -> None:
    line = console.request_line(
        _rec(status=502, error_type="UpstreamError", input_tokens=None, cost_usd=None)
    )
    assert line.startswith("messages task t-9: claude-x → local-mini (cheapest expected cost")
    assert line.endswith(" 502 UpstreamError - tok $- 812 ms")


def test_one_fallback_line_per_backend_left() -> None:
    tries = [TryRecord("a", status=500, error_type="UpstreamError"), TryRecord("a", status=500),
             TryRecord("b", status=None, error_type="BreakerOpen"), TryRecord("c", status=200)]  # fmt: skip
    lines = console.fallback_lines(_rec(tries=tries))
    assert lines == [
        "fallback in request r1 (task t-9): a failed (500) → b",
        "fallback in request r1 (task t-9): b failed (BreakerOpen) → c",
    ]
    assert console.fallback_lines(_rec(tries=[TryRecord("a", status=200)])) == []


def test_json_log_lines_carry_the_request_fields(caplog: object) -> None:
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    console.log.addHandler(handler)
    console.log.setLevel(logging.INFO)
    try:
        console.log_request(_rec(tries=[TryRecord("x", status=503), TryRecord("local-mini", status=200)]))
    finally:
        console.log.removeHandler(handler)
        console.log.setLevel(logging.NOTSET)
    fallback, request = (orjson.loads(JsonFormatter().format(r)) for r in records)
    assert fallback["level"] == "warning" and fallback["event"] == "fallback"
    assert request["level"] == "info" and request["event"] == "request"
    assert request["task_id"] == "t-9" and request["cost_usd"] == 0.000368 and request["status"] == 200
    assert request["message"] == console.request_line(_rec())
    assert request["time"].endswith("Z") and request["logger"] == "router.requests"


def test_an_explored_choice_says_so_first_and_keeps_the_policys_own() -> None:
    reason = (
        "explored (epsilon 0.2); the policy chose local-nano: cheapest expected cost among the candidates"
    )
    line = console.request_line(_rec(chosen_model="local-claude", decision_reason=reason))
    assert "local-claude (explored (epsilon 0.2); the policy chose local-nano: " in line


async def test_the_ready_line_says_where_the_log_is(tmp_path, caplog, fake) -> None:  # type: ignore[no-untyped-def]
    # It said "store sqlite": which file, the reader of `router tasks --store` had to guess.
    from tests.unit.inprocess import serving
    from tests.unit.requestpath import model

    with caplog.at_level(logging.INFO, logger="router.app.factory"):
        async with serving(tmp_path, [model("a", fake.url)]):
            pass
    ready = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("router ready"))
    assert ready.endswith(f"store sqlite:///{tmp_path / 'log.db'}"), ready
