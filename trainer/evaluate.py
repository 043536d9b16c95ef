"""Held-out evaluation: greedy, batched generation, graded in the sandbox. Baseline and final use this same code."""

from __future__ import annotations

import time
from typing import Any

import torch
from nodus.core.environment import Environment, Task
from nodus.core.grading import Grader
from pydantic import BaseModel


class TaskScore(BaseModel):
    id: str
    status: str
    score: float | None
    passed: bool | None
    details: str
    completion: str


class Evaluation(BaseModel):
    mean_score: float
    pass_rate: float
    scored: int
    infrastructure_failures: int
    seconds: float
    tasks: list[TaskScore]

    def scores_by_id(self) -> dict[str, float | None]:
        return {t.id: t.score for t in self.tasks}


@torch.no_grad()
def generate_greedy(
    model: Any, tokenizer: Any, messages: list[list[dict[str, str]]], max_new_tokens: int, batch_size: int
) -> list[str]:
    """Greedy completions for chat prompts, in batches, with left padding so every row ends at its prompt."""
    tokenizer.padding_side = "left"
    model.eval()
    texts = [tokenizer.apply_chat_template(m, tokenize=False, add_generation_prompt=True) for m in messages]
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
        )
        new_tokens = output[:, batch["input_ids"].shape[1] :]
        completions.extend(tokenizer.batch_decode(new_tokens, skip_special_tokens=True))
    return completions


def evaluate(
    model: Any,
    tokenizer: Any,
    env: Environment,
    tasks: list[Task],
    grader: Grader,
    max_new_tokens: int,
    batch_size: int,
) -> Evaluation:
    started = time.monotonic()
    completions = generate_greedy(model, tokenizer, [env.prompt(t) for t in tasks], max_new_tokens, batch_size)
    outcomes = grader.grade(list(zip(tasks, completions, strict=True)))
    rows = [
        TaskScore(id=t.id, status=o.status, score=o.score, passed=o.passed, details=o.details, completion=c)
        for t, o, c in zip(tasks, outcomes, completions, strict=True)
    ]
    # Infrastructure failures are excluded from the means: they say nothing about the model.
    scored = [r for r in rows if r.score is not None]
    return Evaluation(
        mean_score=sum(r.score or 0.0 for r in scored) / len(scored) if scored else 0.0,
        pass_rate=sum(bool(r.passed) for r in scored) / len(scored) if scored else 0.0,
        scored=len(scored),
        infrastructure_failures=len(rows) - len(scored),
        seconds=time.monotonic() - started,
        tasks=rows,
    )
