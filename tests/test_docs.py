"""Every code block of README.md and docs/ is run here or marked as not run, and the README's quickstart runs as
shown.

The convention (also in docs/reference/index.md), read from each fenced block's info string:

- `python` or `bash` without a title: run here, in the checkout's root (`.venv/bin/` is this venv's `bin/`), with
  a scripted OpenAI-compatible judge on loopback as `OPENAI_API_BASE` (`ruler/testing.py`), so a block that names
  an `openai/...` judge runs without a key. `title="slow: REASON"` runs it in the slow tier.
- `title="not run: REASON"` (a GPU, a key, a server, data, your own code): not run. A python block must compile
  (top-level `await` allowed) and every name it imports from ruler_rl or evals must exist (the folders' own names
  ruler, judges, trainer are not import names: a block importing them fails); a bash
  block must parse (`bash -n`), every `ruler` subcommand it calls must exist and every script it runs must be in the
  checkout.
- `text`, `json`, `jsonl`, `nginx`: read, not run (json and jsonl must parse). A `text` block titled `output` is
  what the nearest run block above it prints: its shape (the lines, with numbers and the judge's free text left
  out) must match what that block prints now.

Any other info string, and any indented code block, fails.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from markdown_it import MarkdownIt

from ruler_rl.testing import FakeJudge

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
RUN_KINDS = {"python", "bash"}
READ_KINDS = {"text", "json", "jsonl", "nginx"}
PROJECT_PACKAGES = {"ruler_rl", "evals"}
OLD_NAMES = {"ruler", "judges", "trainer"}  # folders, imported as ruler_rl, ruler_rl.judges, ruler_rl.trainer
TITLE = re.compile(r'title="([^"]*)"')


@dataclass
class Block:
    page: Path
    line: int  # 1-based line of the opening fence
    kind: str  # the info string's first word; "indented" for an indented code block
    title: str
    code: str

    @property
    def id(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"

    @property
    def runs(self) -> bool:
        return self.kind in RUN_KINDS and not self.title.startswith("not run")


def blocks_of(page: Path) -> list[Block]:
    found = []
    for token in MarkdownIt("commonmark").enable("table").parse(page.read_text()):
        if token.type == "fence":
            info = token.info.strip()
            title = TITLE.search(info)
            found.append(Block(page, token.map[0] + 1, info.split()[0] if info else "", title[1] if title else "",
                               token.content))
        elif token.type == "code_block":
            found.append(Block(page, token.map[0] + 1, "indented", "", token.content))
    return found


BLOCKS = [b for page in PAGES for b in blocks_of(page)]


def by_kind(*kinds: str, runs: bool | None = None) -> list:
    return [pytest.param(b, id=b.id) for b in BLOCKS if b.kind in kinds and (runs is None or b.runs == runs)]


def test_the_pages_hold_code_blocks():
    """The parser sees the blocks (an empty list would make every test below pass vacuously)."""
    assert len([b for b in BLOCKS if b.page.name == "README.md"]) >= 5
    assert len([b for b in BLOCKS if b.page.name != "README.md"]) >= 15


@pytest.mark.parametrize("block", [pytest.param(b, id=b.id) for b in BLOCKS])
def test_every_block_is_of_a_known_kind(block):
    assert block.kind in RUN_KINDS | READ_KINDS, (
        f"{block.id}: a code block must be one of {sorted(RUN_KINDS | READ_KINDS)} (fenced, with the kind as its "
        f"info string), got {block.kind or 'no info string'!r}; see tests/test_docs.py")
    if block.title.startswith("not run"):
        assert block.kind in RUN_KINDS and block.title.removeprefix("not run").lstrip(": "), (
            f"{block.id}: 'not run' marks a python or bash block and says why: title=\"not run: REASON\"")


# ---- blocks that are not run: checked without running them ----

def defined_names(module: str) -> set[str]:
    """The names `from MODULE import NAME` can take, read from the module's source without importing it (a
    package's __init__ is imported: the project's are light, and their lazily loaded names are in their __dir__)."""
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin, f"no module {module}"
    names: set[str] = set()
    for node in ast.parse(Path(spec.origin).read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    if spec.submodule_search_locations is not None:
        names.update(dir(importlib.import_module(module)))
    return names


def project_imports(code: str) -> list[tuple[str, str | None]]:
    """(module, name) for each `from M import N` and (module, None) for each `import M` of the project's packages."""
    found = []
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in OLD_NAMES | PROJECT_PACKAGES:
            found.extend((node.module, a.name) for a in node.names)
        elif isinstance(node, ast.Import):
            found.extend((a.name, None) for a in node.names if a.name.split(".")[0] in OLD_NAMES | PROJECT_PACKAGES)
    return found


