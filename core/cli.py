"""The ``grpo`` command line.

Built on click (rather than typer, which wraps it) because we need full control of error output: every user
mistake is one line on stderr saying what was wrong and the fix, exit code 2, never a traceback.
"""

from __future__ import annotations

import contextlib
import json
import logging
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

import click
from nodus.core.environment import (
    DEFAULT_HELD_OUT_TASKS,
    DEFAULT_TRAIN_TASKS,
    MAX_HELD_OUT_TASKS,
    MAX_SEED,
    MAX_TRAIN_TASKS,
    Environment,
    Task,
)
from nodus.core.errors import NodusError, Terminated
from nodus.core.grading import Grader, grade_completions
from nodus.core.registry import EnvironmentSpec, Registry, get_registry
from nodus.sandbox import SandboxUnavailable, UnsandboxedGradingWarning

USER_ERROR_EXIT = 2


class UsageFailure(NodusError):
    pass


def fail(message: str) -> NoReturn:
    raise UsageFailure(message)


def parse_params(pairs: tuple[str, ...], flag: str = "--param") -> dict[str, Any]:
    """``key=value`` pairs; a value is read as JSON when it parses (numbers, true/false), else as text."""
    params: dict[str, Any] = {}
    example = {"--param": "num_vertices=12", "--trl": "top_p=0.9"}.get(flag, "wall_time_s=30")
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            fail(f"{flag} {pair!r} is not key=value; write e.g. {flag} {example}")
        if key.strip() in params:
            fail(f"{flag} {key.strip()} is given twice; give each key once")
        try:
            params[key.strip()] = json.loads(value)
        except ValueError:
            params[key.strip()] = value
    return params


def resolve_environment(registry: Registry, env_text: str, param_pairs: tuple[str, ...]) -> Environment:
    resolution = registry.resolve(env_text)
    if resolution.note:
        click.echo(f"note: {resolution.note}", err=True)
    return resolution.spec.make(parse_params(param_pairs))


def split_tasks(env: Environment, split: str, seed: int, count: int) -> list[Task]:
    return env.tasks(split, seed, count)  # type: ignore[arg-type]


def task_json(env: Environment, task: Task) -> dict[str, Any]:
    return {
        "id": task.id,
        "env": task.env,
        "split": task.split,
        "seed": task.seed,
        "index": task.index,
        "draw": task.draw,
        "prompt": env.prompt_text(task),
        "messages": env.prompt(task),
        "data": task.data,
    }


def print_json(value: Any) -> None:
    click.echo(json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False))


env_option = click.option("--env", "env_text", required=True, help="Environment id, e.g. graph-coloring@1.")
param_option = click.option(
    "--param", "params", multiple=True, metavar="KEY=VALUE", help="Environment parameter (repeatable)."
)
seed_option = click.option(
    "--seed", type=click.IntRange(0, MAX_SEED), default=42, show_default=True, help="Seed of the task stream."
)
split_option = click.option("--split", type=click.Choice(["train", "heldout"]), required=True, help="Which split.")
json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")


def split_size_options(command: Any) -> Any:
    """--train-tasks and --held-out-tasks, with the bounds grpo train has."""
    held_out = click.option(
        "--held-out-tasks",
        type=click.IntRange(0, MAX_HELD_OUT_TASKS),
        default=DEFAULT_HELD_OUT_TASKS,
        show_default=True,
        help="Size of the held-out split.",
    )
    train = click.option(
        "--train-tasks",
        type=click.IntRange(0, MAX_TRAIN_TASKS),
        default=DEFAULT_TRAIN_TASKS,
        show_default=True,
        help="Size of the train split.",
    )
    return train(held_out(command))


def split_size(split: str, train_tasks: int, held_out_tasks: int) -> tuple[int, str]:
    """The split's size and the flag that sets it."""
    return (train_tasks, "--train-tasks") if split == "train" else (held_out_tasks, "--held-out-tasks")


sandbox_option = click.option(
    "--sandbox",
    type=click.Choice(["nsjail", "none"]),
    default="nsjail",
    show_default=True,
    help="Where the grader runs: nsjail (as training does), or 'none' in this process (trusted graders only).",
)
limit_option = click.option(
    "--limit",
    "limits",
    multiple=True,
    metavar="KEY=VALUE",
    help="Override a sandbox limit, e.g. --limit wall_time_s=30 (repeatable).",
)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="nodus", prog_name="grpo", message="%(prog)s (nodus) %(version)s")
def cli() -> None:
    """nodus: GRPO training on tasks whose answers a program can check."""


