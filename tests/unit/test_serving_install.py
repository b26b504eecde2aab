"""A serving install has no scikit-learn (fitting is the ``router[learn]`` extra): the router
serves, decides, labels conversations, previews a policy and draws its dashboard without it."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

#: Run in a fresh interpreter: this test process has imported scikit-learn through other tests.
SCRIPT = textwrap.dedent(
    """
    import asyncio, sys, tempfile
    from pathlib import Path

    sys.modules["sklearn"] = None  # as if not installed: importing it (or any part) fails

    from router.app.cli import main

    from router.fakeupstream import FakeUpstream
    from tests.unit.inprocess import serving
    from tests.unit.requestpath import model

    TOOLS = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]
    CALL = {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": '{"cmd": "pytest"}'}}
    MESSAGES = [
        {"role": "user", "content": "fix the failing test"},
        {"role": "assistant", "content": None, "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "c1", "content": "FAILED tests/test_a.py::test_x\\n1 failed, 2 passed in 0.1s"},
    ]

    async def serve(tmp: Path) -> None:
        with FakeUpstream() as up:
            async with serving(tmp, [model("a", up.url), model("b", up.url)]) as r:
                for _ in range(2):  # the second request reads the conversation the first left
                    answer = await r.post(messages=MESSAGES, tools=TOOLS, headers={"x-router-task-id": "t1"})
                    assert answer.status_code == 200, answer.text
                await r.s.writer.flush()
                labels = await r.s.store.outcomes_since(0.0)
                assert labels, "the conversation was labelled"
                route = await r.client.post("/v1/route", json={"model": "auto", "messages": MESSAGES})
                assert route.status_code == 200, route.text
                for path in ("/v1/policy", "/metrics", "/ui", "/ui/policy", "/ui/tasks"):
                    got = await r.client.get(path)
                    assert got.status_code == 200, (path, got.status_code, got.text[:300])
                text = r.s.settings.config.read_text()
                preview = await r.client.post("/v1/policy/preview", content=text)
                assert preview.status_code == 200, preview.text

    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(serve(Path(tmp)))
    print(sorted(m for m, v in sys.modules.items() if m.split(".")[0] == "sklearn" and v is not None))
    # Fitting says what to install, in one line, not a traceback.
    for command in (["train", "--out", "unused.json"], ["eval"], ["eval-labels"]):
        print(main(command))
    """
)


def test_the_router_serves_without_scikit_learn() -> None:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], cwd=ROOT, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["[]", "2", "2", "2"]
    refusals = [line for line in done.stderr.splitlines() if "pip install 'router[learn]'" in line]
    assert [line.split(":")[0] for line in refusals] == ["router train", "router eval", "router eval-labels"]
