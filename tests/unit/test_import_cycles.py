"""The package's modules import each other without cycles, function-level imports included.

An import inside a function hides a cycle from Python but not from a reader; so does
``importlib.import_module`` with a literal name. Both count here. Imports under
``if TYPE_CHECKING:`` do not run and do not count. ``from package import module`` depends on that
module, not on the package's ``__init__``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx

ROOT = Path(__file__).resolve().parents[2]


def module_names() -> dict[str, Path]:
    names = {}
    for path in (ROOT / "kerple").rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return names


def _type_checking_nodes(tree: ast.Module) -> set[int]:
    hidden: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
            hidden.update(id(child) for statement in node.body for child in ast.walk(statement))
    return hidden


def imported(tree: ast.Module, modules: dict[str, Path]) -> set[str]:
    """The project modules ``tree`` imports (anywhere but under TYPE_CHECKING)."""
    hidden, found = _type_checking_nodes(tree), set()
    for node in ast.walk(tree):
        if id(node) in hidden:
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            submodules = {f"{node.module}.{alias.name}" for alias in node.names} & set(modules)
            found.update(submodules or {node.module})
            if len(submodules) < len(node.names):  # names defined in the module itself
                found.add(node.module)
        elif isinstance(node, ast.Call) and ast.unparse(node.func).endswith("import_module") and node.args:
            if isinstance(node.args[0], ast.Constant):
                found.add(str(node.args[0].value))
    return found & set(modules)


def import_graph() -> nx.DiGraph:
    modules = module_names()
    graph = nx.DiGraph()
    for name, path in modules.items():
        graph.add_node(name)
        for target in imported(ast.parse(path.read_text(encoding="utf-8")), modules) - {name}:
            graph.add_edge(name, target)
    return graph


def test_the_checker_sees_a_cycle() -> None:
    modules = {"kerple.a": Path("a.py"), "kerple.b": Path("b.py")}
    tree = ast.parse("def f():\n    from kerple.b import x\n")
    assert imported(tree, modules) == {"kerple.b"}
    hidden = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from kerple.b import x\n")
    assert imported(hidden, modules) == set()


def test_no_module_imports_itself_back() -> None:
    cycles = [sorted(component) for component in nx.strongly_connected_components(import_graph()) if len(component) > 1]
    assert cycles == [], f"import cycles: {cycles}"
