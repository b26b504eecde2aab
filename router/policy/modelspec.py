"""A backend's entry in the policy file: its litellm model, protocol, key, prices and limits.

The schema of one ``models:`` item; ``router.policy.config`` holds the rest of the file and
``router.policy.catalog`` fills what an entry leaves out from litellm's price map.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

Protocol = Literal["openai", "anthropic", "openai_responses"]


class Strict(BaseModel):
    """Every section of a policy file: unknown keys are errors, and a loaded file is immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class LongContext(Strict):
    """Dearer prices (USD per 1M tokens) for a call whose prompt has more than ``above`` tokens,
    the whole call; an omitted one is the tier's below."""

    above: int = Field(gt=0)
    input: float | None = Field(default=None, ge=0)
    output: float | None = Field(default=None, ge=0)
    cache_read: float | None = Field(default=None, ge=0)
    cache_write: float | None = Field(default=None, ge=0)


class Prices(Strict):
    """USD per 1M tokens. Omitted values come from litellm's price map for the model."""

    input: float | None = Field(default=None, ge=0)
    output: float | None = Field(default=None, ge=0)
    cache_read: float | None = Field(default=None, ge=0)
    cache_write: float | None = Field(default=None, ge=0)
    #: A prompt token cached for an hour (Anthropic's ``cache_control`` ``ttl: "1h"``); omitted:
    #: litellm's price, else twice the input price (Anthropic's rule).
    cache_write_1h: float | None = Field(default=None, ge=0)
    #: USD per call of each hosted tool kind (``web_search``, ``file_search``, ...), over the
    #: defaults (``router.policy.catalog.HOSTED_TOOL_FEES``); 0 makes a kind free.
    per_call: dict[
        Annotated[str, Field(pattern=r"^[a-z][a-z0-9_]{0,63}$")], Annotated[float, Field(ge=0)]
    ] = Field(default_factory=dict)
    #: USD the provider bills for every call on top of its tokens, whatever it writes: a search
    #: model behind Chat Completions (gpt-5-search-api, gpt-4o-search-preview) searches on each
    #: call and bills the search ($0.01, $0.025), a reply that shows no call of it. Omitted:
    #: litellm's ``input_cost_per_request`` for the model, else none.
    per_request: float | None = Field(default=None, ge=0)
    #: Prices by prompt length (Anthropic's Sonnet above 200k tokens, ...); given, they replace
    #: the tiers litellm's map has for the model; omitted, the map's apply when the base prices
    #: come from it.
    long_context: list[LongContext] | None = None


class Capabilities(Strict):
    tools: bool = True
    vision: bool = False
    thinking: bool = False


class ModelSpec(Strict):
    id: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}$")]
    litellm_model: Annotated[str, Field(min_length=1, max_length=256)]
    protocol: Protocol
    api_base: str | None = None
    #: The *name* of the environment variable holding the key; never the key itself.
    api_key_env: Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")] | None = None
    prices: Prices = Prices()
    context_window: int | None = Field(default=None, gt=0)
    max_output_tokens: int | None = Field(default=None, gt=0)
    capabilities: Capabilities = Capabilities()
    #: Prompt-cache lifetime at the provider, used for cache-affinity estimates.
    cache_ttl_s: float = Field(default=300, ge=0)
    #: Calls in flight to this backend from one replica; more wait (and the wait is queue time).
    max_concurrency: int | None = Field(default=None, gt=0)
    #: LLM calls one attempt may make on this model; the next is refused and the task escalates
    #: (``router.features.task.attempt``). Unset: the learned cap, if the artifact has one.
    max_calls_per_attempt: int | None = Field(default=None, gt=0)
    #: The model stops at its window instead of refusing a prompt plus ``max_tokens`` that
    #: overflow it, so that only the prompt and room for a reply must fit. Unset: Claude models
    #: from Sonnet 4.5 on, on Anthropic's API, Bedrock or Vertex, do
    #: (``router.policy.catalog.stops_at_window``); a gateway's name for one needs it said here.
    stops_at_window: bool | None = None

    @field_validator("api_key_env", mode="before")
    @classmethod
    def _a_variable_name(cls, value: Any) -> Any:
        # A key pasted here got "String should match pattern '^[A-Za-z_]...'", which did not say
        # what goes here instead (the value is never repeated: it may be the key).
        if isinstance(value, str) and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", value):
            raise ValueError(
                "the NAME of the environment variable holding the key (e.g. OPENAI_API_KEY), never the key "
                "itself: export the key in the router's environment under that name"
            )
        return value

    @model_validator(mode="after")
    def _api_base_is_http(self) -> ModelSpec:
        if self.api_base is not None and not self.api_base.startswith(("http://", "https://")):
            raise ValueError("api_base must start with http:// or https://")
        if self.api_base is not None and "@" in self.api_base.split("://", 1)[-1].split("/", 1)[0]:
            # Sent beside the key's own header, a URL's credentials made every OpenAI-protocol call
            # a 500 (aiohttp refuses both), and the file is shown on the dashboard and archived.
            raise ValueError(
                "api_base must not carry credentials (user:password@): name the variable that holds "
                "the backend's key in api_key_env"
            )
        return self
