"""Held-out evaluation: greedy, batched generation, graded in the sandbox. Baseline and final use this same code.

With the fast path on, greedy decoding runs on the static-cache sampler that serves GRPO's rollouts (one CUDA graph
per token on a GPU, where `model.generate` spends most of its time launching kernels). It is the same model's greedy
decoding: identical tokens to `model.generate` in float32 (the tests), while in bf16 a near-tie between two tokens
may go the other way (other kernels round differently). Anything the sampler does not cover (see
`fast_generation.unsupported_reason`) falls back to `model.generate`, with one warning
saying why.
"""

from __future__ import annotations

import gc
import logging
import time
from typing import TYPE_CHECKING, Any

import torch
from nodus.core.environment import Environment, Task
from nodus.core.errors import NodusError, first_line
from nodus.core.grading import Grader
from nodus.sandbox.outcome import summary_line
from pydantic import BaseModel

if TYPE_CHECKING:
    from nodus.trainer.fast_generation import FastWeights, StaticCacheSampler

log = logging.getLogger(__name__)

_said: set[str] = set()  # fallback reasons already logged by this process


class TaskScore(BaseModel):
    id: str
    status: str
    score: float | None
    passed: bool | None
    details: str
    completion: str


class Evaluation(BaseModel):
    # Over the tasks that were graded; None when none was (every one an infrastructure failure): never a 0.
    mean_score: float | None
    pass_rate: float | None
    scored: int
    infrastructure_failures: int
    seconds: float
    tasks: list[TaskScore]

    def scores_by_id(self) -> dict[str, float | None]:
        return {t.id: t.score for t in self.tasks}


class NothingGraded(NodusError):
    """An evaluation in which no task could be graded: the grader or the sandbox is broken, not the model."""


def check_something_graded(evaluation: Evaluation, what: str, env_id: str) -> None:
    """Stop when every task of an evaluation was an infrastructure failure: there is nothing to compare, and
    training would get no reward either."""
    if evaluation.scored or not evaluation.tasks:
        return
    first = evaluation.tasks[0]
    raise NothingGraded(
        f"the {what} graded none of the {len(evaluation.tasks)} held-out tasks: every one was an infrastructure "
        f"failure (first: {summary_line(first.details)}); fix the grader or the sandbox (grpo check --env "
        f"{env_id} shows what fails), then repeat the command"
    )


def score_text(value: float | None) -> str:
    """A mean score or pass rate for a line of output: n/a when no task was graded."""
    return "n/a" if value is None else f"{value:.3f}"


def render_prompts(
    tokenizer: Any, messages: list[list[dict[str, str]]], chat_template_kwargs: dict[str, Any] | None = None
) -> list[str]:
    """Chat prompts as text, ready for the assistant's answer, rendered as TRL renders GRPO's prompts."""
    kwargs = chat_template_kwargs or {}
    return [tokenizer.apply_chat_template(m, tokenize=False, add_generation_prompt=True, **kwargs) for m in messages]


@torch.no_grad()
def generate_greedy(
    model: Any,
    tokenizer: Any,
    messages: list[list[dict[str, str]]],
    max_new_tokens: int,
    batch_size: int,
    fast: bool = False,
    weights: FastWeights | None = None,
    chat_template_kwargs: dict[str, Any] | None = None,
) -> list[str]:
    """Greedy completions for chat prompts, in batches, with left padding so every row ends at its prompt.

    `fast` decodes with the static-cache sampler when it supports the model; `weights` lends it the fused weights
    a fast trainer already holds (refreshed here), so that evaluating the trained model costs no second copy.
    `chat_template_kwargs` (e.g. Qwen3's enable_thinking) render the prompts as TRL renders GRPO's.
    """
    texts = render_prompts(tokenizer, messages, chat_template_kwargs)
    return greedy_completions(model, tokenizer, texts, max_new_tokens, batch_size, fast, weights)


@torch.no_grad()
def greedy_completions(
    model: Any,
    tokenizer: Any,
    texts: list[str],
    max_new_tokens: int,
    batch_size: int,
    fast: bool = False,
    weights: FastWeights | None = None,
) -> list[str]:
    """`generate_greedy` for prompts already rendered as text."""
    if fast:
        decoded = _sampler_greedy(model, tokenizer, texts, max_new_tokens, batch_size, weights)
        if decoded is not None:
            return decoded
    tokenizer.padding_side = "left"
    model.eval()
    completions: list[str] = []
    for start in range(0, len(texts), batch_size):
        batch = tokenizer(
            texts[start : start + batch_size], return_tensors="pt", padding=True, add_special_tokens=False
        )
        batch = batch.to(model.device)
        output = model.generate(
            **batch,
            max_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=completion_end_ids(model, tokenizer),
        )
        new_tokens = output[:, batch["input_ids"].shape[1] :]
        completions.extend(tokenizer.batch_decode(new_tokens, skip_special_tokens=True))
    return completions


