"""The package layout's rules: no import cycle between modules (imports inside functions
count), no core module that imports a target package, and no Python file past ~800 lines."""

from __future__ import annotations

import ast
from pathlib import Path

PYTHON = Path(__file__).resolve().parents[2] / "python"
PACKAGES = ("tvm_accel", "tvm_vta_cp", "tvm_dpu", "tvm_marsellus")
TARGET_PACKAGES = PACKAGES[1:]
MAX_LINES = 850


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for path in (PYTHON / pkg).rglob("*.py"):
            parts = list(path.relative_to(PYTHON).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """Project modules ``name`` imports anywhere in its source (top level or in functions);
    ``from pkg import mod`` counts as importing ``pkg.mod`` when that is a module."""
    is_pkg = path.name == "__init__.py"
    base = name.split(".") if is_pkg else name.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            mod = node.module or ""
            if node.level:
                mod = ".".join(base[:len(base) - node.level + 1] + ([mod] if mod else []))
            targets = [f"{mod}.{a.name}" if f"{mod}.{a.name}" in modules else mod
                       for a in node.names]
        else:
            continue
        for t in targets:
            while t and t not in modules:  # a name inside a module: the module
                t = t.rpartition(".")[0]
            if t and t != name:
                found.add(t)
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle, or None (iterative DFS; a package's own submodules importing the
    package ``__init__`` is an edge like any other)."""
    state: dict[str, int] = {}
    for root in sorted(graph):
        if state.get(root):
            continue
        stack = [(root, iter(sorted(graph[root])))]
        path = [root]
        state[root] = 1
        while stack:
            node, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                state[node] = 2
                stack.pop()
                path.pop()
            elif state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            elif not state.get(nxt):
                state[nxt] = 1
                stack.append((nxt, iter(sorted(graph.get(nxt, ())))))
                path.append(nxt)
    return None


def test_no_module_imports_form_a_cycle():
    cycle = _cycle(_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_cycle_finder_sees_imports_inside_functions(tmp_path):
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}}
    assert _cycle(graph) == ["a", "b", "c", "a"]
    src = tmp_path / "m.py"
    src.write_text("def f():\n    from tvm_accel import target\n")
    assert _imports("tvm_accel.m", src, _modules()) == {"tvm_accel.target"}


def test_no_core_module_imports_a_target_package():
    offenders = sorted(f"{name} -> {dep}" for name, deps in _graph().items()
                       if name.split(".")[0] == "tvm_accel"
                       for dep in deps if dep.split(".")[0] in TARGET_PACKAGES)
    assert not offenders, offenders


def test_no_python_file_grows_past_the_size_limit():
    big = sorted(f"{p.relative_to(PYTHON)} ({n} lines)" for p in _modules().values()
                 if (n := len(p.read_text().splitlines())) > MAX_LINES)
    assert not big, big
