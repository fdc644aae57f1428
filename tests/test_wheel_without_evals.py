"""The wheel ships the packages pyproject.toml's `[tool.setuptools.packages.find]` includes (ruler, judges,
trainer); evals/ stays in the checkout. So no packaged module may import evals, and every `ruler` command but
`ruler eval` (the checkout's evaluations, by design) must load from a packaged module."""

import ast
import tomllib
from pathlib import Path

from setuptools import find_packages

ROOT = Path(__file__).resolve().parents[1]


def packaged_modules() -> dict[str, Path]:
    """Module name -> file, for every .py file of the packages the wheel is built from."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    include = config["tool"]["setuptools"]["packages"]["find"]["include"]
    modules = {}
    for package in find_packages(str(ROOT), include=include):
        folder = ROOT.joinpath(*package.split("."))
        for path in folder.glob("*.py"):
            modules[package if path.stem == "__init__" else f"{package}.{path.stem}"] = path
    return modules


def imported_modules(path: Path) -> set[str]:
    """The absolute module names a file imports: `import x.y`, `from x.y import z`, and
    `importlib.import_module("x.y")` with a literal name."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) == "import_module"
              and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            names.add(node.args[0].value)
    return names


def test_no_packaged_module_imports_evals():
    modules = packaged_modules()
    assert {"ruler.cli", "ruler.labels", "trainer.distill", "trainer.distill_cli"} <= set(modules)
    assert not any(name.split(".")[0] == "evals" for name in modules)
    offenders = {name: sorted(m for m in imported_modules(path) if m.split(".")[0] == "evals")
                 for name, path in modules.items()}
    assert {name: found for name, found in offenders.items() if found} == {}


def test_every_command_but_eval_loads_from_a_packaged_module():
    from ruler.cli import PLUGIN_COMMANDS

    modules = packaged_modules()
    for command, (module, attribute, _, _) in PLUGIN_COMMANDS.items():
        if command == "eval":
            assert module.split(".")[0] == "evals"  # the checkout's evaluations: absent from the wheel by design
            continue
        assert module in modules, f"`ruler {command}` loads {module}, which the wheel does not ship"
        assert f"{attribute} = typer.Typer(" in modules[module].read_text(encoding="utf-8")