@pytest.mark.parametrize("block", by_kind("python"))
def test_python_block_compiles_and_its_imports_exist(block):
    compile(block.code, block.id, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    for module, name in project_imports(block.code):
        assert module.split(".")[0] not in OLD_NAMES, f"{block.id}: `{module}` is imported as ruler_rl"
        assert importlib.util.find_spec(module) is not None, f"{block.id}: no module {module}"
        if name is not None:
            assert name in defined_names(module) or importlib.util.find_spec(f"{module}.{name}") is not None, (
                f"{block.id}: `from {module} import {name}`: {module} has no {name}")


def ruler_commands() -> set[str]:
    import click
    import typer

    from ruler_rl.cli import app

    group = typer.main.get_command(app)
    return set(group.list_commands(click.Context(group)))


def simple_commands(code: str) -> list[list[str]]:
    """Each simple command of a bash block as its words (comments dropped; split at &&, ||, |, ;)."""
    commands = []
    for line in code.replace("\\\n", " ").splitlines():
        lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        lexer.commenters = "#"
        words: list[str] = []
        for word in lexer:
            if word in {"&&", "||", "|", ";", "&"}:
                commands.append(words)
                words = []
            else:
                words.append(word)
        commands.append(words)
    return [[w for w in c if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", w)] or c for c in commands if c]


def check_command(block: Block, words: list[str], commands: set[str]) -> None:
    program, args = Path(words[0]).name, words[1:]
    if program == "ruler":
        sub = next((a for a in args if not a.startswith("-")), None)
        assert sub is None or sub in commands, f"{block.id}: `ruler {sub}` is not a command of ruler ({commands})"
    elif re.fullmatch(r"python3?", program) or program == "torchrun":
        if "-m" in args:
            module = args[args.index("-m") + 1]
            assert module.split(".")[0] not in OLD_NAMES, f"{block.id}: `-m {module}`: the package is ruler_rl"
            assert importlib.util.find_spec(module) is not None, f"{block.id}: `-m {module}`: no such module"
        elif program != "torchrun":
            script = next((a for a in args if not a.startswith("-")), None)
            assert script is None or (ROOT / script).is_file(), f"{block.id}: {script} is not in the checkout"
    elif program == "bash" and args:
        assert (ROOT / args[0]).is_file(), f"{block.id}: {args[0]} is not in the checkout"


@pytest.mark.parametrize("block", by_kind("bash"))
def test_bash_block_parses_and_names_what_exists(block):
    parsed = subprocess.run(["bash", "-n"], check=False, input=block.code, capture_output=True, text=True)
    assert parsed.returncode == 0, f"{block.id}: {parsed.stderr}"
    commands = ruler_commands()
    for words in simple_commands(block.code):
        check_command(block, words, commands)


@pytest.mark.parametrize("block", by_kind("json", "jsonl"))
def test_json_block_parses(block):
    if block.kind == "json":
        json.loads(block.code)
    else:
        for line in filter(str.strip, block.code.splitlines()):
            json.loads(line)


# ---- blocks that are run ----

NUMBER = re.compile(r"[-+]?\d+(?:[.,]\d+)*")


def shape(output: str) -> list[str]:
    """The lines with their numbers left out and whatever follows `explanation:` (the judge's own words)."""
    return [NUMBER.sub("N", line.split("explanation:")[0].rstrip()) for line in output.strip().splitlines()]


def output_after(block: Block) -> Block | None:
    """The first `output` block after BLOCK on its page: what BLOCK prints. (The README's two quickstart blocks
    print the same lines and share the one shown after the second.)"""
    later = [b for b in BLOCKS if b.page == block.page and b.line > block.line]
    return next((b for b in later if b.kind == "text" and b.title == "output"), None)


@pytest.fixture(scope="module")
def scripted_judge():
    judge = FakeJudge()
    yield judge
    judge.close()


def run_block(block: Block, judge: FakeJudge, timeout: int) -> str:
    """Runs a bash block (or a python block as a script) in the checkout's root; returns its stdout."""
    bin_dir = str(Path(sys.executable).parent)
    code = block.code.replace(".venv/bin/", bin_dir + "/")
    argv = ["bash", "-euo", "pipefail", "-c", code] if block.kind == "bash" else [sys.executable, "-c", code]
    env = dict(os.environ, OPENAI_API_BASE=judge.params["api_base"], OPENAI_API_KEY=judge.params["api_key"],
               PATH=bin_dir + os.pathsep + os.environ.get("PATH", ""),
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    done = subprocess.run(argv, check=False, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{block.id} failed ({done.returncode}):\n{done.stdout}\n{done.stderr[-3000:]}"
    return done.stdout


def run_params() -> list:
    params = []
    for b in BLOCKS:
        if b.runs:
            marks = [pytest.mark.slow] if b.title.startswith("slow") else []
            params.append(pytest.param(b, id=b.id, marks=marks))
    return params


@pytest.mark.parametrize("block", run_params())
def test_runnable_block_runs_and_prints_what_the_page_shows(block, scripted_judge):
    scripted_judge.reset()
    stdout = run_block(block, scripted_judge, timeout=900)
    if "--judge openai/" in block.code:  # reached the judge through litellm, not a cache or a fallback
        assert scripted_judge.requests, f"{block.id} names an openai/ judge but never called it"
    shown = output_after(block)
    if shown is not None:
        assert shape(stdout) == shape(shown.code), (
            f"{block.id} printed\n{stdout}\nwhich is not shaped like what {shown.id} shows:\n{shown.code}")


# ---- the README ----

def test_readme_is_short_and_its_quickstart_runs_both_judges():
    readme = ROOT / "README.md"
    assert len(readme.read_text().splitlines()) <= 150
    runs = [b for b in BLOCKS if b.page == readme and b.runs]
    named = [b for b in runs if "examples/score_group.py --judge openai/" in b.code]
    embedded = [b for b in runs if "examples/score_group.py" in b.code and "--judge" not in b.code]
    assert named and not named[0].title.startswith("slow"), "the named-judge quickstart runs in the fast tier"
    assert embedded and embedded[0].title.startswith("slow"), "the embedded-judge quickstart runs in the slow tier"
    assert all(output_after(b) is not None for b in named + embedded)


def test_reference_pages_document_every_public_name():
    """docs/reference/PACKAGE.md has a `::: module.NAME` entry for every name of PACKAGE.__all__, and that module
    has the name (mkdocs build --strict fails on an entry it cannot find; this names the public name left out)."""
    for folder, package in (("ruler", "ruler_rl"), ("judges", "ruler_rl.judges"), ("trainer", "ruler_rl.trainer")):
        page = (ROOT / "docs" / "reference" / f"{folder}.md").read_text()
        entries = dict(reversed(m.groups()) for m in re.finditer(r"^::: ([\w.]+)\.(\w+)$", page, re.MULTILINE))
        for name in importlib.import_module(package).__all__:
            assert name in entries, f"docs/reference/{folder}.md has no entry for {package}.{name}"
            assert name in defined_names(entries[name]), f"{entries[name]} defines no {name}"


def test_every_api_entry_names_the_import_name():
    """mkdocstrings could still find a folder by its own name (griffe searches the mapped folders' parent): every
    `::: target` of docs/ names ruler_rl."""
    targets = [(page.relative_to(ROOT).as_posix(), m.group(1)) for page in sorted((ROOT / "docs").rglob("*.md"))
               for m in re.finditer(r"^::: ([\w.]+)", page.read_text(), re.MULTILINE)]
    assert len(targets) > 40
    assert [t for t in targets if t[1].split(".")[0] != "ruler_rl"] == []
