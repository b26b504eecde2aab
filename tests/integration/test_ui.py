"""The dashboard in a real browser (headless Chromium through selenium) against a real router with
logged traffic: what the pages show, search, the task ledger, the policy page, the login.

Needs Debian's ``chromium`` and ``chromium-driver`` (``.ci/run`` installs them); skipped, saying
why, where they are missing. The login's cookie rules are also checked over plain HTTP.
"""

from __future__ import annotations

import math
import re
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from router.fakeupstream import FakeUpstream
from tests.integration.conftest import RunningRouter, local_policy

pytestmark = pytest.mark.integration

MASTER = "ui-master-key-0123456789abcdef"
WAIT_S = 10


def _chrome_paths() -> tuple[str, str] | str:
    browser = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    driver = shutil.which("chromedriver")
    if browser is None or driver is None:
        return "no Chromium/chromedriver on PATH (apt-get install chromium chromium-driver)"
    return browser, driver


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed")
    paths = _chrome_paths()
    if isinstance(paths, str):
        pytest.skip(paths)
    options = webdriver.ChromeOptions()
    options.binary_location = paths[0]
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1300,1600"):  # fmt: skip
        options.add_argument(arg)
    # An explicit driver path: selenium's own manager would try to download one.
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=paths[1]))
    try:
        yield driver
    finally:
        driver.quit()


def wait(driver: Any, condition: Callable[[Any], Any]) -> Any:
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, WAIT_S).until(condition)


def text(driver: Any, css: str) -> str:
    from selenium.webdriver.common.by import By

    return str(driver.find_element(By.CSS_SELECTOR, css).text)


def rows(driver: Any, table_id: str) -> list[str]:
    from selenium.webdriver.common.by import By

    return [str(tr.text) for tr in driver.find_elements(By.CSS_SELECTOR, f"#{table_id} tr")[1:]]


def facts(driver: Any, table_id: str) -> list[str]:
    """The rows of a table of facts (a header cell on each row, no header row)."""
    from selenium.webdriver.common.by import By

    return [str(tr.text) for tr in driver.find_elements(By.CSS_SELECTOR, f"#{table_id} tr")]


def chat(c: httpx.Client, task: str, content: str, headers: dict[str, str] | None = None) -> httpx.Response:
    body = {"model": "auto", "messages": [{"role": "user", "content": content}]}
    r = c.post("/v1/chat/completions", json=body, headers={"x-router-task-id": task, **(headers or {})})
    assert r.status_code == 200, r.text
    return r


def traffic(router: RunningRouter) -> list[dict[str, Any]]:
    """Three tasks: one that succeeds, one that fails, one without a verdict (streamed, on the large
    model through the premium header); returns the log rows."""
    with httpx.Client(base_url=router.url, timeout=30) as c:
        for i in range(3):  # the repository from the URL
            chat(c, "ui-task-alpha", f"Fix https://github.com/acme/widgets/issues/7, step {i}")
        chat(c, "ui-task-beta", "only step", {"x-router-repo": "acme/gadgets"})
        c.post("/v1/chat/completions", headers={"x-router-task-id": "ui-task-gamma", "x-router-tier": "premium"},
               json={"model": "auto", "stream": True, "messages": [{"role": "user", "content": "stream it"}]})  # fmt: skip
        for task, ok in (("ui-task-alpha", True), ("ui-task-beta", False)):
            assert c.post("/v1/outcomes", json={"task_id": task, "success": ok}).status_code == 200
    return router.records(wait_for=5)


@pytest.fixture
def served(
    router_factory: Callable[..., RunningRouter], upstream: FakeUpstream
) -> tuple[RunningRouter, list[dict[str, Any]]]:
    upstream.clear()
    router = router_factory(local_policy(upstream.url))
    return router, traffic(router)


