"""The tree's layering: no import cycles (type-only and function-level imports included), and each
top-level folder imports only its own layer or lower ones (``LAYERS``), the assembly (``router.app``)
at the top."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

#: Lowest first; the names of one layer may import each other. The request's path reads upwards:
#: features read the request, policy decides, forward answers; learning fits offline what rollout
#: puts into service; http, ui and the fake provider are the edges; app assembles them all.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("errors", "ids", "digits", "background", "jsondoc"),
    ("protocols", "store"),
    ("shared",),
    ("telemetry", "features"),
    ("policy",),
    ("forward",),
    ("learning",),
    ("rollout",),
    ("http",),
    ("ui", "fakeupstream"),
    ("app",),
)


def import_graph() -> dict[str, set[str]]:
    """Module → the router modules it imports anywhere in its text."""
    files = {}
    for path in (ROOT / "router").rglob("*.py"):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        files[".".join(parts)] = path

    def resolve(name: str) -> str | None:
        while name and name not in files:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for module, path in files.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        targets: list[str] = []
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets += [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*up, *([node.module] if node.module else [])])
                targets += [f"{base}.{a.name}" if f"{base}.{a.name}" in files else base for a in node.names]
        graph[module] = {r for t in targets if (r := resolve(t)) and r != module}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def layer_of(module: str) -> int:
    """The layer of ``router.<top>...`` (``router`` itself, the package's root, sits below all)."""
    parts = module.split(".")
    if len(parts) == 1:
        return -1
    for level, names in enumerate(LAYERS):
        if parts[1] in names:
            return level
    raise AssertionError(f"{module}: router.{parts[1]} is in no layer of LAYERS")


def upward_imports(graph: dict[str, set[str]]) -> dict[str, list[str]]:
    return {
        m: bad
        for m, ts in sorted(graph.items())
        if (bad := sorted(t for t in ts if layer_of(t) > layer_of(m)))
    }


def test_the_layer_check_finds_an_upward_import() -> None:
    graph = {
        "router.features.x": {"router.policy.y", "router.store.z"},
        "router.policy.y": {"router.features.x"},
    }
    assert upward_imports(graph) == {"router.features.x": ["router.policy.y"]}


def test_every_folder_imports_only_its_layer_or_lower() -> None:
    assert upward_imports(import_graph()) == {}


def test_no_import_cycles() -> None:
    assert cycles(import_graph()) == []


def test_only_the_assembly_knows_the_app() -> None:
    graph = import_graph()
    upward = {m: sorted(t for t in ts if t.startswith("router.app")) for m, ts in graph.items()}
    assert {m: ts for m, ts in upward.items() if ts and not m.startswith("router.app")} == {}


def test_telemetry_and_the_lower_half_never_import_the_http_layer() -> None:
    graph = import_graph()
    lower = ("router.telemetry", "router.policy", "router.forward", "router.store", "router.shared",
             "router.protocols", "router.features", "router.learning")  # fmt: skip
    bad = {
        m: sorted(t for t in ts if t.startswith("router.http"))
        for m, ts in graph.items()
        if m.startswith(lower)
    }
    assert {m: ts for m, ts in bad.items() if ts} == {}
