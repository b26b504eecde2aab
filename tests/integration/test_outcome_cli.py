"""``router outcome`` against the log a running router wrote (issue 30, lesser items)."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest

from router.app.cli import main
from router.fakeupstream import FakeUpstream
from tests.integration.conftest import RunningRouter
from tests.integration.test_faults import HI, faulty

pytestmark = pytest.mark.integration


def test_outcome_refuses_a_task_no_backend_served(
    router_factory: Callable[..., RunningRouter], upstream: FakeUpstream, capsys: pytest.CaptureFixture[str]
) -> None:
    r = router_factory(faulty(upstream, "status=500"))
    for task in ("unserved", "served"):
        model = "solo" if task == "unserved" else "auto"  # auto falls back to the good backend
        resp = httpx.post(r.url + "/v1/chat/completions", json={"model": model, "messages": HI},
                          headers={"x-router-task-id": task}, timeout=20)  # fmt: skip
        assert resp.status_code == (502 if task == "unserved" else 200), resp.text
    r.records(2)
    store = f"sqlite:///{r.db_path}"
    capsys.readouterr()  # the router's own log lines, once a CLI test has sent logging to stderr
    assert main(["outcome", "unserved", "--success", "--store", store]) == 2
    err = capsys.readouterr().err
    assert "no backend served it" in err and err.count("\n") == 1, err
    assert main(["outcome", "served", "--success", "--store", store]) == 0
    assert main(["tasks", "--task", "unserved", "--json", "--store", store]) == 0
    assert '"source": "explicit"' not in capsys.readouterr().out  # nothing was recorded