def test_overview_shows_the_logged_traffic(
    browser: Any, served: tuple[RunningRouter, list[dict[str, Any]]]
) -> None:
    router, records = served
    browser.get(f"{router.url}/ui")
    assert text(browser, "#total-requests") == str(len(records)) == "5"
    assert text(browser, "#total-tasks") == "3"
    assert text(browser, "#success-rate") == "50.0%"  # one of the two tasks with a verdict
    spend = sum(r["cost_usd"] for r in records)
    assert text(browser, "#total-spend") == f"${spend:.{2 - math.floor(math.log10(spend))}f}"  # 3 digits
    backends = {r["chosen_model"] for r in records}
    shown = {row.split()[0] for row in rows(browser, "by-backend")}
    assert shown == backends and "local-large" in shown
    share = text(browser, "#share")
    for b in backends:
        n = sum(1 for r in records if r["chosen_model"] == b)
        assert f"{b} — {n} ({100 * n / len(records):.1f}%)" in share
    # the policy revision grouping: every request was decided by the one revision of the file
    assert records[0]["policy_revision"] and {r["policy_revision"] for r in records} == {
        records[0]["policy_revision"]
    }
    assert [row.split()[:2] for row in rows(browser, "by-revision")] == [[records[0]["policy_revision"], "5"]]


def test_every_page_loads_without_a_console_error(
    browser: Any, served: tuple[RunningRouter, list[dict[str, Any]]]
) -> None:
    # Each page asked for /favicon.ico, a 404 the browser's console showed as an error.
    router, _ = served
    browser.get_log("browser")  # what earlier tests left
    for page in ("/ui", "/ui/tasks", "/ui/latency", "/ui/policy", "/ui/tasks/ui-task-alpha"):
        browser.get(f"{router.url}{page}")
        text(browser, "main")  # rendered
        assert [e for e in browser.get_log("browser") if e["level"] == "SEVERE"] == [], page


def test_pages_read_at_most_the_latest_requests_and_say_so(
    browser: Any, router_factory: Callable[..., RunningRouter], upstream: FakeUpstream
) -> None:
    """A busy window is read only up to ``max_window_requests`` (its latest requests), and the page
    says that older ones were left out; under the cap it says nothing."""
    from selenium.webdriver.common.by import By

    upstream.clear()
    router = router_factory(local_policy(upstream.url, **ARMS), max_window_requests=3)
    records = traffic(router)
    browser.get(f"{router.url}/ui")
    assert text(browser, "#total-requests") == "3" and len(records) == 5
    first_shown = sorted(r["ts"] for r in records)[-3]
    notice = text(browser, "p.capped")
    assert (
        notice.startswith("The latest 3 requests of the window, from ") and "router report --since" in notice
    )
    assert time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(first_shown)) in notice
    browser.get(f"{router.url}/ui/tasks")
    assert "The latest 3 requests" in text(browser, "p.capped")
    browser.get(f"{router.url}/ui/policy")
    assert "The latest 3 requests" in text(browser, "p.capped")
    browser.find_element(By.ID, "preview-button").click()  # the file as it is: nothing moves
    wait(browser, lambda d: d.find_elements(By.ID, "preview"))
    assert text(browser, "#preview-summary").startswith("3 requests of 3 tasks decided again")
    assert "The latest 3 requests" in text(browser, "#preview-capped")
    uncapped = router_factory(local_policy(upstream.url), max_window_requests=5)
    traffic(uncapped)
    browser.get(f"{uncapped.url}/ui")
    assert text(browser, "#total-requests") == "5" and "The latest" not in browser.page_source


def test_task_search_and_ledger(browser: Any, served: tuple[RunningRouter, list[dict[str, Any]]]) -> None:
    from selenium.webdriver.common.by import By

    router, records = served
    browser.get(f"{router.url}/ui/tasks")
    listed = [row.split()[0] for row in rows(browser, "tasks")]
    assert listed == ["ui-task-gamma", "ui-task-beta", "ui-task-alpha"]  # most recently active first
    box = browser.find_element(By.ID, "q")
    box.send_keys("alpha")
    box.submit()
    wait(browser, lambda d: "q=alpha" in d.current_url)
    [alpha] = rows(browser, "tasks")
    assert alpha.startswith("ui-task-alpha acme/widgets") and "success (explicit)" in alpha
    browser.get(f"{router.url}/ui/tasks?q=GADGETS")
    assert [row.split()[:2] for row in rows(browser, "tasks")] == [["ui-task-beta", "acme/gadgets"]]
    browser.get(f"{router.url}/ui/tasks?q=alpha")
    browser.find_element(By.LINK_TEXT, "ui-task-alpha").click()
    wait(browser, lambda d: d.current_url.endswith("/ui/tasks/ui-task-alpha"))
    assert text(browser, "#task-id") == "ui-task-alpha"
    assert text(browser, "#task-verdict") == "success"
    logged = [r for r in records if r["task_id"] == "ui-task-alpha"]
    shown = rows(browser, "requests")
    assert len(shown) == len(logged) == 3
    for row, rec in zip(shown, logged, strict=True):
        assert f"auto → {rec['chosen_model']}" in row
        assert rec["decision_reason"] in row
    browser.get(f"{router.url}/ui/tasks?q=no-such-thing")
    assert "No task matches" in text(browser, "#no-tasks")


