"""The dashboard's pure parts: session tokens, SVG charts, and the numbers the pages show."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from router.fakeupstream import FakeUpstream
from router.features.labels.model import SOURCE as LABEL_MODEL
from router.store import OutcomeRecord, RequestRecord, open_store
from router.store.records import TryRecord
from router.ui import charts, policyview, session, views
from tests.unit.inprocess import serving
from tests.unit.requestpath import model
from tests.unit.test_store import full_record

SECRET = b"s" * 32


def test_session_tokens() -> None:
    sessions = session.Sessions()
    token = sessions.issue(SECRET, now=1000.0)
    assert sessions.valid(SECRET, token, now=1000.0 + session.TTL_S - 1)
    assert not sessions.valid(SECRET, token, now=1000.0 + session.TTL_S + 1)  # expired
    assert not sessions.valid(b"t" * 32, token, now=1000.0)  # another master key
    expires, nonce, mac = token.split(".")
    assert not sessions.valid(SECRET, f"{int(expires) + 3600}.{nonce}.{mac}", now=1000.0)  # extended by hand
    assert not sessions.valid(SECRET, f"{expires}.{nonce[::-1]}.{mac}", now=1000.0)  # another session
    crafted = ("²³.x.y", f"{expires}.{nonce}.{mac[:-1]}é", "1" * 5000 + ".a.b", "9" * 40 + ".a.b")
    for bad in (None, "", "abc", ".", "12.", "12..", f"x{token}", *crafted):
        assert not sessions.valid(SECRET, bad, now=1000.0)
    sessions.revoke(SECRET, token, now=1000.0)
    assert not sessions.valid(SECRET, token, now=1000.0)  # logged out
    assert sessions.valid(SECRET, sessions.issue(SECRET, now=1000.0), now=1000.0)  # a new login works


def test_form_posts_must_come_from_the_dashboard() -> None:
    host = {"host": "router:8080"}
    assert session.same_origin(host, "http")  # no Origin, no Referer: not a browser's cross-site form
    assert session.same_origin({**host, "origin": "http://router:8080"}, "http")
    assert session.same_origin({**host, "referer": "http://router:8080/ui/policy"}, "http")
    assert not session.same_origin({**host, "origin": "https://evil.example"}, "http")
    assert not session.same_origin({**host, "origin": "null"}, "http")
    assert not session.same_origin({**host, "referer": "https://evil.example/x"}, "http")
    assert not session.same_origin({**host, "sec-fetch-site": "cross-site"}, "http")


def test_login_redirects_stay_on_the_dashboard() -> None:
    assert session.safe_next("/ui/tasks?q=a") == "/ui/tasks?q=a"
    for target in (
        None,
        "",
        "https://evil.example/ui",
        "//evil.example",
        "/ui//evil.example",
        "/ui\\x",
        "/v1/models",
    ):
        assert session.safe_next(target) == "/ui"


def test_charts_escape_labels() -> None:
    svg = str(charts.hbars([("<script>x</script>", 1.0), ("none", None)], title="t&t"))
    assert "<script>" not in svg and "&lt;script&gt;" in svg and "t&amp;t" in svg
    assert "n/a" in svg
    assert charts.hbars([], title="empty") == ""


def test_share_bar_percentages() -> None:
    svg = str(charts.share_bar([("a", 3.0), ("b", 1.0)], title="share"))
    assert "a — 3 (75.0%)" in svg and "b — 1 (25.0%)" in svg
    assert charts.share_bar([("a", 0.0)], title="none") == ""


def test_quantiles_on_a_log_axis() -> None:
    svg = str(charts.quantiles([("queue", 0.5, 1.0, 2.0), ("total", 50.0, 900.0, 4000.0), ("ttft", None, None, None)],
                               title="q"))  # fmt: skip
    for tick in ("0.1 ms", "1 ms", "10 ms", "100 ms", "1000 ms"):
        assert f">{tick}<" in svg
    assert "no data" in svg
    assert 'class="p99"' in svg


def _row(
    task: str, ts: float, model: str, cost: float, client: str = "aider/1", **more: Any
) -> RequestRecord:
    return RequestRecord(f"{task}@{ts}", ts, task_id=task, chosen_model=model, cost_usd=cost, status=200,
                         client=client, total_ms=10.0, **more)  # fmt: skip


def _verdict(task: str, success: bool, ts: float, source: str = "explicit") -> OutcomeRecord:
    return OutcomeRecord(task, 1, success, None, source, None, ts, source == "explicit")


def test_task_rows_search() -> None:
    requests = [_row("fix-login", 1.0, "cheap", 0.01), _row("add-cache", 2.0, "large", 0.5, "claude-cli/2"),
                _row("fix-login", 3.0, "large", 0.2)]  # fmt: skip
    requests[1].repo = "acme/cache"
    outcomes = [_verdict("fix-login", True, 4.0)]
    every = views.task_rows(requests, outcomes)
    assert [t["task_id"] for t in every["tasks"]] == ["fix-login", "add-cache"]
    assert every["tasks"][0]["verdict"] == "success (explicit)"
    assert [t["task_id"] for t in views.task_rows(requests, outcomes, "CLAUDE")["tasks"]] == ["add-cache"]
    assert [t["task_id"] for t in views.task_rows(requests, outcomes, "cheap")["tasks"]] == ["fix-login"]
    assert [t["task_id"] for t in views.task_rows(requests, outcomes, "success")["tasks"]] == ["fix-login"]
    assert views.task_rows(requests, outcomes, "nothing")["matched"] == 0
    [cache] = views.task_rows(requests, outcomes, "acme/")["tasks"]
    assert (cache["task_id"], cache["repo"]) == ("add-cache", "acme/cache")


def test_overview_totals_and_timeline() -> None:
    requests = [_row("a", 10.0, "cheap", 0.25), _row("b", 50.0, "large", 0.75), _row("b", 99.0, "large", 1.0)]
    outcomes = [_verdict("a", False, 60.0, "tests"), _verdict("b", True, 99.0)]
    o = views.overview(requests, outcomes, since=0.0, until=100.0)
    assert (o["requests"], o["spend_usd"], o["success_rate"]) == (3, 2.0, 0.5)
    assert o["tasks"]["cost_per_completed_task_usd"] == 2.0  # both tasks' spend over the one success
    assert o["share"] == [("large", 2), ("cheap", 1)]
    assert [g["by"] for g in o["groupings"]] == ["backend"]  # no policy column in these rows
    counts = [n for _, n in o["timeline"]["requests"]]
    assert sum(counts) == 3 and counts[2] == 1 and counts[-1] == 1
    assert o["timeline"]["requests"][-1][0] == "now"


def test_a_task_of_side_calls_alone_is_no_task_awaiting_a_verdict() -> None:
    # opencode's session title is a side call that hashes to a task of its own: the headline read
    # "2 tasks (1 with a verdict)" for one opencode run, the task list "no verdict yet" for the title.
    requests = [_row("title", 10.0, "cheap", 0.25, side_call=True), _row("run", 11.0, "cheap", 0.5)]
    o = views.overview(requests, [_verdict("run", True, 20.0)], since=0.0, until=100.0)
    assert (o["tasks"]["tasks"], o["tasks"]["with_outcome"], o["spend_usd"]) == (1, 1, 0.75)
    [group] = o["groupings"][0]["groups"]
    assert group["tasks"]["count"] == 1
    rows = views.task_rows(requests, [_verdict("run", True, 20.0)])
    assert [(t["task_id"], t["verdict"]) for t in rows["tasks"]] == [
        ("run", "success (explicit)"),
        ("title", "side calls only"),
    ]


def test_window_labels() -> None:
    assert views.window_seconds("1h") == ("1h", 3600)
    assert views.window_seconds("1y") == (views.DEFAULT_WINDOW, views.WINDOWS[views.DEFAULT_WINDOW])
    assert views.window_seconds(None)[0] == views.DEFAULT_WINDOW
    assert views.window_seconds(None, "7d") == ("7d", 7 * 86400)


def test_intervals_chart() -> None:
    svg = str(charts.intervals([("control", 0.8, 0.6, 0.9), ("<b>", None, None, None)], title="s",
                               fmt="{:.0%}".format, top=1.0))  # fmt: skip
    assert "control: 80% (60%–90%)" in svg and "&lt;b&gt;" in svg and "<b>" not in svg
    assert svg.count("<circle") == 1 and "n/a" in svg and ">100%<" in svg
    assert charts.intervals([("a", None, None, None)], title="none") == ""


def _arm_rows() -> tuple[list[RequestRecord], list[OutcomeRecord]]:
    requests = [RequestRecord(f"r{i}", float(i), task_id=f"t{i}", arm="treated" if i % 2 else "control",
                              policy_revision="new", cost_usd=0.01, status=200, total_ms=10.0)
                for i in range(8)]  # fmt: skip
    requests.append(replace(requests[0], task_id="old", policy_revision="old", request_id="r-old"))
    outcomes = [_verdict(f"t{i}", i < 5, 9.0) for i in range(8)]
    return requests, outcomes


def test_arms_of_the_revision_in_force_are_the_reports() -> None:
    from router.rollout.arms import arm_report
    from router.ui import policyview

    requests, outcomes = _arm_rows()
    shown = policyview.arms(requests, outcomes, "new")
    [new] = [r for r in arm_report(requests, outcomes)["revisions"] if r["revision"] == "new"]
    assert [a for a, _ in shown["rows"]] == ["control", "treated"]  # control first
    assert dict(shown["rows"]) == new["arms"]
    assert shown["other_revisions"] == ["old"]
    control = new["arms"]["control"]
    assert shown["success_chart"][0] == ("control", control["success_rate"], *control["success_ci95"])
    nothing = policyview.arms(requests, outcomes, "unseen")
    assert (
        nothing["rows"] == []
        and nothing["success_chart"] == []
        and set(nothing["other_revisions"]) == {"new", "old"}
    )


def test_guard_state_and_scopes_in_words() -> None:
    from router.policy.config import GuardSpec, PolicyFile
    from router.ui import policyview

    spec = GuardSpec(min_tasks=10)
    assert policyview.guard(None, None, None) is None
    assert policyview.guard(spec, None, 5.0)["state"] is None  # not checked yet
    waiting = policyview.guard(spec, {"reason": "waiting: 4 control and 12 treated tasks", "worse": False,
                                      "control_tasks": 4, "treated_tasks": 12}, 5.0)["state"]  # fmt: skip
    assert waiting["status"] is None and (waiting["control_share"], waiting["treated_share"]) == (0.4, 1.0)
    worse = policyview.guard(spec, {"reason": "success 10% treated", "worse": True, "control_tasks": 10,
                                    "treated_tasks": 10}, 5.0)["state"]  # fmt: skip
    assert worse["status"] == "worse than control"
    policy = PolicyFile.model_validate({
        "models": [{"id": m, "litellm_model": f"openai/{m}", "protocol": "openai"} for m in "abc"],
        "routes": [{"match": "auto", "candidates": ["a"]}],
        "rules": [{"name": "big", "when": {"prompt_tokens": {"gt": 9}}, "only": ["c"]}],
        "scopes": [
            {"name": "acme", "match": {"repo": "acme/*"}, "objective": {"max_attempts": 2},
             "routes": [{"match": "auto", "candidates": ["a", "b"], "fallbacks": ["c"]},
                        {"match": "gpt-*", "passthrough": "b"}],
             "rules": [{"name": "big", "when": {"prompt_tokens": {"gt": 5}}, "only": ["b"]}]},
            {"name": "tagged", "match": {"team": "ml"}},
        ],
    })  # fmt: skip
    assert policyview.scopes(policy) == [
        {"name": "acme", "match": "repo = acme/*",
         "overrides": ["route auto → a, b (fallbacks c) (in place of the policy's)", "route gpt-* → passthrough b (added)",
                       "rule big (in place of the policy's)", "objective: max_attempts = 2"]},
        {"name": "tagged", "match": "team = ml", "overrides": []},
    ]  # fmt: skip


async def test_the_login_page_offers_no_log_out_and_names_no_policy(fake: Any, tmp_path: Any) -> None:
    # In master-key mode every page showed "log out" and the policy's name, the login form too.
    from tests.unit.inprocess import MASTER, serving
    from tests.unit.requestpath import model

    async with serving(
        tmp_path, [model("a", fake.url)], master_key=MASTER, policy={"name": "acme-secret"}
    ) as r:
        login = await r.client.get("/ui/login")
        assert login.status_code == 200 and 'name="key"' in login.text
        assert "log out" not in login.text and "acme-secret" not in login.text
        wrong = await r.client.post("/ui/login", data={"key": "wrong", "next": "/ui"})
        assert wrong.status_code == 401 and "log out" not in wrong.text and "acme-secret" not in wrong.text
        await r.client.post("/ui/login", data={"key": MASTER, "next": "/ui"})
        page = await r.client.get("/ui")
        assert page.status_code == 200 and "log out" in page.text and "acme-secret" in page.text


def test_overview_says_what_failed_what_each_key_and_route_spent_and_what_the_headline_leaves_out() -> None:
    ok = [
        _row("a", 10.0, "cheap", 0.25, key_id="key_1", requested_model="auto", input_tokens=1000, output_tokens=10,
             cache_read_tokens=800),
        _row("b", 20.0, "large", 0.5, requested_model="auto", input_tokens=500, output_tokens=5),
        _row("c", 30.0, "large", 1.25, key_id="key_2", requested_model="claude-sonnet", input_tokens=2500,
             output_tokens=40),
    ]  # fmt: skip
    failed = [
        replace(_row("a", 40.0, "cheap", 0.0), status=502, error_type="UpstreamError", error_message="old"),
        replace(
            _row("a", 41.0, "large", 0.0), status=502, error_type="UpstreamError", error_message="x" * 500
        ),
        replace(_row("b", 42.0, "cheap", 0.0), status=404, error_type="UnknownModel", chosen_model=None),
    ]
    outcomes = [_verdict("a", True, 99.0), _verdict("b", False, 99.0)]
    o = views.overview([*ok, *failed], outcomes, since=0.0, until=100.0, key_names={"key_1": "ci"})
    assert o["tokens"] == {"input_tokens": 4000, "output_tokens": 55, "cache_read_tokens": 800}
    # Task c has no verdict: its $1.25 of the $2.00 spent is outside the headline cost per completed task.
    assert (o["unlabelled_spend_usd"], o["unlabelled_share"]) == (1.25, 0.625)
    kinds = [(e["status"], e["reason"], e["count"]) for e in o["error_kinds"]]
    assert kinds == [(502, "UpstreamError", 2), (404, "UnknownModel", 1)]
    upstream = o["error_kinds"][0]
    assert dict(upstream["backends"]) == {"cheap": 1, "large": 1} and upstream["last_ts"] == 41.0
    assert upstream["message"] == "x" * (views.ERROR_MESSAGE_CHARS - 1) + "…"
    assert dict(o["error_kinds"][1]["backends"]) == {"(none: refused before routing)": 1}
    groups = {g["by"]: {x["label"]: x for x in g["groups"]} for g in o["groupings"]}
    assert set(groups) == {"backend", "route", "key"}
    assert {k: (x["requests"], x["cost_usd"]) for k, x in groups["key"].items()} == {
        "ci (key_1)": (1, 0.25), "key_2": (1, 1.25), "(master or open)": (4, 0.5)}  # fmt: skip
    auto = groups["route"]["auto"]
    assert (auto["requests"], auto["cost_usd"], auto["success_rate"]) == (2, 0.75, 0.5)
    assert groups["route"]["claude-sonnet"]["success_rate"] is None  # no verdict: not 0%


def test_the_task_list_is_paginated_not_capped() -> None:
    requests = [_row(f"t{i:03d}", float(i), "cheap", 0.01) for i in range(250)]
    first = views.task_rows(requests, [])
    assert (first["matched"], first["pages"], first["page"], len(first["tasks"])) == (250, 3, 1, 100)
    assert first["tasks"][0]["task_id"] == "t249"  # most recent first
    last = views.task_rows(requests, [], page=3)
    assert (last["first"], [t["task_id"] for t in last["tasks"]][-1], len(last["tasks"])) == (201, "t000", 50)
    assert views.task_rows(requests, [], page=99)["page"] == 3
    assert views.task_rows(requests, [], "t24", page=1)["pages"] == 1


def test_money_on_charts_is_never_in_exponent_form() -> None:
    # Charts formatted dollars with "${:.4g}": a nano model's $0.000004 read "$4e-06".
    from router.ui.routes import _usd

    bars = str(charts.hbars([("nano", 0.000004), ("large", 0.0123)], title="t", fmt=_usd))
    columns = str(charts.columns([("now", 0.0000031)], title="t", fmt=_usd))
    assert "$0.00000400" in bars and "$0.0123" in bars and "$0.00000310" in columns
    assert "e-0" not in bars + columns


def test_a_revision_diff_shows_the_policy_lines_and_the_artifact() -> None:
    from router.ui import policyview

    old = b"name: p\nobjective:\n  exploration: {epsilon: 0.2}\n"
    new = b"name: p\nobjective:\n  exploration: {epsilon: 0.1}\nlearned: {artifact: a.json}\n"
    d = policyview.diff("aaaaaaaaaaaa", old, "bbbbbbbbbbbb", new, (None, b"{}"))
    assert d is not None and d["against"] == "aaaaaaaaaaaa"
    assert ("-", "-  exploration: {epsilon: 0.2}") in d["lines"] and (
        "+",
        "+learned: {artifact: a.json}",
    ) in d["lines"]
    assert d["artifact"] == ("none", "44136fa355b3…")  # it read "none…" for an artifact unpinned
    assert policyview.diff("aaaaaaaaaaaa", None, "bbbbbbbbbbbb", new, (None, None)) is None


def test_the_archive_reads_only_revision_folders(tmp_path: Any) -> None:
    from router.policy.revisions import Archive

    archive = Archive(tmp_path / "policy.yaml")
    (archive.dir / "0123456789ab").mkdir(parents=True)
    (archive.dir / "0123456789ab" / "policy.yaml").write_text("name: p\n")
    (tmp_path / "secret").write_text("key")
    assert archive.archived("0123456789ab") == b"name: p\n"
    assert archive.archived("../../secret", "") is None and archive.archived("../../..") is None
    assert archive.archived("0123456789ab", "artifact") is None


async def test_the_task_page_shows_each_request_with_its_fallbacks_and_the_verdict(
    fake: FakeUpstream, tmp_path: Path
) -> None:
    async with serving(tmp_path, [model("a", fake.url, "status=503"), model("b", fake.url)]) as r:
        answer = await r.post(headers={"x-router-task-id": "t1"})
        assert answer.status_code == 200, answer.text
        await r.s.writer.flush()
        said = await r.client.post("/v1/outcomes", json={"task_id": "t1", "success": True})
        assert said.status_code == 200, said.text
        page = await r.client.get("/ui/tasks/t1")
    assert page.status_code == 200
    row = page.text.split('<table id="requests">')[1]
    assert "<strong>b</strong>" in row and "after a (" in row  # served by b, after a failed
    assert "success (explicit)" in page.text and "sent by the client" in page.text


async def test_the_task_page_says_a_verdict_the_router_guessed_is_one(
    fake: FakeUpstream, tmp_path: Path
) -> None:
    # The card said "verdict from outcome_model" and the attempt "success (outcome_model)" while the
    # task list said "success (inferred, P(success) 0.98)" (cfe64fb).
    async with serving(tmp_path, [model("a", fake.url)]) as r:
        answer = await r.post(headers={"x-router-task-id": "t1"})
        assert answer.status_code == 200, answer.text
        await r.s.writer.flush()
        guess = OutcomeRecord("t1", 1, True, 0.983963, LABEL_MODEL, {"signals": []}, time.time(), False)
        await r.s.store.write_outcome(guess)
        page = await r.client.get("/ui/tasks/t1")
    assert page.status_code == 200
    assert '<div class="k">verdict: inferred, P(success) 0.98</div>' in page.text
    attempts = page.text.split('<table id="attempts">')[1].split("</table>")[0]
    assert "<td>success (inferred, P(success) 0.98)</td>" in attempts and "outcome_model" not in attempts


async def test_a_budget_refusal_shows_what_each_candidate_holds(fake: FakeUpstream, tmp_path: Path) -> None:
    # Codex CLI declares a web_search tool in every request: each candidate that runs it (a
    # Responses or Anthropic backend) holds its $0.01 fee on top of tokens. Refused with a task
    # budget of $0.01, the page said "no candidate fits the budget left ($0.010000)" above
    # "a · est. $0.0000xx", a cost the budget plainly covers.
    from router.protocols import OPENAI_RESPONSES

    budget = {"objective": {"max_cost_per_task": 0.01}}
    async with serving(tmp_path, [model("a", fake.url, protocol=OPENAI_RESPONSES)], policy=budget) as r:
        refused = await r.post(
            OPENAI_RESPONSES, tools=[{"type": "web_search"}], headers={"x-router-task-id": "t1"}
        )
        assert refused.status_code == 403, refused.text
        await r.s.writer.flush()
        page = await r.client.get("/ui/tasks/t1")
    row = page.text.split('<table id="requests">')[1]
    assert "no candidate fits the budget left" in row
    # $0.00202 of tokens (1,024 output at $2/M), and the search it may make.
    assert 'est. $0.00202 · <span class="hold"' in row and ">holds $0.0120<" in row, row


def test_a_verdict_says_what_it_rests_on() -> None:
    # The page said "failure (outcome_model) 0.25" for a run the label model put at 0.98: that a
    # tool loop overrode it was only in the outcome's details, in the log.
    def shown(details: dict[str, Any] | None, explicit: bool = False) -> str:
        o = OutcomeRecord("t1", 1, explicit, None if explicit else 0.25, "explicit" if explicit else "outcome_model",
                          details, 0.0, explicit)  # fmt: skip
        return views.task_detail("t1", [], [o])["outcomes"][0].why

    looped = {"p": 0.25, "model": "92bd40c3008a", "signals": ["exit_code", "tool_loop"], "model_p": 0.981705}
    assert (
        shown(looped)
        == "signals read: exit_code, tool_loop; in a tool loop, P at most 0.25 (the label model alone: 0.98)"
    )
    assert shown({"p": 0.9, "signals": []}) == "the label model on the conversation"
    assert shown({"client_source": "cli"}, explicit=True) == "sent from cli"
    assert shown(None, explicit=True) == "sent by the client"


async def test_the_task_page_reads_a_long_task_as_far_as_a_window(fake: FakeUpstream, tmp_path: Path) -> None:
    """Issue 30: /ui/tasks/{id} read every request of a task and laid them out on the event loop
    (a 20k-request task stalled every client, as /v1/tasks/{id} did before it was bounded)."""
    async with serving(tmp_path, [model("a", fake.url)], max_window_requests=3) as r:
        for _ in range(5):
            assert (await r.post(headers={"x-router-task-id": "long"})).status_code == 200
        await r.s.writer.flush()
        page = await r.client.get("/ui/tasks/long")
    assert page.status_code == 200
    shown = page.text.split('<table id="requests">')[1].split("</table>")[0]
    assert shown.count("<tr") - 1 == 3  # the header row, then the latest three requests
    assert "The task's latest 3 requests" in page.text


async def test_the_window_pages_read_the_same_without_the_columns_they_leave_unread(tmp_path: Path) -> None:
    base = full_record()
    requests = [
        replace(base, request_id=f"r{i}", ts=float(i), task_id=f"t{i % 3}", key_id=f"k{i % 2}",
                status=200 if i % 4 else 502, chosen_model="ab"[i % 2], arm="control" if i % 2 else "treated",
                policy_revision="rev", cost_usd=0.01 * i, cost_input_usd=0.005 * i if i % 3 else None,
                queue_ms=None if i == 5 else 1.0, repo="acme/x" if i == 1 else None,
                tries=[TryRecord("a", status=503), TryRecord("ab"[i % 2])] if i % 3 else base.tries)
        for i in range(12)
    ]  # fmt: skip
    outcomes = [_verdict("t0", True, 20.0), _verdict("t1", False, 21.0, "tests")]
    store = open_store(f"sqlite:///{tmp_path / 'log.db'}")
    await store.open()
    await store.write_requests(requests)
    for o in outcomes:
        await store.write_outcome(o)
    everything = await store.requests_since(0.0)
    shown = await store.requests_since(0.0, without=views.UNREAD)
    await store.close()
    assert all(r.prompt is None and r.candidates is None for r in shown)
    assert views.overview(shown, outcomes, 0.0, 30.0) == views.overview(everything, outcomes, 0.0, 30.0)
    assert views.task_rows(shown, outcomes) == views.task_rows(everything, outcomes)
    assert views.latency(shown, outcomes) == views.latency(everything, outcomes)
    assert policyview.arms(shown, outcomes, "rev") == policyview.arms(everything, outcomes, "rev")


async def test_the_task_page_shows_the_request_just_answered(fake: FakeUpstream, tmp_path: Path) -> None:
    # The page read the store alone, which the log's writer fills in batches (every 0.1 s): opened
    # right after a reply it was "no such task", or lacked the latest request (as GET /v1/tasks/{id}
    # was before f6e3128).
    async with serving(tmp_path, [model("a", fake.url)]) as r:
        for n in range(1, 4):
            answer = await r.post(headers={"x-router-task-id": "t-now"})
            assert answer.status_code == 200, answer.text
            page = await r.client.get("/ui/tasks/t-now")
            assert page.status_code == 200, page.text
            assert page.text.split('<table id="requests">')[1].count("<strong>a</strong>") == n
