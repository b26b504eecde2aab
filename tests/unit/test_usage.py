"""What each protocol's replies say about themselves: tokens, the provider's reply id, why it ended."""

from __future__ import annotations

import orjson

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