def test_latency_page_shows_phases_and_load(
    browser: Any, served: tuple[RunningRouter, list[dict[str, Any]]]
) -> None:
    router, records = served
    browser.get(f"{router.url}/ui/latency")
    assert text(browser, "#load").startswith(f"Measured under: {len(records)} requests")
    phases = rows(browser, "phases")
    assert sum(1 for r in records if r["ttft_ms"] is not None) == 1
    ttft_row = next(row for row in phases if row.startswith("TTFT"))
    assert ttft_row.split()[1] == "1"  # n: only the streamed request has a first token
    assert any(row.startswith("end to end 5 ") for row in phases), phases
    assert {row.split()[0] for row in rows(browser, "per-backend")} == {r["chosen_model"] for r in records}


def test_policy_page_shows_the_file_and_a_rejected_reload(
    browser: Any, served: tuple[RunningRouter, list[dict[str, Any]]]
) -> None:
    router, _ = served
    policy_file = router.db_path.parent / "policy.yaml"
    browser.get(f"{router.url}/ui/policy")
    assert "the file on disk is the one running" in text(browser, "#rejected")
    revision = text(browser, "#revision")
    assert "local-demo" in text(browser, "#yaml")
    assert {row.split()[0] for row in rows(browser, "models")} == {
        "local-nano",
        "local-mini",
        "local-large",
        "local-claude",
    }
    spec = yaml.safe_load(policy_file.read_text())
    assert spec["routes"][0]["candidates"][1] == "local-mini"
    spec["routes"][0]["candidates"][1] = "local-mni"
    policy_file.write_text(yaml.safe_dump(spec))

    def rejected_shown(d: Any) -> bool:
        d.refresh()
        return "was not applied" in text(d, "#rejected")

    browser.set_window_size(1280, 1600)
    try:
        wait(browser, rejected_shown)
        error = text(browser, "#rejected pre")
        assert "unknown model id 'local-mni' (did you mean 'local-mini'?)" in error
        assert text(browser, "#revision") == revision  # the running policy stayed
        # The error wraps instead of scrolling its "did you mean" out of sight: unwrapped, its
        # line (with the file's path) is wider than the page at 1280 pixels.
        unwrapped, wrapped, shown = browser.execute_script(
            "const e = document.querySelector('#rejected pre'); const w = e.style.whiteSpace;"
            "e.style.whiteSpace = 'pre'; const before = e.scrollWidth; e.style.whiteSpace = w;"
            "return [before, e.scrollWidth, e.clientWidth];"
        )
        assert unwrapped > shown >= wrapped
    finally:
        browser.set_window_size(1300, 1600)


def test_policy_preview_of_an_edit(browser: Any, served: tuple[RunningRouter, list[dict[str, Any]]]) -> None:
    from selenium.webdriver.common.by import By

    router, records = served
    browser.get(f"{router.url}/ui/policy")
    box = browser.find_element(By.ID, "edit")
    spec = yaml.safe_load(box.get_attribute("value"))
    assert spec["routes"][0]["match"] == "auto"
    spec["routes"][0]["candidates"] = ["local-mini", "local-large"]
    edited = yaml.safe_dump(spec)
    browser.execute_script("arguments[0].value = arguments[1];", box, edited)
    browser.find_element(By.ID, "preview-button").click()
    wait(browser, lambda d: d.find_elements(By.ID, "preview"))
    nano = sum(1 for r in records if r["chosen_model"] == "local-nano")
    assert nano == 4  # alpha's three and beta's one: the edit takes local-nano away from "auto"
    assert [row.split() for row in rows(browser, "moves")] == [["local-nano", "->", "local-mini", str(nano)]]
    assert f"{nano} would move" in text(browser, "#preview-summary")
    # Why a projection is missing, not "no data": this policy has no learned routing at all.
    assert "(learned_model): n/a (the policy routes by cheapest, with no learned model of success)" in text(
        browser, "#preview"
    )
    assert "file on disk is the one running" in text(browser, "#rejected")  # nothing was applied
    box = browser.find_element(By.ID, "edit")
    browser.execute_script("arguments[0].value = arguments[1];", box, edited.replace("models:", "modelz:", 1))
    browser.find_element(By.ID, "preview-button").click()
    assert "modelz" in wait(browser, lambda d: d.find_element(By.ID, "preview-error")).text


