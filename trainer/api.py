"""The Python API: what ``grpo train`` does, callable from a script or a notebook.

from nodus.trainer import api
print(api.plan(env="graph-coloring@1", gpu="h100"))            # grpo train --dry-run
results = api.train(env="graph-coloring@1", seed=42, output="outputs/gc", max_steps=50)

# No plugin: prompts plus a reward function (graded in this process, as it is your own code).
results = api.train_on_function(prompts, reward=lambda prompt, completion: float("42" in completion))

Keyword arguments are the CLI flags in snake_case (``num_generations=8``); ``params``, ``limits`` and ``trl`` are
the mappings of ``--param``, ``--limit`` and ``--trl``. Mistakes raise ``NodusError`` with the CLI's messages.
"""

from __future__ import annotations

import difflib
import importlib.util
from collections.abc import Mapping, Sequence
from decimal import Decimal
from pathlib import Path
from typing import Any

from nodus.core.function_env import RewardFunction, function_environment
from nodus.trainer.cli_train import TrainingExtrasMissing
from nodus.trainer.pricing import parse_usd_per_hour
from nodus.trainer.run import RunOptions
from nodus.trainer.run import train as run_training
from nodus.trainer.spec import FIELD_FLAGS, InvalidJobSpec, TrainingJob, load_job


def plan(
    job_file: str | Path | None = None,
    *,
    gpu: str | None = None,
    gpu_rate: str | Decimal | None = None,
    params: Mapping[str, Any] | None = None,
    limits: Mapping[str, Any] | None = None,
    trl: Mapping[str, Any] | None = None,
    **fields: Any,
) -> str:
    """``grpo train --dry-run`` as a function: the plan, memory estimate, time and cost, as text."""
    from nodus.trainer.plan import dry_run

    job = _job(job_file, params, limits, trl, fields)
    return dry_run(job, gpu, _rate(gpu_rate))


def train(
    job_file: str | Path | None = None,
    *,
    output: str | Path | None = None,
    gpu: str | None = None,
    gpu_rate: str | Decimal | None = None,
    quiet: bool = False,
    tensorboard: bool = False,
    params: Mapping[str, Any] | None = None,
    limits: Mapping[str, Any] | None = None,
    trl: Mapping[str, Any] | None = None,
    **fields: Any,
) -> dict[str, Any]:
    """``grpo train`` as a function; returns results.json's content."""
    job = _job(job_file, params, limits, trl, fields)
    options = RunOptions(
        output=Path(output or Path("outputs") / job.name),
        gpu=gpu,
        gpu_rate=_rate(gpu_rate),
        quiet=quiet,
        report_to=_report_to(tensorboard),
    )
    return run_training(job, options)


def train_on_function(
    prompts: Sequence[str],
    reward: RewardFunction,
    *,
    name: str = "function-task",
    output: str | Path | None = None,
    quiet: bool = False,
    tensorboard: bool = False,
    references: Mapping[str, str] | None = None,
    trl: Mapping[str, Any] | None = None,
    **fields: Any,
) -> dict[str, Any]:
    """Train on ``prompts`` scored by ``reward(prompt, completion) -> float in [0, 1]``, in one call.

    ``references`` (prompt -> a completion that scores 1) allow an SFT warm-up (``sft_warmup_steps=N``).

    Tasks are split into train and held-out by the usual rule (about one prompt in eight is held out); the
    reward runs in this process with ``sandbox: none``, which warns on every run.
    """
    env = function_environment(name, prompts, reward, references)
    distinct = list(dict.fromkeys(prompts))
    held_out = sum(env.split_of(prompt) == "heldout" for prompt in distinct)
    if held_out in (0, len(distinct)):
        split = "held-out" if held_out == 0 else "train"
        raise InvalidJobSpec(
            f"train_on_function: none of the {len(distinct)} distinct prompts falls in the {split} split (a hash of "
            "each prompt decides, about one in eight is held out); pass more prompts, e.g. 40 or more"
        )
    fields.setdefault("held_out_tasks", held_out)
    fields.setdefault("train_tasks", len(distinct) - held_out)
    fields["env"] = env.id_text()
    fields["sandbox"] = "none"
    job = _job(None, None, None, trl, fields)
    options = RunOptions(output=Path(output or Path("outputs") / name), quiet=quiet, report_to=_report_to(tensorboard))
    return run_training(job, options, environment=env)


def _job(
    job_file: str | Path | None,
    params: Mapping[str, Any] | None,
    limits: Mapping[str, Any] | None,
    trl: Mapping[str, Any] | None,
    fields: dict[str, Any],
) -> TrainingJob:
    """The job from a file and keywords, as ``grpo train`` builds it from ``-f`` and flags (keywords win)."""
    unknown = sorted(set(fields) - set(FIELD_FLAGS))
    if unknown:
        hints = [f"did you mean {close[0]!r}?" for key in unknown if (close := _close(key))]
        if "dry_run" in unknown:
            hints.append("for the dry run call api.plan(...), which takes no output, quiet or tensorboard")
        raise TypeError(
            f"unknown training field(s) {', '.join(unknown)}{' (' + ' '.join(hints) + ')' if hints else ''}; "
            f"known: {', '.join(sorted(FIELD_FLAGS))}"
        )
    overrides: dict[str, Any] = {FIELD_FLAGS[key][0]: value for key, value in fields.items() if value is not None}
    for path, mapping in (("spec.environment.params", params), ("spec.sandboxLimits", limits),
                          ("spec.parameters.trl", trl)):
        if mapping:
            overrides[path] = dict(mapping)
    return load_job(Path(job_file) if job_file else None, overrides)


def _close(key: str) -> list[str]:
    return difflib.get_close_matches(key, sorted(FIELD_FLAGS), n=1)


def _rate(gpu_rate: str | Decimal | None) -> Decimal | None:
    return None if gpu_rate is None else parse_usd_per_hour(str(gpu_rate), "gpu_rate")


def _report_to(tensorboard: bool) -> list[str]:
    if tensorboard and importlib.util.find_spec("tensorboard") is None:
        raise TrainingExtrasMissing("tensorboard=True needs the tensorboard package: pip install tensorboard")
    return ["tensorboard"] if tensorboard else []
