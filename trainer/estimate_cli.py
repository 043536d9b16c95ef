"""``grpo estimate``: the memory a GRPO job needs, term by term, and whether it fits a GPU.

The command is registered on the ``grpo`` group in ``nodus.core.cli``; errors it raises are ``NodusError`` or
``click.UsageError``, which ``nodus.core.cli.main`` prints as one line with exit code 2.
"""

from __future__ import annotations

import json
from typing import Any

import click
from nodus.trainer.estimate import (
    DEFAULT_LORA_R,
    NOT_COUNTED,
    JobSettings,
    MemoryEstimate,
    Method,
    estimate_memory,
    load_model_shape,
    parse_method,
)
from nodus.trainer.pricing import BYTES_PER_GB, fits, lookup_gpu


def format_table(estimate: MemoryEstimate) -> list[str]:
    """One aligned line per term, then the total; GB to three decimals (1 GB = 1e9 bytes)."""
    settings = estimate.settings
    method = settings.method.value + (f" r={settings.lora_r}" if settings.method is not Method.FULL else "")
    parameters = estimate.parameters.total
    share = estimate.trained_parameters / parameters
    lines = [
        f"memory estimate for {estimate.model.name}: {method}, beta {settings.beta:g}, "
        f"{settings.num_generations} generations of {settings.prompt_length} prompt + "
        f"{settings.max_completion_length} completion tokens",
        f"parameters: {parameters:,} total, {estimate.trained_parameters:,} trained ({share:.2%})",
    ]
    rows = [(term.label, f"{term.bytes / BYTES_PER_GB:.3f}", term.detail) for term in estimate.terms]
    rows.append(("total", f"{estimate.total_bytes / BYTES_PER_GB:.3f}", ""))
    label_width = max(len(label) for label, _, _ in rows)
    gb_width = max(len("GB"), *(len(gb) for _, gb, _ in rows))
    lines.append(f"{'term':<{label_width}}  {'GB':>{gb_width}}  arithmetic")
    lines += [f"{label:<{label_width}}  {gb:>{gb_width}}  {detail}".rstrip() for label, gb, detail in rows]
    lines.append(f"1 GB = 1e9 bytes; not counted: {', '.join(NOT_COUNTED)}")
    lines += [f"note: {note}" for note in estimate.notes]
    return lines


@click.command()
@click.option(
    "--model",
    "model",
    required=True,
    metavar="CONFIG.JSON|DIR|hf://ORG/NAME@REV",
    help="The model's config.json, a directory holding it, or a model in the local Hugging Face cache.",
)
@click.option("--method", "method_text", required=True, metavar="LoRA|QLoRA|Full", help="How the model is trained.")
@click.option("--lora-r", type=int, default=None, help=f"LoRA rank (LoRA and QLoRA only)  [default: {DEFAULT_LORA_R}]")
@click.option("--beta", type=float, default=0.0, show_default=True, help="KL coefficient; > 0 needs a reference model.")
@click.option("--num-generations", type=int, default=4, show_default=True, help="Completions per prompt (one group).")
@click.option("--max-completion-length", type=int, default=64, show_default=True, help="Tokens per completion.")
@click.option("--prompt-length", type=int, default=256, show_default=True, help="Tokens per prompt.")
@click.option("--gpu", "gpu_name", default=None, help="Say whether the job fits this GPU, e.g. h100, a100, 4090.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON, every term in bytes.")
def estimate(
    model: str,
    method_text: str,
    lora_r: int | None,
    beta: float,
    num_generations: int,
    max_completion_length: int,
    prompt_length: int,
    gpu_name: str | None,
    as_json: bool,
) -> None:
    """Estimate the GPU memory of a GRPO job from the model's config.json."""
    method = parse_method(method_text)
    if method is Method.FULL and lora_r is not None:
        raise click.UsageError("--lora-r applies to LoRA and QLoRA; drop it with --method Full")
    gpu = lookup_gpu(gpu_name) if gpu_name is not None else None  # before loading, so a typo fails fast
    settings = JobSettings(
        method=method,
        lora_r=DEFAULT_LORA_R if lora_r is None else lora_r,
        beta=beta,
        num_generations=num_generations,
        max_completion_length=max_completion_length,
        prompt_length=prompt_length,
    )
    result = estimate_memory(load_model_shape(model), settings)
    fit = fits(result, gpu) if gpu is not None else None
    if as_json:
        payload: dict[str, Any] = result.as_json()
        if gpu is not None and fit is not None:
            payload["gpu"] = {
                "name": gpu.name,
                "memory_bytes": gpu.memory_gb * BYTES_PER_GB,
                "fits": fit[0],
                "message": fit[1],
            }
        click.echo(json.dumps(payload, indent=2, ensure_ascii=False))
        return
    for line in format_table(result):
        click.echo(line)
    if fit is not None:
        click.echo(fit[1])
