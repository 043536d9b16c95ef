"""SFT warm-up: a few supervised steps on the environment's reference answers before GRPO.

Why: GRPO learns only from differences between the completions of one prompt. A model that never produces a
gradable answer (every reward 0, as the embedded SmolLM2-135M on graph colouring) gives every group the same
reward and GRPO learns nothing. A short warm-up on (prompt, reference answer) pairs of the *train* tasks teaches
the answer format first; GRPO then improves on it. Held-out tasks are never trained on.

TRL's SFTTrainer does the work (prompt-completion data, loss on the completion only, the chat template), with the
same LoRA configuration GRPO then keeps training, so the adapter GRPO starts from is the warm-up's.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from nodus.core.environment import Environment, Task
from nodus.core.errors import NodusError

# Common starting points when the spec gives none: LoRA SFT recipes use ~2e-4, full fine-tuning ~2e-5.
DEFAULT_LEARNING_RATE = {"LoRA": 2e-4, "QLoRA": 2e-4, "Full": 2e-5}


class NoReferenceAnswers(NodusError):
    """The environment cannot give reference answers, so there is nothing to warm up on."""


@dataclass(frozen=True)
class WarmupSummary:
    steps: int
    learning_rate: float
    losses: list[float]
    seconds: float

    def to_json(self) -> dict[str, Any]:
        return {
            "steps": self.steps,
            "learningRate": self.learning_rate,
            "lossFirst": self.losses[0] if self.losses else None,
            "lossLast": self.losses[-1] if self.losses else None,
            "lossPerStep": self.losses,
            "seconds": round(self.seconds, 1),
        }


def reference_answer(env: Environment, task: Task) -> str:
    try:
        return env.reference(task)
    except NodusError as error:
        raise NoReferenceAnswers(
            f"sftWarmupSteps needs reference answers, and {env.id_text()} has none ({error}); "
            "set sftWarmupSteps to 0 (--sft-warmup-steps 0)"
        ) from None


def warmup_dataset(env: Environment, tasks: list[Task], chat_template_kwargs: dict[str, Any] | None = None) -> Any:
    """Prompt-completion pairs in TRL's conversational form: the GRPO prompt, then the reference as the answer.

    `chat_template_kwargs` (TRL's SFTTrainer reads them per row) render the prompts as GRPO's are rendered."""
    from datasets import Dataset

    rows: list[dict[str, Any]] = [
        {"prompt": env.prompt(task), "completion": [{"role": "assistant", "content": reference_answer(env, task)}]}
        for task in tasks
    ]
    if chat_template_kwargs:  # an empty mapping would be an Arrow struct without fields, which datasets refuses
        rows = [{**row, "chat_template_kwargs": chat_template_kwargs} for row in rows]
    return Dataset.from_list(rows)


def sft_warmup(
    model: Any,
    tokenizer: Any,
    env: Environment,
    tasks: list[Task],
    *,
    steps: int,
    learning_rate: float,
    batch_size: int,
    seed: int,
    output_dir: str,
    peft_config: Any,
    on_gpu: bool,
    bf16: bool,
    say: Any,
    progress: Any = None,
    chat_template_kwargs: dict[str, Any] | None = None,
) -> tuple[Any, WarmupSummary]:
    """Train `steps` SFT steps; returns the trained model (a peft model when `peft_config` is given) and a summary.

    `progress(done, total, line)` is called after each step (the run's console: a live bar or plain lines)."""
    from transformers import PrinterCallback, TrainerCallback
    from trl import SFTConfig, SFTTrainer

    class Progress(TrainerCallback):  # type: ignore[misc]
        def __init__(self) -> None:
            self.started = time.monotonic()

        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **_: Any) -> None:
            if progress is None or not logs or "loss" not in logs:
                return
            per_step = (time.monotonic() - self.started) / max(state.global_step, 1)
            remaining = per_step * (state.max_steps - state.global_step)
            progress(
                state.global_step,
                state.max_steps,
                f"SFT step {state.global_step}/{state.max_steps}  loss {float(logs['loss']):.3f}  "
                f"{per_step:.1f} s/step  ETA {remaining:.0f}s",
            )

    dataset = warmup_dataset(env, tasks, chat_template_kwargs)
    config = SFTConfig(
        output_dir=output_dir,
        max_steps=steps,
        learning_rate=learning_rate,
        per_device_train_batch_size=batch_size,
        logging_steps=1,
        save_strategy="no",  # a warm-up is short: a kill repeats it (GRPO checkpoints hold its result)
        report_to=[],
        disable_tqdm=True,
        seed=seed,
        use_cpu=not on_gpu,
        bf16=bf16,
        completion_only_loss=True,  # learn the answer, not the prompt
    )
    say(f"SFT warm-up: {steps} steps on the reference answers of {len(tasks)} train tasks, lr {learning_rate:g}")
    started = time.monotonic()
    trainer = SFTTrainer(
        model=model, args=config, train_dataset=dataset, processing_class=tokenizer, peft_config=peft_config
    )
    trainer.remove_callback(PrinterCallback)
    trainer.add_callback(Progress())
    trainer.train()
    losses = [round(float(row["loss"]), 4) for row in trainer.state.log_history if "loss" in row]
    summary = WarmupSummary(steps, learning_rate, losses, time.monotonic() - started)
    if losses:
        say(f"SFT warm-up done: loss {losses[0]:.3f} -> {losses[-1]:.3f} ({summary.seconds:.0f}s)")
    return trainer.model, summary
