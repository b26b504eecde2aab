"""Reading a policy file once: safe YAML, ``${VAR}`` interpolation, validation, and error messages
that name the file, the field path (with the item's id) and the nearest known key for a typo.
"""

from __future__ import annotations

import difflib
import os
import re
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from router.errors import ConfigError
from router.policy.config import Policy, PolicyFile, check_reachable
from router.policy.interpolate import ITEM_NAMES, interpolate, named_path


def load_policy(path: str | Path, env: Mapping[str, str] | None = None) -> Policy:
    """Read, interpolate, validate and compile a policy file; every error names file and field."""
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{source}: cannot read policy file: {exc.strerror}") from None
    except UnicodeDecodeError as exc:  # a binary file, or one saved in Latin-1: a traceback before
        raise ConfigError(f"{source}: not a UTF-8 text file (byte {exc.start}: {exc.reason})") from None
    return parse_policy(text, source=source, env=os.environ if env is None else env)


def parse_policy(
    text: str, *, source: str, env: Mapping[str, str] | None, base: Path | None = None, confined: bool = False
) -> Policy:
    """``env=None``: no ``${VAR}`` is read from the environment (only defaults apply); ``base``,
    ``confined``: see ``Policy``."""
    try:
        # The safe loader: no Python tags, no object construction from YAML.
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        if node is not None and _expanded_size(node) > MAX_YAML_NODES:
            raise ConfigError(
                f"{source}: the document expands to more than {MAX_YAML_NODES} values "
                "(anchors and aliases repeated inside each other?)"
            )
        if node is not None and (dup := _duplicate_key(node)) is not None:
            raise ConfigError(f"{source}: {dup}")
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: {_yaml_problem(exc, text)}") from None
    except RecursionError:  # PyYAML composes recursively: "[[[[...": a traceback before
        raise ConfigError(f"{source}: the document is nested too deeply") from None
    if raw is None:
        raise ConfigError(f"{source}: the file is empty (a policy needs at least version, models and routes)")
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: the top level must be a mapping (version: 1, models: ..., routes: ...)")
    _key_names_are_literal(raw, source)
    raw = interpolate(raw, env, source=source)
    try:
        spec = PolicyFile.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(_describe(exc, source, raw)) from None
    policy = Policy(spec, source, base, confined=confined)
    check_reachable(source, spec.routes)
    for i, scope in enumerate(spec.scopes):
        check_reachable(source, scope.routes or [], f"scopes[{i}].routes")
    return policy


_REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)")


def _key_names_are_literal(raw: dict[str, Any], source: str) -> None:
    """``api_key_env`` names the variable; written ``${OPENAI_API_KEY}`` it was replaced by the key
    itself, which then passed as a variable's name and was quoted by every "environment variable
    ... is not set" message: in each client's 500, the log's rows and the console."""
    models = raw.get("models")
    for i, model in enumerate(models if isinstance(models, list) else []):
        value = model.get("api_key_env") if isinstance(model, dict) else None
        if isinstance(value, str) and "$" in value:
            name = _REFERENCE.search(value)
            raise ConfigError(
                f"{source}: {named_path(['models', i, 'api_key_env'], raw)}: write the variable's name, "
                f"not a reference to it (api_key_env: {name.group(1) if name else 'OPENAI_API_KEY'}): "
                "${...} puts the key itself here"
            )


def _yaml_problem(exc: yaml.YAMLError, text: str) -> str:
    """PyYAML's complaint on one line (its own spans four, with a caret under a quoted line), led
    by where it is: the line, and the field before it in the terms of the other errors
    (``models[1] (id 'mid').prices``), since a line number alone is hard to match to an edit."""
    mark = getattr(exc, "problem_mark", None)
    if not isinstance(exc, yaml.MarkedYAMLError) or mark is None:
        return f"not valid YAML: {' '.join(str(exc).split())}"
    where = f"line {mark.line + 1}, column {mark.column + 1}"
    after = _field_before(text, mark.line)
    if after:
        where += f" (after {after})"
    said = str(exc.problem or "")
    if exc.context:
        context_mark = exc.context_mark
        at = f" at line {context_mark.line + 1}" if context_mark is not None else ""
        said += f" ({exc.context}{at})"
    hint = next((h for cue, h in _YAML_HINTS if cue in said), "")
    return f"{where}: not valid YAML: {said}{hint}"


