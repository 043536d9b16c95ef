"""results.json and the reward plot: what a run reports."""

from __future__ import annotations

import math
import random
from importlib import metadata
from pathlib import Path
from typing import Any

from nodus.trainer.evaluate import Evaluation
from nodus.trainer.rewards import ZERO_VARIANCE_METRIC


def paired_comparison(baseline: Evaluation, final: Evaluation, resamples: int = 10_000) -> dict[str, Any]:
    """Final minus baseline on the same held-out tasks, with a paired significance measure.

    Pairs are tasks scored in both evaluations. ``signTestP`` is the exact two-sided sign test on the tasks
    whose score changed (no distribution assumed; right for 0/1 scores); ``ci95`` is a seeded paired bootstrap
    interval of the mean difference.
    """
    before, after = baseline.scores_by_id(), final.scores_by_id()
    diffs = [b - a for i, a in before.items() if a is not None and (b := after.get(i)) is not None]
    if not diffs:
        return {"pairs": 0, "meanDifference": None, "signTestP": None, "ci95": None, "improved": 0, "worsened": 0}
    improved = sum(d > 0 for d in diffs)
    worsened = sum(d < 0 for d in diffs)
    rng = random.Random(0)
    means = sorted(sum(rng.choices(diffs, k=len(diffs))) / len(diffs) for _ in range(resamples))
    return {
        "pairs": len(diffs),
        "meanDifference": sum(diffs) / len(diffs),
        "improved": improved,
        "worsened": worsened,
        "signTestP": sign_test_p(improved, worsened),
        "ci95": [means[int(0.025 * resamples)], means[int(0.975 * resamples) - 1]],
    }


def sign_test_p(improved: int, worsened: int) -> float:
    n = improved + worsened
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, k) for k in range(min(improved, worsened) + 1)) / 2**n
    return float(min(1.0, 2 * tail))


def versions(env_distribution: str) -> dict[str, str | None]:
    def version(name: str) -> str | None:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return None

    found: dict[str, str | None] = {name: version(name) for name in ("nodus", "torch", "transformers", "trl", "peft")}
    dist_name, _, dist_version = env_distribution.partition(" ")
    if dist_name != "in-process":
        found[dist_name] = dist_version or version(dist_name)
    return found


def reward_signal(reward_state: dict[str, Any], metrics: list[dict[str, Any]]) -> dict[str, Any]:
    """Did training see a learning signal? Identical rewards everywhere means GRPO learned nothing."""
    counts: dict[str, int] = reward_state.get("rewardCounts", {})
    fractions = [row[ZERO_VARIANCE_METRIC] for row in metrics if row.get(ZERO_VARIANCE_METRIC) is not None]
    zero_variance = sum(fractions) / len(fractions) if fractions else None
    if len(counts) == 1:
        (value,) = counts
        status = (
            f"warning: every training reward was {value}, so every group had zero variance and GRPO learned "
            "nothing; warm up with SFT on reference answers, or use easier tasks (or partial credit)"
        )
    elif not counts:
        status = "warning: no training reward was graded"
    elif zero_variance is not None and zero_variance >= 1.0:
        # Rewards differed between prompts but never within a group: every advantage was 0.
        status = (
            "warning: within every group the rewards were equal (zero variance), so GRPO learned nothing; the "
            "reward must tell a prompt's completions apart (partial credit, or tasks the model sometimes solves)"
        )
    else:
        status = "ok"
    return {
        "rewardSignal": status,
        "zeroVarianceGroupFraction": zero_variance,
        "distinctRewards": len(counts),
        "infrastructureFailures": reward_state.get("infrastructureFailures", 0),
        "graded": reward_state.get("graded", 0),
    }


def plot_rewards(path: Path, metrics: list[dict[str, Any]], baseline: Evaluation, final: Evaluation | None) -> None:
    import matplotlib

    matplotlib.use("Agg")  # no display on training machines
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4))
    steps = [row["step"] for row in metrics if "reward" in row]
    axes.plot(steps, [row["reward"] for row in metrics if "reward" in row], marker=".", label="training reward (mean)")
    if baseline.mean_score is not None:  # None: no held-out task was graded, so there is no line to draw
        label = f"held-out baseline {baseline.mean_score:.3f}"
        axes.axhline(baseline.mean_score, color="gray", linestyle="--", label=label)
    if final is not None and final.mean_score is not None:
        axes.axhline(final.mean_score, color="green", linestyle="-", label=f"held-out final {final.mean_score:.3f}")
    axes.set_xlabel("training step")
    axes.set_ylabel("score")
    axes.set_ylim(-0.02, 1.02)
    axes.legend(loc="best")
    axes.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
