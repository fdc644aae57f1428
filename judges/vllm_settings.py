"""vLLM settings the project's vLLM engines share (the in-process judge engine, the trainer's server, the judge
meta-evaluation's server). Plain data: importing it imports neither vLLM nor litellm."""

# Structured-output settings for JSON on one line with json.dumps' separators and no free whitespace. vLLM 0.24's
# default JSON grammar allows any whitespace between tokens, and a small judge can write it until its token limit
# (a 1.5B self-judge wrote newlines after `"scores": [`, 2026-12-07; vLLM issue 38696). It applies to JSON-schema and
# json_object grammars (response_format), not to vLLM's structural tags, which is what tool calls use under strict
# tool calling (vLLM's default). vLLM refuses disable_any_whitespace under its default backend "auto", hence the
# backend named; "auto" would pick xgrammar for every schema xgrammar takes, and a schema it refuses (multipleOf,
# uniqueItems, patternProperties, some string formats) is then an error instead of another backend's grammar.
COMPACT_JSON = {"backend": "xgrammar", "disable_any_whitespace": True}
