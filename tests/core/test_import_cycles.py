"""No import cycle in the core: data flows one way (hook -> capture -> reduce -> write -> read -> rules).

The graph is read from the source with ast: every ``import`` of an smdebug module counts, at module level
or inside a function (a deferred import only hides a cycle), except those under ``if TYPE_CHECKING:``."""

from __future__ import annotations

import ast
import pathlib

import smdebug

PACKAGE = pathlib.Path(smdebug.__file__).parent


def _modules() -> dict[str, pathlib.Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = ["smdebug", *path.relative_to(PACKAGE).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _type_checking_only(tree: ast.AST) -> set[int]:
    hidden = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            hidden.update(id(sub) for stmt in node.body for sub in ast.walk(stmt))
    return hidden


def import_graph() -> dict[str, set[str]]:
    """module -> the smdebug modules it imports."""
    modules = _modules()

    def owner(name: str) -> str | None:  # the module a dotted name lives in
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        hidden = _type_checking_only(tree)
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets = set()
        for node in ast.walk(tree):
            if id(node) in hidden:
                continue
            if isinstance(node, ast.Import):
                targets.update(owner(alias.name) for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*up, base] if base else up)
                targets.update(owner(f"{base}.{alias.name}") or owner(base) for alias in node.names)
        graph[name] = {t for t in targets if t is not None and t != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
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


def test_the_core_has_no_import_cycle():
    graph = import_graph()
    assert "smdebug.hook" in graph and "smdebug.writing.thread_writer" in graph  # the walk sees the package
    assert "smdebug.writing.outbox" in graph["smdebug.writing.thread_writer"]
    assert cycles(graph) == []


def test_a_cycle_is_found():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}}
    assert cycles(graph) == [["a", "b", "c"]]


def test_data_flows_one_way():
    """The Trial and the rules never import the writer; the writer never imports the hook or the rules."""
    graph = import_graph()
    for name, targets in graph.items():
        if name.startswith(("smdebug.trials", "smdebug.rules")):
            assert not {t for t in targets if t.startswith("smdebug.writing")}, name
        if name.startswith("smdebug.writing"):
            assert not {t for t in targets if t.startswith(("smdebug.hook", "smdebug.rules"))}, name
