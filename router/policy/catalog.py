"""The model catalog as the router uses it: prices, windows and credentials resolved.

Prices and limits a policy file leaves out come from litellm's price map (bundled with the
package, read offline). A backend's key is read from its environment variable when a call is
made, so a key rotated in the environment needs no reload, and a missing key is an error that
names the variable rather than a failure at startup for a backend that may never be chosen.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import importlib.util
import os
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import orjson

from router.errors import ConfigError, MissingCredentials
from router.policy.config import Policy
from router.policy.modelspec import LongContext, ModelSpec

PriceLookup = Callable[[str], Mapping[str, Any] | None]


#: USD per call of the hosted tools the providers bill on top of tokens (their list prices at
#: the end of 2025; a model's ``prices.per_call`` overrides them): OpenAI's web search $10 per
#: 1,000 calls ($25 for the preview tool), file search $2.50 per 1,000, a code interpreter
#: container $0.03, an image at most $0.25 (gpt-image-1, high quality, 1536x1024); Anthropic's
#: web search $10 per 1,000, web fetch nothing but its tokens, code execution $0.05 a container
#: hour, billed at least 5 minutes. A kind not named costs nothing.
HOSTED_TOOL_FEES: Mapping[str, float] = MappingProxyType({
    "web_search": 0.01, "web_search_preview": 0.025, "file_search": 0.0025, "code_interpreter": 0.03,
    "image_generation": 0.25, "web_fetch": 0.0, "code_execution": 0.05 / 12,
})  # fmt: skip


@dataclass(frozen=True, slots=True)
class Price:
    """USD per token (not per million) so cost is a plain dot product; ``per_call``: USD per call
    of each hosted tool kind (``router.protocols.hosted``)."""

    input: float
    output: float
    cache_read: float
    cache_write: float
    #: A prompt token cached for an hour (Anthropic's ``ttl: "1h"``: twice the input price, against
    #: 1.25 times for five minutes); None: priced as ``cache_write``.
    cache_write_1h: float | None = None
    per_call: Mapping[str, float] = field(default_factory=lambda: HOSTED_TOOL_FEES)
    #: USD billed for every call whatever it writes (a search model's search), with the hosted
    #: tools' fees in ``CostSplit.tools``.
    per_request: float = 0.0
    #: Dearer prices for long prompts, by threshold: a call whose prompt has more than a tier's
    #: tokens is billed at its prices (the last such tier's), the whole call (OpenAI's gpt-5.4 and
    #: 5.5 above 272k tokens, Gemini above 200k). Empty: one price.
    tiers: tuple[tuple[int, Price], ...] = ()

    def at(self, prompt_tokens: int) -> Price:
        """The prices a call with a prompt of ``prompt_tokens`` tokens is billed at."""
        for above, price in reversed(self.tiers):
            if prompt_tokens > above:
                return price
        return self

    def write_cost(self, tokens: int, one_hour: int = 0) -> float:
        """The cost of ``tokens`` written to the cache, ``one_hour`` of them for an hour."""
        one_hour = min(one_hour, tokens)
        longer = self.cache_write if self.cache_write_1h is None else self.cache_write_1h
        return (tokens - one_hour) * self.cache_write + one_hour * longer

    def tools(self, calls: Mapping[str, int]) -> float:
        """What ``calls`` (per hosted tool kind) cost."""
        return sum(n * self.per_call.get(kind, 0.0) for kind, n in calls.items())

    def cost(self, input_tokens: int, output_tokens: int, cache_read: int = 0, cache_write: int = 0) -> float:
        """``input_tokens`` excludes cached reads and writes, which are priced on their own."""
        return (
            input_tokens * self.input
            + output_tokens * self.output
            + cache_read * self.cache_read
            + cache_write * self.cache_write
        )


@dataclass(frozen=True, slots=True)
class Backend:
    id: str
    litellm_model: str
    protocol: str
    api_base: str | None
    api_key_env: str | None
    price: Price
    context_window: int
    max_output_tokens: int
    tools: bool
    vision: bool
    thinking: bool
    cache_ttl_s: float
    max_concurrency: int | None = None
    #: The model writes until its window is full and stops there, rather than refusing a call
    #: whose prompt and output limit overflow it (``stops_at_window`` below; ``router.policy.window``).
    stops_at_window: bool = False

    @property
    def provider(self) -> str:
        return self.litellm_model.split("/", 1)[0] if "/" in self.litellm_model else "openai"

    @property
    def wire_model(self) -> str:
        """The model name the provider's own API expects (litellm's provider prefix removed)."""
        return self.litellm_model.split("/", 1)[1] if "/" in self.litellm_model else self.litellm_model

    def api_key(self, env: Mapping[str, str] | None = None) -> str | None:
        if self.api_key_env is None:
            return None
        # Stripped: a key pasted from a file ends in a newline, which no header can carry (every
        # call to the backend failed with the router's own 500).
        value = ((os.environ if env is None else env).get(self.api_key_env) or "").strip()
        if not value:
            raise MissingCredentials(
                f"backend {self.id!r} cannot be called: environment variable {self.api_key_env} is not set"
            )
        return value


class Catalog:
    def __init__(self, backends: Mapping[str, Backend]) -> None:
        self.backends = dict(backends)

    def __getitem__(self, model_id: str) -> Backend:
        return self.backends[model_id]

    def __iter__(self) -> Iterator[Backend]:
        return iter(self.backends.values())

    def missing_credentials(self, env: Mapping[str, str] | None = None) -> list[str]:
        """One line per key variable the catalog names that is not set, with the backends it
        leaves uncallable: said when a router applies the policy and by ``router check``, since
        otherwise the first sign is every request failing over through them."""
        env = os.environ if env is None else env
        missing: dict[str, list[str]] = {}
        for b in self:
            if b.api_key_env is not None and not (env.get(b.api_key_env) or "").strip():
                missing.setdefault(b.api_key_env, []).append(b.id)
        return [
            f"{var} is not set: {', '.join(ids)} cannot be called until it is (requests fall over to other models)"
            for var, ids in missing.items()
        ]


#: A Claude model's tier and version in its id, wherever the id sits in litellm's name:
#: ``claude-sonnet-4-5``, ``claude-haiku-4-5-20251001``, ``claude-opus-4-6``, ``claude-sonnet-5``
#: (a date is no minor version: ``claude-sonnet-4-20250514`` is 4.0). The ids of before Claude 4
#: (``claude-3-7-sonnet``) name the version first and never match.
_CLAUDE = re.compile(r"(?<![a-z])claude-[a-z]+-(\d{1,2})(?:[-.](\d{1,2})(?!\d))?(?!\d)")


#: The clouds that serve Anthropic's Claude under their own ids (``bedrock/anthropic.claude-...``,
#: ``bedrock/us.anthropic.claude-...``, ``vertex_ai/claude-...@date``), reached only through litellm
#: (no relay default), which sends Claude its Messages body there whatever the entry's protocol.
_CLAUDE_CLOUDS = ("bedrock/", "vertex_ai/")


def stops_at_window(litellm_model: str, protocol: str) -> bool:
    """Whether the model, called as the policy calls it, stops at its context window instead of
    refusing a call whose prompt and ``max_tokens`` overflow it.

    Anthropic's Messages API does so for Claude Sonnet 4.5 and the models after it (Haiku 4.5,
    Opus 4.5, the 4.6s, the 5s): the reply ends with ``stop_reason:
    "model_context_window_exceeded"`` (Anthropic's "Handling stop reasons"; an earlier model
    does so only with the beta header ``model-context-window-exceeded-2025-08-26``, which the
    router does not send), on Anthropic's own API and on Bedrock's and Vertex's, the same model
    under their ids. Other providers, and Claude through them (OpenRouter checks the sum itself;
    Anthropic's OpenAI endpoint is not said to stop), refuse such a call; a model entry's
    ``stops_at_window`` says otherwise."""
    on_anthropic = protocol == "anthropic" and litellm_model.startswith("anthropic/")
    if not (on_anthropic or litellm_model.startswith(_CLAUDE_CLOUDS)):
        return False
    m = _CLAUDE.search(litellm_model.lower())
    return m is not None and (int(m.group(1)), int(m.group(2) or 0)) >= (4, 5)


def build_catalog(policy: Policy, lookup: PriceLookup | None = None) -> Catalog:
    lookup = lookup or litellm_price_lookup
    backends = {}
    for i, spec in enumerate(policy.spec.models):
        backends[spec.id] = _backend(spec, lookup, f"{policy.source}: models[{i}] (id {spec.id!r})",
                                     mapped=lookup is litellm_price_lookup)  # fmt: skip
    return Catalog(backends)


_ABOVE = re.compile(r"input_cost_per_token_above_(\d+)k_tokens")
#: A tier's prices in litellm's map: ``{key}_above_{k}k_tokens``.
_MAP_KEYS = {"input": "input_cost_per_token", "output": "output_cost_per_token",
             "cache_read": "cache_read_input_token_cost", "cache_write": "cache_creation_input_token_cost"}  # fmt: skip
Tier = tuple[int, Mapping[str, Any]]


def _map_tiers(known: Mapping[str, Any]) -> list[Tier]:
    """The long-context tiers litellm's map gives a model: (threshold, USD per token by field)."""
    ks = sorted(int(m.group(1)) for key in known if (m := _ABOVE.fullmatch(key)))
    return [
        (k * 1000, {f: known.get(f"{key}_above_{k}k_tokens") for f, key in _MAP_KEYS.items()}) for k in ks
    ]


def _policy_tiers(given: list[LongContext]) -> list[Tier]:
    """The policy's own tiers (USD per million tokens) as ``_map_tiers`` gives them."""
    return [
        (t.above, {f: None if (v := getattr(t, f)) is None else v / 1e6 for f in _MAP_KEYS}) for t in given
    ]


def _tiered(price: Price, given: list[Tier]) -> Price:
    """``price`` with dearer prices above each threshold; a price a tier does not give is the one
    below it."""
    tiers: list[tuple[int, Price]] = []
    below = price
    for above, prices in sorted(given, key=lambda t: t[0]):
        below = dataclasses.replace(
            below, input=_pick(prices, "input", below.input), output=_pick(prices, "output", below.output),
            cache_read=_pick(prices, "cache_read", below.cache_read),
            cache_write=_pick(prices, "cache_write", below.cache_write),
        )  # fmt: skip
        tiers.append((above, below))
    return dataclasses.replace(price, tiers=tuple(tiers))


def _per_request(known: Mapping[str, Any] | None) -> float:
    """litellm's fee per call for the model (``input_cost_per_request``), else none. Its
    ``search_context_cost_per_query`` is no such fee: gpt-4.1 and gpt-5 have one too, for the
    web search tool a request may declare; only the search models search on every call."""
    value = (known or {}).get("input_cost_per_request")
    return float(value) if isinstance(value, int | float) and value >= 0 else 0.0


def _pick(prices: Mapping[str, Any], name: str, below: float) -> float:
    value = prices.get(name)
    return float(value) if isinstance(value, int | float) else below


def _backend(spec: ModelSpec, lookup: PriceLookup, where: str, *, mapped: bool = False) -> Backend:
    """``mapped``: ``lookup`` is litellm's map, whose names a misspelt one is said beside."""
    p = spec.prices
    known = None
    unknown = ""
    if None in (p.input, p.output, spec.context_window, spec.max_output_tokens):
        found = lookup(spec.litellm_model)
        known = found or {}
        guess = _near_name(spec.litellm_model) if found is None and mapped else None
        if guess is not None:
            unknown = f": did you mean {guess!r}? If the name is right,"

    def per_token(given: float | None, key: str, field: str, default: float | None = None) -> float:
        if given is not None:
            return given / 1e6
        value = known.get(key) if known else None
        if value is None:
            if default is not None:
                return default
            raise ConfigError(
                f"{where}.prices.{field}: not given, and litellm's price map has no price for "
                f"{spec.litellm_model!r}{_unless(unknown, _PRICES_HINT)}"
            )
        return float(value)

    input_price = per_token(p.input, "input_cost_per_token", "input")
    price = Price(
        input=input_price,
        output=per_token(p.output, "output_cost_per_token", "output"),
        cache_read=per_token(p.cache_read, "cache_read_input_token_cost", "cache_read", input_price),
        cache_write=per_token(p.cache_write, "cache_creation_input_token_cost", "cache_write", input_price),
        # Only Anthropic reports one-hour writes; its price for them is twice the input's.
        cache_write_1h=per_token(
            p.cache_write_1h, "cache_creation_input_token_cost_above_1hr", "cache_write_1h", 2 * input_price
        ),
        per_call=MappingProxyType({**HOSTED_TOOL_FEES, **p.per_call}) if p.per_call else HOSTED_TOOL_FEES,
        per_request=p.per_request if p.per_request is not None else _per_request(known),
    )
    # The map's tiers only with the map's prices: an operator's own prices stand alone.
    if p.long_context is not None:
        price = _tiered(price, _policy_tiers(p.long_context))
    elif p.input is None and known:
        price = _tiered(price, _map_tiers(known))
    window = spec.context_window or (known or {}).get("max_input_tokens") or (known or {}).get("max_tokens")
    if not window:
        raise ConfigError(
            f"{where}.context_window: not given, and litellm does not know {spec.litellm_model!r}"
            f"{_unless(unknown, _WINDOW_HINT)}"
        )
    max_out = spec.max_output_tokens or (known or {}).get("max_output_tokens") or 4096
    return Backend(
        id=spec.id,
        litellm_model=spec.litellm_model,
        protocol=spec.protocol,
        api_base=spec.api_base.rstrip("/") if spec.api_base else None,
        api_key_env=spec.api_key_env,
        price=price,
        context_window=int(window),
        max_output_tokens=int(max_out),
        tools=spec.capabilities.tools,
        vision=spec.capabilities.vision,
        thinking=spec.capabilities.thinking,
        cache_ttl_s=spec.cache_ttl_s,
        max_concurrency=spec.max_concurrency,
        stops_at_window=(
            stops_at_window(spec.litellm_model, spec.protocol)
            if spec.stops_at_window is None
            else spec.stops_at_window
        ),
    )


def litellm_price_lookup(litellm_model: str) -> Mapping[str, Any] | None:
    cost_map: Mapping[str, Any] = bundled_cost_map()
    bare = litellm_model.split("/", 1)[1] if "/" in litellm_model else litellm_model
    return cost_map.get(litellm_model) or cost_map.get(bare)


_PRICES_HINT = "give it in $ per million tokens: prices: {input: 0.25, output: 2}"
_WINDOW_HINT = "give the model's window in tokens"


def misspelt(specs: Sequence[ModelSpec]) -> list[str]:
    """Models whose litellm name the map lacks but nearly has, priced and sized by the file: such a
    file loads (it needs nothing of the map), and a misspelt name fails at the provider on every call."""
    said = []
    for spec in specs:
        if litellm_price_lookup(spec.litellm_model) is None and (near := _near_name(spec.litellm_model)):
            said.append(f"models.{spec.id}.litellm_model: litellm knows no {spec.litellm_model!r}: did you mean "
                        f"{near!r}? (a name the provider does not know fails every call)")  # fmt: skip
    return said


def _unless(guess: str, what: str) -> str:
    """What to give, after the nearest name when one is (``guess``), else in brackets."""
    return f"{guess} {what}" if guess else f" ({what})"


def _near_name(litellm_model: str) -> str | None:
    """The name in litellm's map nearest one it lacks ('anthropic/claude-sonnet-4-5' for
    'anthropic/claude-sonet-4-5'), if one is near. A misspelt name was said to lack a price alone,
    and given one it passed the check, to fail at the provider on every call."""
    provider, _, bare = litellm_model.rpartition("/")
    near = difflib.get_close_matches(
        bare, {k.rpartition("/")[2] for k in bundled_cost_map()}, n=1, cutoff=0.9
    )
    if not near:
        return None
    return f"{provider}/{near[0]}" if provider else near[0]


@functools.cache
def bundled_cost_map() -> dict[str, Any]:
    """litellm's price and context-window map, from the file it ships (what it loads itself with
    ``LITELLM_LOCAL_MODEL_COST_MAP``), without importing litellm: a tenth of a second, not seconds."""
    spec = importlib.util.find_spec("litellm")
    if spec is None or not spec.submodule_search_locations:
        return {}
    path = Path(next(iter(spec.submodule_search_locations))) / "model_prices_and_context_window_backup.json"
    try:
        cost_map: dict[str, Any] = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return {}
    return cost_map
