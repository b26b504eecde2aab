"""What the router keeps per task: a packed vector (the same to every reader, and small), within a bound."""

from __future__ import annotations

import itertools
import json
import math
import re
import tracemalloc
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from router.app.settings import Settings
from router.features.task.identity import task_id_of
from router.features.task.tracker import TaskTracker
from router.features.task.vector import NUMERIC, Packed, arrays, repo_hint, task_vector, to_json, with_attempt
from router.learning.training.fit import fit
from router.policy.learned import LearnedScorer, Objective
from router.protocols import openai_chat
from router.protocols.common import ClientRequest
from router.shared import AttemptMark
from tests.unit.test_plan import rows_for

TASKS = Path(__file__).resolve().parents[2] / "evals" / "data" / "swebench-verified" / "tasks.jsonl"


def issues(n: int) -> list[str]:
    with TASKS.open() as f:
        return [json.loads(line)["problem_statement"] for line, _ in zip(f, range(n), strict=False)]


def reference_vector(text: str) -> dict[int, float]:
    """The hashed text features as defined: one signed bucket per word and word pair, counts
    log-scaled, L2-normalised, in the order each bucket first occurs; then the repository's."""
    words = re.findall(r"[a-z_][a-z0-9_]{1,30}", text.lower())
    counts: dict[int, float] = {}
    for g in [*words, *(f"{a} {b}" for a, b in itertools.pairwise(words))]:
        h = zlib.crc32(g.encode())
        counts[(h >> 1) % 2048] = counts.get((h >> 1) % 2048, 0.0) + (1.0 if h & 1 else -1.0)
    scaled = {i: math.copysign(math.log1p(abs(v)), v) for i, v in counts.items() if v}
    norm = math.sqrt(sum(v * v for v in scaled.values())) or 1.0
    out = {len(NUMERIC) + i: v / norm for i, v in scaled.items()}
    repo = repo_hint(text)
    if repo:  # the repository's own slot, at full weight
        slot = len(NUMERIC) + (zlib.crc32(f"repo:{repo.lower()}".encode()) >> 1) % 2048
        out[slot] = out.get(slot, 0.0) + 1.0
    return out


@pytest.mark.parametrize("text", [*issues(40), "", "a", "ab ab ab", "ab cd ab cd", "ÉTÉ été été_x"])
def test_the_hashed_features_are_exactly_the_per_word_sums(text: str) -> None:
    vec = task_vector(text)
    hashed = {i: v for i, v in vec.items() if i >= len(NUMERIC)}
    ref = reference_vector(text)
    assert list(hashed.items()) == list(ref.items())  # the same floats, in the same order


@pytest.mark.parametrize(
    ("text", "traceback"),
    [
        ("Traceback (most recent call last):\n  File x", True),
        ("thread 'main' panicked at src/lib.rs:3:5", True),
        ("    at com.x.Foo.bar(Foo.java:42)", True),
        ("at Foo.bar(Foo.java:42)", True),  # a frame at the very start
        ("Error\n\tat $x.y (a.js:1)", False),  # a space before the parenthesis
        ("at Object.<anonymous>(a.js:1)", False),
        ("that foo(a.py:12)", False),  # "at" inside a word is no frame
        ("éat foo(a.py:12)", False),
        ("-at foo(a.py:12)", True),
        ("at foo(a.py:x)", False),
        ("look at this(see line:3) now", True),
    ],
)
def test_a_traceback_is_a_traceback_header_a_panic_or_a_stack_frame(text: str, traceback: bool) -> None:
    assert task_vector(text)[NUMERIC.index("has_traceback")] == float(traceback)
    pattern = r"Traceback \(most recent call last\)|\bat [\w.$]+\(.*:\d+\)|panicked at"
    assert bool(re.search(pattern, text)) == traceback  # the definition it stands for


def test_a_packed_vector_reads_as_the_dict_it_was_made_from() -> None:
    vec = task_vector(issues(1)[0], "You are a coding agent.", 12, "astropy/astropy")
    packed = Packed(vec)
    assert packed == vec and dict(packed.items()) == vec
    assert len(packed) == len(vec) and list(packed) == sorted(vec)
    first = min(vec)
    assert packed[first] == vec[first] and packed.get(-1) is None and first in packed
    with pytest.raises(KeyError):
        packed[10**6]
    assert to_json(packed) == to_json(vec)
    assert with_attempt(packed, 2) == with_attempt(vec, 2)
    idx, vals = arrays(packed)
    assert dict(zip(idx.tolist(), vals.tolist(), strict=True)) == vec
    with pytest.raises(ValueError):
        vals[0] = 1.0  # shared with the scorer's memory: read-only


