"""``${VAR}`` / ``${VAR:-default}`` interpolation in the string values of a YAML-loaded tree.

Only string values are expanded (mapping keys never are). ``$${`` is a literal ``${``; a
``$`` not followed by ``{`` is left alone. A substituted value is never expanded again, so an
environment variable holding ``${X}`` stays literal. ``${VAR:-default}`` follows the shell:
the default applies when ``VAR`` is unset *or* empty. Without an environment (``env=None``:
a policy posted to the server) only defaults apply, so no value of the router's environment
can be echoed back to a caller in a preview or an error.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from router.errors import ConfigError

__all__ = ["format_path", "interpolate", "named_path"]

# One alternation so a single left-to-right scan sees escapes before references:
# ``$${X}`` must become the literal ``${X}``, not ``$`` + the value of X.
_TOKEN = re.compile(
    r"\$\$\{"
    r"|\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?::-(?P<default>[^}]*))?\}"
    r"|\$\{[^}]*(?P<closed>\}?)"
)
_MAX_DEPTH = 100
# Keys that would read ambiguously when joined with dots are shown bracketed and quoted.
_PLAIN_KEY = re.compile(r"[^\s\[\]]+")


def format_path(parts: Sequence[str | int]) -> str:
    """Render a field path the way users write it: ``models[2].api_base``."""
    out: list[str] = []
    for part in parts:
        if isinstance(part, int) and not isinstance(part, bool):
            out.append(f"[{part}]")
            continue
        key = str(part)
        if not _PLAIN_KEY.fullmatch(key):
            out.append(f"[{key!r}]")
        elif out:
            out.append(f".{key}")
        else:
            out.append(key)
    return "".join(out)


#: The key that names an item of each top-level list, shown beside its index.
ITEM_NAMES = {"models": "id", "routes": "match", "rules": "name"}


def named_path(parts: Sequence[str | int], root: Any) -> str:
    """``models[2].api_base`` → ``models[2] (id 'gpt-x').api_base``: an index alone is hard to find
    in a long file. ``root`` is the document the path points into."""
    if len(parts) >= 2 and isinstance(parts[1], int) and parts[0] in ITEM_NAMES and isinstance(root, Mapping):
        key = ITEM_NAMES[str(parts[0])]
        items = root.get(parts[0])
        item = items[parts[1]] if isinstance(items, list) and parts[1] < len(items) else None
        name = item.get(key) if isinstance(item, Mapping) else None
        if isinstance(name, str):
            return f"{format_path(parts[:2])} ({key} {name!r})" + format_path(["x", *parts[2:]])[1:]
    return format_path(parts)


def _located(source: str, parts: Sequence[str | int], message: str, root: Any) -> ConfigError:
    path = named_path(parts, root)
    return ConfigError(f"{source}: {path}: {message}" if path else f"{source}: {message}")


def _expand(text: str, env: Mapping[str, str] | None, source: str, parts: list[str | int], root: Any) -> str:
    def substitute(match: re.Match[str]) -> str:
        name = match.group("name")
        if name is not None:
            default = match.group("default")
            value = None if env is None else env.get(name)
            if default is not None:
                return value if value else default
            if env is None:
                raise _located(
                    source,
                    parts,
                    f"${{{name}}}: a posted policy is not read with the router's environment "
                    f"(write ${{{name}:-value}} to preview with a value)",
                    root,
                )
            if value is None:
                raise _located(
                    source,
                    parts,
                    f"environment variable {name} is not set (use ${{{name}:-default}} for a default)",
                    root,
                )
            return value
        if match.group(0) == "$${":
            return "${"
        shown = match.group(0)
        if len(shown) > 40:
            shown = shown[:40] + "..."
        reason = "" if match.group("closed") else " (no closing '}')"
        raise _located(
            source,
            parts,
            f"malformed variable reference {shown!r}{reason}: "
            "write ${NAME} or ${NAME:-default} (NAME: letters, digits, '_', not starting with a digit), "
            "or $${ for a literal ${",
            root,
        )

    return _TOKEN.sub(substitute, text)


def interpolate(tree: Any, env: Mapping[str, str] | None, *, source: str) -> Any:
    """Return a copy of ``tree`` with references in string values expanded from ``env``.

    Raises ``ConfigError`` naming ``source`` and the field path for an unset variable
    without a default, a malformed reference, or a cyclic / absurdly deep tree.
    """
    parts: list[str | int] = []
    # PyYAML can build self-referencing structures from anchors; ids on the current path
    # catch the cycle before recursion does.
    on_path: set[int] = set()

    def walk(node: Any) -> Any:
        if isinstance(node, str):
            return _expand(node, env, source, parts, tree) if "$" in node else node
        if not isinstance(node, Mapping | list | tuple):
            return node
        if id(node) in on_path:
            raise _located(source, parts, "the document refers to itself (recursive anchor)", tree)
        if len(parts) >= _MAX_DEPTH:
            raise _located(source, parts, f"nested deeper than {_MAX_DEPTH} levels", tree)
        on_path.add(id(node))
        try:
            if isinstance(node, Mapping):
                result: dict[Any, Any] = {}
                for key, value in node.items():
                    parts.append(key if isinstance(key, str) else str(key))
                    result[key] = walk(value)
                    parts.pop()
                return result
            items = []
            for index, value in enumerate(node):
                parts.append(index)
                items.append(walk(value))
                parts.pop()
            return items if isinstance(node, list) else tuple(items)
        finally:
            on_path.discard(id(node))

    return walk(tree)
