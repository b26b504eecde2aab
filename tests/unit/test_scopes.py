"""Scopes: the first matching scope's routes, rules or objective decide; the rest is the policy's."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from router.errors import ConfigError
from router.features.request import Features
from router.features.task.vector import repo_hint
from router.policy.active import load_active_policy
from router.policy.scopes import ScopeFacts, scope_facts
from router.protocols.common import ClientRequest
from router.rollout.preview import preview
from router.store import RequestRecord

M = {"litellm_model": "openai/x", "protocol": "openai", "context_window": 100_000, "max_output_tokens": 1000}


def write(path: Path, scopes: list[dict[str, Any]], **extra: Any) -> Path:
    doc = {"version": 1, "name": "p", "models": [{**M, "id": "cheap", "prices": {"input": 1, "output": 1}},
                                                 {**M, "id": "dear", "prices": {"input": 9, "output": 9}}],
           "routes": [{"match": "auto", "candidates": ["cheap", "dear"]}], "scopes": scopes, **extra}  # fmt: skip
    path.write_text(yaml.safe_dump(doc))
    return path


def feats() -> Features:
    return Features(protocol="openai_chat", requested_model="auto", prompt_tokens=100, max_output_tokens=None,
                    tools=False, n_tools=0, thinking=False, vision=False, stream=False, n_messages=1)  # fmt: skip


SCOPES = [
    {"name": "acme", "match": {"repo": "acme/*"}, "routes": [{"match": "auto", "passthrough": "dear"}]},
    {"name": "ci", "match": {"key": "key_ci*", "team": "platform"},
     "rules": [{"name": "no-cheap", "when": {"stream": False}, "exclude": ["cheap"]}]},
]  # fmt: skip


def test_the_first_matching_scope_decides(tmp_path: Path) -> None:
    rt = load_active_policy(write(tmp_path / "p.yaml", SCOPES))
    decide = lambda facts: rt.arm_for("t1", facts)[1].decide(feats())  # noqa: E731
    assert decide(ScopeFacts(repo="acme/api")).chosen == "dear"
    assert decide(ScopeFacts(repo="acme/api")).policy == "p/acme/cheapest"
    assert decide(ScopeFacts(repo="other/api")).chosen == "cheap"
    assert decide(ScopeFacts(key="key_ci1", team="platform")).chosen == "dear"  # both globs hold
    assert decide(ScopeFacts(key="key_ci1")).chosen == "cheap"  # the team does not
    assert decide(None).chosen == "cheap"
    assert rt.logged_headers == ("x-router-repo", "x-router-team")


def test_the_control_arm_comes_before_any_scope(tmp_path: Path) -> None:
    rt = load_active_policy(
        write(tmp_path / "p.yaml", SCOPES, control={"share": 0.999, "route": {"passthrough": "cheap"}})
    )
    arm, decider = rt.arm_for("t1", ScopeFacts(repo="acme/x"))
    assert arm == "control" and decider.decide(feats()).chosen == "cheap"


REMOTE = "remote: git@github.com:acme/api.git\n"


def test_the_repository_comes_from_the_header_or_the_conversation() -> None:
    req = ClientRequest(
        protocol="openai_chat", body={}, model="auto", stream=False, messages=[],
        system=REMOTE, tools=[], max_output_tokens=None, temperature=None, top_p=None,
        first_user_text="Fix the bug", system_text=REMOTE,
    )  # fmt: skip
    assert scope_facts(req, {}, "key_1") == ScopeFacts(repo="acme/api", key="key_1", team=None)
    assert scope_facts(req, {"x-router-repo": "acme/web", "x-router-team": "t"}, None).repo == "acme/web"
    req.first_user_text = "see https://github.com/octo/cat/issues/1"
    assert scope_facts(req, {}, None).repo == "octo/cat"


@pytest.mark.parametrize(
    ("system", "repo"),
    [
        # Claude Code's system prompt links its own issue tracker: not the task's repository.
        ("To give feedback, users should report the issue at https://github.com/anthropics/claude-code/issues\n"
         "Is directory a git repo: Yes\n", None),
        ("feedback: https://github.com/anthropics/claude-code/issues\n$ git remote -v\n"
         "origin\thttps://github.com/acme/web.git (fetch)\n", "acme/web"),
        ("remote: git@github.com:acme/api.git\n", "acme/api"),
        ("clone of https://github.com/acme/cli.git", "acme/cli"),
        ("upstream  https://github.com/acme/lib (push)", "acme/lib"),
    ],
)  # fmt: skip
def test_only_a_git_remote_in_the_system_prompt_names_the_repository(system: str, repo: str | None) -> None:
    req = ClientRequest(
        protocol="anthropic", body={}, model="claude-x", stream=False, messages=[], system=system, tools=[],
        max_output_tokens=None, temperature=None, top_p=None, first_user_text="Fix the bug", system_text=system,
    )  # fmt: skip
    assert scope_facts(req, {}, None).repo == repo
    # The log and the task vector use the same answer (the repository's hashed feature).
    assert repo_hint(req.first_user_text, None, req.system_text) == repo


@pytest.mark.parametrize(
    ("scopes", "message"),
    [
        ([{"name": "x", "match": {}, "objective": {}}], "scopes[0].match: give at least one of repo, key, team"),
        ([{"name": "x", "match": {"repo": "a/*"}, "routes": [{"match": "auto", "passthrough": "gone"}]}],
         "scopes[0]: routes[0] (match 'auto').passthrough: unknown model id 'gone'"),
        ([SCOPES[0], SCOPES[0]], "scopes[1].name: duplicate scope name 'acme'"),
        ([{"name": "x", "match": {"org": "a"}, "objective": {}}], "scopes[0].match.org: unknown field"),
    ],
)  # fmt: skip
def test_bad_scopes_name_the_field(tmp_path: Path, scopes: list[dict[str, Any]], message: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_active_policy(write(tmp_path / "p.yaml", scopes))
    assert message in str(err.value)


def test_preview_replays_scopes_from_the_logged_headers(tmp_path: Path) -> None:
    rt = load_active_policy(write(tmp_path / "p.yaml", SCOPES))
    row = RequestRecord("r1", 1.0, decision_id="d", task_id="t", attempt=1, protocol="openai_chat",
                        requested_model="auto", chosen_model="cheap", prompt_tokens_est=100, input_tokens=100,
                        output_tokens=10, status=200, rule_headers={"x-router-repo": "acme/api"})  # fmt: skip
    assert preview([row], [], rt)["moves"] == {"cheap -> dear": 1}
    assert preview([replace(row, rule_headers=None)], [], rt)["moved"] == 0
    # The task's repository as the log keeps it (its first request's ``repo``) counts as well.
    assert preview([replace(row, rule_headers=None, repo="acme/api")], [], rt)["moved"] == 1


def test_a_scope_may_only_name_tasks_for_the_learned_models_effects(tmp_path: Path) -> None:
    """Without routes, rules or objective it decides as the policy does (``router train`` may give it
    learned effects of its own: tests/unit/test_scope_effects.py)."""
    rt = load_active_policy(write(tmp_path / "p.yaml", [{"name": "x", "match": {"repo": "a/*"}}]))
    decider = rt.arm_for("t1", ScopeFacts(repo="a/b"))[1]
    assert decider is rt.scopes[0].decider and decider.decide(feats()).chosen == "cheap"


def test_a_scope_overrides_only_what_it_names(tmp_path: Path) -> None:
    # The policy serves `auto` and `claude-*`, has a rule, and an objective; the scope changes
    # `auto` alone, one rule by name, and one field of the objective.
    rule = {"name": "no-dear-streams", "when": {"stream": True}, "exclude": ["dear"]}
    scope = {"name": "acme", "match": {"repo": "acme/*"},
             "routes": [{"match": "auto", "passthrough": "dear"}],
             "rules": [{"name": "no-dear-streams", "when": {"stream": True}, "exclude": ["cheap"]},
                       {"name": "long", "when": {"prompt_tokens": {"$gt": 50}}, "prefer": ["dear"]}],
             "objective": {"target_success": 0.8}}  # fmt: skip
    path = write(tmp_path / "p.yaml", [scope], rules=[rule],
                 objective={"max_attempts": 2, "value_per_completed_usd": 0.5})  # fmt: skip
    doc = yaml.safe_load(path.read_text())
    doc["routes"].append({"match": "claude-*", "candidates": ["cheap"]})
    path.write_text(yaml.safe_dump(doc))
    rt = load_active_policy(path)
    acme = rt.arm_for("t1", ScopeFacts(repo="acme/api"))[1]
    assert acme.decide(feats()).chosen == "dear"
    assert (
        acme.decide(replace(feats(), requested_model="claude-sonnet-4-6")).chosen == "cheap"
    )  # the route the scope does not name is still served
    assert [r.name for r in acme.policy.spec.rules] == ["no-dear-streams", "long"]
    assert acme.policy.spec.rules[0].exclude == ["cheap"]  # the scope's rule of that name wins
    objective = acme.policy.objective
    assert (objective.max_attempts, objective.target_success, objective.value_per_completed_usd) == (
        2,
        0.8,
        None,
    )