def test_the_scorer_answers_the_same_for_a_packed_vector() -> None:
    artifact = fit(rows_for(40))
    scorer = LearnedScorer(artifact, Objective(max_attempts=3))
    for text in ("fix the race deadlock 7", "fix the typo docstring 8", *issues(5)):
        vec = task_vector(text)
        for attempt in (1, 2):
            plan, opts = scorer.plan(vec, ["cheap", "strong"], attempt=attempt)
            plan_p, opts_p = scorer.plan(Packed(vec), ["cheap", "strong"], attempt=attempt)
            assert plan_p == plan and opts_p == opts
        assert artifact.models["cheap"].p_success(Packed(vec)) == pytest.approx(
            artifact.models["cheap"].p_success(vec), rel=1e-12
        )


def test_a_remembered_task_costs_a_few_kilobytes() -> None:
    # Real issues hash to ~200 features; the tracker remembers up to 100k tasks.
    texts = issues(100)
    features = sum(len(task_vector(t)) for t in texts)

    def bytes_per_feature(make: Callable[[str], object]) -> float:
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            kept = [make(t) for t in texts]
            after = tracemalloc.get_traced_memory()[0]
        finally:
            tracemalloc.stop()
        assert len(kept) == len(texts)
        return (after - before) / features

    assert bytes_per_feature(lambda t: Packed(task_vector(t))) < 16
    assert bytes_per_feature(task_vector) > 60  # a dict of Python numbers: why it is packed


def test_the_tracker_forgets_the_least_recently_seen_task_past_its_bound() -> None:
    tracker = TaskTracker(max_tasks=2)
    tracker.get("a").attempt = 2
    tracker.get("b")
    tracker.get("a")  # seen again: now "b" is the oldest
    tracker.get("c")
    assert tracker.peek("b") is None and tracker.peek("a") is not None and tracker.peek("a").attempt == 2
    with pytest.raises(ValidationError, match="max_tasks"):
        Settings(max_tasks=0)


def test_one_key_cannot_push_every_other_task_out() -> None:
    tracker = TaskTracker(max_tasks=10, key_share=0.2)  # two tasks a key
    tracker.get("key_aa/victim").attempt = 2
    tracker.get("shared-open-mode-task").attempt = 3
    for i in range(50):
        tracker.get(f"key_bb/flood-{i}")
    assert tracker.peek("key_aa/victim").attempt == 2  # type: ignore[union-attr]
    assert tracker.peek("shared-open-mode-task").attempt == 3  # type: ignore[union-attr]
    assert [t for t in ("key_bb/flood-48", "key_bb/flood-49", "key_bb/flood-47") if tracker.peek(t)] == [
        "key_bb/flood-48", "key_bb/flood-49"]  # fmt: skip


def chat(*messages: dict[str, Any]) -> ClientRequest:
    return openai_chat.parse(json.dumps({"model": "auto", "messages": list(messages)}).encode())


OPEN = {"role": "user", "content": "fix the leap-year bug"}
TURN = ({"role": "assistant", "content": "looking"}, {"role": "user", "content": "go on"})


def test_what_another_replica_wrote_of_the_attempt_is_taken_in_before_the_request_advances_it() -> None:
    tracker = TaskTracker()
    # B served two calls of attempt 1: a cap here counts them.
    assert tracker.begin("t", chat(OPEN, *TURN), None, AttemptMark(1, calls=2)).calls == 2
    # B heard the attempt failed: the conversation's restart here opens attempt 2, calls afresh.
    state = tracker.begin("t", chat(OPEN), None, AttemptMark(1, 2, failed=True))
    assert (state.attempt, state.calls, state.failed_open) == (2, 0, False)
    # A mark of an earlier attempt than ours says nothing new.
    tracker.served(state, "local-mini", 100, 60, side_call=False)
    assert tracker.begin("t", chat(OPEN, *TURN), None, AttemptMark(1, 9, failed=True)).calls == 1
    # B went on to attempt 3 and stopped it: its calls are refused here too, and what ours was
    # pinned to counts as failed.
    stop = ("attempt stopped by the router on local-large: ...", "max_calls_per_attempt")
    state = tracker.begin("t", chat(OPEN, *TURN), None, AttemptMark(3, 4, True, stop))
    assert (state.attempt, state.calls, state.stopped, state.stop_said) == (3, 4, 3, stop)
    assert state.failed_models == ["local-mini"] and state.pinned is None
    # The preview takes it in as well, on a copy.
    assert tracker.preview("t", chat(OPEN, *TURN), None, AttemptMark(4, 1)).attempt == 4
    assert tracker.peek("t").attempt == 3  # type: ignore[union-attr]


