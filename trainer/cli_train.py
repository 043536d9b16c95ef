"""``grpo train``: the job spec from ``-f job.yaml`` and flags (flags win), then the run or its dry-run plan.

Importing this module must stay cheap (no torch): ``grpo envs`` and friends import it to build the command group.
"""

from __future__ import annotations

import importlib.util
import signal
from decimal import Decimal
from pathlib import Path
from typing import Any

import click
from nodus.core.errors import NodusError, Terminated
from nodus.trainer.spec import FIELD_FLAGS, load_job


class TrainingExtrasMissing(NodusError):
    pass


def field_options(command: Any) -> Any:
    for flag, (path, kind) in reversed(FIELD_FLAGS.items()):
        command = click.option(f"--{flag.replace('_', '-')}", flag, type=kind, default=None, help=f"Sets {path}.")(
            command
        )
    return command


def parse_params(pairs: tuple[str, ...], flag: str = "--param") -> dict[str, Any]:
    from nodus.core.cli import parse_params as parse

    return parse(pairs, flag)


@click.command()
@click.option("-f", "--file", "job_file", type=click.Path(path_type=Path), default=None, help="Job spec YAML.")
@field_options
@click.option("--param", "params", multiple=True, metavar="KEY=VALUE", help="Environment parameter (repeatable).")
@click.option(
    "--limit",
    "limits",
    multiple=True,
    metavar="KEY=VALUE",
    help="Override a sandbox limit of the grader, e.g. --limit wall_time_s=30 (sets spec.sandboxLimits).",
)
@click.option(
    "--trl",
    "trl_pairs",
    multiple=True,
    metavar="KEY=VALUE",
    help="Any other GRPOConfig field, e.g. --trl top_p=0.9 (sets spec.parameters.trl).",
)
@click.option(
    "--output",
    type=click.Path(path_type=Path),
    default=None,
    help="Run directory (default ./outputs/NAME). Re-running on it resumes.",
)
@click.option("--dry-run", is_flag=True, help="Print the plan, memory estimate, time and cost; train nothing.")
@click.option("--gpu", "gpu", default=None, help="GPU for the cost projection and rate, e.g. h100, a100, 4090.")
@click.option("--gpu-rate", "gpu_rate", default=None, metavar="USD_PER_HOUR", help="Hourly rate for the cost meter.")
@click.option("--quiet", is_flag=True, help="No progress lines.")
@click.option("--tensorboard", is_flag=True, help="Also log to TensorBoard (TRL's report_to) under the run dir.")
def train(
    job_file: Path | None,
    params: tuple[str, ...],
    limits: tuple[str, ...],
    trl_pairs: tuple[str, ...],
    output: Path | None,
    dry_run: bool,
    gpu: str | None,
    gpu_rate: str | None,
    quiet: bool,
    tensorboard: bool,
    **fields: Any,
) -> None:
    """Train a LoRA adapter with GRPO on an environment: baseline, training, final evaluation, results.json."""
    overrides = {FIELD_FLAGS[key][0]: value for key, value in fields.items() if value is not None}
    if params:
        overrides["spec.environment.params"] = parse_params(params)
    if limits:
        overrides["spec.sandboxLimits"] = parse_params(limits, "--limit")
    if trl_pairs:
        overrides["spec.parameters.trl"] = parse_params(trl_pairs, "--trl")
    job = load_job(job_file, overrides)
    rate = parse_rate(gpu_rate)
    run_dir = output or Path("outputs") / job.name
    if dry_run:
        from nodus.trainer.plan import dry_run as print_plan

        click.echo(print_plan(job, gpu, rate))
        return
    try:
        from nodus.trainer.run import RunOptions
        from nodus.trainer.run import train as run_training
    except ImportError as error:
        raise TrainingExtrasMissing(
            f"grpo train needs the training extras ({error.name} is missing): pip install 'nodus[train]'"
        ) from None
    if tensorboard and importlib.util.find_spec("tensorboard") is None:
        raise TrainingExtrasMissing("--tensorboard needs the tensorboard package: pip install tensorboard")
    options = RunOptions(
        output=run_dir, gpu=gpu, gpu_rate=rate, quiet=quiet, report_to=["tensorboard"] if tensorboard else []
    )
    # timeout, docker stop and batch schedulers stop a job with SIGTERM: stop as Ctrl-C does, recorded as interrupted
    # in results.json (the default action ended the process with no record at all).
    signal.signal(signal.SIGTERM, _stop_like_ctrl_c)
    results = run_training(job, options)
    click.echo(f"results: {run_dir / 'results.json'} (status {results['status']})")


def _stop_like_ctrl_c(_signum: int, _frame: object) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM ends the process at once
    raise Terminated()


def parse_rate(text: str | None) -> Decimal | None:
    from nodus.trainer.pricing import InvalidCostInput, parse_usd_per_hour

    if text is None:
        return None
    try:
        return parse_usd_per_hour(text)
    except InvalidCostInput as error:
        raise click.BadParameter(str(error).removeprefix("--gpu-rate "), param_hint="--gpu-rate") from None
