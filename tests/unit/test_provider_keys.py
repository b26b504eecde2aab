"""Which key litellm is given for a backend: the policy's, a placeholder, or the cloud's identity."""

from __future__ import annotations

import pytest

from router.forward.translate.litellm_setup import call_kwargs
from router.forward.translate.target import Target


def key_for(model: str, api_base: str | None, api_key: str | None = None) -> str | None:
    return call_kwargs(Target(model, api_base, api_key, timeout=10))["api_key"]


@pytest.mark.parametrize(
    "model",
    [
        "bedrock/anthropic.claude-sonnet-4-5-20250929-v1:0",
        "vertex_ai/gemini-2.5-pro",
        "sagemaker/my-endpoint",
    ],
)
def test_a_cloud_backend_at_its_own_endpoint_signs_with_the_platforms_identity(model: str) -> None:
    # A placeholder went to Bedrock as a bearer token, which it refuses: an instance role's calls failed.
    assert key_for(model, None) is None


@pytest.mark.parametrize(
    "model", ["bedrock/anthropic.claude-sonnet-4-5-20250929-v1:0", "vertex_ai/gemini-2.5-pro"]
)
def test_a_cloud_backend_at_another_address_is_never_given_the_environments_credentials(model: str) -> None:
    assert key_for(model, "http://127.0.0.1:9/v1") == "no-key"


@pytest.mark.parametrize("model", ["anthropic_text/claude-2", "groq/llama-3", "openai/gpt-5-mini"])
def test_other_keyless_backends_get_a_placeholder_never_none(model: str) -> None:
    assert key_for(model, None) == "no-key"


def test_a_named_key_is_sent_as_is() -> None:
    assert key_for("bedrock/anthropic.claude-sonnet-4-5-20250929-v1:0", None, "abc") == "abc"
