"""What a provider's error text may say of the router's key and account, and what reaches anyone."""

from __future__ import annotations

import pytest

from router.errors import redact_key

KEY = "sk-proj-Abcdefghijklmnop0123456789wxyz"


@pytest.mark.parametrize(
    ("said", "left"),
    [
        # OpenAI's refusal quotes the key's start and last four characters.
        (
            "Incorrect API key provided: sk-proj-********************wxyz. You can find your API key at x.",
            "Incorrect API key provided: [redacted]. You can find your API key at x.",
        ),
        ("Incorrect API key provided: sk-abc...wxyz.", "Incorrect API key provided: [redacted]."),
        (
            "Rate limit reached for gpt-4o in organization org-AbCdEf1234567890 on tokens per min (TPM).",
            "Rate limit reached for gpt-4o in organization [redacted] on tokens per min (TPM).",
        ),
        (
            "You exceeded the quota of project proj_0a1B2c3D4e5F.",
            "You exceeded the quota of project [redacted].",
        ),
        ("invalid x-api-key sk-ant-api03-AAAA_bbbb-CCCC", "invalid x-api-key [redacted]"),
        ("API key not valid: AIzaSyA0123456789abcdefghijklmnopqrst", "API key not valid: [redacted]"),
        # The key itself, whatever its form.
        (f"the key sent: {KEY}", "the key sent: [redacted]"),
    ],
)
def test_what_a_provider_quotes_of_a_key_or_account_is_redacted(said: str, left: str) -> None:
    assert redact_key(said, KEY) == left


def test_words_that_only_look_alike_are_kept() -> None:
    said = "task-runner hit a risk-free desk-top limit for organization settings; model gpt-4o-mini"
    assert redact_key(said, None) == said
    assert redact_key("custom key zz-9", "zz-9") == "custom key [redacted]"
