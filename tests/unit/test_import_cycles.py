"""The tree's modules import each other without cycles, function-level imports included: the package,
the scripts under tools/ and benchmarks/, and the entry points at the root. The package imports no
script: a module of kerple/ that needs benchmarks/ or tools/ works only with the repository root on
``sys.path``, so the scripts import their shared code from kerple (kerple/measure/), never the reverse.

An import inside a function hides a cycle from Python but not from a reader; so do
``importlib.import_module`` with a literal name and a file loaded by ``spec_from_file_location``. All
count here. Imports under ``if TYPE_CHECKING:`` do not run and do not count. ``from package import
module`` depends on that module, not on the package's ``__init__``. A script imports its siblings by
their bare name (its folder leads ``sys.path``): ``import demo`` in tools/ is ``tools.demo``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx

ROOT = Path(__file__).resolve().parents[2]


SCRIPT_FOLDERS = ("tools", "benchmarks")


def module_names() -> dict[str, Path]:
    paths = [*(ROOT / "kerple").rglob("*.py"), *ROOT.glob("*.py")]
    paths += [path for folder in SCRIPT_FOLDERS for path in (ROOT / folder).rglob("*.py")]
    names = {}
    for path in paths:
        parts = path.relative_to(ROOT).with_suffix("").parts
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return names


def _loaded_files(node: ast.Call) -> set[str]:
    """``spec_from_file_location(name, ROOT / "tools" / "demo.py")``: the ``.py`` names it loads."""
    return {str(c.value) for c in ast.walk(node) if isinstance(c, ast.Constant) and str(c.value).endswith(".py")}


def _type_checking_nodes(tree: ast.Module) -> set[int]:
    hidden: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
            hidden.update(id(child) for statement in node.body for child in ast.walk(statement))
    return hidden


def imported(tree: ast.Module, modules: dict[str, Path], folder: str = "") -> set[str]:
    """The project modules ``tree`` (a module of ``folder``, e.g. ``tools``) imports (anywhere but under
    TYPE_CHECKING)."""
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
        elif isinstance(node, ast.Call) and ast.unparse(node.func).endswith("spec_from_file_location"):
            found.update(_loaded_modules(_loaded_files(node), modules))
    siblings = {f"{folder}.{name}" for name in found if folder and "." not in name}
    return (found | siblings) & set(modules)


def _loaded_modules(files: set[str], modules: dict[str, Path]) -> set[str]:
    return {name for name, path in modules.items() if path.name in files and path.name != "__init__.py"}


def import_graph() -> nx.DiGraph:
    modules = module_names()
    graph = nx.DiGraph()
    for name, path in modules.items():
        graph.add_node(name)
        folder = name.rpartition(".")[0] if name.split(".")[0] in SCRIPT_FOLDERS else ""
        for target in imported(ast.parse(path.read_text(encoding="utf-8")), modules, folder) - {name}:
            graph.add_edge(name, target)
    return graph


def test_the_checker_sees_a_cycle() -> None:
    modules = {"kerple.a": Path("a.py"), "kerple.b": Path("b.py")}
    tree = ast.parse("def f():\n    from kerple.b import x\n")
    assert imported(tree, modules) == {"kerple.b"}
    hidden = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from kerple.b import x\n")
    assert imported(hidden, modules) == set()
    scripts = {"tools.demo": Path("tools/demo.py"), "tools.demo_extension": Path("tools/demo_extension.py")}
    assert imported(ast.parse("def main():\n    import demo_extension\n"), scripts, "tools") == {"tools.demo_extension"}
    loader = "spec_from_file_location('x', ROOT / 'tools' / 'demo.py')"
    assert imported(ast.parse(loader), scripts, "tools") == {"tools.demo"}


def test_the_tree_as_it_was_had_a_cycle_between_two_scripts() -> None:
    """tools/demo.py imported demo_extension at the top, which imported demo in its functions."""
    modules = {"tools.demo": Path("tools/demo.py"), "tools.demo_extension": Path("tools/demo_extension.py")}
    graph = nx.DiGraph()
    graph.add_edges_from((name, target) for name, source in (
        ("tools.demo", "from demo_extension import merge_zero_shot\n"),
        ("tools.demo_extension", "def main():\n    import demo\n")) for target in imported(ast.parse(source), modules, "tools"))
    assert any(len(c) > 1 for c in nx.strongly_connected_components(graph))


def test_the_whole_tree_is_read() -> None:
    names = set(module_names())
    assert {"kerple.jobs.process", "tools.demo", "benchmarks.host_overhead", "train"} <= names


def test_no_module_imports_itself_back() -> None:
    cycles = [sorted(component) for component in nx.strongly_connected_components(import_graph()) if len(component) > 1]
    assert cycles == [], f"import cycles: {cycles}"


def scripts_imported(tree: ast.Module) -> set[str]:
    """What ``tree`` imports from the script folders, anywhere in it (in functions, through
    ``importlib.import_module`` or ``spec_from_file_location``, under TYPE_CHECKING too)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
        elif isinstance(node, ast.Call) and ast.unparse(node.func).endswith("import_module") and node.args:
            if isinstance(node.args[0], ast.Constant):
                found.add(str(node.args[0].value))
        elif isinstance(node, ast.Call) and ast.unparse(node.func).endswith("spec_from_file_location"):
            found.update(str(c.value) for c in ast.walk(node) if isinstance(c, ast.Constant) and isinstance(c.value, str)
                         and c.value.replace("/", ".").split(".")[0] in SCRIPT_FOLDERS)
    return {name for name in found if name.replace("/", ".").split(".")[0] in SCRIPT_FOLDERS}


def test_the_boundary_check_sees_a_script_import() -> None:
    offending = [
        "from benchmarks.train_throughput import build_trainer\n",
        "def run():\n    from benchmarks import eval_memory\n",
        "import benchmarks.host_overhead as host\n",
        "import benchmarks\n",
        "import importlib\nimportlib.import_module('benchmarks.eval_memory')\n",
        "from tools.demo import main\n",
        "spec_from_file_location('x', ROOT / 'benchmarks' / 'eval_memory.py')\n",
    ]
    assert all(scripts_imported(ast.parse(source)) for source in offending)
    allowed = "from kerple.measure.training import build_trainer\nimport benchmarks_of_mine\nimport toolz\n"
    assert scripts_imported(ast.parse(allowed)) == set()


def test_the_package_imports_no_script() -> None:
    offenders = {
        str(path.relative_to(ROOT)): sorted(names)
        for name, path in module_names().items()
        if name.split(".")[0] == "kerple" and (names := scripts_imported(ast.parse(path.read_text(encoding="utf-8"))))
    }
    assert offenders == {}, f"kerple/ imports scripts (move the shared code into kerple/measure/ or similar): {offenders}"
