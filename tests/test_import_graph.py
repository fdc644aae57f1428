"""The project's modules import one way: no import circle among them, and the layers judges <- ruler <- trainer <- evals.

The graph is read from the source with `ast`, nothing is imported. Every `import x` and `from x import y` of a
module counts, wherever it is: at the top, inside a function, under `if TYPE_CHECKING:` (a circle that only a type
checker follows still ties two modules together, and becomes an import error once one of its names is needed at
run time). Relative imports are resolved against the module's package. Only modules of the packages named
(judges/, ruler/, trainer/, evals/ here) are nodes; everything else is ignored. A name resolves to a module thus:

- `import a.b.c`: the longest project module that `a.b.c` names (a.b.c itself, as a rule);
- `from p import n`: the module `p.n` when there is one; else, when `p`'s `__init__` maps `n` lazily (PEP 562: a
  module-level dict of name -> module name that its `__getattr__` reads, as in ruler/__init__.py), the module `n`
  maps to, and any module its `__getattr__` imports by a literal name for every name (ruler_rl.judges.completion, in
  judges/__init__.py); else the package `p` itself.

So `from ruler_rl import Trajectory` inside ruler/ is an edge to ruler_rl.trajectory (where the lazy map sends it), and
`from ruler_rl import tracing` an edge to ruler_rl.tracing. A package's lazy map is no edge of the package: its
`__getattr__` runs only when a name is asked for, and the module asking gets the edge. Parent packages are not
edges either (Python imports a package before any of its modules, whatever the modules import), nor is a module
importing names from itself.
"""

from __future__ import annotations

import ast
from collections import deque
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAYERS = ("judges", "ruler", "trainer", "evals")  # each package may import only the ones before it
# each folder's import name: ruler/ is the package ruler_rl, judges/ and trainer/ its subpackages (pyproject's
# package-dir); evals/ stays a folder of the checkout, imported as evals
PACKAGES = {"judges": "ruler_rl.judges", "ruler": "ruler_rl", "trainer": "ruler_rl.trainer", "evals": "evals"}

# Circles the project still has, each as the set of modules that import each other around it. The test fails
# when one is gone (remove its entry) and when any other circle appears.
KNOWN_CYCLES: set[frozenset[str]] = set()  # circles allowed by name, each with its reason (none today)

Graph = dict[str, dict[str, str]]  # module -> {module it imports: "path:line" of the first such import}


def project_modules(root: Path, packages: dict[str, str] | tuple[str, ...]) -> dict[str, Path]:
    """Dotted module name -> source file, for every .py file under the packages (a package is its __init__.py):
    `packages` maps each folder to its import name (a folder alone is imported by its own name)."""
    modules = {}
    for folder, name in (packages.items() if isinstance(packages, dict) else ((p, p) for p in packages)):
        for path in sorted((root / folder).rglob("*.py")):
            parts = path.relative_to(root / folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join([name, *parts])] = path
    return modules


def lazy_map(tree: ast.Module, modules: dict[str, Path]) -> tuple[dict[str, str], list[str]]:
    """For a package __init__ with a PEP 562 `__getattr__`: its map of lazy names to project modules (every
    module-level dict whose keys are strings and whose values are all project module names), and the project
    modules its `__getattr__` imports by literal name whatever the name asked for. Empty without `__getattr__`."""
    getattr_fn = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "__getattr__"), None)
    if getattr_fn is None:
        return {}, []
    names: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, ast.Dict):
            pairs = list(zip(node.value.keys, node.value.values))
            if pairs and all(isinstance(k, ast.Constant) and isinstance(k.value, str) and isinstance(v, ast.Constant)
                             and v.value in modules for k, v in pairs):
                names.update({k.value: v.value for k, v in pairs})
    always = [call.args[0].value for call in ast.walk(getattr_fn)
              if isinstance(call, ast.Call) and getattr(call.func, "attr", getattr(call.func, "id", None)) ==
              "import_module" and call.args and isinstance(call.args[0], ast.Constant)
              and call.args[0].value in modules]
    return names, always


