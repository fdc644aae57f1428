"""The `ruler` command line (`ruler` or `python -m ruler_rl`): `ruler score FILE`, `ruler demo`, `ruler serve`,
`ruler keys ...`, and the commands of the packages above ruler: `ruler train-report` (trainer) and
`ruler eval ...` (evals, from a checkout). Those are looked up by module name when used or listed
(`PLUGIN_COMMANDS`), so ruler never imports trainer or evals; when one cannot load (its extra is missing, or
evals is absent from an installed wheel) the command still shows and prints one line saying what to install.

Every error is one line on stderr naming the problem and a non-zero exit: 2 for bad input or options
(usage errors included), 1 when the judge failed or for anything unexpected. `--debug` (or
`RULER_DEBUG=1`) shows the traceback instead.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import json
import os
import sys
import time
from importlib import resources
from pathlib import Path
from typing import Optional

import click
import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ruler_rl.judges.choice import JUDGES_BY_KEY, choose_judge
from ruler_rl.judges.errors import JudgeConfigError, JudgeError
from ruler_rl.judges.extras import MissingExtraError, missing_modules, pip_command, require
from ruler_rl.judges.retry import MAX_ATTEMPTS
from ruler_rl.judges.rubrics import MAX_RUBRIC_CHARS, RUBRICS, load_rubric_file
from ruler_rl.limits import MAX_PERMUTATIONS, MAX_PROMPT_TOKENS, MIN_PROMPT_TOKENS, UNKNOWN_CONTEXT_TOKENS, Limits

console = Console()
err = Console(stderr=True, soft_wrap=True, highlight=False)
MAX_ERROR_CHARS = 2000


def error_line(message: str) -> None:
    """One line on stderr: `error: <message>` (whitespace folded, no markup interpreted)."""
    text = " ".join(str(message).split())
    if len(text) > MAX_ERROR_CHARS:
        text = text[:MAX_ERROR_CHARS] + " ..."
    err.print(f"[red]error:[/red] {escape(text)}", soft_wrap=True)


def exit_code_and_message(exc: BaseException) -> tuple[int, str]:
    """How the command line reports an exception: 2 for bad input or options, 1 for failures."""
    import sqlite3

    if isinstance(exc, JudgeConfigError):
        return 2, str(exc)
    if isinstance(exc, JudgeError):  # unavailable or unusable answers: the judge failed, not the input
        return 1, str(exc)
    if isinstance(exc, (ValueError, TypeError, FileNotFoundError, IsADirectoryError, NotADirectoryError,
                        PermissionError, UnicodeError)):
        return 2, str(exc)
    if isinstance(exc, sqlite3.DatabaseError):
        return 2, f"database error: {exc}"
    if isinstance(exc, OSError):
        return 1, str(exc)
    return 1, f"internal error: {type(exc).__name__}: {exc} (run with --debug for the traceback)"


# Commands of the packages above ruler, imported by module name only when run (ruler never imports trainer or
# evals; listing them in --help imports nothing): command name -> (module, its typer.Typer attribute, the extra
# it needs, its one-line help).
PLUGIN_COMMANDS: dict[str, tuple[str, str, str, str]] = {
    "train-report": ("ruler_rl.trainer.cli", "app", "train",
                     "Plot a training run's reward and loss curves to a PNG and print the last steps."),
    "eval": ("evals.cli", "app", "eval", "Evaluations: judge meta-evaluation, benchmarks."),
    "mcp-rl": ("ruler_rl.trainer.mcp_rl_cli", "app", "mcp",
               "Train an agent on the tools of an MCP server with RULER as the reward."),
    "distill": ("ruler_rl.trainer.distill_cli", "app", "train",
                "Distil a cheap local judge from a judge's cached judgments and/or labelled groups."),
}


def plugin_unavailable(name: str) -> str | None:
    """Why plugin `name` cannot run here (its package or its extra's modules are not installed), found
    without importing them; None when it looks runnable (loading it may still fail: `load_plugin_command`)."""
    if name not in PLUGIN_COMMANDS:
        raise ValueError(f"unknown plugin command {name!r}; known: {', '.join(PLUGIN_COMMANDS)}")
    module_name, _, extra, _ = PLUGIN_COMMANDS[name]
    package = module_name.rpartition(".")[0]  # ruler_rl.trainer, evals: the package the command lives in
    try:
        found = importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        return (f"`ruler {name}` runs from a checkout of the ruler-rl repository ({package} is not in the "
                f"installed package): in the checkout run `bash .ci/setup`, or `python -m ruler_rl {name} ...` "
                f"from its root with the '{extra}' extra installed ({pip_command(extra)})")
    missing = missing_modules(extra)
    if missing:
        return f"`ruler {name}` needs the '{extra}' extra ({', '.join(missing)} not installed): {pip_command(extra)}"
    return None


def load_plugin_command(name: str) -> click.Command:
    """The click command of plugin `name`; one that only prints why it is unavailable if its module cannot load."""
    if name not in PLUGIN_COMMANDS:
        raise ValueError(f"unknown plugin command {name!r}; known: {', '.join(PLUGIN_COMMANDS)}")
    module_name, attribute, extra, _ = PLUGIN_COMMANDS[name]
    why = plugin_unavailable(name)
    if why is not None:
        return _unavailable_command(name, why)
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:  # MissingExtraError included
        if isinstance(exc, MissingExtraError):
            why = (f"`ruler {name}` needs the '{exc.extra}' extra ({', '.join(exc.missing)} not installed): "
                   f"{pip_command(exc.extra)}")
        else:
            why = f"`ruler {name}` cannot load ({exc}); it needs the '{extra}' extra: {pip_command(extra)}"
        return _unavailable_command(name, why)
    command = typer.main.get_command(getattr(module, attribute))
    command.name = name
    return command


def _unavailable_command(name: str, why: str) -> click.Command:
    """A command that takes any arguments, `--help` included, and prints `why` as one error line (exit 2)."""

    def explain() -> None:
        error_line(why)
        raise typer.Exit(2)

    listed = f"unavailable: {why}"
    if app.rich_markup_mode == "rich":  # the root's help renders rich markup: the extra's [brackets] must survive
        listed = escape(listed)
    return click.Command(name, callback=explain, short_help=listed, add_help_option=False,
                         context_settings={"ignore_unknown_options": True, "allow_extra_args": True})


class CliGroup(typer.core.TyperGroup):
    """The root command: usage errors and exceptions become one line and an exit code (no traceback); the
    commands of `PLUGIN_COMMANDS` are loaded when named or listed."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        own = super().list_commands(ctx)
        return [*own, *(name for name in PLUGIN_COMMANDS if name not in own)]

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        """A command by name; a plugin not run yet is a stand-in with its one-line help (listing imports nothing)."""
        command = super().get_command(ctx, cmd_name)
        if command is None and cmd_name in PLUGIN_COMMANDS:
            why = plugin_unavailable(cmd_name)
            if why is not None:
                return _unavailable_command(cmd_name, why)
            return click.Command(cmd_name, short_help=PLUGIN_COMMANDS[cmd_name][3])
        return command

    def resolve_command(self, ctx: click.Context, args: list[str]):
        """The command being run: a plugin is imported now, once."""
        if args and args[0] in PLUGIN_COMMANDS and args[0] not in self.commands:
            self.add_command(load_plugin_command(args[0]), args[0])
        return super().resolve_command(ctx, args)

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        try:
            rv = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except typer.TyperException as exc:  # usage errors (bad option values, missing arguments, ...)
            if type(exc).__name__ == "NoArgsIsHelpError":  # the help was asked for by giving nothing
                if exc.format_message().strip():
                    typer.echo(exc.format_message())
                sys.exit(2)
            ctx = getattr(exc, "ctx", None)
            hint = f" (see '{ctx.command_path} --help')" if ctx is not None else ""
            error_line(exc.format_message() + hint)
            sys.exit(exc.exit_code)
        except typer.Abort:
            error_line("aborted")
            sys.exit(1)
        sys.exit(rv if isinstance(rv, int) else 0)

    def invoke(self, ctx: typer.Context):
        try:
            return super().invoke(ctx)
        except (typer.Exit, typer.Abort, typer.TyperException):
            raise
        except Exception as exc:
            if ctx.meta.get("ruler_debug"):
                raise
            code, message = exit_code_and_message(exc)
            error_line(message)
            raise typer.Exit(code) from None


app = typer.Typer(cls=CliGroup, add_completion=False, no_args_is_help=True,
                  help="RULER: reward-free scores for agent trajectories.")


@app.callback()
def _root(ctx: typer.Context,
          debug: bool = typer.Option(False, "--debug", envvar="RULER_DEBUG",
                                     help="Show the traceback of an error instead of one line.")) -> None:
    ctx.meta["ruler_debug"] = debug


DEMO_GROUP = "demo_group.json"
LIMITS = Limits()


def _not_empty(value: str | None, flag: str) -> str | None:
    if value is not None and not value.strip():
        raise typer.BadParameter("must not be empty (leave the option out for the default)", param_hint=flag)
    return value


def _check_api_base(value: str | None) -> str | None:
    _not_empty(value, "--api-base")
    if value is not None and not value.startswith(("http://", "https://")):
        raise typer.BadParameter(f"{value!r} is not an http(s) URL", param_hint="--api-base")
    return value


def resolve_rubric(value: str) -> str:
    """`--rubric`: a library name, else a rubric file; anything else is an error (never sent as text)."""
    if value in RUBRICS:
        return RUBRICS[value]
    path = Path(value).expanduser()
    if path.is_file():
        return load_rubric_file(path)
    if path.exists():
        raise JudgeConfigError(f"--rubric {value!r} is not a file")
    raise JudgeConfigError(f"unknown rubric {value!r}: not a rubric name ({', '.join(RUBRICS)}) and no such file")


ALLOW_HUB_HELP = ("Let a local/<folder> judge whose base model is a hub id download it (by default local judges "
                  "read only folders and the local Hugging Face cache; also $RULER_LOCAL_MODELS_FROM_HUB=1).")


def _allow_hub(allow: bool) -> None:
    if allow:
        from ruler_rl.judges.embedded import HUB_ENV

        os.environ[HUB_ENV] = "1"


SCORE_TIMEOUT_S = 180.0
"""`ruler score`'s default `--timeout`: a judge call gets three minutes, retries included (a large group judged by
a reasoning model takes one or two), and a judge that never answers fails after that, not after ten."""


def _score(group, judge: str | None, api_base: str | None, rubric: str, cache: bool, permutations: int,
           timeout: float = SCORE_TIMEOUT_S, retries: int = 4, max_prompt_tokens: int | None = None):
    from ruler_rl import ruler_score_group
    from ruler_rl.judges import RetryPolicy

    params = {"api_base": api_base} if api_base else None
    # one attempt may take half the deadline when there are retries, so a hung attempt leaves room for another
    attempt = timeout / 2 if retries else timeout
    retry = RetryPolicy(attempts=retries + 1, deadline=timeout, timeout=min(RetryPolicy.timeout, attempt))
    return asyncio.run(ruler_score_group(group, judge, params, rubric, cache=None if cache else False,
                                         num_permutations=permutations, retry=retry,
                                         max_prompt_tokens=max_prompt_tokens))


def _print_table(scored, title: str) -> None:
    from ruler_rl.advantages import group_has_signal
    from ruler_rl.results import score_notes, score_rows

    rewards = [t.reward for t in scored.trajectories]
    table = Table(title=escape(title), show_lines=True)
    for col, kw in (("id", {"justify": "right"}), ("label", {}), ("score", {"justify": "right"}),
                    ("advantage", {"justify": "right"}), ("explanation", {"overflow": "fold"})):
        table.add_column(col, **kw)
    for t, row in zip(scored.trajectories, score_rows(scored), strict=True):
        table.add_row(row.trajectory_id, escape(str(t.metadata.get("label", ""))), f"{row.score:.3f}",
                      f"{row.advantage:+.2f}", escape(row.explanation))
    console.print(table)
    meta = scored.metadata
    console.print(
        f"judge {escape(str(meta.get('judge_model')))}: {meta.get('judge_calls')} call(s), "
        f"{meta.get('judge_prompt_tokens')} prompt + {meta.get('judge_completion_tokens')} completion tokens, "
        f"${meta.get('judge_cost', 0):.6f}{' (from cache)' if meta.get('judge_cached') else ''}"
        + ("" if group_has_signal(rewards) else "  [yellow]all scores equal: no training signal[/yellow]")
    )
    for note in score_notes(scored):
        console.print(f"[dim]RULER note: {escape(note)}[/dim]")


def _to_json(scored) -> str:
    from ruler_rl.results import score_notes, score_rows

    return json.dumps(allow_nan=False, obj={
        "metadata": scored.metadata,
        "scores": [row.model_dump() for row in score_rows(scored)],
        "notes": score_notes(scored),
    }, indent=2)


@app.command(help=f"""Score one group of trajectories with RULER and print id, score, advantage and explanation.

The group is checked before anything is sent: at most {LIMITS.max_trajectories} trajectories,
{LIMITS.max_messages:,} messages each, {LIMITS.max_message_chars:,} characters per message; known roles and
message fields only; tool calls that name their tool; tool messages with a tool_call_id; finite rewards.
One judge call takes at most --timeout seconds, retries included.""")
def score(
    file: Path = typer.Argument(..., help="A group as JSON (object or list) or JSONL (one trajectory per line)."),
    judge: Optional[str] = typer.Option(None, "--judge", help="litellm model string (default: $RULER_JUDGE_MODEL, "
                                        "else the embedded judge)."),
    api_base: Optional[str] = typer.Option(None, "--api-base", help="OpenAI-compatible base URL for the judge."),
    rubric: str = typer.Option("default", "--rubric", help=f"A rubric name ({', '.join(RUBRICS)}) or a rubric "
                               f"file (UTF-8, at most {MAX_RUBRIC_CHARS:,} characters)."),
    no_cache: bool = typer.Option(False, "--no-cache", help="Do not read or write the judge cache."),
    permutations: int = typer.Option(1, "--permutations", "-k", min=1, max=MAX_PERMUTATIONS,
                                     help=f"Judge under k orderings (1-{MAX_PERMUTATIONS}) and average: k judge calls."),
    timeout: float = typer.Option(SCORE_TIMEOUT_S, "--timeout", min=0.1, max=86_400.0,
                                  help="Seconds one judge call may take in all, retries and waits included (a judge "
                                  "that never answers fails after this; one attempt gets half of it when --retries "
                                  "> 0). A CPU judge (local/...) scoring a large group may need more."),
    retries: int = typer.Option(4, "--retries", min=0, max=MAX_ATTEMPTS - 1,
                                help="Retries of a judge call after 429, 5xx, timeouts or connection errors."),
    max_prompt_tokens: Optional[int] = typer.Option(
        None, "--max-prompt-tokens", min=MIN_PROMPT_TOKENS, max=MAX_PROMPT_TOKENS,
        help=f"Largest judge prompt in tokens (default: the judge's context; {UNKNOWN_CONTEXT_TOKENS:,} when litellm "
             "does not know it). Longer groups have long bodies cut, then are split."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
    allow_hub: bool = typer.Option(False, "--allow-hub-downloads", help=ALLOW_HUB_HELP),
) -> None:
    from ruler_rl import TrajectoryGroup
    from ruler_rl.errors import TrajectoryError

    _allow_hub(allow_hub)
    _not_empty(judge, "--judge")
    _check_api_base(api_base)
    rubric_text = resolve_rubric(rubric)
    group = TrajectoryGroup.load(file)
    if not len(group):
        raise ValueError(f"{file} holds no trajectories: nothing to score")
    try:
        scored = _score(group, judge, api_base, rubric_text, not no_cache, permutations, timeout, retries,
                        max_prompt_tokens)
    except TrajectoryError as exc:
        raise ValueError(f"{file}: {exc}") from None
    if as_json:
        print(_to_json(scored))
    else:
        _print_table(scored, f"RULER scores for {file}")


def _key_judges() -> str:
    return ", ".join(f"{var} picks {model}" for var, model in JUDGES_BY_KEY)


@app.command(help=f"""Score the bundled example group (an email agent's rollouts of differing quality).

The judge: --judge, else $RULER_JUDGE_MODEL, else a real judge picked by an API key in the environment
({_key_judges()}), else the embedded SmolLM2-135M judge, which checks the plumbing, not quality.""")
def demo(
    judge: Optional[str] = typer.Option(None, "--judge", help="litellm model string (default: $RULER_JUDGE_MODEL, "
                                        "else one picked by an API key in the environment, else the embedded judge)."),
    api_base: Optional[str] = typer.Option(None, "--api-base", help="OpenAI-compatible base URL for the judge."),
    no_cache: bool = typer.Option(True, "--no-cache/--cache", help="Judge afresh (default) or allow cache hits."),
) -> None:
    """Score the bundled example group (an email agent's rollouts of differing quality)."""
    from ruler_rl import TrajectoryGroup

    _not_empty(judge, "--judge")
    _check_api_base(api_base)
    choice = choose_judge(judge)
    embedded = choice.source == "embedded"
    if embedded:  # before anything is printed: without the extra, one line says what to do
        require("embedded", f"the demo's default judge ({choice.model})",
                f"or use a real judge: --judge MODEL (any litellm model string), $RULER_JUDGE_MODEL, or an API key "
                f"in the environment ({_key_judges()})")
    why = {"given": "--judge", "env": "$RULER_JUDGE_MODEL", "key": f"{choice.key_var} is set",
           "embedded": "no --judge, no $RULER_JUDGE_MODEL, no API key in the environment"}[choice.source]
    path = resources.files("ruler_rl") / "data" / DEMO_GROUP
    group = TrajectoryGroup.model_validate_json(path.read_text(encoding="utf-8"))
    console.print(f"Scoring {len(group)} trajectories of the bundled email-agent group with [bold]"
                  f"{escape(choice.model)}[/bold] ({escape(why)})"
                  + ("; the first run converts the embedded model, ~1 min..." if embedded else "..."))
    started = time.perf_counter()
    scored = _score(group, choice.model, api_base, "default", not no_cache, 1)
    _print_table(scored, "RULER demo: who answered the inbox question best?")
    console.print(f"demo wall time: {time.perf_counter() - started:.1f} s")
    if embedded:
        console.print("[yellow]The embedded SmolLM2-135M judge checks the plumbing, not quality: it is near chance "
                      "on human-labelled pairs. For real scores give a real judge: --judge MODEL (any litellm "
                      f"model string; or $RULER_JUDGE_MODEL), or set an API key ({escape(_key_judges())}).[/yellow]")


def print_frame(df, title: str, fmt: str = "{:.3f}") -> None:
    """A DataFrame as a rich table, wide enough not to wrap the numbers (for the plugin commands' summaries)."""
    table = Table(title=escape(title))
    for col in df.columns:
        table.add_column(escape(str(col)), justify="right")
    for row in df.itertuples(index=False):
        table.add_row(*[fmt.format(v) if isinstance(v, float) else escape(str(v)) for v in row])
    Console(width=max(console.width, 240)).print(table)


def main() -> None:
    """The `ruler` console script and `python -m ruler_rl`: the same commands and help, named `ruler`."""
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    app(prog_name="ruler")


keys_app = typer.Typer(no_args_is_help=True, help="API keys of the judging service.")
app.add_typer(keys_app, name="keys")
DEFAULT_DB = "ruler-service.db"


@keys_app.command("create")
def keys_create(name: str = typer.Argument(..., help="Who the key is for (1-200 characters)."),
                db: Path = typer.Option(Path(DEFAULT_DB), "--db")) -> None:
    """Create a key; it is printed once and only its hash is stored."""
    from ruler_rl.service.store import Store, check_key_name

    check_key_name(name)  # before the database is created
    key, key_id = Store(db).create_key(name)
    console.print(f"key id {key_id}: [bold]{key}[/bold]  (shown once; store it now)", soft_wrap=True)


@keys_app.command("list")
def keys_list(db: Path = typer.Option(Path(DEFAULT_DB), "--db")) -> None:
    """List keys (ids, names, when created and revoked), never the keys themselves."""
    from ruler_rl.service.store import Store

    table = Table("id", "name", "created", "revoked")
    for k in Store(db).list_keys():
        table.add_row(k["id"], k["name"], time.strftime("%Y-%m-%d %H:%M", time.gmtime(k["created"])),
                      time.strftime("%Y-%m-%d %H:%M", time.gmtime(k["revoked"])) if k["revoked"] else "")
    console.print(table)


@keys_app.command("revoke")
def keys_revoke(key_id: str = typer.Argument(...), db: Path = typer.Option(Path(DEFAULT_DB), "--db")) -> None:
    """Revoke a key by id: requests with it get 401 from then on."""
    from ruler_rl.service.store import Store

    if not Store(db).revoke_key(key_id):
        err.print(f"[red]error:[/red] no active key with id {key_id!r}")
        raise typer.Exit(2)
    console.print(f"revoked {key_id}")


@app.command()
def serve(
    host: str = typer.Option("127.0.0.1", "--host"),
    port: int = typer.Option(8700, "--port", min=1, max=65535),
    judge: Optional[str] = typer.Option(None, "--judge", help="Default judge (litellm model string)."),
    judge_api_base: Optional[str] = typer.Option(None, "--judge-api-base", help="api_base for the judge."),
    allow_judge: list[str] = typer.Option([], "--allow-judge", help="Other judges clients may ask for. Repeatable."),
    allow_api_base: list[str] = typer.Option([], "--allow-api-base", help="An api_base clients may send (exact URL); "
                                             "none by default. Repeatable."),
    rubric_dir: Optional[Path] = typer.Option(None, "--rubric-dir", help="A folder of named rubrics (<name>.txt or "
                                              ".md), read once at start. Clients name them; they never send paths."),
    db: Path = typer.Option(Path(DEFAULT_DB), "--db", help="SQLite database (keys, jobs, results)."),
    max_body_mb: float = typer.Option(8.0, "--max-body-mb", min=0.001, max=1024.0,
                                      help="Largest request body, counted as it arrives (chunked too): 413."),
    body_timeout: float = typer.Option(60.0, "--body-timeout", min=0.1, max=3600.0,
                                       help="Seconds the whole request body may take to arrive after its headers "
                                       "(slow clients, slow-loris): 408."),
    max_trajectories: int = typer.Option(256, "--max-trajectories", min=1, help="Trajectories per group."),
    max_messages: int = typer.Option(512, "--max-messages", min=1, help="Messages per trajectory."),
    max_message_chars: int = typer.Option(200_000, "--max-message-chars", min=1, help="Characters per message."),
    max_groups: int = typer.Option(1000, "--max-groups-per-job", min=1, help="Groups per job."),
    max_permutations: int = typer.Option(8, "--max-permutations", min=1, max=MAX_PERMUTATIONS,
                                         help="The most orderings (k) a request may ask for."),
    max_prompt_tokens: Optional[int] = typer.Option(
        None, "--max-prompt-tokens", min=MIN_PROMPT_TOKENS, max=MAX_PROMPT_TOKENS,
        help="Ceiling on any judge prompt in tokens (default: the judge's context)."),
    rate_per_minute: int = typer.Option(600, "--rate-per-minute", min=1, help="Requests per key per minute."),
    max_inflight: int = typer.Option(32, "--max-inflight-per-key", min=1, help="Concurrent /v1/score requests per key."),
    judge_timeout: float = typer.Option(600.0, "--judge-timeout", min=0.1,
                                        help="Seconds one group may take, retries included: 504 / an error result."),
    judge_retries: int = typer.Option(4, "--judge-retries", min=0, max=MAX_ATTEMPTS - 1,
                                      help="Retries of a judge call on 429/5xx/timeouts (within --judge-timeout)."),
    workers: int = typer.Option(8, "--worker-concurrency", min=1, help="Job groups judged at once."),
    max_group_attempts: int = typer.Option(3, "--max-group-attempts", min=1, max=100,
                                           help="Attempts at a job group whose judge stays unavailable."),
    metrics_key: bool = typer.Option(False, "--metrics-require-key", help="Protect /metrics with an API key."),
    header_timeout: float = typer.Option(10.0, "--header-timeout", min=0.01, max=3600.0,
                                         help="Seconds a request's headers may take to arrive (idle and slow "
                                         "connections): 408."),
    max_per_ip: int = typer.Option(256, "--max-connections-per-ip", min=0,
                                   help="Connections from one client address; over it the oldest one still waiting "
                                   "for its headers is closed (0: no limit, e.g. behind a reverse proxy)."),
    max_connections: int = typer.Option(1000, "--max-connections", min=1,
                                        help="Connections in all; over it the oldest one still waiting for its "
                                        "headers is closed."),
    allow_hub: bool = typer.Option(False, "--allow-hub-downloads", help=ALLOW_HUB_HELP),
) -> None:
    """Run the judging service (FastAPI + uvicorn): /v1/score, /v1/jobs, /healthz, /metrics, /docs."""
    require("serve", "the judging service (ruler serve)")
    _allow_hub(allow_hub)
    import logging

    import uvicorn

    from ruler_rl.service.app import ServiceConfig, create_app
    from ruler_rl.service.connections import ConnectionLimits, uvicorn_options

    _not_empty(judge, "--judge")
    cfg = ServiceConfig(db_path=str(db), judge_model=judge, judge_params={"api_base": judge_api_base} if judge_api_base else {},
                        allowed_judges=allow_judge or None, allowed_api_bases=list(allow_api_base),
                        rubric_dir=str(rubric_dir) if rubric_dir else None,
                        max_body_bytes=max(1, int(max_body_mb * 1024 * 1024)),
                        body_timeout_s=body_timeout,
                        max_trajectories=max_trajectories, max_messages=max_messages,
                        max_message_chars=max_message_chars, max_groups_per_job=max_groups,
                        max_permutations=max_permutations, max_prompt_tokens=max_prompt_tokens,
                        rate_per_minute=rate_per_minute, max_inflight_per_key=max_inflight,
                        judge_timeout_s=judge_timeout, judge_retries=judge_retries, worker_concurrency=workers,
                        max_group_attempts=max_group_attempts, metrics_require_key=metrics_key)
    limits = ConnectionLimits(header_timeout_s=header_timeout, max_per_ip=max_per_ip, max_connections=max_connections)
    service = create_app(cfg)  # opens the database and the rubric folder: their errors come before the server
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    uvicorn.run(service, host=host, port=port, log_level="warning", timeout_graceful_shutdown=30,
                **uvicorn_options(limits))


if __name__ == "__main__":  # pragma: no cover  (`python -m ruler_rl` is the documented way)
    main()
