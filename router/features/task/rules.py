"""What a task's context reads of the policy in force, built once per policy (``Policy.task_rules``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from router.features.labels.model import LabelModel
from router.features.task.attempt import AttemptControl


@dataclass(frozen=True, slots=True)
class TaskRules:
    #: Tool-less calls with at most this many output tokens and a short history are side calls.
    side_call_max_tokens: int
    #: The same tool call repeated this many times is a loop (a reason to switch models).
    loop_threshold: int
    #: Leave the pinned model when the attempt's P(success) falls below this (None: never).
    escalate_below: float | None
    #: The task's budget (``objective.max_cost_per_task``): what is left of it steers the plan.
    max_cost_per_task: float | None
    #: The outcome label model that reads the conversation.
    label_model: LabelModel
    #: Per model, the rules that end an attempt early (``router.features.task.attempt``).
    attempt_controls: Mapping[str, AttemptControl] = field(default_factory=dict)
    #: How long a task is remembered without a request (``tasks.abandon_after_s``): shared marks expire then.
    abandon_after_s: float = 1800.0
