"""The TRL/transformers callback that connects a training run to its run directory, progress line and cost cap."""

from __future__ import annotations

import time
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

from nodus.trainer.ranks import Ranks
from nodus.trainer.rewards import ZERO_VARIANCE_METRIC, SandboxReward
from nodus.trainer.rundir import RunDir
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

# Seconds kept in hand when deciding whether one more step fits under maxCostUSD (see RunCallback._check_cap).
WRAP_UP_MARGIN_SECONDS = 3.0
GUESSED_SAVE_SECONDS = 2.0  # until the first save is measured

# Metrics TRL logs each step that we keep (TRL's names, and nodus' own zero-variance count; TRL's
# frac_reward_zero_std is kept to compare).
KEPT_METRICS = (
    "reward", "reward_std", ZERO_VARIANCE_METRIC, "frac_reward_zero_std", "loss", "num_tokens", "kl", "learning_rate"
)


class CostMeter:
    """Spend so far (wall time of the run, across resumes, x hourly rate) and the projection ahead.

    The whole run counts, not only optimizer steps: a rented GPU is billed while the model loads and evaluates.
    """

    def __init__(self, usd_per_hour: Decimal | None, cap: Decimal | None, previous_seconds: float = 0.0) -> None:
        self.usd_per_hour = usd_per_hour
        self.cap = cap
        self.previous_seconds = previous_seconds
        self._started = time.monotonic()

    @property
    def spent_seconds(self) -> float:
        return self.previous_seconds + time.monotonic() - self._started

    def usd(self, seconds: float | None = None) -> Decimal | None:
        if self.usd_per_hour is None:
            return None
        total = self.spent_seconds if seconds is None else seconds
        return (self.usd_per_hour * Decimal(str(total)) / 3600).quantize(Decimal("0.0001"))

    def would_exceed(self, extra_seconds: float) -> bool:
        """True when spending ``extra_seconds`` more would pass the cap."""
        projected = self.usd(self.spent_seconds + extra_seconds)
        return self.cap is not None and projected is not None and projected > self.cap


