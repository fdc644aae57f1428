"""Grading rubrics: ART's default plus a small library, selectable by name (`get_rubric("efficiency")`)."""

from __future__ import annotations

from pathlib import Path

from judges.errors import JudgeConfigError

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


def get_rubric(name_or_text: str) -> str:
    """A rubric by library name, from a file path, or the text itself when it is neither."""
    if not isinstance(name_or_text, str) or not name_or_text.strip():
        raise JudgeConfigError("rubric must be a non-empty string (a name, a file path or the text)")
    if name_or_text in RUBRICS:
        return RUBRICS[name_or_text]
    if "\n" not in name_or_text and len(name_or_text) < 4096:
        path = Path(name_or_text).expanduser()
        if path.is_file():
            text = path.read_text(encoding="utf-8")
            if not text.strip():
                raise JudgeConfigError(f"rubric file {path} is empty")
            return text
        if " " not in name_or_text.strip():
            raise JudgeConfigError(
                f"unknown rubric {name_or_text!r}: not a library name ({', '.join(RUBRICS)}) nor a file"
            )
    return name_or_text