def completion_end_ids(model: Any, tokenizer: Any) -> list[int]:
    """The token ids a completion ends at, as TRL's GRPOTrainer stops rollouts: every EOS id of the model's
    generation config (a list for chat models such as Qwen3) and the tokenizer's own EOS."""
    eos = model.generation_config.eos_token_id
    ids = list(eos) if isinstance(eos, list) else [] if eos is None else [eos]
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in ids:
        ids.insert(0, tokenizer.eos_token_id)
    return ids


def greedy_sampler(
    model: Any, tokenizer: Any, max_new_tokens: int, weights: FastWeights | None = None
) -> StaticCacheSampler | None:
    """The fast sampler set up as `model.generate(do_sample=False)` would decode, or None when it cannot be."""
    from nodus.trainer.fast_generation import SamplingSettings, StaticCacheSampler, unsupported_reason

    config = model.generation_config
    reason = unsupported_reason(model, config, sampling=False)
    if reason is not None:
        if reason not in _said:  # once per reason: baseline and final evaluation would repeat it
            _said.add(reason)
            log.warning("Held-out evaluation decodes with model.generate (slower): %s.", reason)
        return None
    settings = SamplingSettings(
        max_new_tokens=max_new_tokens,
        eos_token_ids=tuple(completion_end_ids(model, tokenizer)),
        do_sample=False,
        temperature=0,
        min_new_tokens=int(config.min_new_tokens or 0),
    )
    if weights is not None:
        weights.refresh()  # the fused copy is refreshed before each rollout: after the last step it is stale
    # Compiled on a GPU, as the trainer's rollouts are; on the CPU compiling costs more than it saves.
    on_gpu = next(model.parameters()).device.type == "cuda"
    return StaticCacheSampler(
        model,
        settings,
        pad_token_id=tokenizer.pad_token_id,
        compile_layers=on_gpu,
        weights=weights,
        prefill_graphs=on_gpu,
    )


def _sampler_greedy(
    model: Any, tokenizer: Any, texts: list[str], max_new_tokens: int, batch_size: int, weights: FastWeights | None
) -> list[str] | None:
    """Completions decoded on the sampler; None (the caller then uses model.generate) when it cannot serve."""
    if not texts:
        return []
    try:
        sampler = greedy_sampler(model, tokenizer, max_new_tokens, weights)
        if sampler is None:
            return None
        prompts = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
        size = min(batch_size, len(prompts))
        completions: list[str] = []
        for start in range(0, len(prompts), size):
            batch = prompts[start : start + size]
            # The last batch is filled up with copies of its last prompt: one batch size means one decode graph (and
            # one compilation) for the whole evaluation. The copies' completions are dropped.
            rollout = sampler.generate(batch + [batch[-1]] * (size - len(batch)))
            ids = rollout.completion_ids()[: len(batch)]
            completions.extend(tokenizer.batch_decode(ids, skip_special_tokens=True))
        return completions
    except Exception as error:  # model.generate is the reference: an evaluation is never lost to us
        if isinstance(error, torch.OutOfMemoryError):
            why = "ran out of GPU memory (it adds a KV cache and CUDA graphs beside the model)"
        else:
            cause = f"{type(error).__name__}: {first_line(error)}"
            why = f"failed ({cause}); please report this with the model's config.json"
        log.warning("The fast sampler %s; held-out evaluation decodes with model.generate instead (slower).", why)
        return None
    finally:
        # The sampler and its decode state refer to each other: collect the cycle now, so that its KV cache, CUDA
        # graph and any fused copy of the weights are handed back before training or the fallback allocates.
        sampler = None
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def evaluate(
    model: Any,
    tokenizer: Any,
    env: Environment,
    tasks: list[Task],
    grader: Grader,
    max_new_tokens: int,
    batch_size: int,
    fast: bool = False,
    weights: FastWeights | None = None,
    chat_template_kwargs: dict[str, Any] | None = None,
) -> Evaluation:
    started = time.monotonic()
    messages = [env.prompt(t) for t in tasks]
    completions = generate_greedy(
        model, tokenizer, messages, max_new_tokens, batch_size, fast, weights, chat_template_kwargs
    )
    outcomes = grader.grade(list(zip(tasks, completions, strict=True)))
    rows = [
        TaskScore(id=t.id, status=o.status, score=o.score, passed=o.passed, details=o.details, completion=c)
        for t, o, c in zip(tasks, outcomes, completions, strict=True)
    ]
    # Infrastructure failures are excluded from the means: they say nothing about the model.
    scored = [r for r in rows if r.score is not None]
    return Evaluation(
        mean_score=sum(r.score or 0.0 for r in scored) / len(scored) if scored else None,
        pass_rate=sum(bool(r.passed) for r in scored) / len(scored) if scored else None,
        scored=len(scored),
        infrastructure_failures=len(rows) - len(scored),
        seconds=time.monotonic() - started,
        tasks=rows,
    )