@cli.command()
@click.option("--env", "env_text", default=None, help="Show one environment's parameters.")
@json_option
def envs(env_text: str | None, as_json: bool) -> None:
    """List the installed environments."""
    registry = get_registry()
    for error in registry.load_errors:
        click.echo(f"warning: {error}", err=True)
    specs = registry.all() if env_text is None else [registry.resolve(env_text).spec]
    rows = [environment_row(spec) for spec in specs]
    if as_json:
        print_json(rows)
        return
    if not rows:
        click.echo("no environments installed; install one, e.g. pip install nodus-env-graph-coloring")
        return
    width = max(len(row["id"]) for row in rows)
    dist_width = max(len(row["distribution"]) for row in rows)
    for row in rows:
        click.echo(f"{row['id']:<{width}}  {row['distribution']:<{dist_width}}  {row['description']}")
        if env_text is not None:
            properties: dict[str, Any] = row["parameter_schema"].get("properties", {})
            for name, schema in properties.items():
                bounds = ", ".join(f"{key} {schema[key]}" for key in ("minimum", "maximum") if key in schema)
                extra = f" ({bounds})" if bounds else ""
                click.echo(f"  {name} = {json.dumps(schema.get('default'))}{extra}: {schema.get('description', '')}")


def environment_row(spec: EnvironmentSpec) -> dict[str, Any]:
    # The defaults as JSON: a date or a frozenset default of one plugin must not break the listing of every plugin.
    defaults = spec.cls.Params().model_dump(mode="json", warnings=False)
    return {
        "id": str(spec.env_id),
        "distribution": spec.distribution,
        "description": spec.description,
        "parameters": {
            name: {"default": defaults.get(name), "description": field.description}
            for name, field in spec.cls.Params.model_fields.items()
        },
        "parameter_schema": spec.cls.Params.model_json_schema(),
    }


@cli.command()
@env_option
@seed_option
@split_option
@click.option("-n", "count", type=click.IntRange(min=0), default=None, help="How many tasks (default: all).")
@split_size_options
@param_option
@json_option
def tasks(
    env_text: str,
    seed: int,
    split: str,
    count: int | None,
    train_tasks: int,
    held_out_tasks: int,
    params: tuple[str, ...],
    as_json: bool,
) -> None:
    """Print the tasks of a split."""
    env = resolve_environment(get_registry(), env_text, params)
    size, flag = split_size(split, train_tasks, held_out_tasks)
    if count is not None and count > size:
        fail(f"-n {count} is more than the {size} tasks of the {split} split; lower -n or raise {flag}")
    selected = split_tasks(env, split, seed, size if count is None else count)
    if as_json:
        print_json([task_json(env, task) for task in selected])
        return
    for task in selected:
        click.echo(f"=== {task.env} {task.id} (split {task.split}, index {task.index}, draw {task.draw})")
        click.echo(env.prompt_text(task))
        click.echo()


@cli.command()
@env_option
@seed_option
@split_option
@click.option("--index", type=click.IntRange(min=0), required=True, help="Position of the task in its split.")
@split_size_options
@click.option(
    "--completion",
    "completion_file",
    type=click.File("rb"),
    default=None,
    help="File with the completion, or - for stdin.",
)
@click.option("--reference", is_flag=True, help="Grade the environment's reference answer.")
@sandbox_option
@param_option
@limit_option
@json_option
def grade(
    env_text: str,
    seed: int,
    split: str,
    index: int,
    train_tasks: int,
    held_out_tasks: int,
    completion_file: Any,
    reference: bool,
    sandbox: str,
    params: tuple[str, ...],
    limits: tuple[str, ...],
    as_json: bool,
) -> None:
    """Grade one completion of one task."""
    if reference == (completion_file is not None):
        fail("give exactly one of --completion FILE (or - for stdin) and --reference")
    size, flag = split_size(split, train_tasks, held_out_tasks)
    if index >= size:
        fail(f"--index {index} is past the {size} tasks of the {split} split; lower --index or raise {flag}")
    completion = None if reference else read_completion(completion_file)
    env = resolve_environment(get_registry(), env_text, params)
    task = split_tasks(env, split, seed, index + 1)[index]
    if completion is None:
        completion = env.reference(task)
    outcome = grade_completions(env, [(task, completion)], sandbox=sandbox, limits=parse_params(limits, "--limit"))[0]  # type: ignore[arg-type]
    if as_json:
        print_json({"task": task.id, "env": task.env, **outcome})
    else:
        if outcome["status"] == "graded":
            verdict = "passed" if outcome["passed"] else "failed"
            click.echo(f"{task.env} {task.id}: score {outcome['score']:.3f} ({verdict}): {outcome['details']}")
        else:
            click.echo(f"{task.env} {task.id}: infrastructure failure, not a score: {outcome['details']}")
    if outcome["status"] != "graded":
        sys.exit(1)


def read_completion(file: Any) -> str:
    """A completion file's text; one that is not UTF-8 is a user error, not a traceback."""
    name = "standard input" if file.name == "<stdin>" else file.name
    try:
        text = str(file.read().decode("utf-8"))
    except UnicodeDecodeError as error:
        fail(f"the completion in {name} is not UTF-8 text (byte {error.start}); save it as UTF-8")
    return text.replace("\r\n", "\n").replace("\r", "\n")  # as a text-mode read would: graders see \n only


