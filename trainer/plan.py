"""The dry run: what ``grpo train`` would do, the memory it needs, and what it would cost on a chosen GPU."""

from __future__ import annotations

import json
import math
from decimal import Decimal

from nodus.core.environment import Environment
from nodus.core.grading import sandbox_limits
from nodus.core.registry import get_registry
from nodus.trainer.estimate import JobSettings, estimate_memory, load_model_shape, parse_method
from nodus.trainer.estimate_cli import format_table
from nodus.trainer.pricing import GPU_PRICES, fits, lookup_gpu, project_cost
from nodus.trainer.spec import InvalidJobSpec, TrainingJob, check_combinations, check_cost_cap_rate


def planned_steps(job: TrainingJob) -> int:
    """Optimizer steps the job will take, as transformers plans them for TRL: maxSteps, or per epoch the batches of
    the whole rounds of prompts the train tasks fill (TRL drops a partial round), gradient_accumulation_steps of
    them a step (a partial one ends an epoch)."""
    p = job.spec.parameters
    if p.max_steps is not None:
        return p.max_steps
    rounds = job.spec.environment.train_tasks // (p.completions_per_round // p.num_generations)
    batches = rounds * p.micro_batches_per_round
    per_epoch = max(1, math.ceil(batches / (p.trl_count("gradient_accumulation_steps") or 1)))
    return math.ceil(p.epochs * per_epoch)


def prompt_tokens_estimate(env: Environment, job: TrainingJob) -> int:
    """A rough prompt length in tokens (4 characters a token) from the first held-out task."""
    task = env.task("heldout", job.spec.environment.seed, 0)
    return max(1, sum(len(m["content"]) for m in env.prompt(task)) // 4 + 16)


def dry_run(job: TrainingJob, gpu_name: str | None, rate: Decimal | None) -> str:
    from nodus.trainer.models import ModelNotAvailable, model_config_path, model_fit_problem, resolve_model

    # What the run would refuse at its start, the plan refuses too.
    check_combinations(job)
    check_cost_cap_rate(job, gpu_name is not None or rate is not None)
    spec, p = job.spec, job.spec.parameters
    rounded = p.checkpoint_steps != p.save_steps
    env = get_registry().resolve(spec.environment.name).spec.make(spec.environment.params)
    sandbox_limits(env, spec.sandbox_limits)
    steps = planned_steps(job)
    fsdp = spec.distributed.strategy == "FSDP"
    gpus = (spec.distributed.processes or 1) if fsdp else 1
    params = ", ".join(f"{key}={json.dumps(value)}" for key, value in env.params.model_dump(mode="json").items())
    lines = [
        f"plan for {job.name}: {spec.environment.name}, seed {spec.environment.seed}, "
        f"{spec.environment.train_tasks} train / {spec.environment.held_out_tasks} held-out tasks"
        + (f", parameters {params}" if params else ""),
        f"  model {spec.model.uri}, {p.method}"
        + (f" r={p.lora.r}" if p.method != "Full" else "")
        + f", {p.num_generations} generations of up to {p.max_completion_length} tokens, batch {p.batch_size}, "
        f"beta {p.beta:g}, learning rate {p.learning_rate:g}",
        f"  1. baseline evaluation on {spec.environment.held_out_tasks} held-out tasks (greedy), graded in "
        f"sandbox {spec.sandbox}",
        f"  2. {steps} GRPO steps, a checkpoint every {p.checkpoint_steps}"
        + (f" (saveSteps {p.save_steps} rounded up to whole rounds of completions)" if rounded else "")
        + (
            f", FSDP over {spec.distributed.processes} GPUs"
            if fsdp and spec.distributed.processes
            else ", FSDP over every GPU visible where it runs (set distributed.processes to plan for a number)"
            if fsdp
            else ""
        ),
        "  3. final evaluation on the same held-out tasks; results.json, metrics.jsonl, reward.png",
        "",
    ]
    source = resolve_model(spec.model.uri)
    try:
        config_path = model_config_path(source)
        problem = model_fit_problem(p.trl, p.max_completion_length, config_path)
        if problem is not None:
            raise InvalidJobSpec(problem)
        shape = load_model_shape(str(config_path))
    except ModelNotAvailable as error:
        # Planning must work before the model is downloaded: the rest of the plan does not need it.
        shape = None
        lines.append(f"memory: not estimated: {error}")
        lines.append("  (or size it from a config.json alone: grpo estimate --model path/to/config.json)")
    estimate = None
    if shape is not None:
        settings = JobSettings(
            method=parse_method(p.method),
            lora_r=p.lora.r,
            beta=p.beta,
            num_generations=p.num_generations,
            max_completion_length=p.max_completion_length,
            prompt_length=prompt_tokens_estimate(env, job),
        )
        estimate = estimate_memory(shape, settings)
        lines += format_table(estimate)
    if fsdp and estimate is not None:
        lines.append(
            "  (one device holding the whole model; FSDP divides the weights, gradients and optimizer state over "
            "the GPUs, not the activations or the KV cache)"
        )
    lines.append("")
    gpu = lookup_gpu(gpu_name) if gpu_name else None
    if gpu is None:
        known = ", ".join(g.aliases[0] for g in GPU_PRICES)
        lines.append(f"time and cost: name a GPU with --gpu ({known}) or give --gpu-rate with --gpu")
        return "\n".join(lines)
    # Rates are per GPU: a run over several GPUs pays for each (the step time is the table's single-GPU figure).
    hourly = (rate if rate is not None else gpu.usd_per_hour) * gpus
    projection = project_cost(steps, gpu.seconds_per_step, hourly)
    if estimate is not None:
        lines.append(fits(estimate, gpu)[1])
    lines.append(
        f"time and cost on {gpu.name}: {steps} steps x {gpu.seconds_per_step} s = {projection.seconds} s of training, "
        f"${projection.usd} at ${hourly}/h (step time and price as published on {gpu.as_of.isoformat()}; "
        "evaluation time not included)" + (f"; {gpus} GPUs" if gpus > 1 else "")
    )
    if fsdp and spec.distributed.processes is None:
        lines.append("note: the cost is for one GPU; set distributed.processes to project the GPUs the run will use")
    if spec.max_cost_usd is not None and projection.usd > spec.max_cost_usd:
        lines.append(f"warning: the projection passes maxCostUSD {spec.max_cost_usd}: training will stop early")
    return "\n".join(lines)
