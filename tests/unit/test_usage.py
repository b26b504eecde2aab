"""What each protocol's replies say about themselves: tokens, the provider's reply id, why it ended."""

from __future__ import annotations

import orjson

from router.forward.accounting import streamed_tokens
from router.protocols import anthropic, openai_chat, responses


def test_chat_reply_and_stream_name_their_id_and_finish_reason() -> None:
    whole = {"id": "chatcmpl-1", "model": "m", "choices": [{"finish_reason": "length"}],
             "usage": {"prompt_tokens": 5, "completion_tokens": 2}}  # fmt: skip
    u = openai_chat.usage_from(whole)
    assert (u.response_id, u.finish_reasons, u.input_tokens) == ("chatcmpl-1", ["length"], 5)
    obs = openai_chat.StreamObserver()
    chunks = [
        {"id": "chatcmpl-2", "model": "m", "choices": [{"delta": {"content": "hi"}, "finish_reason": None}]},
        {"id": "chatcmpl-2", "choices": [{"delta": {}, "finish_reason": "tool_calls"}]},
        {"id": "chatcmpl-2", "choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 1}},
    ]
    assert [obs.observe(None, orjson.dumps(c)) for c in chunks] == [True, False, False]
    u = obs.usage
    assert (u.response_id, u.finish_reasons, u.provider_model, u.output_tokens) == (
        "chatcmpl-2",
        ["tool_calls"],
        "m",
        1,
    )


def test_anthropic_message_and_stream_name_their_id_and_stop_reason() -> None:
    u = anthropic.usage_from({"id": "msg_1", "stop_reason": "end_turn", "usage": {"input_tokens": 3}})
    assert (u.response_id, u.finish_reasons) == ("msg_1", ["end_turn"])
    obs = anthropic.StreamObserver()
    start = {"message": {"id": "msg_2", "model": "c", "stop_reason": None, "usage": {"input_tokens": 3}}}
    obs.observe("message_start", orjson.dumps(start))
    obs.observe(
        "message_delta", orjson.dumps({"delta": {"stop_reason": "max_tokens"}, "usage": {"output_tokens": 9}})
    )
    assert (obs.usage.response_id, obs.usage.finish_reasons, obs.usage.output_tokens) == (
        "msg_2",
        ["max_tokens"],
        9,
    )


def test_responses_say_how_they_ended() -> None:
    done = responses.usage_from({"id": "resp_1", "status": "completed", "usage": {"input_tokens": 1}})
    assert (done.response_id, done.finish_reasons) == ("resp_1", ["completed"])
    cut = responses.usage_from({"id": "resp_2", "status": "incomplete",
                                "incomplete_details": {"reason": "max_output_tokens"}})  # fmt: skip
    assert cut.finish_reasons == ["max_output_tokens"]
    obs = responses.StreamObserver()
    obs.observe(
        "response.created",
        orjson.dumps({"response": {"id": "resp_3", "model": "m", "status": "in_progress"}}),
    )
    assert (obs.usage.response_id, obs.usage.finish_reasons) == ("resp_3", [])
    obs.observe("response.completed", orjson.dumps({"response": {"id": "resp_3", "status": "completed"}}))
    assert (obs.usage.response_id, obs.usage.finish_reasons) == ("resp_3", ["completed"])


def test_a_cut_stream_is_charged_for_every_kind_of_output_its_events_carried() -> None:
    """What a stream cut before its usage is charged comes from its content events: a custom
    tool's input (Codex's apply_patch), a code interpreter's code or a shell command the model
    wrote in a Responses stream, and a Chat delta that carries only reasoning (as vLLM, OpenRouter
    and Groq name it) or a refusal, were no content, so a stream cut while a 2,000-token patch was
    written was charged for none of it."""
    patch = "*** Begin Patch\n*** Update File: a.py\n" + "+print('line')\n" * 400
    events = [
        ("response.custom_tool_call_input.delta", patch),
        ("response.code_interpreter_call_code.delta", "import os\nprint(os.listdir())"),
        ("response.shell_call_command.delta", "ls -la"),
    ]
    for name, delta in events:
        obs = responses.StreamObserver()
        assert obs.observe(name, orjson.dumps({"type": name, "delta": delta})), name
        assert streamed_tokens(obs.written) > len(delta) // 8, name
    obs = openai_chat.StreamObserver()
    chunks = [{"choices": [{"delta": {"reasoning": "let me think " * 100}}]},
              {"choices": [{"delta": {"refusal": "I cannot help with that."}}]}]  # fmt: skip
    assert [obs.observe(None, orjson.dumps(c)) for c in chunks] == [True, True]
    assert streamed_tokens(obs.written) > 200