@cli.command()
@env_option
@click.option("--examples", type=click.IntRange(min=1), default=16, show_default=True, help="Tasks sampled per check.")
@sandbox_option
@param_option
@limit_option
@json_option
def check(
    env_text: str, examples: int, sandbox: str, params: tuple[str, ...], limits: tuple[str, ...], as_json: bool
) -> None:
    """Run the conformance checks on an environment: determinism, disjoint splits, sound grading."""
    from nodus.core.testing import run_checks

    env = resolve_environment(get_registry(), env_text, params)
    if sandbox == "none":  # once: the sandbox would say it for every batch the check grades
        click.echo(
            "warning: grading with --sandbox none: in this process, without isolation or limits other than wall "
            "time; only for trusted graders",
            err=True,
        )
    with (
        sandbox_log_left_to_the_report(),
        Grader(env, sandbox=sandbox, limits=parse_params(limits, "--limit")) as grader,  # type: ignore[arg-type]
    ):

        def grade_in_sandbox(_: Environment, pairs: list[tuple[Task, str]]) -> list[dict[str, Any]]:
            return [outcome.model_dump() for outcome in grader.grade(pairs)]

        report = run_checks(env, examples, grade_fn=grade_in_sandbox)
    if as_json:
        print_json(report.to_dict())
    else:
        click.echo(report.summary())
    if not report.passed:
        sys.exit(1)


@contextlib.contextmanager
def sandbox_log_left_to_the_report() -> Iterator[None]:
    """Keep the sandbox from logging what the check's report says: a grader's error (the grader raised, killed or
    hung its worker) is a row of the table, not a "grading infrastructure failure" line per job, and the --sandbox
    none warning is said once. The machine's own failures are still logged: the report excuses them."""
    from nodus.core.testing.outcomes import GRADER_FAULTS, WORKER_HUNG, WORKER_KILLED

    reported = GRADER_FAULTS | WORKER_KILLED | WORKER_HUNG

    def keep(record: logging.LogRecord) -> bool:
        reason = record.args[0] if isinstance(record.args, tuple) and record.args else None
        return reason not in reported and "sandbox='none'" not in record.getMessage()

    logger = logging.getLogger("nodus.sandbox")
    logger.addFilter(keep)
    try:
        yield
    finally:
        logger.removeFilter(keep)


@cli.command("new-env")
@click.argument("name")
@click.option(
    "--dest",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("."),
    show_default=True,
    help="Directory to create the plugin in.",
)
def new_env(name: str, dest: Path) -> None:
    """Scaffold a new environment plugin that installs and passes 'grpo check' as generated."""
    from nodus.core.scaffold import scaffold_environment

    target = scaffold_environment(name, dest)
    next_steps = f"pip install -e '{target}[test]' && grpo check --env {name}@1 && pytest {target}"
    click.echo(f"created {target}; next: {next_steps}")


def _add_trainer_commands() -> None:
    # The trainer's commands live with the trainer; their modules import torch only when a command runs.
    from nodus.trainer.cli_train import train
    from nodus.trainer.estimate_cli import estimate

    cli.add_command(train)
    cli.add_command(estimate)


_add_trainer_commands()


def main(argv: list[str] | None = None) -> None:
    """Entry point of ``grpo``: user mistakes become one line on stderr and exit code 2."""
    # The sandbox logs its own one-line warning for --sandbox none; the Python warning would repeat it.
    warnings.simplefilter("ignore", UnsandboxedGradingWarning)
    try:
        cli.main(args=argv, prog_name="grpo", standalone_mode=False)
    except click.exceptions.Exit as done:
        sys.exit(done.exit_code)
    except click.exceptions.NoArgsIsHelpError as error:  # bare `grpo`: the help, not an error
        click.echo(error.ctx.get_help() if error.ctx else error.format_message())
        sys.exit(0)
    except click.exceptions.Abort as abort:  # click's form of a KeyboardInterrupt (Ctrl-C, or SIGTERM in train)
        terminated = isinstance(abort.__cause__, Terminated)
        click.echo("grpo: terminated" if terminated else "grpo: aborted", err=True)
        sys.exit(143 if terminated else 130)
    except click.UsageError as error:
        command = error.ctx.command_path if error.ctx else "grpo"
        click.echo(f"{command}: error: {error.format_message()} (see '{command} --help')", err=True)
        sys.exit(USER_ERROR_EXIT)
    except click.ClickException as error:
        click.echo(f"grpo: error: {error.format_message()}", err=True)
        sys.exit(USER_ERROR_EXIT)
    except (NodusError, SandboxUnavailable) as error:
        click.echo(f"grpo: error: {error}", err=True)
        sys.exit(USER_ERROR_EXIT)
