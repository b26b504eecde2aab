"""A task as the router first sees it: the agent's opening request, parsed by the router's own code.

mini-swe-agent opens a task with a system prompt about working through a shell, the issue text
as the first user message, and (in its tool-calling configuration) one ``bash`` tool. The body
is built as bytes and goes through the OpenAI Chat parser, token counter and task-feature code
that the proxy runs, with the repository as the ``x-router-repo`` header carries it.
"""

from __future__ import annotations

from dataclasses import dataclass

import orjson

from router.features.request import Features
from router.features.task.context import vector_for
from router.features.task.vector import Vector
from router.features.tokens import TokenCounter
from router.learning.evals.loader import Task
from router.policy.pipeline import request_features
from router.protocols import openai_chat

#: The model name the agent asks for; the evaluation policy routes it to every candidate.
REQUESTED_MODEL = "auto"

SYSTEM_PROMPT = (
    "You are a helpful assistant that works on a software repository through a computer shell, "
    "over many turns, to resolve the issue the user describes.\n"
    "Each reply runs exactly one bash command (commands may be chained with && or ||). Before the "
    "command, explain your reasoning in a THOUGHT section.\n"
    "Do not edit test files. When the fix is done and verified, submit it with: "
    "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && git add -A && git diff --cached"
)

BASH_TOOL = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "Run a bash command in the repository's sandbox and return its output.",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string", "description": "The command to run."}},
            "required": ["command"],
        },
    },
}


@dataclass(frozen=True, slots=True)
class Arrival:
    task_id: str
    repo: str
    features: Features
    vector: Vector


def first_request(task: Task) -> bytes:
    """The body of the agent's first call on ``task`` (OpenAI Chat Completions)."""
    body = {
        "model": REQUESTED_MODEL,
        "messages": [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": task.problem_statement},
        ],
        "tools": [BASH_TOOL],
    }
    return orjson.dumps(body)


def arrive(task: Task, counter: TokenCounter) -> Arrival:
    """Parse the first request and compute its features and task vector as the proxy would."""
    headers = {"x-router-repo": task.repo}
    req = openai_chat.parse(first_request(task))
    features = request_features(req, counter.count_request(req), headers)
    return Arrival(task.id, task.repo, features, vector_for(req, headers["x-router-repo"]))
