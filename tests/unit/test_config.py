"""Policy files: validation with file and field paths, interpolation, catalog resolution."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from router.errors import ConfigError, MissingCredentials
from router.policy.catalog import build_catalog
from router.policy.loading import load_policy, parse_policy

ROOT = Path(__file__).resolve().parents[2]

BASE = """
version: 1
models:
  - id: a
    litellm_model: openai/a
    protocol: openai
    api_base: ${UP:-http://127.0.0.1:9100}/v1
    prices: {input: 1, output: 2}
    context_window: 1000
routes:
  - match: auto
    candidates: [a]
"""


def parse(text: str, env: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
    return parse_policy(text, source="p.yaml", env=env or {})


def no_prices(model: str) -> None:
    return None


def test_shipped_policies_load() -> None:
    for path in [ROOT / "policies/default.yaml", *sorted((ROOT / "policies/examples").glob("*.yaml"))]:
        policy = load_policy(path, env={})
        catalog = build_catalog(policy)
        assert catalog.backends, path


def test_interpolation_default_and_override() -> None:
    assert parse(BASE).models["a"].api_base == "http://127.0.0.1:9100/v1"
    assert parse(BASE, {"UP": "http://h:1"}).models["a"].api_base == "http://h:1/v1"


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (lambda t: t.replace("protocol: openai", "protocol: grpc"), "p.yaml: models[0] (id 'a').protocol:"),
        (lambda t: t.replace("context_window: 1000", "context_window: 1000\n    colour: red"),
         "p.yaml: models[0] (id 'a').colour: unknown field"),
        (lambda t: t.replace("context_window: 1000", "context_window: big"), "p.yaml: models[0] (id 'a').context_window:"),
        (lambda t: t.replace("candidates: [a]", "candidates: [b]"),
         "p.yaml: routes[0] (match 'auto').candidates[0]: unknown model id 'b' (known: a)"),
        (lambda t: t + "surprise: 1\n", "p.yaml: surprise: unknown field"),
        (lambda t: t.replace("${UP:-http://127.0.0.1:9100}", "${UP}"), "p.yaml: models[0] (id 'a').api_base"),
        (lambda t: t.replace("api_base: ${UP:-http://127.0.0.1:9100}/v1", "api_base: file:///etc/passwd"),
         "p.yaml: models[0] (id 'a'): api_base must start with http"),
        (lambda t: t + "rules:\n  - name: r\n    when: {prompt_tokens: {$gt: 1}}\n",
         "p.yaml: rules[0] (name 'r'): a rule needs"),
        (lambda t: t + "rules:\n  - name: r\n    when: {colour: red}\n    exclude: [a]\n",
         "p.yaml: rules[0] (name 'r').when: unknown feature 'colour'"),
        (lambda t: t + "rules:\n  - name: r\n    when: {prompt_tokens: {$where: 1}}\n    exclude: [a]\n",
         "p.yaml: rules[0] (name 'r').when"),
        (lambda t: t.replace("candidates: [a]", "candidates: [a]\n    passthrough: a"),
         "p.yaml: routes[0] (match 'auto'): give candidates or passthrough, not both"),
        (lambda t: "!!python/object/apply:os.system ['true']\n" + t, "p.yaml: line 3, column 1: not valid YAML"),
        (lambda t: t.replace("routes:", "routes: [\n"), "p.yaml: line "),  # never "<unicode string>"
        (lambda t: t.replace("context_window: 1000", "context_windw: 1000"),
         "p.yaml: models[0] (id 'a').context_windw: unknown field (did you mean 'context_window'?)"),
        (lambda t: t.replace("candidates: [a]", "candidates: [a]\n    fallback: [a]"),
         "p.yaml: routes[0] (match 'auto').fallback: unknown field (did you mean 'fallbacks'?)"),
        (lambda t: t + "objectiv: {}\n", "p.yaml: objectiv: unknown field (did you mean 'objective'?)"),
        (lambda t: t.replace("prices: {input: 1, output: 2}", "prices: {input: 1, outptu: 2}"),
         "p.yaml: models[0] (id 'a').prices.outptu: unknown field (did you mean 'output'?)"),
        (lambda t: "- just\n- a list\n", "p.yaml: the top level must be a mapping"),
        # A model twice among the candidates: explored twice as often as its logged propensity says.
        (lambda t: t.replace("candidates: [a]", "candidates: [a, a]"),
         "p.yaml: routes[0] (match 'auto'): candidates: 'a' is listed twice"),
        (lambda t: t.replace("candidates: [a]", "candidates: [a]\n    fallbacks: [a, a]"),
         "p.yaml: routes[0] (match 'auto'): fallbacks: 'a' is listed twice"),
        # A value the feature never holds: "prompt_tokens: '>10000'" loaded, and the rule never fired.
        (lambda t: t + "rules:\n  - name: r\n    when: {prompt_tokens: '>10000'}\n    exclude: [a]\n",
         "p.yaml: rules[0] (name 'r').when.prompt_tokens: prompt_tokens is a number: '>10000' never equals it "
         "(write {$gt: 10000})"),
        (lambda t: t + "rules:\n  - name: r\n    when: {thinking: 'yes'}\n    exclude: [a]\n",
         "p.yaml: rules[0] (name 'r').when.thinking: thinking is a boolean: 'yes' never equals it"),
        (lambda t: t + "rules:\n  - name: r\n    when: {protocol: {$in: [openai, 1]}}\n    exclude: [a]\n",
         "p.yaml: rules[0] (name 'r').when.protocol.$in: protocol is a string: 1 never equals it"),
        (lambda t: t + "rules:\n  - name: r\n    when: {protocol: {$gte: 1}}\n    exclude: [a]\n",
         "p.yaml: rules[0] (name 'r').when.protocol.$gte: protocol is a string: $gte compares numbers"),
        # A feature name with a typo gets the nearest one, as a field name does.
        (lambda t: t + "rules:\n  - name: r\n    when: {protocl: openai}\n    exclude: [a]\n",
         "p.yaml: rules[0] (name 'r').when: unknown feature 'protocl' (did you mean 'protocol'?)"),
        (lambda t: t + "rules:\n  - name: r\n    when: {header.x-tier: gold}\n    exclude: [a]\n",
         "unknown feature 'header.x-tier' (did you mean 'headers.x-tier'?)"),
        # An empty list was "Value error, give exactly one of candidates or passthrough".
        (lambda t: t.replace("candidates: [a]", "candidates: []"),
         "p.yaml: routes[0] (match 'auto'): no backend: give candidates (a non-empty list of model ids) "
         "or passthrough (one id)"),
        # No model or no route checked "ok", and the router refused every request.
        (lambda t: t.replace("candidates: [a]", "candidates: []").split("routes:")[0] + "routes: []\n",
         "p.yaml: routes: must not be empty"),
        (lambda t: "version: 1\nmodels: []\nroutes: [{match: auto, passthrough: a}]\n",
         "p.yaml: models: must not be empty"),
        # passthrough is one id, not a list: no "[0]" in its path.
        (lambda t: t.replace("candidates: [a]", "passthrough: b"),
         "p.yaml: routes[0] (match 'auto').passthrough: unknown model id 'b' (known: a)"),
        # A section's fields dedented under it: pydantic's "Input should be a valid dictionary or
        # instance of ObjectiveSpec", then "exploration: unknown field" with no word of where it goes.
        (lambda t: t + "objective:\nexploration: {epsilon: 0.2}\n",
         "p.yaml: objective: empty: its fields go on the lines below it, indented under it (or remove the line)\n"
         "p.yaml: exploration: unknown field at this level (a field of objective: indent it under it)"),
        (lambda t: t + "objective:\n  max_attempts: 2\nexploration: {epsilon: 0.2}\n",
         "p.yaml: exploration: unknown field at this level (a field of objective: indent it under it)"),
        (lambda t: t.replace("    context_window: 1000", "context_window: 1000"),
         "p.yaml: context_window: unknown field at this level (a field of each item of models: indent it under it)"),
        # YAML lets a later key silently replace an earlier one; a policy file does not.
        (lambda t: t.replace("context_window: 1000", "context_window: 1000\n    context_window: 10"),
         "p.yaml: models[0] (id 'a'): line 10: duplicate key 'context_window' (line 9 has it already)"),
    ],
)  # fmt: skip
def test_errors_name_file_and_field(mutate, expected: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigError) as exc:
        parse(mutate(BASE))
    assert expected in str(exc.value)


def test_invalid_yaml_is_one_line_naming_file_line_and_column() -> None:
    # PyYAML's message spans four lines, the last a caret under the quoted line.
    with pytest.raises(ConfigError) as exc:
        parse(BASE.replace("routes:", "routes: [\n"))
    message = str(exc.value)
    assert "\n" not in message, message
    assert re.match(r"p\.yaml: line \d+, column \d+: not valid YAML: expected the node content, but found '-' "
                    r"\(while parsing a flow node at line \d+\)$", message), message  # fmt: skip


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        # A line indented one step too far: the field before it, and what to look at. It was
        # "p.yaml: not valid YAML: while parsing a block mapping; expected <block end>, but found
        # '<block mapping start>' (in "p.yaml", line 10, column 5)": which model, the reader had
        # to count.
        (lambda t: t.replace("    context_window: 1000", "      context_window: 1000"),
         "p.yaml: line 9, column 7 (after models[0] (id 'a').prices): not valid YAML: expected <block end>, "
         "but found '<block mapping start>' (while parsing a block mapping at line 4); is this line "
         "indented like the lines of its block?"),
        (lambda t: t.replace("    context_window: 1000", "\tcontext_window: 1000"),
         "p.yaml: line 9, column 1 (after models[0] (id 'a').prices): not valid YAML: found character '\\t' "
         "that cannot start any token (while scanning for the next token); YAML indents with spaces, never tabs"),
        (lambda t: t.replace("  - match: auto", "   - match: auto"),
         "p.yaml: line 12, column 5 (after routes[0] (match 'auto').match): not valid YAML"),
        # Nothing above the slip loads: the line alone.
        (lambda t: "version: [1\n" + t, "p.yaml: line 3, column 8: not valid YAML: expected ',' or ']'"),
        # An empty file was "the top level must be a mapping".
        (lambda t: "", "p.yaml: the file is empty"),
        (lambda t: "# nothing yet\n", "p.yaml: the file is empty"),
    ],
)  # fmt: skip
def test_a_yaml_slip_names_its_line_and_the_field_before_it(mutate, expected: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigError) as exc:
        parse(mutate(BASE))
    assert str(exc.value).startswith(expected), str(exc.value)


def test_duplicate_model_ids() -> None:
    text = BASE.replace("routes:", "  - id: a\n    litellm_model: openai/b\n    protocol: openai\nroutes:")
    with pytest.raises(ConfigError, match=r"models\[1\] \(id 'a'\): duplicate model id"):
        parse(text)


RULE = "  - name: {name}\n    when: {{protocol: openai}}\n    exclude: [a]\n"


@pytest.mark.parametrize(
    ("tail", "expected"),
    [
        # A scope's rule replaces every rule of its name: two of one name were checked "ok", and
        # a scope meaning to override one silently dropped both.
        ("rules:\n" + RULE.format(name="r") + RULE.format(name="r"),
         "p.yaml: rules[1] (name 'r').name: duplicate rule name (rules[0] has it; a scope's rule "
         "replaces rules by name)"),
        # The first matching route wins: a later route of the same match never served a request.
        ("  - match: auto\n    passthrough: a\n",
         "p.yaml: routes[1] (match 'auto'): never used: routes[0] (match 'auto') matches every "
         "request it would"),
        ("  - match: \"claude-*\"\n    passthrough: a\n  - match: claude-opus\n    passthrough: a\n",
         "p.yaml: routes[2] (match 'claude-opus'): never used: routes[1] (match 'claude-*') matches "
         "every request it would"),
    ],
)  # fmt: skip
def test_a_rule_name_or_route_given_twice_is_refused(tail: str, expected: str) -> None:
    with pytest.raises(ConfigError) as exc:
        parse(BASE + tail)
    assert str(exc.value) == expected


def test_a_scope_route_given_twice_is_refused_but_may_shadow_the_policys_own() -> None:
    scope = "scopes:\n  - name: s\n    match: {{repo: 'acme/*'}}\n    routes: [{routes}]\n"
    shadowing = (
        BASE
        + "  - match: claude-opus\n    passthrough: a\n"
        + scope.format(routes="{match: 'claude-*', passthrough: a}")
    )
    assert [r.match for r in parse(shadowing).routes] == ["auto", "claude-opus"]
    twice = BASE + scope.format(routes="{match: auto, passthrough: a}, {match: auto, passthrough: a}")
    with pytest.raises(ConfigError) as exc:
        parse(twice)
    assert str(exc.value) == (
        "p.yaml: scopes[0].routes[1] (match 'auto'): never used: scopes[0].routes[0] (match 'auto') "
        "matches every request it would"
    )


def test_a_route_after_a_glob_it_is_not_covered_by_is_kept() -> None:
    # claude-* before claude-opus is dead; claude-opus before claude-* is the usual override.
    text = BASE + '  - match: claude-opus\n    passthrough: a\n  - match: "claude-*"\n    passthrough: a\n'
    assert [r.match for r in parse(text).routes] == ["auto", "claude-opus", "claude-*"]


def test_missing_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read policy file"):
        load_policy(tmp_path / "nope.yaml")


def test_prices_from_litellm_map_when_omitted() -> None:
    text = BASE.replace("prices: {input: 1, output: 2}", "prices: {output: 2}")
    catalog = build_catalog(parse(text), lookup=lambda m: {"input_cost_per_token": 3e-6})
    assert catalog["a"].price.input == pytest.approx(3e-6)
    assert catalog["a"].price.output == pytest.approx(2e-6)
    # Cache prices default to the input price when nothing says otherwise.
    assert catalog["a"].price.cache_read == pytest.approx(3e-6)


def test_unknown_price_is_a_config_error_naming_the_model_and_the_fix() -> None:
    # It said "models[0].prices.input" where every other error says which model: "(id 'a')".
    text = BASE.replace("prices: {input: 1, output: 2}", "prices: {}")
    with pytest.raises(ConfigError) as exc:
        build_catalog(parse(text), lookup=no_prices)
    assert str(exc.value) == (
        "p.yaml: models[0] (id 'a').prices.input: not given, and litellm's price map has no price for "
        "'openai/a' (give it in $ per million tokens: prices: {input: 0.25, output: 2})"
    )
    text = BASE.replace("context_window: 1000", "")
    with pytest.raises(ConfigError, match=r"p.yaml: models\[0\] \(id 'a'\).context_window: not given"):
        build_catalog(parse(text), lookup=no_prices)


@pytest.mark.parametrize(
    ("given", "said"),
    [
        ("prices: {}", "prices.input: not given, and litellm's price map has no price for "
         "'anthropic/claude-sonet-4-5': did you mean 'anthropic/claude-sonnet-4-5'? If the name is right, give it "
         "in $ per million tokens: prices: {input: 0.25, output: 2}"),
        ("prices: {input: 1, output: 2}", "context_window: not given, and litellm does not know "
         "'anthropic/claude-sonet-4-5': did you mean 'anthropic/claude-sonnet-4-5'? If the name is right, give "
         "the model's window in tokens"),
    ],
)  # fmt: skip
def test_a_misspelt_model_name_gets_the_nearest_in_litellms_map(given: str, said: str) -> None:
    # It was said to lack a price (or a window) alone: given one, the misspelt name passed
    # `router check` and failed at the provider on every call.
    text = BASE.replace("openai/a", "anthropic/claude-sonet-4-5").replace(
        "protocol: openai", "protocol: anthropic"
    )
    text = text.replace("prices: {input: 1, output: 2}", given).replace("    context_window: 1000\n", "")
    with pytest.raises(ConfigError) as exc:
        build_catalog(parse(text))
    assert str(exc.value) == f"p.yaml: models[0] (id 'a').{said}"


def test_missing_key_names_the_variable() -> None:
    text = BASE.replace("context_window: 1000", "context_window: 1000\n    api_key_env: MY_KEY")
    backend = build_catalog(parse(text), lookup=no_prices)["a"]
    with pytest.raises(MissingCredentials, match="MY_KEY"):
        backend.api_key(env={})
    assert backend.api_key(env={"MY_KEY": "k"}) == "k"


def test_committed_schema_is_current_and_every_shipped_policy_points_at_it_and_passes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    import jsonschema
    import orjson
    import yaml

    from router.app.cli import main
    from router.policy.loading import json_schema

    committed = orjson.loads((ROOT / "policies/policy.schema.json").read_bytes())
    assert committed == json_schema(), "regenerate: router schema > policies/policy.schema.json"
    assert main(["schema"]) == 0
    assert orjson.loads(capsys.readouterr().out) == committed
    validator = jsonschema.Draft202012Validator(committed)
    for path in [ROOT / "policies/default.yaml", *sorted((ROOT / "policies/examples").glob("*.yaml"))]:
        first = path.read_text().splitlines()[0]
        assert first.startswith("# yaml-language-server: $schema="), path
        assert (path.parent / first.split("=", 1)[1]).resolve() == ROOT / "policies/policy.schema.json"
        errors = list(validator.iter_errors(yaml.safe_load(path.read_text())))
        assert not errors, (path, errors[:1])
    typo = yaml.safe_load((ROOT / "policies/examples/local.yaml").read_text())
    typo["models"][0]["context_windw"] = 1
    assert list(validator.iter_errors(typo))  # the editor flags what the router would refuse


def test_objective_takes_a_value_or_a_target_and_reads_old_floors_as_targets() -> None:
    assert (
        parse(BASE + "objective: {value_per_completed_usd: 0.5}\n").objective.value_per_completed_usd == 0.5
    )
    assert parse(BASE + "objective: {target_success: 0.8}\n").objective.target == 0.8
    with pytest.raises(ConfigError, match="give one of value_per_completed_usd, target_success"):
        parse(BASE + "objective: {target_success: 0.8, value_per_completed_usd: 1}\n")
    old = parse(BASE + "objective: {min_success: 0.7}\n")
    assert old.objective.target == 0.7
    [warning] = old.warnings
    assert "p.yaml: objective.min_success is deprecated" in warning
    assert "Write `target_success: 0.7`" in warning and "value_per_completed_usd" in warning
    assert parse(BASE).warnings == []


def test_a_key_variable_written_as_a_reference_is_refused_without_its_value() -> None:
    """``api_key_env: ${MY_KEY}`` became the key, which every "is not set" message then quoted
    (a client's 500, the log, ``router check`` and the console at startup)."""
    text = BASE.replace("context_window: 1000", "context_window: 1000\n    api_key_env: ${MY_KEY}")
    with pytest.raises(ConfigError) as caught:
        parse(text, {"MY_KEY": "abcSECRET0123456789"})
    message = str(caught.value)
    assert "abcSECRET" not in message
    assert "models[0] (id 'a').api_key_env" in message and "(api_key_env: MY_KEY)" in message


def test_a_key_pasted_as_the_key_variable_is_told_what_goes_there_without_its_value() -> None:
    """It said "String should match pattern '^[A-Za-z_][A-Za-z0-9_]*$'" (after `api_key:` was
    refused with "did you mean 'api_key_env'?", the key is what a newcomer writes there)."""
    text = BASE.replace(
        "context_window: 1000", "context_window: 1000\n    api_key_env: sk-proj-abcSECRET-0123"
    )
    with pytest.raises(ConfigError) as caught:
        parse(text)
    message = str(caught.value)
    assert "abcSECRET" not in message and "pattern" not in message
    assert "models[0] (id 'a').api_key_env: the NAME of the environment variable holding the key" in message


def test_a_model_priced_in_tiers_by_prompt_length_takes_each_tier_from_the_map() -> None:
    """Some of litellm's models change price twice (above 32k and 256k tokens): a prompt past the
    second was priced at the first's."""
    known = {
        "input_cost_per_token": 1e-6, "output_cost_per_token": 2e-6,
        "input_cost_per_token_above_32k_tokens": 2e-6,
        "input_cost_per_token_above_256k_tokens": 4e-6, "output_cost_per_token_above_256k_tokens": 8e-6,
    }  # fmt: skip
    text = BASE.replace("    prices: {input: 1, output: 2}\n", "")
    price = build_catalog(parse(text), lookup=lambda m: known)["a"].price
    assert (price.at(32_000).input, price.at(32_000).output) == (1e-6, 2e-6)
    assert (price.at(40_000).input, price.at(40_000).output) == (2e-6, 2e-6)  # output as below it
    assert (price.at(300_000).input, price.at(300_000).output) == (4e-6, 8e-6)


def test_credentials_in_an_api_base_are_refused_without_showing_them() -> None:
    """With a key beside them, every OpenAI-protocol call was a 500 ("internal error in the router"),
    and the policy file is shown on the dashboard and kept with its revisions."""
    text = BASE.replace("${UP:-http://127.0.0.1:9100}/v1", "https://user:pw-SECRET@example.com/v1")
    with pytest.raises(ConfigError) as caught:
        parse(text)
    assert "api_base must not carry credentials" in str(caught.value) and "pw-SECRET" not in str(caught.value)
    assert parse(BASE.replace("${UP:-http://127.0.0.1:9100}/v1", "https://example.com/v1/a@b"))  # a path's @


def test_a_policy_gives_its_own_long_context_prices() -> None:
    """A model litellm's map prices flat (Sonnet 4.6 has a 1M-token window there and no tier) could
    not be given the dearer prices its provider bills long prompts at; an empty list turns off the
    map's tiers."""
    tiered = "prices: {input: 3, output: 15, long_context: [{above: 200000, input: 6, output: 22.5}]}"
    price = build_catalog(parse(BASE.replace("prices: {input: 1, output: 2}", tiered)), lookup=no_prices)[
        "a"
    ].price
    assert (price.at(200_000).input, price.at(200_000).output) == (3e-6, 15e-6)
    assert (price.at(200_001).input, price.at(200_001).output) == (6e-6, 22.5e-6)
    assert price.at(200_001).cache_read == price.cache_read  # not given: the price below
    known = {
        "input_cost_per_token": 1e-6,
        "output_cost_per_token": 2e-6,
        "input_cost_per_token_above_32k_tokens": 2e-6,
    }
    flat = BASE.replace("prices: {input: 1, output: 2}", "prices: {long_context: []}")
    assert build_catalog(parse(flat), lookup=lambda m: known)["a"].price.at(40_000).input == 1e-6