#: What the usual slips of a hand edit look like in PyYAML's words, and what to look at.
_YAML_HINTS = (
    ("'\\t'", "; YAML indents with spaces, never tabs"),
    ("expected <block end>", "; is this line indented like the lines of its block?"),
    (
        "mapping values are not allowed here",
        "; a value holding ': ' needs quotes, or the line is indented too far",
    ),
)


def _field_before(text: str, line: int) -> str:
    """The path of the last field that ends before ``line`` (0-based), or ''. Read from the nodes
    of the lines above it, which may load where the whole file did not; never constructed, so an
    alias bomb above a typo costs nothing."""
    head = "".join(text.splitlines(keepends=True)[:line])
    try:
        root = yaml.compose(head, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return ""
    parts: list[str | int] = []
    node, seen = root, set()
    # Not into a flow collection (``prices: {input: 1}``): to the reader its line is one field.
    while isinstance(node, yaml.CollectionNode) and node.value and not node.flow_style:
        if id(node) in seen:  # an alias inside its own anchor
            break
        seen.add(id(node))
        last = node.value[-1]
        if isinstance(node, yaml.SequenceNode):
            parts.append(len(node.value) - 1)
            node = last
        elif isinstance(last[0], yaml.ScalarNode):
            parts.append(last[0].value)
            node = last[1]
        else:
            break
    return _named_path_of_nodes(parts, root)


def _named_path_of_nodes(parts: list[str | int], root: yaml.Node | None) -> str:
    """``named_path`` where only the nodes exist: the one name it reads (an item's id, match or
    name) is handed to it in a stand-in of the document's shape."""
    name = None
    if (
        len(parts) >= 2
        and isinstance(parts[1], int)
        and parts[0] in ITEM_NAMES
        and isinstance(root, yaml.MappingNode)
    ):
        items = next(
            (v for k, v in root.value if isinstance(k, yaml.ScalarNode) and k.value == parts[0]), None
        )
        item = (
            items.value[parts[1]]
            if isinstance(items, yaml.SequenceNode) and parts[1] < len(items.value)
            else None
        )
        if isinstance(item, yaml.MappingNode):
            key = ITEM_NAMES[str(parts[0])]
            name = next((v.value for k, v in item.value if isinstance(k, yaml.ScalarNode) and k.value == key
                         and isinstance(v, yaml.ScalarNode)), None)  # fmt: skip
    stand_in = (
        {parts[0]: [{ITEM_NAMES[str(parts[0])]: name}] * (int(parts[1]) + 1)} if name is not None else {}
    )
    return named_path(parts, stand_in)


#: A policy is a few hundred values; aliases nested in aliases can make a short file expand to
#: billions, which every later pass (interpolation, validation) would walk.
MAX_YAML_NODES = 100_000


def _duplicate_key(root: yaml.Node) -> str | None:
    """The first mapping key given twice, said with its path and both lines: YAML keeps the later
    value without a word, so an edit that adds a key a model already has would be silently
    half-applied."""
    seen_nodes: set[int] = set()
    stack: list[tuple[yaml.Node, list[str | int]]] = [(root, [])]
    while stack:
        node, parts = stack.pop()
        if id(node) in seen_nodes:
            continue
        seen_nodes.add(id(node))
        if isinstance(node, yaml.MappingNode):
            lines: dict[str, int] = {}
            for key, value in node.value:
                if isinstance(key, yaml.ScalarNode) and key.tag != "tag:yaml.org,2002:merge":
                    line = key.start_mark.line + 1
                    if key.value in lines:
                        where = _named_path_of_nodes(parts, root)
                        said = f"line {line}: duplicate key {key.value!r} (line {lines[key.value]} has it already)"
                        return f"{where}: {said}" if where else said
                    lines[key.value] = line
                    stack.append((value, [*parts, key.value]))
                else:
                    stack.extend(((key, parts), (value, parts)))
        elif isinstance(node, yaml.SequenceNode):
            stack.extend((item, [*parts, i]) for i, item in enumerate(node.value))
    return None


def _expanded_size(root: yaml.Node) -> int:
    """How many values the document has once aliases are expanded, counted without expanding them."""
    sizes: dict[int, int] = {}
    open_: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        if id(node) in sizes:
            continue
        if isinstance(node, yaml.MappingNode):
            kids: list[yaml.Node] = [n for pair in node.value for n in pair]
        elif isinstance(node, yaml.SequenceNode):
            kids = list(node.value)
        else:
            kids = []
        if children_done or not kids:
            open_.discard(id(node))
            sizes[id(node)] = min(1 + sum(sizes[id(k)] for k in kids), MAX_YAML_NODES + 1)
            continue
        if id(node) in open_ or any(id(k) in open_ for k in kids):
            return MAX_YAML_NODES + 1  # an alias inside its own anchor: infinite
        open_.add(id(node))
        stack.append((node, True))
        stack.extend((k, False) for k in kids if id(k) not in sizes)
    return sizes[id(root)]


def _describe(exc: ValidationError, source: str, raw: Mapping[str, Any]) -> str:
    lines = []
    for err in exc.errors():
        loc = [p for p in err["loc"] if not isinstance(p, str) or not p.startswith("function-")]
        where = named_path(loc, raw)
        msg = err["msg"]
        if err["type"] == "value_error":  # our validators' own sentence, without pydantic's "Value error, "
            msg = str(err.get("ctx", {}).get("error", msg))
        elif err["type"] == "too_short" and not err["input"]:
            msg = "must not be empty"
        elif err["type"] in ("model_type", "model_attributes_type", "dict_type") and err["input"] is None:
            # "objective:" with its fields dedented below it: pydantic said "Input should be a valid
            # dictionary or instance of ObjectiveSpec".
            msg = "empty: its fields go on the lines below it, indented under it (or remove the line)"
        if err["type"] == "extra_forbidden":
            msg = "unknown field"
            near = difflib.get_close_matches(str(loc[-1]), _known_keys(loc[:-1]), n=1, cutoff=0.6)
            home = _home_of(loc)
            if near:
                msg += f" (did you mean {near[0]!r}?)"
            elif home:
                # A field indented too little lands a level up, where it is unknown.
                msg += f" at this level ({home}: indent it under it)"
        lines.append(f"{source}: {where or '(top level)'}: {msg}")
    return "\n".join(lines)


def _known_keys(loc: Sequence[str | int]) -> list[str]:
    """The field names allowed at ``loc`` (a path into ``PolicyFile``), for "did you mean"."""
    model = _model_at(loc)
    return list(model.model_fields) if model is not None else []


def _home_of(loc: Sequence[str | int]) -> str | None:
    """Where ``loc[-1]`` is a field one level down from where it was found: "a field of objective",
    "a field of each item of models"."""
    parent = _model_at(loc[:-1])
    if parent is None:
        return None
    for name, field in parent.model_fields.items():
        inner = _model_in(field.annotation)
        if inner is not None and loc[-1] in inner.model_fields:
            listed = typing.get_origin(field.annotation) is list or any(
                typing.get_origin(a) is list for a in typing.get_args(field.annotation)
            )
            return f"a field of {'each item of ' if listed else ''}{name}"
    return None


def _model_at(loc: Sequence[str | int]) -> Any:
    """The pydantic model of the section at ``loc`` (a path into ``PolicyFile``; None: no section)."""
    model: Any = PolicyFile
    for part in loc:
        if isinstance(part, int):
            continue
        field = model.model_fields.get(part)
        model = _model_in(field.annotation) if field is not None else None
        if model is None:
            return None
    return model


def _model_in(annotation: Any) -> Any:
    """The pydantic model inside ``X``, ``X | None``, ``list[X]`` or ``Annotated[X, ...]``."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def json_schema() -> dict[str, Any]:
    """The policy file's JSON Schema (``router schema``; ``policies/policy.schema.json``)."""
    schema = PolicyFile.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "router policy"
    schema["description"] = "A policy file of the cost-aware router: models, routes, rules, objective."
    return schema