def test_login_with_the_master_key(
    browser: Any, router_factory: Callable[..., RunningRouter], upstream: FakeUpstream
) -> None:
    from selenium.webdriver.common.by import By

    router = router_factory(local_policy(upstream.url), master_key=MASTER)
    with httpx.Client(base_url=router.url, timeout=30, headers={"authorization": f"Bearer {MASTER}"}) as c:
        chat(c, "ui-locked-task", "hello")
    router.records(wait_for=1)
    browser.delete_all_cookies()
    browser.get(f"{router.url}/ui/tasks")
    wait(browser, lambda d: "/ui/login" in d.current_url)
    browser.find_element(By.ID, "key").send_keys("not-the-key")
    browser.find_element(By.ID, "key").submit()
    assert "not the master key" in wait(browser, lambda d: d.find_element(By.ID, "login-error")).text
    browser.find_element(By.ID, "key").send_keys(MASTER)
    browser.find_element(By.ID, "key").submit()
    wait(browser, lambda d: d.current_url.endswith("/ui/tasks"))  # back where it was going
    assert [row.split()[0] for row in rows(browser, "tasks")] == ["ui-locked-task"]
    assert MASTER not in browser.current_url
    [cookie] = browser.get_cookies()
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and MASTER not in cookie["value"]
    browser.find_element(By.CSS_SELECTOR, "header button").click()
    wait(browser, lambda d: "/ui/login" in d.current_url)
    browser.get(f"{router.url}/ui")
    assert "/ui/login" in browser.current_url


def test_login_rules_over_http(router_factory: Callable[..., RunningRouter], upstream: FakeUpstream) -> None:
    router = router_factory(local_policy(upstream.url), master_key=MASTER)
    with httpx.Client(base_url=router.url, timeout=30) as c:
        for path in ("/ui", "/ui/tasks", "/ui/tasks/x", "/ui/latency", "/ui/policy"):
            r = c.get(path)
            assert r.status_code == 303 and r.headers["location"].startswith("/ui/login?next="), path
        # the API key headers do not open the pages: only the session cookie does
        assert c.get("/ui", headers={"authorization": f"Bearer {MASTER}"}).status_code == 303
        c.cookies.set("router_ui", "9999999999.forged")
        assert c.get("/ui").status_code == 303
        c.cookies.clear()
        bad = c.post("/ui/login", data={"key": "wrong", "next": "/ui"})
        assert bad.status_code == 401 and "set-cookie" not in bad.headers
        off_site = c.post("/ui/login", data={"key": MASTER, "next": "//evil.example/"})
        assert off_site.status_code == 303 and off_site.headers["location"] == "/ui"
        cookie = off_site.headers["set-cookie"].lower()
        assert "httponly" in cookie and "samesite=strict" in cookie and "path=/ui" in cookie
        assert MASTER.lower() not in cookie
        assert c.get("/ui").status_code == 200  # the client kept the cookie