def _known(name: str, modules: dict[str, Path]) -> str | None:
    """The longest project module that the dotted `name` starts with."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def _imports(tree: ast.Module, package: str, modules: dict[str, Path],
             lazy: dict[str, tuple[dict[str, str], list[str]]]):
    """(project module, line) for each module an import in `tree` (a module of `package`) resolves to."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield _known(alias.name, modules), node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                source = ".".join([*parts[:len(parts) - (node.level - 1)], *([node.module] if node.module else [])])
            else:
                source = node.module or ""
            source = _known(source, modules)
            if source is None:
                continue
            names, always = lazy.get(source, ({}, []))
            for alias in node.names:
                if f"{source}.{alias.name}" in modules:
                    yield f"{source}.{alias.name}", node.lineno
                elif alias.name in names:
                    yield names[alias.name], node.lineno
                    for module in always:
                        yield module, node.lineno
                else:
                    yield source, node.lineno


def import_graph(root: Path, packages: dict[str, str] | tuple[str, ...] = PACKAGES) -> Graph:
    """Which project module imports which, as the module docstring resolves each import."""
    modules = project_modules(root, packages)
    trees = {name: ast.parse(path.read_text(encoding="utf-8"), filename=str(path)) for name, path in modules.items()}
    lazy = {name: lazy_map(trees[name], modules) for name, path in modules.items() if path.name == "__init__.py"}
    graph: Graph = {}
    for name, tree in trees.items():
        path = modules[name]
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges: dict[str, str] = {}
        for target, line in _imports(tree, package, modules, lazy):
            if target is not None and target != name:
                edges.setdefault(target, f"{path.relative_to(root).as_posix()}:{line}")
        graph[name] = edges
    return graph


def strongly_connected(graph: Graph) -> list[list[str]]:
    """The groups of two or more modules that all reach each other (Tarjan's algorithm), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(groups)


def a_cycle(graph: Graph, group: list[str]) -> str:
    """One shortest circle through the group's first module, with where each import is written."""
    start, members = group[0], set(group)
    came_from: dict[str, str] = {}
    queue = deque([start])
    while queue:
        v = queue.popleft()
        for w in sorted(graph[v]):
            if w not in members:
                continue
            if w == start:
                path = [v]
                while path[-1] != start:
                    path.append(came_from[path[-1]])
                path.reverse()
                hops = [f"{a} -> {b} ({graph[a][b]})" for a, b in zip(path, [*path[1:], start])]
                return "; ".join(hops)
            if w not in came_from:
                came_from[w] = v
                queue.append(w)
    raise AssertionError(f"{group} is not strongly connected")


def layer_of(module: str, packages: dict[str, str] = PACKAGES) -> str:
    """The folder (layer) a module comes from: the one whose import name is the longest prefix of its name (a
    module of no such package: its first name, a folder imported by its own name)."""
    names = sorted(packages.items(), key=lambda item: -len(item[1]))
    return next((folder for folder, name in names if module == name or module.startswith(name + ".")),
                module.split(".")[0])


def layer_violations(graph: Graph, layers: tuple[str, ...] = LAYERS) -> list[str]:
    """Each import of a package from one that comes before it in `layers` ("a -> b (path:line)")."""
    rank = {package: i for i, package in enumerate(layers)}
    return [f"{a} -> {b} ({where})" for a, edges in sorted(graph.items()) for b, where in sorted(edges.items())
            if rank[layer_of(a)] < rank[layer_of(b)]]


# --- the project ------------------------------------------------------------------------------------------------


def test_the_project_has_no_import_circle_but_the_known_ones():
    graph = import_graph(ROOT)
    groups = strongly_connected(graph)
    new = [a_cycle(graph, g) for g in groups if frozenset(g) not in KNOWN_CYCLES]
    assert not new, "import circles:\n" + "\n".join(new)
    gone = [sorted(c) for c in KNOWN_CYCLES if sorted(c) not in groups]
    assert not gone, f"no longer circles (remove them from KNOWN_CYCLES): {gone}"