def test_a_served_call_leaves_its_prompt_warm_with_what_the_provider_cached_of_it() -> None:
    tracker = TaskTracker()
    state = tracker.begin("t", chat(OPEN), None)
    tracker.served(state, "local-mini", 9_000, 60, side_call=False, cached_tokens=4_096)
    assert tracker.warm(state) == ("local-mini", 9_000, 4_096)
    # A side call leaves the main loop's warm prefix as it was; a provider that says nothing: unknown.
    tracker.served(state, "local-nano", 500, 60, side_call=True, cached_tokens=0)
    assert tracker.warm(state) == ("local-mini", 9_000, 4_096)
    tracker.served(state, "local-mini", 9_500, 60, side_call=False)
    assert tracker.warm(state) == ("local-mini", 9_500, None)
    tracker.served(state, "local-mini", 9_500, -1, side_call=False, cached_tokens=9_000)
    assert tracker.warm(state) == (None, 0, None)  # past the cache's lifetime


@pytest.mark.parametrize(
    "pasted",
    ["sk-proj-" + "Ab3" * 20, "sk-ant-api03-" + "x9Y" * 30, "AIza" + "Sy1" * 12, "mine/sk-" + "q7" * 24],
)
def test_a_key_sent_as_the_task_id_is_not_taken_as_its_name(pasted: str) -> None:
    # It was the task's name in the log, the console, traces and /ui.
    req = chat(OPEN)
    derived = task_id_of(req, None, "keyhash")
    assert task_id_of(req, pasted, "keyhash") == derived and pasted not in derived
    # Names that only start alike are names.
    for name in ("sk-learn-upgrade-task-42", "task-sk-1", "AIza-migration"):
        assert task_id_of(req, name, "keyhash") == name


@pytest.mark.parametrize(
    "pasted",
    ["sk-proj-" + "Ab3" * 20, "sk-ant-api03-" + "x9Y" * 30, "AIza" + "Sy1" * 12, "mine/sk-" + "q7" * 24],
)
def test_a_key_sent_as_the_session_is_not_taken_for_the_tasks_name(pasted: str) -> None:
    # A key in OpenAI's prompt_cache_key (or Responses') made the task "session-sk-proj-…" in the
    # log, the console and the reply's x-router-task-id, past the header's check (hostile probe).
    req = openai_chat.parse(
        json.dumps({"model": "auto", "messages": [OPEN], "prompt_cache_key": pasted}).encode()
    )
    derived = task_id_of(req, None, "keyhash")
    assert pasted not in derived and derived == task_id_of(chat(OPEN), None, "keyhash")
    named = openai_chat.parse(
        json.dumps({"model": "auto", "messages": [OPEN], "prompt_cache_key": "sk-learn-sess-1"}).encode()
    )
    assert task_id_of(named, None, "keyhash") == "session-sk-learn-sess-1"


def test_a_clients_context_turn_is_not_taken_for_the_task() -> None:
    # Qwen Code (and Gemini CLI, which it forks) opens every session with the same context turn
    # before the task: every session in one folder on one day was one task, one attempt and one
    # task vector, whatever it was asked.
    context = {"role": "user", "content": "This is the Qwen Code. We are setting up the context for our chat.\n"
               "Today's date is Friday, December 4, 2026.\nMy operating system is: linux\n"
               "I'm currently working in the directory: /tmp/work\n├───hello.py"}  # fmt: skip
    ack = {"role": "assistant", "content": "Got it. Thanks for the context!"}
    ask = [{"role": "user", "content": text} for text in ("add a docstring to hello.py", "list the files")]
    first, second = (chat(context, ack, a) for a in ask)
    assert first.first_user_text == "add a docstring to hello.py"
    assert task_id_of(first, None, "k") != task_id_of(second, None, "k")
    # The task's id holds as its conversation grows; an opening that only looks alike is the task.
    assert task_id_of(chat(context, ack, ask[0], *TURN), None, "k") == task_id_of(first, None, "k")
    assert (
        chat(context, {"role": "assistant", "content": "Sure."}, ask[0]).first_user_text == context["content"]
    )
    assert chat(context).first_user_text == context["content"]
