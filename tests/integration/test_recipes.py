"""The client recipes that are Python libraries (docs/agents.md), run as written against a real router.

(Claude Code and Codex CLI are run in ``test_agents.py``.) Each recipe's code is docs/agents.md's, with
the base URL of the test's router; a library that is not installed skips, saying which.
"""

from __future__ import annotations

import pytest

from tests.integration.conftest import RunningRouter

pytestmark = pytest.mark.integration


def test_openai_agents_sdk_recipe(router: RunningRouter) -> None:
    agents = pytest.importorskip(
        "agents", reason="openai-agents is not installed (pip install openai-agents)"
    )
    from openai import AsyncOpenAI

    # --- the docs/agents.md recipe (base_url from the test's router)
    agents.set_tracing_disabled(True)  # the SDK would otherwise send traces to OpenAI

    @agents.function_tool
    def list_files() -> str:
        """List the files in the repository."""
        return "README.md\nsetup.py"

    client = AsyncOpenAI(base_url=f"{router.url}/v1", api_key="anything")
    agent = agents.Agent(
        name="coder", instructions="You are a coding agent.", tools=[list_files],
        model=agents.OpenAIChatCompletionsModel(model="auto", openai_client=client),
    )  # fmt: skip
    result = agents.Runner.run_sync(agent, "List the files.", max_turns=4)
    # ---
    kinds = [type(item).__name__ for item in result.new_items]
    assert kinds == ["ToolCallItem", "ToolCallOutputItem", "MessageOutputItem"]
    assert "README.md" in result.final_output  # the fake provider read the tool's result back
    rows = router.records(wait_for=2)
    assert [r["status"] for r in rows] == [200, 200] and len({r["task_id"] for r in rows}) == 1
