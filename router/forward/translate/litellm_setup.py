"""Import litellm once, configured for a proxy that owns retries, logging and the network.

Importing litellm takes seconds (7.5 s of a 9 s cold start here) and changes process state, so it
happens on first use only, behind ``functools.cache``; every later call is a dictionary lookup.
The router does not wait for it to start: ``Upstream`` loads it on a thread once serving, and a
translated request that comes first waits for that load. Prices and context windows come from
litellm's bundled price map file, read without importing litellm
(``router.policy.catalog.bundled_cost_map``).
"""

from __future__ import annotations

import functools
import logging
import os
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from router.forward.translate.target import Target

#: Used when a backend needs ``max_tokens`` (Anthropic requires it) and litellm knows no limit.
FALLBACK_MAX_TOKENS = 4096
#: The key litellm is given for a backend that has none (never one from the environment).
_NO_KEY = "no-key"
#: Providers that authenticate with the cloud's own credentials rather than a key.
_CLOUD_IDENTITY = frozenset({"bedrock", "sagemaker", "sagemaker_chat", "vertex_ai", "vertex_ai_beta"})


@functools.cache
def get_litellm() -> ModuleType:
    """The configured litellm module (imported on the first call)."""
    # The price map must come from the bundled file: fetching it at import hangs offline.
    os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
    os.environ["MAX_IMAGE_URL_DOWNLOAD_SIZE_MB"] = "0"  # see below
    # Importing litellm points TIKTOKEN_CACHE_DIR at its bundled files; an operator's choice wins.
    tiktoken_dir = os.environ.get("TIKTOKEN_CACHE_DIR")
    import litellm

    if tiktoken_dir is not None:
        os.environ["TIKTOKEN_CACHE_DIR"] = tiktoken_dir
    # The router never fetches a URL a client named. Translating for some backends, litellm would
    # download http(s) image and file URLs itself (a request from the router's network to any
    # address); with downloads off such a request fails instead. The constant is read at import,
    # so it is also set on the module in case litellm was imported before this function ran.
    from litellm.litellm_core_utils.prompt_templates import image_handling

    image_handling.MAX_IMAGE_URL_DOWNLOAD_SIZE_MB = 0  # type: ignore[misc]
    # Older releases phone home unless told not to; 1.110 only has consent-gated proxy telemetry.
    if hasattr(litellm, "telemetry"):
        litellm.telemetry = False
    litellm.suppress_debug_info = True
    litellm.set_verbose = False
    litellm.turn_off_message_logging = True
    litellm.disable_streaming_logging = True
    litellm.log_raw_request_response = False
    litellm.redact_messages_in_exceptions = True
    # Let litellm repair histories that another model wrote into what this backend accepts: e.g.
    # drop Anthropic `thinking` when the tool-use turn has no thinking block to continue from,
    # pair orphaned tool calls with results, and put a user message first.
    litellm.modify_params = True
    # Keys come only from the variables the policy names. litellm's OpenAI-compatible providers
    # (perplexity, deepinfra, nvidia_nim, litellm_proxy and some twenty more) fall back to
    # ``litellm.openai_key``, then to the process's OPENAI_API_KEY, when they find no key of their
    # own: a backend on one of them without ``api_key_env`` was sent the OpenAI key.
    litellm.openai_key = _NO_KEY
    # litellm warns per request (e.g. for every dropped parameter); the router logs its own errors.
    for name in ("LiteLLM", "LiteLLM Router", "LiteLLM Proxy"):
        logging.getLogger(name).setLevel(logging.ERROR)
    # The router's executor is the only retry loop: a retry inside litellm would hide a 429
    # from the fallback logic and double the deadline.
    litellm.num_retries = 0
    litellm.num_retries_per_request = 0
    litellm.retry = False
    for name in (
        "callbacks",
        "input_callback",
        "success_callback",
        "failure_callback",
        "service_callback",
        "_async_input_callback",
        "_async_success_callback",
        "_async_failure_callback",
    ):
        setattr(litellm, name, [])
    return litellm


