"""The package's shape: no import cycles among the suite's modules, counting the imports
inside functions (a cycle hidden that way still ties two modules' meaning together: each
was written to be read with the other). Read from the source, so nothing is imported."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# folder -> the package name it has once installed (pyproject.toml's package-dir)
PACKAGES = {"tritoncheck": "tritoncheck", "kernels": "tritoncheck.kernels", "references": "tritoncheck.references",
            "properties": "tritoncheck.properties", "controls": "tritoncheck.controls",
            "mutants": "tritoncheck.mutants", "tritoncheck/report": "tritoncheck.report"}


def _modules() -> dict[str, Path]:
    found = {}
    for folder, package in PACKAGES.items():
        for path in (ROOT / folder).glob("*.py"):
            found[package if path.stem == "__init__" else f"{package}.{path.stem}"] = path
    return found


def import_graph() -> dict[str, set[str]]:
    """Module -> the suite's modules it imports anywhere in its source (not the lazy names of
    tritoncheck/__init__.py)."""
    modules = _modules()
    graph = {name: set() for name in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                # `from package import module` imports that module (and runs the package's
                # face, which is no tie of meaning); `from module import name`, the module
                targets = [f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in modules else node.module
                           for alias in node.names]
            else:
                continue
            graph[name].update(t for t in targets if t in modules and t not in (name, "tritoncheck"))
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm)."""
    index, low, stack, on_stack, groups = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while not group or group[-1] != v:
                group.append(stack.pop())
                on_stack.discard(group[-1])
            if len(group) > 1:
                groups.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return groups


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles():
    graph = import_graph()
    assert len(graph) > 50 and graph["tritoncheck.harness"], "the graph reads no modules: a path is wrong"
    assert cycles(graph) == []
