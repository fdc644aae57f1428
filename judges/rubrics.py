"""Grading rubrics: ART's default plus a small library, selectable by name (`get_rubric("efficiency")`).

A rubric is a name or its text. `get_rubric` never opens a file; only `load_rubric_file` (the command
line's `--rubric FILE`) and `load_rubric_folder` (the folder a service operator configures, read once at
start) read from disk, and the judging service passes nothing a client sent to either. What they read,
and what `get_rubric` resolves, is a `RubricText`: text that is never taken for a name or a path again.
"""

from __future__ import annotations

import re
from pathlib import Path

from ruler_rl.judges.errors import JudgeConfigError

DEFAULT_RUBRIC = """
- A trajectory that achieves its goal should always get a significantly higher score than a trajectory that does not achieve its goal.
- A trajectory that achieves its goal more efficiently (eg. by avoiding unproductive detours) should get a higher score than a trajectory that achieves its goal less efficiently.
- If one trajectory is only slightly better than another, the difference in scores should be small. If it is significantly better, the difference in scores should be large.
- You may give some partial credit for a trajectory that makes progress towards its goal but does not complete it.
"""
"""ART's default rubric, word for word in meaning: the task itself is read from the trajectories."""

RUBRICS: dict[str, str] = {
    "default": DEFAULT_RUBRIC,
    "strict-correctness": """
- Judge only whether the final answer is correct and complete for the task stated in the system and user messages.
- A correct final answer scores at least 0.8; a wrong or missing final answer scores at most 0.2.
- Saying "I don't know" when the information is truly unavailable scores higher than a confident wrong answer.
- Ignore style, length and politeness unless the task asks for them.
""",
    "efficiency": """
- A trajectory that achieves its goal scores significantly higher than one that does not.
- Among trajectories that achieve the goal, fewer turns, fewer tool calls and less repeated work score higher.
- Repeating the same tool call with the same arguments, or reading material that is never used, costs score.
- Partial progress earns partial credit in proportion to how close it came.
""",
    "tool-hygiene": """
- A trajectory that achieves its goal scores significantly higher than one that does not.
- Tool calls must use the documented tool names and valid arguments; malformed or failing calls cost score.
- Results returned by tools must be used correctly: claims in the final answer must be supported by them.
- Final answers must go through the designated answer tool or format when the task defines one.
""",
    "hallucination-penalty": """
- A trajectory that achieves its goal scores significantly higher than one that does not.
- Any statement presented as fact that is not supported by the context or by tool results is a hallucination; each one costs a large part of the score.
- A trajectory that admits uncertainty scores higher than one that invents an answer.
- Partial credit is allowed for correct, supported progress towards the goal.
""",
}


MAX_RUBRIC_CHARS = 20_000
"""The longest rubric text accepted (the library's own rubrics are under 600 characters)."""

RUBRIC_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,63}")
"""What a rubric name looks like: lower-case letters, digits, `-` and `_` (so a name is never a path)."""

_PATHLIKE = re.compile(r"^(?:~|\.{1,2}[/\\]|[/\\]|[A-Za-z]:[/\\]|file:)|\.(?:txt|md|markdown|ya?ml|json|rubric)$", re.IGNORECASE)


class RubricText(str):
    """Rubric text already resolved (read from a file, looked up by name, checked once): `get_rubric` returns
    it as it is, so a rubric whose text is one word or ends in `.md` is not refused as a name or a path."""


def get_rubric(name_or_text: str, library: dict[str, str] | None = None) -> RubricText:
    """A rubric by name (the built-in library, or `library` when given), else the rubric text itself.

    Never reads a file: a one-line value that looks like a path (`/...`, `~/...`, `./...`, `C:\\...`,
    `file:...`, `... .txt|.md|.yaml|.json`) and a single word that is no known name are errors, so a
    typo or a missing file is never sent to the judge as if it were rubric text. Callers that may read
    files (the command line, a server-side rubric folder) do so themselves (`load_rubric_file`). A
    `RubricText` is returned unchanged (its length still checked).
    """
    if not isinstance(name_or_text, str) or not name_or_text.strip():
        raise JudgeConfigError("rubric must be a non-empty string: a rubric name or the rubric text")
    if len(name_or_text) > MAX_RUBRIC_CHARS:
        raise JudgeConfigError(f"rubric text has {len(name_or_text):,} characters; the limit is {MAX_RUBRIC_CHARS:,}")
    if isinstance(name_or_text, RubricText):
        return name_or_text
    names = {**RUBRICS, **(library or {})}
    if name_or_text in names:
        return RubricText(names[name_or_text])
    one_line = name_or_text.strip()
    if "\n" not in one_line:
        known = ", ".join(sorted(names))
        if _PATHLIKE.search(one_line):
            raise JudgeConfigError(f"rubric {one_line!r} looks like a file path; files are not read here: "
                                   f"pass a rubric name ({known}) or the rubric text")
        if not any(c.isspace() for c in one_line):
            raise JudgeConfigError(f"unknown rubric {one_line!r}: not a rubric name ({known}), and too short "
                                   "to be rubric text")
    return RubricText(name_or_text)


def load_rubric_file(path: str | Path) -> RubricText:
    """The text of a rubric file (UTF-8, not empty, at most `MAX_RUBRIC_CHARS` characters)."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise JudgeConfigError(f"no rubric file {str(path)!r}")
    size = path.stat().st_size
    if size > 4 * MAX_RUBRIC_CHARS:  # checked before reading: a rubric is a few hundred characters
        raise JudgeConfigError(f"rubric file {path} is {size:,} bytes; the limit is {MAX_RUBRIC_CHARS:,} characters")
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise JudgeConfigError(f"rubric file {path} is not valid UTF-8 (byte {exc.start})") from None
    if not text.strip():
        raise JudgeConfigError(f"rubric file {path} is empty")
    if len(text) > MAX_RUBRIC_CHARS:
        raise JudgeConfigError(f"rubric file {path} has {len(text):,} characters; the limit is {MAX_RUBRIC_CHARS:,}")
    return RubricText(text)


def load_rubric_folder(folder: str | Path) -> dict[str, RubricText]:
    """Named rubrics from a folder: `<name>.txt` or `<name>.md` becomes rubric `<name>`.

    For a server's own rubrics (`ruler serve --rubric-dir`): read once, at start; names follow
    `RUBRIC_NAME` and may not replace a built-in rubric. A symbolic link is followed only to a file inside the
    folder: one that leads out of it (to `/etc/passwd`, a key file) is refused with the folder's other errors.
    """
    folder = Path(folder).expanduser()
    if not folder.is_dir():
        raise JudgeConfigError(f"rubric folder {str(folder)!r} is not a folder")
    inside = folder.resolve()
    found: dict[str, str] = {}
    for path in sorted(folder.iterdir()):
        if path.suffix not in (".txt", ".md"):
            continue
        if path.is_symlink() and not path.resolve().is_relative_to(inside):
            raise JudgeConfigError(f"rubric file {path.name} is a link out of the rubric folder (to "
                                   f"{path.resolve()}): rubrics are read from the folder only")
        if not path.is_file():
            continue
        name = path.stem
        if not RUBRIC_NAME.fullmatch(name):
            raise JudgeConfigError(f"rubric file {path.name}: a rubric name is lower-case letters, digits, - and _")
        if name in RUBRICS or name in found:
            raise JudgeConfigError(f"rubric file {path.name}: the name {name!r} is already taken")
        found[name] = load_rubric_file(path)
    return found