class RunCallback(TrainerCallback):  # type: ignore[misc]  # transformers is untyped here
    def __init__(
        self,
        run: RunDir,
        reward: SandboxReward,
        cost: CostMeter,
        say: Callable[[str], None],
        reference_step_seconds: float | None = None,
        progress: Callable[[int, int, str], None] | None = None,
        ranks: Ranks | None = None,
        reward_state: Callable[[], dict[str, Any]] | None = None,
        steps_per_round: int = 1,
    ) -> None:
        self.run = run
        self.reward = reward
        self.cost = cost
        self.say = say
        # Under FSDP every process runs this callback: rank 0 writes and decides, the others follow it.
        self.ranks = ranks or Ranks()
        self.reward_state = reward_state or reward.state
        # A checkpoint counts only at the end of a round of completions (see Parameters.checkpoint_steps).
        self.steps_per_round = steps_per_round
        # (steps done, steps in all, the plain progress line): a live bar on a terminal; a plain line by default.
        self.progress = progress or (lambda done, total, line: say(line))
        self.stopped_by_cost_cap = False
        self._step_started = time.monotonic()
        self._step_seconds: list[float] = []
        # Before the first step is measured, the cap is checked against a reference step time (the price table's).
        self._reference_step_seconds = reference_step_seconds
        # Stopping still costs a checkpoint and the adapter: the slowest save measured so far (None before one).
        self._slowest_save: float | None = None
        self._step_ended = time.monotonic()
        self._last_round: dict[str, Any] = {}  # the reward metrics of the last step that sampled completions

    @property
    def step_seconds(self) -> float | None:
        recent = self._step_seconds[-5:]
        return sorted(recent)[len(recent) // 2] if recent else self._reference_step_seconds

    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **_: Any) -> None:
        self._check_cap(control, state)
        self._step_started = time.monotonic()

    def on_step_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **_: Any) -> None:
        self._step_started = time.monotonic()

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **_: Any) -> None:
        self._step_ended = time.monotonic()
        self._step_seconds.append(self._step_ended - self._step_started)
        if self.ranks.main:
            self.run.save_spend(self.cost.spent_seconds)
        self._check_cap(control, state)

    def _check_cap(self, control: TrainerControl, state: TrainerState) -> None:
        step = self.step_seconds
        # The checkpoint, then the adapter, then what ends a run (freeing the trainer, the results): a periodic save
        # alone under-predicts that, and a run once passed its cap by a second on a busy machine.
        save = self._slowest_save if self._slowest_save is not None else GUESSED_SAVE_SECONDS
        wrap_up = 2 * save + WRAP_UP_MARGIN_SECONDS
        over = step is not None and self.cost.would_exceed(step + wrap_up) and state.global_step < state.max_steps
        # One decision for all processes (each measures its own step time; a split decision would hang them).
        if self.ranks.broadcast(over):
            # Stop before the spend passes the cap, and keep what was learned: save a checkpoint now.
            self.stopped_by_cost_cap = True
            control.should_training_stop = True
            at_round_end = state.global_step % self.steps_per_round == 0
            control.should_save = state.global_step > 0 and at_round_end
            self.say(
                f"stopping: one more step ({step or 0:.1f} s) and the wrap-up after it (saves, {wrap_up:.1f} s) would "
                f"pass maxCostUSD {self.cost.cap} (spent ${self.cost.usd()})"
                + ("" if at_round_end else "; no checkpoint inside a round of completions: a continued run resumes "
                   "from the last one")
            )

    def on_log(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        logs: dict[str, Any] | None = None,
        **_: Any,
    ) -> None:
        if not logs or "loss" not in logs:
            return  # the end-of-training summary log (train_loss, train_runtime), not a step
        # TRL samples a new round of completions only every steps_per_generation x num_iterations steps (a
        # generationBatchSize above batchSize, or --trl num_iterations): only those steps log a reward. The others
        # are still steps (a loss, an optimizer update) and get their row; the progress line keeps the last reward.
        # Each process grades its own share of the completions: the count is over all of them (a collective, so
        # every process takes part before the others return; TRL logs a step's metrics on every process).
        failures = sum(self.ranks.gather(self.reward.infrastructure_failures))
        if not self.ranks.main:
            return  # only rank 0 writes
        row: dict[str, Any] = {"step": state.global_step, **{k: logs[k] for k in KEPT_METRICS if k in logs}}
        row["step_seconds"] = round(self._step_seconds[-1], 3) if self._step_seconds else None
        row["infrastructure_failures"] = failures
        if "reward" in row:
            self._last_round = {k: row.get(k) for k in ("reward", ZERO_VARIANCE_METRIC)}
        spent = self.cost.usd()
        row["spent_usd"] = None if spent is None else str(spent)
        self.run.append_metrics(row)
        self.progress(state.global_step, state.max_steps, self._progress_line(state, row))

    def _progress_line(self, state: TrainerState, row: dict[str, Any]) -> str:
        step = self.step_seconds or 0.0
        remaining = max(state.max_steps - state.global_step, 0) * step
        parts = [
            f"step {state.global_step}/{state.max_steps}",
            f"reward {format_number(self._last_round.get('reward'), '.3f')}",
            f"zero-variance groups {format_number(self._last_round.get(ZERO_VARIANCE_METRIC), '.2f')}",
            f"{step:.1f} s/step",
            f"ETA {format_duration(remaining)}",
        ]
        if row["infrastructure_failures"]:
            parts.append(f"infrastructure failures so far {row['infrastructure_failures']}")
        if self.cost.usd_per_hour is not None:
            projected = self.cost.usd(self.cost.spent_seconds + remaining)
            parts.append(f"spent ${self.cost.usd()} (projected ${projected})")
        return "  ".join(parts)

    def on_save(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **_: Any) -> None:
        # Called after TRL wrote every file of the checkpoint: only now does it count as complete.
        seconds = time.monotonic() - self._step_ended
        self._slowest_save = max(seconds, self._slowest_save or 0.0)
        rewards = self.reward_state()  # every process's tally (a collective under FSDP: all take part)
        checkpoint = Path(str(args.output_dir)) / f"checkpoint-{state.global_step}"
        if self.ranks.main and checkpoint.is_dir():
            self.run.mark_complete(checkpoint, {"step": state.global_step, "rewards": rewards})


def format_duration(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def format_number(value: Any, spec: str) -> str:
    """A metric for the progress line; TRL logs None when every reward of a step was an infrastructure failure."""
    return "n/a" if value is None else format(value, spec)