def test_virtual_keys_without_a_master_key_keep_the_pages_locked(
    router_factory: Callable[..., RunningRouter], upstream: FakeUpstream, capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:  # fmt: skip
    from router.app.cli import main

    store = f"sqlite:///{tmp_path / 'keys.db'}"
    assert main(["keys", "create", "--store", store, "--name", "agent"]) == 0
    capsys.readouterr()
    router = router_factory(local_policy(upstream.url), store=store)
    with httpx.Client(base_url=router.url, timeout=30) as c:
        r = c.get("/ui")
        assert r.status_code == 403 and "needs a master key" in r.text


def test_demo_serve_prints_the_dashboard_that_shows_its_requests(tmp_path: Path) -> None:
    """On a fresh checkout: ``router demo --serve`` names the dashboard, and it lists the demo's requests."""
    import os
    import re
    import signal
    import subprocess
    import sys
    import time

    db = tmp_path / "demo.db"
    proc = subprocess.Popen(
        [sys.executable, "-m", "router.app.cli", "demo", "--serve", "--port", "0", "--store", f"sqlite:///{db}"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path,
        env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        lines = []
        for line in proc.stdout:
            lines.append(line)
            found = re.search(r"Dashboard: (http://127\.0\.0\.1:\d+/ui)", line)
            if found:
                break
        else:
            pytest.fail("no dashboard URL in the demo's output:\n" + "".join(lines))
        deadline = time.monotonic() + WAIT_S
        with httpx.Client(timeout=10) as c:
            while True:  # the log writer flushes in the background, every quarter second
                page = c.get(found.group(1)).text
                shown = re.search(r'id="total-requests">(\d+)<', page)
                if (shown and shown.group(1) == "7") or time.monotonic() > deadline:
                    break
        assert shown is not None and shown.group(1) == "7", page  # the demo sends seven requests
        assert "local-demo" in page
    finally:
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=60)


ARMS = {"control": {"share": 0.5, "route": {"passthrough": "local-mini"}}}
SCOPES = [
    {
        "name": "acme",
        "match": {"repo": "acme/*"},
        "routes": [{"match": "auto", "passthrough": "local-large"}],
    },
    {"name": "team-x", "match": {"team": "x", "key": "vk-*"}, "objective": {"max_attempts": 2}},
]


def poll(get: Callable[[], Any], done: Callable[[Any], bool]) -> Any:
    import time

    deadline = time.monotonic() + WAIT_S
    while not done(value := get()):
        assert time.monotonic() < deadline, f"not reached: {value}"
        time.sleep(0.1)
    return value


def test_policy_page_shows_the_arms_the_guard_and_the_scopes(
    browser: Any, router_factory: Callable[..., RunningRouter], upstream: FakeUpstream,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    import json

    from selenium.webdriver.common.by import By

    from router.app.cli import main
    from router.ui.routes import _ms, _pct, _usd

    upstream.clear()
    guard = {"min_tasks": 50, "check_every_s": 0.2, "max_success_drop": 0.04}
    router = router_factory(local_policy(upstream.url, **ARMS, guard=guard, scopes=SCOPES))
    with httpx.Client(base_url=router.url, timeout=30) as c:
        for i in range(12):
            chat(c, f"ui-arm-{i}", f"step of task {i}")
            if i < 10:  # two without a verdict yet
                ok = i % 3 != 0
                assert (
                    c.post("/v1/outcomes", json={"task_id": f"ui-arm-{i}", "success": ok}).status_code == 200
                )
        router.records(wait_for=12)
        state = poll(lambda: c.get("/v1/policy").json()["guard"],
                     lambda g: g is not None and g["control_tasks"] + g["treated_tasks"] == 10)  # fmt: skip
    capsys.readouterr()
    store = f"sqlite:///{router.db_path}"
    assert main(["report", "--by", "arm", "--since", "7d", "--store", store, "--json"]) == 0
    [revision] = json.loads(capsys.readouterr().out)["revisions"]
    assert set(revision["arms"]) == {"control", "treated"}

    browser.get(f"{router.url}/ui/policy")
    control = text(browser, "#control")
    assert "50.0% of tasks" in control and "passthrough local-mini" in control
    expected = []
    for arm in ("control", "treated"):
        s = revision["arms"][arm]
        lo, hi = s["success_ci95"]
        cost = "n/a"
        if s["cost_per_completed_usd"] is not None:
            clo, chi = s["cost_per_completed_ci95"]
            cost = f"{_usd(s['cost_per_completed_usd'])} ({_usd(clo)}–{_usd(chi)})"
        expected.append(
            f"{arm} {s['tasks']} {s['with_outcome']} {s['completed']:g} {_pct(s['success_rate'])} "
            f"({_pct(lo)}–{_pct(hi)}) {cost} {_ms(s['latency_ms']['p50'])} / {_ms(s['latency_ms']['p95'])}"
        )
    assert rows(browser, "arms") == expected
    assert sum(s["tasks"] for s in revision["arms"].values()) == 12
    assert "router report --by arm --since 7d" in text(browser, "main")
    # The chart draws each arm's success with its interval, as the table gives it.
    [success_chart] = [
        svg.get_attribute("innerHTML")
        for svg in browser.find_elements(By.CSS_SELECTOR, "svg.chart")
        if "success rate per arm" in svg.get_attribute("innerHTML")
    ]
    for arm, s in revision["arms"].items():
        lo, hi = s["success_ci95"]
        assert f"{arm}: {_pct(s['success_rate'])} ({_pct(lo)}–{_pct(hi)})" in success_chart
    # The guard: its settings and the state GET /v1/policy gives.
    config = facts(browser, "guard-config")
    assert "tasks with an outcome needed per arm 50" in config and any("4.0%" in r for r in config)
    assert not browser.find_elements(By.ID, "guard-status")  # "waiting: …" says it
    assert text(browser, "#guard-reason") == state["reason"]
    assert state["reason"].startswith("waiting: ") and "50 needed in each" in state["reason"]
    assert f"{state['control_tasks']} / 50" in text(browser, "#guard-state")
    assert rows(browser, "scopes") == [
        "acme repo = acme/*\nroute auto → passthrough local-large (in place of the policy's)",
        "team-x key = vk-*, team = x\nobjective: max_attempts = 2",
    ]


def test_policy_page_shows_a_rollback_in_words(
    browser: Any, router_factory: Callable[..., RunningRouter], upstream: FakeUpstream
) -> None:
    from router.ui.routes import _when_utc

    upstream.clear()
    guard = {"min_tasks": 10, "check_every_s": 0.2, "max_success_drop": 0.05}
    good = {**local_policy(upstream.url), **ARMS, "guard": guard, "rules": [], "name": "good",
            "routes": [{"match": "auto", "passthrough": "local-mini"}]}  # fmt: skip
    worse = {**good, "name": "worse", "routes": [{"match": "auto", "passthrough": "local-nano"}]}
    router = router_factory(good)
    with httpx.Client(base_url=router.url, timeout=30) as c:
        first = c.get("/v1/policy").json()["revision"]
        (router.db_path.parent / "policy.yaml").write_text(yaml.safe_dump(worse))
        bad = poll(lambda: c.get("/v1/policy").json(), lambda p: p["name"] == "worse")["revision"]
        upstream.set_behaviour("nano-model", status=500)  # the treated arm fails
        try:
            for i in range(300):
                if c.get("/v1/policy").json()["name"] != "worse":
                    break
                body = {"model": "auto", "messages": [{"role": "user", "content": f"task {i}"}]}
                r = c.post("/v1/chat/completions", json=body, headers={"x-router-task-id": f"ui-guard-{i}"})
                verdict = {"task_id": f"ui-guard-{i}", "success": r.status_code == 200}
                assert c.post("/v1/outcomes", json=verdict).status_code == 200
        finally:
            upstream.set_behaviour("nano-model")
        policy = poll(lambda: c.get("/v1/policy").json(), lambda p: p["revision"] == first)
    rollback = policy["last_rollback"]
    assert rollback["from"] == bad and rollback["to"] == first

    browser.get(f"{router.url}/ui/policy")
    assert facts(browser, "rollback") == [
        f"from {bad} (rolled back)",
        f"to {first} (the revision in force)",
        f"when {_when_utc(rollback['at'])}",
        f"reason {rollback['reason']}",
    ]
    assert rollback["reason"].startswith("guard: success")
    assert str(int(rollback["at"])) not in text(browser, "#rollback")  # a time, not epoch seconds
    # The arms are the revision put back's (a task may have arrived just after the rollback); the
    # one rolled back is named with the window's others.
    assert bad in text(browser, "#other-revisions")
    assert f"{first}'s tasks" in text(browser, "main") or "No task of revision" in text(browser, "#arms")


SHOTS = Path("/tmp/router-ui-shots")
WIDE = 1400


def fits(driver: Any, name: str) -> None:
    """The page is as wide as the window at most (no sideways scrolling), and a screenshot of it."""
    SHOTS.mkdir(exist_ok=True)
    height = driver.execute_script("return document.documentElement.scrollHeight")
    driver.set_window_size(WIDE, min(max(height + 150, 900), 6000))
    driver.save_screenshot(str(SHOTS / f"{name}.png"))
    width = driver.execute_script("return document.documentElement.scrollWidth")
    assert width <= WIDE, f"{name}: {width} px wide"
    # Money never in exponent form ($4e-06): every figure of the page's text and its charts' labels.
    page = driver.execute_script("return document.body.innerText + document.body.innerHTML")
    assert not re.search(r"\$\d(\.\d+)?e-?\d", page), name


def test_the_dashboard_an_operator_keeps_open(
    browser: Any, router_factory: Callable[..., RunningRouter], upstream: FakeUpstream,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """Errors by status and reason; spend and requests per key and per route; success and cost per
    completed task per revision on one row; token totals; what changed between revisions; the task
    list in pages; the preview's result and its errors where the eye is after submit; every page
    within 1400 px and no money in exponent form."""
    import json

    from selenium.webdriver.common.by import By

    from router.app.cli import main
    from router.telemetry.ledger import tokens

    upstream.clear()
    policy = local_policy(upstream.url)
    # A backend whose provider answers every call with a 500 (the fake provider reads "@status=").
    policy["models"].append(
        {**policy["models"][0], "id": "local-broken", "litellm_model": "openai/nano-model@status=500"}
    )
    policy["routes"].append({"match": "broken", "passthrough": "local-broken"})
    router = router_factory(policy, master_key=MASTER)
    store = f"sqlite:///{router.db_path}"
    assert main(["keys", "create", "--store", store, "--name", "ci-bot", "--json"]) == 0
    ci_key = json.loads(capsys.readouterr().out)["key"]
    master = {"authorization": f"Bearer {MASTER}"}
    policy_file = router.db_path.parent / "policy.yaml"
    with httpx.Client(base_url=router.url, timeout=30) as c:
        for i in range(105):  # more than a page of tasks; a fifth of them labelled, half of those done
            key = master if i % 2 else {"authorization": f"Bearer {ci_key}"}  # the even ones the CI key's
            chat(c, f"op-task-{i:03d}", f"step of task {i}", key)
            if i % 5 == 0:
                done = {"task_id": f"op-task-{i:03d}", "success": i % 10 == 0}
                assert c.post("/v1/outcomes", json=done, headers=key).status_code == 200
        assert c.post("/v1/chat/completions", headers=master,
                      json={"model": "no-such", "messages": [{"role": "user", "content": "x"}]}).status_code == 404  # fmt: skip
        broken = c.post("/v1/chat/completions", headers={**master, "x-router-task-id": "op-broken"},
                        json={"model": "broken", "messages": [{"role": "user", "content": "x"}]})  # fmt: skip
        assert broken.status_code >= 500
        # A second revision: the file edited while serving (what the diff must show).
        spec = yaml.safe_load(policy_file.read_text())
        spec["objective"]["exploration"] = {"epsilon": 0.05}
        policy_file.write_text(yaml.safe_dump(spec))
        poll(lambda: c.get("/v1/policy", headers=master).json()["previous"], bool)
        for i in range(3):
            chat(c, f"op-late-{i}", "after the edit", master)
            c.post("/v1/outcomes", json={"task_id": f"op-late-{i}", "success": True}, headers=master)
    records = router.records(wait_for=111)
    browser.delete_all_cookies()
    browser.get(f"{router.url}/ui/login")
    browser.find_element(By.ID, "key").send_keys(MASTER)
    browser.find_element(By.ID, "key").submit()
    wait(browser, lambda d: d.current_url.endswith("/ui"))
    try:
        # Overview: errors, tokens, the headline's unlabelled spend, per key and per route, per revision.
        kinds = rows(browser, "error-kinds")
        assert any(r.startswith("404 UnknownModel 1") for r in kinds), kinds
        assert len(kinds) == 2, kinds
        assert any(r.split()[2:4] == ["1", "local-broken"] and r.startswith("5") for r in kinds), kinds
        inputs, outputs = (sum(r[c] or 0 for r in records) for c in ("input_tokens", "output_tokens"))
        assert text(browser, "#total-tokens") == f"{tokens(inputs)} / {tokens(outputs)}"
        assert "on tasks without a verdict" in text(browser, "#unlabelled-spend")
        keys = {row.split()[0]: row for row in rows(browser, "by-key")}
        assert set(keys) == {"ci-bot", "(master"}, keys
        assert keys["ci-bot"].split()[2] == "53"  # its requests: the even tasks
        routes = {row.split()[0] for row in rows(browser, "by-route")}
        assert {"auto", "no-such", "broken"} <= routes, routes
        revisions = rows(browser, "by-revision")
        revisions = [r for r in revisions if not r.startswith("(none)")]  # the refused request: no policy
        assert len(revisions) == 2 and revisions[1].split()[1:7] == [
            "3",
            revisions[1].split()[2],
            "3",
            "3",
            "3",
            "100.0%",
        ]
        fits(browser, "overview")
        # Tasks: in pages, not capped.
        browser.get(f"{router.url}/ui/tasks")
        assert len(rows(browser, "tasks")) == 100 and "page 1 of 2" in text(browser, "#pages")
        browser.find_element(By.ID, "page-next").click()
        wait(browser, lambda d: "page=2" in d.current_url)
        assert len(rows(browser, "tasks")) == 110 - 100 and "page 2 of 2" in text(
            browser, "#pages"
        )  # and op-broken, the late ones, the refused one
        fits(browser, "tasks-page-2")
        browser.get(f"{router.url}/ui/tasks/op-task-001")  # the master key's: the CI key's ids are scoped
        assert "local-nano · est. $" in text(browser, "#requests")
        fits(browser, "task")
        browser.get(f"{router.url}/ui/latency")
        fits(browser, "latency")
        # Policy: what changed between the revisions.
        browser.get(f"{router.url}/ui/policy")
        diff = text(browser, "#diff-lines")
        assert "-    epsilon: 0.0\n+    epsilon: 0.05" in diff, diff
        fits(browser, "policy")
        # The preview's result, and an error, in view right after submit.
        browser.set_window_size(WIDE, 900)
        browser.find_element(By.ID, "preview-button").click()
        wait(browser, lambda d: d.find_elements(By.ID, "preview"))
        assert browser.execute_script(
            "const r = document.getElementById('preview-result').getBoundingClientRect();"
            "return r.top >= 0 && r.top < window.innerHeight;"
        )
        browser.save_screenshot(str(SHOTS / "preview-result.png"))
        box = browser.find_element(By.ID, "edit")
        browser.execute_script("arguments[0].value = 'modelz: []';", box)
        browser.find_element(By.ID, "preview-button").click()
        wait(browser, lambda d: d.find_elements(By.ID, "preview-error"))
        assert browser.execute_script(
            "const r = document.getElementById('preview-error').getBoundingClientRect();"
            "return r.top >= 0 && r.top < window.innerHeight;"
        )
        browser.save_screenshot(str(SHOTS / "preview-error.png"))
    finally:
        browser.set_window_size(1300, 1600)


def test_sessions_end_at_logout_and_other_sites_cannot_post(
    router_factory: Callable[..., RunningRouter], upstream: FakeUpstream
) -> None:
    """Issue 30: a session kept working after logout, a crafted cookie gave a 500, and the
    dashboard's forms took posts from any site's page."""
    router = router_factory(local_policy(upstream.url), master_key=MASTER)
    with httpx.Client(base_url=router.url, timeout=30) as c:
        for crafted in ("²³.x", "1.ab.é", "9" * 400 + ".a.b"):
            assert c.get("/ui", headers={"cookie": f"router_ui={crafted}".encode()}).status_code == 303, (
                crafted
            )
        assert c.post("/ui/login", data={"key": MASTER, "next": "/ui"}).status_code == 303
        kept = c.cookies["router_ui"]
        assert c.get("/ui").status_code == 200
        evil = {"origin": "https://evil.example"}
        preview = c.post("/ui/policy/preview", data={"yaml": "x: 1"}, headers=evil)
        assert preview.status_code == 403
        assert (
            c.post("/ui/policy/preview", data={"yaml": "x: 1"}, headers={"origin": router.url}).status_code
            == 400
        )
        assert c.post("/ui/login", data={"key": MASTER}, headers=evil).status_code == 403
        assert c.post("/ui/logout", headers=evil).status_code == 403
        assert c.get("/ui").status_code == 200  # a cross-site logout did not end it either
        assert c.post("/ui/logout").status_code == 303
        c.cookies.clear()
        assert c.get("/ui", headers={"cookie": f"router_ui={kept}"}).status_code == 303, (
            "logged out, still in"
        )