def default_max_tokens(target: Target) -> int:
    """The output limit a call to an Anthropic-family backend asks for when the client gave none
    (Anthropic requires one): the model's largest (litellm's map; ``FALLBACK_MAX_TOKENS`` for a
    model it does not know), but no more than the window leaves after the prompt. Models before
    Claude 4.5 refuse a call whose prompt and ``max_tokens`` overflow the window, and the largest
    output is a quarter or a third of the window (Sonnet 4: 64,000 of 200,000)."""
    largest = route_of(target.litellm_model).max_output_tokens or FALLBACK_MAX_TOKENS
    return largest if target.output_room is None else max(1, min(largest, target.output_room))


def call_kwargs(target: Target) -> dict[str, Any]:
    """Per-call litellm arguments: where to go, with what key, how long, and no retries."""
    # A backend without ``api_key_env`` gets a placeholder, never None: given None, litellm reads
    # the provider's own variable from the process (ANTHROPIC_API_KEY for ``anthropic_text/``,
    # GROQ_API_KEY, GOOGLE_API_KEY, AWS_BEARER_TOKEN_BEDROCK ...: 86 of its 190 providers, probed) and
    # sends that key to whatever base URL the backend has. Keys come only from the policy.
    api_key: str | None = target.api_key if target.api_key is not None else _NO_KEY
    if (
        target.api_key is None
        and target.api_base is None
        and route_of(target.litellm_model).provider in _CLOUD_IDENTITY
    ):
        # Bedrock, SageMaker and Vertex sign with the platform's identity (an instance role,
        # workload identity), the usual way to run them: at their own endpoints no key leaves.
        api_key = None
    import httpx  # loaded by litellm anyway; not at the router's start

    return {
        "api_base": target.api_base,
        "api_key": api_key,
        # Per phase, as on the relay path: a hung or stalled backend fails after ``idle`` and is
        # fallen back from, instead of holding the request until the overall deadline.
        "timeout": httpx.Timeout(
            target.timeout, connect=target.connect or target.timeout, read=target.idle or target.timeout
        ),
        "num_retries": 0,
        "max_retries": 0,
        # Parameters the backend cannot take are dropped rather than failing the request.
        "drop_params": True,
    }


@dataclass(frozen=True, slots=True)
class ProviderRoute:
    """What litellm makes of a ``provider/model`` string."""

    model: str
    provider: str
    #: The provider is sent an Anthropic Messages body (Anthropic itself, Bedrock/Vertex Claude).
    anthropic_family: bool
    #: The backend's output limit from litellm's price map, when it knows the model.
    max_output_tokens: int | None


@functools.lru_cache(maxsize=256)
def route_of(litellm_model: str) -> ProviderRoute:
    """Resolve a backend's provider once per model string."""
    get_litellm()
    from litellm.litellm_core_utils.get_llm_provider_logic import get_llm_provider

    try:
        model, provider, _, _ = get_llm_provider(litellm_model)
    except Exception:
        provider, _, model = litellm_model.partition("/")
    return ProviderRoute(
        model=model,
        provider=provider,
        anthropic_family=_builds_anthropic_request(model, provider),
        max_output_tokens=_max_output_tokens(litellm_model),
    )


def _builds_anthropic_request(model: str, provider: str) -> bool:
    try:
        from litellm.responses.litellm_completion_transformation.tool_search import (
            provider_builds_anthropic_request,
        )

        return bool(provider_builds_anthropic_request(model, provider))
    except Exception:
        return provider == "anthropic"


def _max_output_tokens(litellm_model: str) -> int | None:
    litellm = get_litellm()
    try:
        value = litellm.get_max_tokens(litellm_model)
    except Exception:
        return None
    return value if isinstance(value, int) and value > 0 else None
