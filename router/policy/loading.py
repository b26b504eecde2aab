"""Reading a policy file once: safe YAML, ``${VAR}`` interpolation, validation, and error messages
that name the file, the field path (with the item's id) and the nearest known key for a typo.
"""

from __future__ import annotations

import difflib
import os
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from router.errors import ConfigError
from router.policy.config import Policy, PolicyFile
from router.policy.interpolate import interpolate, named_path


def load_policy(path: str | Path, env: Mapping[str, str] | None = None) -> Policy:
    """Read, interpolate, validate and compile a policy file; every error names file and field."""
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{source}: cannot read policy file: {exc.strerror}") from None
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
        raise ConfigError(f"{source}: not valid YAML: {_yaml_problem(exc, source)}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: the top level must be a mapping")
    raw = interpolate(raw, env, source=source)
    try:
        spec = PolicyFile.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(_describe(exc, source, raw)) from None
    return Policy(spec, source, base, confined=confined)


def _yaml_problem(exc: yaml.YAMLError, source: str) -> str:
    """PyYAML's complaint on one line (its own spans four, with a caret under a quoted line),
    naming the file where it says "<unicode string>"."""
    mark = getattr(exc, "problem_mark", None)
    if isinstance(exc, yaml.MarkedYAMLError) and mark is not None:
        said = "; ".join(str(p) for p in (exc.context, exc.problem) if p)
        return f'{said} (in "{source}", line {mark.line + 1}, column {mark.column + 1})'
    return " ".join(str(exc).split()).replace('"<unicode string>"', f'"{source}"')


#: A policy is a few hundred values; aliases nested in aliases can make a short file expand to
#: billions, which every later pass (interpolation, validation) would walk.
MAX_YAML_NODES = 100_000


def _duplicate_key(root: yaml.Node) -> str | None:
    """The first mapping key given twice, said with both lines: YAML keeps the later value
    without a word, so an edit that adds a key a model already has would be silently half-applied."""
    seen_nodes: set[int] = set()
    stack = [root]
    while stack:
        node = stack.pop()
        if id(node) in seen_nodes:
            continue
        seen_nodes.add(id(node))
        if isinstance(node, yaml.MappingNode):
            lines: dict[str, int] = {}
            for key, value in node.value:
                if isinstance(key, yaml.ScalarNode) and key.tag != "tag:yaml.org,2002:merge":
                    line = key.start_mark.line + 1
                    if key.value in lines:
                        return f"line {line}: duplicate key {key.value!r} (line {lines[key.value]} has it already)"
                    lines[key.value] = line
                stack.extend((key, value))
        elif isinstance(node, yaml.SequenceNode):
            stack.extend(node.value)
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
        if err["type"] == "extra_forbidden":
            msg = "unknown field"
            near = difflib.get_close_matches(str(loc[-1]), _known_keys(loc[:-1]), n=1, cutoff=0.6)
            if near:
                msg += f" (did you mean {near[0]!r}?)"
        lines.append(f"{source}: {where or '(top level)'}: {msg}")
    return "\n".join(lines)


def _known_keys(loc: Sequence[str | int]) -> list[str]:
    """The field names allowed at ``loc`` (a path into ``PolicyFile``), for "did you mean"."""
    model: Any = PolicyFile
    for part in loc:
        if isinstance(part, int):
            continue
        field = (
            model.model_fields.get(part) if isinstance(model, type) and issubclass(model, BaseModel) else None
        )
        if field is None:
            return []
        model = _model_in(field.annotation)
    return list(model.model_fields) if isinstance(model, type) and issubclass(model, BaseModel) else []


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
