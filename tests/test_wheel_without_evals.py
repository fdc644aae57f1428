"""The wheel ships the packages pyproject.toml's `[tool.setuptools] packages` names (ruler_rl from ruler/,
ruler_rl.judges from judges/, ruler_rl.trainer from trainer/, as `package-dir` maps them); evals/ stays in the
checkout. So no packaged module may import evals, and every `ruler` command but
`ruler eval` (the checkout's evaluations, by design) must load from a packaged module."""

import ast
import json
import os
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def packaged_modules() -> dict[str, Path]:
    """Module name -> file, for every .py file of the packages the wheel is built from."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    folders = config["package-dir"]
    modules = {}
    for package in config["packages"]:
        # a package's folder: its own entry in package-dir, else its parent's folder and its last name
        parent, _, last = package.rpartition(".")
        folder = ROOT / folders[package] if package in folders else ROOT / folders[parent] / last
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
    assert {"ruler_rl.cli", "ruler_rl.labels", "ruler_rl.trainer.distill", "ruler_rl.trainer.distill_cli"} <= set(modules)
    assert not any(name.split(".")[0] == "evals" for name in modules)
    offenders = {name: sorted(m for m in imported_modules(path) if m.split(".")[0] == "evals")
                 for name, path in modules.items()}
    assert {name: found for name, found in offenders.items() if found} == {}


def test_every_command_but_eval_loads_from_a_packaged_module():
    from ruler_rl.cli import PLUGIN_COMMANDS

    modules = packaged_modules()
    for command, (module, attribute, _, _) in PLUGIN_COMMANDS.items():
        if command == "eval":
            assert module.split(".")[0] == "evals"  # the checkout's evaluations: absent from the wheel by design
            continue
        assert module in modules, f"`ruler {command}` loads {module}, which the wheel does not ship"
        assert f"{attribute} = typer.Typer(" in modules[module].read_text(encoding="utf-8")


def test_the_wheel_has_one_top_level_package(tmp_path):
    """Built as pip builds it: every file of the wheel is under ruler_rl/ (or its .dist-info), with judges/ and
    trainer/ inside it and the demo group's data; no evals/, no examples/, no tests/, no other top-level name."""
    import shutil
    import subprocess
    import sys
    import zipfile

    source = tmp_path / "source"  # a copy: a build writes build/ and an egg-info beside pyproject.toml
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    for folder in ("ruler", "judges", "trainer", "evals"):  # evals too: the wheel must leave it out
        shutil.copytree(ROOT / folder, source / folder, ignore=shutil.ignore_patterns("__pycache__"))
    res = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                          "-w", str(tmp_path), str(source)], capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    (wheel,) = tmp_path.glob("ruler_rl-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")}
    assert tops == {"ruler_rl"}
    assert {"ruler_rl/__init__.py", "ruler_rl/cli.py", "ruler_rl/service/app.py", "ruler_rl/judges/__init__.py",
            "ruler_rl/trainer/__init__.py", "ruler_rl/trainer/distill_cli.py", "ruler_rl/data/demo_group.json"} <= set(names)
    assert set(packaged_modules()) == {name.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
                                       for name in names if name.endswith(".py")}
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    assert "ruler = ruler_rl.cli:main" in zipfile.ZipFile(wheel).read(entry_points).decode()


def test_a_checkout_that_cannot_be_installed_imports_as_ruler_rl_through_links(tmp_path):
    """evals/device/link_package.sh (the GPU host copies the checkout but has no index to install it from): with only
    its folder and the site-packages on the path (`-S`: no .pth, so no editable install), ruler_rl, its judges and
    trainer and the package data load from the checkout's files."""
    import subprocess
    import sys
    import sysconfig

    res = subprocess.run(["bash", str(ROOT / "evals/device/link_package.sh"), str(tmp_path)], capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    code = ("import json, ruler_rl, ruler_rl.judges.rubrics, ruler_rl.trainer.config\n"
            "from importlib import resources\n"
            "print(json.dumps([m.__file__ for m in (ruler_rl, ruler_rl.judges.rubrics, ruler_rl.trainer.config)]"
            " + [(resources.files('ruler_rl') / 'data' / 'demo_group.json').is_file()]))")
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": os.pathsep.join([str(tmp_path), sysconfig.get_paths()["purelib"]])}
    res = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    *files, data = json.loads(res.stdout)
    assert files == [str(tmp_path / "ruler_rl/__init__.py"), str(tmp_path / "ruler_rl/judges/rubrics.py"),
                     str(tmp_path / "ruler_rl/trainer/config.py")]
    assert Path(files[1]).resolve() == ROOT / "judges/rubrics.py" and data is True


def test_a_folder_imported_by_its_own_name_is_refused():
    """From the checkout's root the folders are importable by their own names; each refuses, naming its package,
    rather than loading a second copy of the code beside ruler_rl's."""
    import subprocess
    import sys

    for folder, package in (("ruler", "ruler_rl"), ("judges", "ruler_rl.judges"), ("trainer", "ruler_rl.trainer")):
        res = subprocess.run([sys.executable, "-c", f"import {folder}"], cwd=ROOT, capture_output=True, text=True,
                             timeout=120)
        assert res.returncode == 1
        assert res.stderr.rstrip().splitlines()[-1] == (
            f"ImportError: the folder {folder}/ is the package {package}: import {package}, not {folder} "
            "(install the checkout with `pip install -e .`, as .ci/setup does)")
