"""A local fake model provider speaking OpenAI Chat, OpenAI Responses and Anthropic Messages.

It answers deterministically and can be told to misbehave (latency, errors, broken streams) per
model or per request; see ``behaviour`` for the knobs. Used by tests, demos and the benchmark.
"""

from router.fakeupstream.behaviour import Behaviour, BehaviourError, parse_spec
from router.fakeupstream.harness import FakeUpstream
from router.fakeupstream.server import create_app, run

__all__ = ["Behaviour", "BehaviourError", "FakeUpstream", "create_app", "parse_spec", "run"]
