"""The Python API: what ``grpo train`` does, callable from a script or a notebook.

from nodus.trainer import api
results = api.train(env="graph-coloring@1", seed=42, output="outputs/gc", max_steps=50)

# No plugin: prompts plus a reward function (graded in this process, as it is your own code).
results = api.train_on_function(prompts, reward=lambda prompt, completion: float("42" in completion))
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from decimal import Decimal
from pathlib import Path
from typing import Any

from nodus.core.function_env import RewardFunction, function_environment
from nodus.trainer.run import RunOptions
from nodus.trainer.run import train as run_training
from nodus.trainer.spec import FIELD_FLAGS, load_job


def train(
    job_file: str | Path | None = None,
    *,
    output: str | Path | None = None,
    gpu: str | None = None,
    gpu_rate: str | Decimal | None = None,
    quiet: bool = False,
    params: dict[str, Any] | None = None,
    **fields: Any,
) -> dict[str, Any]:
    """``grpo train`` as a function: keyword arguments are the CLI flags in snake_case (``num_generations=8``)."""
    unknown = sorted(set(fields) - set(FIELD_FLAGS))
    if unknown:
        raise TypeError(f"unknown training field(s) {', '.join(unknown)}; known: {', '.join(sorted(FIELD_FLAGS))}")
    overrides: dict[str, Any] = {FIELD_FLAGS[key][0]: value for key, value in fields.items() if value is not None}
    if params:
        overrides["spec.environment.params"] = params
    job = load_job(Path(job_file) if job_file else None, overrides)
    rate = None if gpu_rate is None else Decimal(str(gpu_rate))
    options = RunOptions(output=Path(output or Path("outputs") / job.name), gpu=gpu, gpu_rate=rate, quiet=quiet)
    return run_training(job, options)


def train_on_function(
    prompts: Sequence[str],
    reward: RewardFunction,
    *,
    name: str = "function-task",
    output: str | Path | None = None,
    quiet: bool = False,
    references: Mapping[str, str] | None = None,
    **fields: Any,
) -> dict[str, Any]:
    """Train on ``prompts`` scored by ``reward(prompt, completion) -> float in [0, 1]``, in one call.

    ``references`` (prompt -> a completion that scores 1) allow an SFT warm-up (``sft_warmup_steps=N``).

    Tasks are split into train and held-out by the usual rule (about one prompt in eight is held out); the
    reward runs in this process with ``sandbox: none``, which warns on every run.
    """
    env = function_environment(name, prompts, reward, references)
    held_out = sum(env.split_of(prompt) == "heldout" for prompt in dict.fromkeys(prompts))
    fields.setdefault("held_out_tasks", held_out)
    fields.setdefault("train_tasks", len(set(prompts)) - held_out)
    unknown = sorted(set(fields) - set(FIELD_FLAGS))
    if unknown:
        raise TypeError(f"unknown training field(s) {', '.join(unknown)}; known: {', '.join(sorted(FIELD_FLAGS))}")
    overrides = {FIELD_FLAGS[key][0]: value for key, value in fields.items() if value is not None}
    overrides["spec.environment.name"] = env.id_text()
    overrides["spec.sandbox"] = "none"
    job = load_job(None, overrides)
    options = RunOptions(output=Path(output or Path("outputs") / name), quiet=quiet)
    return run_training(job, options, environment=env)