def test_each_layer_imports_only_the_layers_below():
    violations = layer_violations(import_graph(ROOT))
    assert not violations, "imports against the layers judges <- ruler <- trainer <- evals:\n" + "\n".join(violations)


def test_the_project_graph_resolves_its_imports():
    graph = import_graph(ROOT)
    assert "ruler_rl.trajectory" in graph["ruler_rl.tracing"]  # at function level: trajectory_id checks the type
    assert "ruler_rl.tracing" not in graph["ruler_rl.trajectory"]  # the circle this split broke stays broken
    assert "ruler_rl.tracing" in graph["ruler_rl.trainer.model"]  # `from ruler_rl import tracing`: the submodule
    assert "ruler_rl.scoring" in graph["ruler_rl.cli"]  # `from ruler_rl import ruler_score_group`: through the lazy map
    assert "ruler_rl.judges.completion" in graph["ruler_rl.service.judging"]  # `from ruler_rl.judges.completion import ...`
    assert graph["ruler_rl"] == {}  # ruler/__init__ imports only the standard library; its lazy map is no edge
    assert layer_of("ruler_rl.judges.panel") == "judges" and layer_of("ruler_rl.panel") == "ruler"


# --- the graph functions on planted packages ----------------------------------------------------------------------


def write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return root


LAZY_INIT = '''import importlib
_NAMES = {"Model": "low.model", "check": "low.checks"}

def __getattr__(name):
    importlib.import_module("low.setup")
    return getattr(importlib.import_module(_NAMES[name]), name)
'''


def test_a_function_level_import_through_a_lazy_map_closes_a_planted_circle(tmp_path):
    root = write(tmp_path, {
        "low/__init__.py": LAZY_INIT,
        "low/setup.py": "",
        "low/model.py": "from low.checks import check\n",
        "low/checks.py": "def check(m):\n    from low import Model\n    return isinstance(m, Model)\n",
    })
    graph = import_graph(root, ("low",))
    assert graph["low.checks"] == {"low.model": "low/checks.py:2", "low.setup": "low/checks.py:2"}
    assert graph["low"] == {}
    assert strongly_connected(graph) == [["low.checks", "low.model"]]
    assert a_cycle(graph, ["low.checks", "low.model"]) == ("low.checks -> low.model (low/checks.py:2); "
                                                           "low.model -> low.checks (low/model.py:1)")
    (root / "low/checks.py").write_text("def check(m):\n    return hasattr(m, 'x')\n")
    assert strongly_connected(import_graph(root, ("low",))) == []


def test_relative_and_type_checking_imports_count(tmp_path):
    root = write(tmp_path, {
        "app/__init__.py": "",
        "app/sub/__init__.py": "from . import a\n",
        "app/sub/a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..top import T\n",
        "app/top.py": "import app.sub.a as a\nfrom .sub import a as again\nfrom os import path\n",
    })
    graph = import_graph(root, ("app",))
    assert graph["app.sub"] == {"app.sub.a": "app/sub/__init__.py:1"}
    assert graph["app.sub.a"] == {"app.top": "app/sub/a.py:3"}
    assert graph["app.top"] == {"app.sub.a": "app/top.py:1"}
    assert strongly_connected(graph) == [["app.sub.a", "app.top"]]


def test_a_name_from_a_package_is_an_edge_to_the_package_unless_lazy_or_a_module(tmp_path):
    root = write(tmp_path, {
        "low/__init__.py": LAZY_INIT + "VERSION = 1\n",
        "low/setup.py": "", "low/model.py": "", "low/checks.py": "", "low/util.py": "",
        "high/__init__.py": "", "high/use.py": "from low import VERSION, util\n",
    })
    graph = import_graph(root, ("low", "high"))
    assert graph["high.use"] == {"low": "high/use.py:1", "low.util": "high/use.py:1"}
    assert layer_violations(graph, ("low", "high")) == []
    assert layer_violations(graph, ("high", "low")) == ["high.use -> low (high/use.py:1)",
                                                        "high.use -> low.util (high/use.py:1)"]
