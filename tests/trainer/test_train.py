"""grpo train end to end on a tiny local model, graded in the real sandbox, as users run it (the CLI)."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

GRPO = str(Path(sys.executable).with_name("grpo"))
TOY = [
    "--env",
    "test/letters@1",
    "--train-tasks",
    "64",
    "--held-out-tasks",
    "8",
    "--num-generations",
    "4",
    "--batch-size",
    "8",
    "--max-completion-length",
    "8",
]


def grpo(*args: str | Path, timeout: int = 600, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, **env} if env else None
    return subprocess.run([GRPO, *map(str, args)], capture_output=True, text=True, timeout=timeout, env=environment)


def stop_when(args: list[str], ready: Callable[[], bool], signum: int, never: str) -> str:
    """Start `grpo *args`, send `signum` once `ready()`, and return its stderr. It exits 128 + the signal's number,
    as a process the signal ended would (130 for Ctrl-C, 143 for SIGTERM)."""
    process = subprocess.Popen([GRPO, *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while not ready():
        assert process.poll() is None and time.monotonic() < deadline, never
        time.sleep(0.05)
    process.send_signal(signum)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 128 + signum, stderr
    return stderr


def test_held_out_reward_rises_and_the_run_reports_it(tiny_model: Path, tmp_path: Path) -> None:
    # Full fine-tuning of a 2-layer random model at a high rate: the smallest setting that learns in seconds.
    out = tmp_path / "run"
    result = grpo(
        "train",
        "--model",
        tiny_model,
        *TOY,
        "--method",
        "Full",
        "--learning-rate",
        "1e-2",
        "--max-steps",
        "60",
        "--save-steps",
        "30",
        "--output",
        out,
    )
    assert result.returncode == 0, result.stderr
    results = json.loads((out / "results.json").read_text())
    assert results["status"] == "completed"
    assert results["baseline"]["meanScore"] < 0.2
    assert results["final"]["meanScore"] > results["baseline"]["meanScore"] + 0.5
    assert results["difference"]["improved"] >= 6 and results["difference"]["signTestP"] < 0.05
    assert results["diagnostics"]["rewardSignal"] == "ok"
    assert results["heldOutTaskIds"] == [f"heldout-42-{i}" for i in range(8)]
    assert set(results["baseline"]["perTask"]) == set(results["heldOutTaskIds"])
    assert results["versions"]["nodus-env-toy"] == "0.1.0" and results["versions"]["trl"]
    assert results["job"]["spec"]["parameters"]["method"] == "Full"
    # What the spec left open is recorded as it ran (the spec itself keeps lora.alpha and sftLearningRate null).
    assert results["effectiveSettings"] == {
        "loraAlpha": None, "sftLearningRate": None, "checkpointSteps": 30, "completionsPerRound": 8
    }
    assert [row["step"] for row in results["training"]["rewardPerStep"]] == list(range(1, 61))
    assert (out / "reward.png").stat().st_size > 10_000
    assert (out / "adapter" / "config.json").exists()
    assert "held-out mean score 0.000 -> " in result.stderr


def test_kill_9_then_rerun_resumes_and_reuses_the_baseline(tiny_model: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    args = [
        "train",
        "--model",
        str(tiny_model),
        *TOY,
        "--learning-rate",
        "1e-3",
        "--max-steps",
        "40",
        "--save-steps",
        "5",
        "--output",
        str(out),
    ]
    process = subprocess.Popen([GRPO, *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while not list((out / "checkpoints").glob("checkpoint-*/COMPLETE.json")):
        assert process.poll() is None and time.monotonic() < deadline, "no checkpoint was written"
        time.sleep(0.05)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    assert not (out / "results.json").exists()

    result = grpo(*args)
    assert result.returncode == 0, result.stderr
    assert "reusing the saved baseline evaluation" in result.stderr
    assert "resuming from checkpoint-" in result.stderr
    results = json.loads((out / "results.json").read_text())
    assert results["status"] == "completed"
    assert [row["step"] for row in results["training"]["rewardPerStep"]] == list(range(1, 41))

    again = grpo(*args)  # a finished run is not trained again
    assert again.returncode == 0 and "this run is already finished" in again.stderr

    changed = grpo(*args[:-2], "--beta", "0.1", "--output", str(out))
    assert changed.returncode == 2
    assert changed.stderr.strip() == (
        f"grpo: error: {out} holds a run of a different spec (spec.parameters.beta: 0.0 -> 0.1); to start fresh, "
        f"pass a new --output directory or remove {out}; to continue that run, repeat its spec"
    )


def test_a_run_that_fails_or_is_interrupted_says_so_in_results_json(tiny_model: Path, tmp_path: Path) -> None:
    # Pushing to the Hugging Face Hub in offline mode: TRL creates the repository when it builds the trainer, after the
    # baseline, and huggingface_hub refuses (offline, so it can never push from a machine that has the Hub and a
    # token). The run is recorded as failed, with the error. (A missing optimizer package, used here before, is now
    # refused before any work.)
    failing = tmp_path / "failing"
    args = ["train", "--model", tiny_model, *TOY, "--max-steps", "2", "--trl", "push_to_hub=true", "--output", failing]
    result = grpo(*args, env={"HF_HUB_OFFLINE": "1"})
    assert result.returncode != 0
    assert f"run failed; recorded in {failing / 'results.json'}" in result.stderr
    assert "to continue from the start of training (no checkpoint yet)" in result.stderr
    record = json.loads((failing / "results.json").read_text())
    assert record["status"] == "failed"
    assert record["error"].startswith("OfflineModeIsEnabled: "), record["error"]
    assert record["baseline"]["meanScore"] == 0.0 and record["training"]["lastCheckpoint"] is None

    # Ctrl-C after the first checkpoint: status interrupted, and the same command continues from the checkpoint.
    out = tmp_path / "run"
    args = ["train", "--model", str(tiny_model), *TOY, "--max-steps", "12", "--save-steps", "4", "--output", str(out)]
    checkpoints = out / "checkpoints"
    stderr = stop_when(
        args, lambda: any(checkpoints.glob("checkpoint-*/COMPLETE.json")), signal.SIGINT, "no checkpoint was written"
    )
    record = json.loads((out / "results.json").read_text())
    assert record["status"] == "interrupted" and record["error"] is None
    checkpoint = record["training"]["lastCheckpoint"]
    assert checkpoint is not None and f"run interrupted; recorded in {out / 'results.json'}" in stderr
    resumed = grpo(*args)
    assert resumed.returncode == 0, resumed.stderr
    assert f"resuming from {checkpoint}" in resumed.stderr
    assert json.loads((out / "results.json").read_text())["status"] == "completed"


def test_a_round_of_completions_trained_over_two_steps_is_logged_and_checkpointed_whole(
    tiny_model: Path, tmp_path: Path
) -> None:
    # generationBatchSize 16 in batches of 8: TRL samples a round on steps 1 and 3 and trains on it for two steps.
    out = tmp_path / "run"
    args = [
        "train", "--model", tiny_model, *TOY, "--generation-batch-size", "16", "--max-steps", "4",
        "--save-steps", "1", "--output", out,
    ]  # fmt: skip
    result = grpo(*args)
    assert result.returncode == 0, result.stderr
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    # Every step has its row (the steps that sample nothing used to be dropped, and with them their loss).
    assert [row["step"] for row in rows] == [1, 2, 3, 4] and all("loss" in row for row in rows)
    assert ["reward" in row for row in rows] == [True, False, True, False]
    assert all(("zero_variance_groups" in row) == ("reward" in row) for row in rows)
    results = json.loads((out / "results.json").read_text())
    assert results["training"]["steps"] == 4
    assert [row["step"] for row in results["training"]["rewardPerStep"]] == [1, 3]
    assert "step 2/4  reward " in result.stderr and "reward n/a" not in result.stderr
    # saveSteps 1 is rounded up to whole rounds: a checkpoint inside a round would resume on another round.
    assert sorted(p.name for p in (out / "checkpoints").glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-4"]

    # Resumed from checkpoint-2, the run samples its next round on step 3, as the uninterrupted run did.
    shutil.rmtree(out / "checkpoints" / "checkpoint-4")
    (out / "results.json").unlink()
    again = grpo(*args)
    assert again.returncode == 0, again.stderr
    assert "resuming from checkpoint-2" in again.stderr
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [(row["step"], "reward" in row) for row in rows] == [(1, True), (2, False), (3, True), (4, False)]


def test_sigterm_is_recorded_as_an_interruption_and_a_restart_logs_each_step_once(
    tiny_model: Path, tmp_path: Path
) -> None:
    # timeout, docker stop and schedulers send SIGTERM: it left no record at all. Stopped after a logged step but
    # before the first checkpoint, the restart used to append its steps after the old rows (steps 1, 1, 2, ...).
    out = tmp_path / "run"
    args = ["train", "--model", str(tiny_model), *TOY, "--max-steps", "4", "--save-steps", "4", "--output", str(out)]
    metrics = out / "metrics.jsonl"
    stop_when(args, lambda: metrics.exists() and bool(metrics.read_text().strip()), signal.SIGTERM, "no step logged")
    record = json.loads((out / "results.json").read_text())
    assert record["status"] == "interrupted" and record["training"]["lastCheckpoint"] is None
    assert record["resume"].endswith("it continues from the start of training (no checkpoint yet)")
    assert record["cost"]["runSecondsAllAttempts"] > 0 and (out / "spend.json").exists()
    resumed = grpo(*args)
    assert resumed.returncode == 0, resumed.stderr
    results = json.loads((out / "results.json").read_text())
    assert [row["step"] for row in results["training"]["rewardPerStep"]] == [1, 2, 3, 4]


def test_cost_cap_stops_training_and_records_the_status(tiny_model: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    # $360/h is 10 cents a second: a $2.00 cap (20 s of the whole run) allows well under the 400 steps asked for.
    args = [
        "train",
        "--model",
        tiny_model,
        *TOY,
        "--max-steps",
        "400",
        "--save-steps",
        "200",
        "--gpu-rate",
        "360",
        "--max-cost-usd",
        "2.00",
        "--output",
        out,
    ]
    result = grpo(*args)
    assert result.returncode == 0, result.stderr
    results = json.loads((out / "results.json").read_text())
    assert results["status"] == "stopped_by_cost_cap"
    assert 0 < results["training"]["steps"] < 400
    assert float(results["cost"]["actualUSD"]) <= 2.00
    # The stop counts the wrap-up too: a projection that stays under the cap must not read as a contradiction.
    assert re.search(r"stopping: one more step \(\d+\.\d s\) and the wrap-up after it \(saves, \d+\.\d s\) would "
                     r"pass maxCostUSD 2\.00 \(spent \$", result.stderr), result.stderr
    assert list((out / "checkpoints").glob("checkpoint-*/COMPLETE.json")), "the work done is kept"

    same = grpo(*args)  # the same cap: nothing to do, and the message says how to go on
    assert same.returncode == 0
    assert "it stopped at its cost cap (maxCostUSD 2.00, spent $" in same.stderr
    assert "to continue it, repeat the command with a --max-cost-usd above what it has spent" in same.stderr
    lower = grpo(*args[:-4], "--max-cost-usd", "1.00", "--output", out)
    assert lower.returncode == 0 and "it stopped at its cost cap" in lower.stderr
    assert json.loads((out / "job.json").read_text())["spec"]["maxCostUSD"] == "2.00", "a cap that never applied"

    raised = grpo(*args[:-4], "--max-cost-usd", "4.00", "--output", out)  # a higher cap continues the run
    assert raised.returncode == 0, raised.stderr
    steps = results["training"]["steps"]
    assert f"resuming from checkpoint-{steps} (step {steps})" in raised.stderr
    assert "reusing the saved baseline evaluation" in raised.stderr
    continued = json.loads((out / "results.json").read_text())
    assert continued["training"]["steps"] > steps
    assert [row["step"] for row in continued["training"]["rewardPerStep"]] == list(
        range(1, continued["training"]["steps"] + 1)
    )
    assert continued["cost"]["maxCostUSD"] == "4.00" and float(continued["cost"]["actualUSD"]) <= 4.00


def test_sft_warmup_runs_before_grpo_and_a_resume_does_not_repeat_it(tiny_model: Path, tmp_path: Path) -> None:
    # The random model never writes 'a' (baseline 0, so GRPO's groups would teach little); SFT on the reference
    # answers ("aaaa") of the train tasks teaches it before GRPO starts.
    out = tmp_path / "run"
    args = [
        "train",
        "--model",
        tiny_model,
        *TOY,
        "--max-steps",
        "2",
        "--save-steps",
        "1",
        "--sft-warmup-steps",
        "12",
        "--sft-learning-rate",
        "1e-2",
        "--output",
        out,
    ]
    result = grpo(*args)
    assert result.returncode == 0, result.stderr
    assert "SFT warm-up: 12 steps on the reference answers of 64 train tasks, lr 0.01" in result.stderr
    results = json.loads((out / "results.json").read_text())
    warmup = results["sftWarmup"]
    assert warmup["steps"] == 12 and len(warmup["lossPerStep"]) == 12
    assert warmup["lossLast"] < warmup["lossFirst"]
    assert results["baseline"]["meanScore"] < 0.2
    assert warmup["afterSft"]["meanScore"] > results["baseline"]["meanScore"] + 0.5
    assert set(warmup["afterSft"]["perTask"]) == set(results["heldOutTaskIds"])
    assert warmup["grpoDifference"]["pairs"] == 8  # what GRPO added on top of the warm-up
    after = warmup["afterSft"]["meanScore"]
    assert f"; after the SFT warm-up {after:.3f}, so GRPO's own difference " in result.stderr
    assert results["job"]["spec"]["parameters"]["sftWarmupSteps"] == 12

    # As if killed right after GRPO's first checkpoint: the re-run resumes from it without warming up again.
    shutil.rmtree(out / "checkpoints" / "checkpoint-2")
    shutil.rmtree(out / "adapter")
    (out / "results.json").unlink()
    (out / "final.json").unlink()
    again = grpo(*args)
    assert again.returncode == 0, again.stderr
    assert "resuming from checkpoint-1" in again.stderr
    assert "the SFT warm-up is in the checkpoints (sft.json has its summary): not repeated" in again.stderr
    assert "SFT warm-up: 12 steps" not in again.stderr
    resumed = json.loads((out / "results.json").read_text())
    assert resumed["sftWarmup"]["lossPerStep"] == warmup["lossPerStep"]
    assert resumed["training"]["steps"] == 2


def test_fast_path_on_the_cpu_evaluates_exactly_as_model_generate(tiny_model: Path, tmp_path: Path) -> None:
    # --fast-path on decodes every evaluation (baseline, after SFT, final, the last with the trainer's own fused
    # weights) with the static-cache sampler. Two runs that differ only in the fast path: the warm-up is the same
    # SFT, and GRPO's rate is too small to change a greedy answer, so every completion must match generate's. Two
    # warm-up steps leave the model halfway (some tasks answered "aaaaaaaa", some not): a sharp comparison.
    def run(fast_path: str) -> tuple[subprocess.CompletedProcess[str], dict[str, list[str]]]:
        out = tmp_path / fast_path
        result = grpo("train", "--model", tiny_model, *TOY, "--max-steps", "1", "--learning-rate", "1e-9",
                      "--sft-warmup-steps", "2", "--sft-learning-rate", "1e-2", "--fast-path", fast_path,
                      "--output", out)
        assert result.returncode == 0, result.stderr
        evaluations = {
            "baseline": json.loads((out / "baseline.json").read_text()),
            "afterSft": json.loads((out / "sft.json").read_text())["afterSft"],
            "final": json.loads((out / "final.json").read_text()),
        }
        return result, {name: [t["completion"] for t in e["tasks"]] for name, e in evaluations.items()}

    fast, fast_completions = run("on")
    assert "fast path: rollouts static-cache sampler, training forward written-out" in fast.stderr
    assert "model.generate" not in fast.stderr, "every evaluation must have been decoded by the sampler"
    slow, slow_completions = run("off")
    assert "fast path:" not in slow.stderr
    assert fast_completions == slow_completions
    assert len(set(fast_completions["final"])) > 1, "the half-warmed-up model must answer tasks differently"


def test_identical_rewards_are_diagnosed(tiny_model: Path, tmp_path: Path) -> None:
    # A random 2-layer model never answers a graph-coloring task: every reward is 0, so GRPO learns nothing.
    out = tmp_path / "run"
    result = grpo(
        "train",
        "--model",
        tiny_model,
        "--env",
        "graph-coloring@1",
        "--train-tasks",
        "8",
        "--held-out-tasks",
        "4",
        "--max-steps",
        "2",
        "--max-completion-length",
        "8",
        "--output",
        out,
        "--tensorboard",
    )
    assert result.returncode == 0, result.stderr
    assert "warning: every held-out baseline score is 0" in result.stderr
    # --tensorboard: TRL's TensorBoard logger wrote the per-step scalars under the run directory.
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (events,) = out.rglob("events.out.tfevents.*")
    accumulator = EventAccumulator(str(events.parent))
    accumulator.Reload()
    assert [e.step for e in accumulator.Scalars("train/reward")] == [1, 2]
    assert {"train/frac_reward_zero_std", "train/loss"} <= set(accumulator.Tags()["scalars"])
    assert (
        "warning: the reference answers of 4 of 4 held-out tasks are longer than maxCompletionLength" in result.stderr
    )
    diagnostics = json.loads((out / "results.json").read_text())["diagnostics"]
    assert diagnostics["rewardSignal"].startswith("warning: every training reward was 0.0, so every group had zero")
    assert diagnostics["zeroVarianceGroupFraction"] == 1.0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--method", "QLoRA"],
            "grpo: error: QLoRA needs a CUDA GPU (bitsandbytes NF4); on CPU use --method LoRA",
        ),
        (
            ["--max-cost-usd", "5"],
            "grpo: error: maxCostUSD needs an hourly rate to measure spend against: pass --gpu "
            "NAME (see 'grpo estimate --help') or --gpu-rate USD_PER_HOUR",
        ),
        (
            ["--gpu", "tpu"],
            "grpo: error: unknown GPU 'tpu'; known GPUs: H100 SXM 80 GB (h100), A100 80 GB (a100), "
            "L40S 48 GB (l40s), RTX 4090 24 GB (4090), RTX A6000 48 GB (a6000)",
        ),
        (
            ["--trl", "top_pp=0.9"],
            "grpo: error: spec.parameters.trl.top_pp is not a GRPOConfig field; did you mean 'top_p'? see TRL's "
            "GRPOConfig",
        ),
        (["--trl", "top_p"], "grpo: error: --trl 'top_p' is not key=value; write e.g. --trl top_p=0.9"),
        (
            ["--sft-warmup-steps", "4", "--beta", "0.04"],
            "grpo: error: sftWarmupSteps with beta > 0 is not supported in this version: the KL reference would be "
            "the warmed-up model in one attempt and the base model after a resume; use beta 0 (the default) with a "
            "warm-up",
        ),
        (
            # TRL refuses it too, at the start of the run; the dry run now refuses it as well.
            ["--trl", "steps_per_generation=2", "--generation-batch-size", "16"],
            "grpo: error: generationBatchSize and spec.parameters.trl.steps_per_generation both size a round of "
            "completions (TRL takes one or the other); remove one of them",
        ),
        (
            ["--trl", "loss_type=grpo"],
            "grpo: error: spec.parameters.trl.loss_type is set by spec.parameters.lossType (--loss-type); set it "
            "there, not through trl",
        ),
        (
            # TRL would import vLLM only after the baseline evaluation, and fail with a traceback.
            ["--trl", "use_vllm=true"],
            "grpo: error: spec.parameters.trl.use_vllm needs vLLM, which is not installed (pip install 'nodus[vllm]'; "
            "its wheels pin torch and CUDA) and a CUDA GPU, and none is available; remove --trl use_vllm=true to "
            "generate with nodus' fast path (on a GPU) or model.generate",
        ),
        (
            # TRL does not check it: it failed with a traceback at the first sampling, after the baseline.
            ["--trl", "top_p=abc"],
            "grpo: error: spec.parameters.trl.top_p = 'abc': Input should be a valid number (GRPOConfig's top_p is "
            "float); fix the value (in YAML, quote text and leave numbers unquoted)",
        ),
        (
            # Past the embedded model's 49,152 tokens: suppress_tokens ignored it, bad_words_ids failed later.
            ["--trl", 'generation_kwargs={"bad_words_ids": [[5], [49152]]}'],
            "grpo: error: spec.parameters.trl.generation_kwargs.bad_words_ids names token id 49152, past the model's "
            "vocabulary of 49152 tokens (ids 0 to 49151); use the model's own token ids (its tokenizer's "
            "convert_tokens_to_ids)",
        ),
        (
            ["--train-tasks", "1"],
            "grpo: error: trainTasks=1 is fewer than the 2 prompts of one round of completions (8 completions / "
            "numGenerations 4), so training would take no step; use at least 2 train tasks (--train-tasks) or a "
            "smaller batchSize",
        ),
        (
            # It generated past the context for minutes and reported "ok".
            ["--max-completion-length", "9000"],
            "grpo: error: maxCompletionLength=9000 leaves no room for a prompt in the model's context of 8192 tokens "
            "(max_position_embeddings); use a --max-completion-length well below 8192",
        ),
        (
            # TRL is given no eval dataset: it failed when it built the trainer, after the baseline.
            ["--trl", 'eval_strategy="steps"'],
            "grpo: error: spec.parameters.trl.eval_strategy is set by nodus (the baseline and final evaluations on "
            "the held-out tasks); set it there, not through trl",
        ),
        (["--model", "hf://Qwen/Qwen3-0.6B"], None),
    ],
)
def test_user_errors_stop_before_any_work(tmp_path: Path, args: list[str], message: str | None) -> None:
    out = tmp_path / "run"
    result = grpo("train", "--env", "graph-coloring@1", *args, "--output", out)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    if message is not None:
        assert result.stderr.strip() == message
    else:
        assert "pin" in result.stderr  # an hf:// model must name its revision


@pytest.mark.parametrize(
    ("trl", "start", "end"),
    [
        (
            'optim="galore_adamw"',
            "grpo: error: spec.parameters.trl.optim 'galore_adamw': transformers cannot build it: You need to install "
            "`galore_torch`",
            "; install what it names, or leave optim unset for the default (adamw_torch_fused)",
        ),
        (
            'lr_scheduler_type="cosine_with_min_lr"',
            "grpo: error: spec.parameters.trl.lr_scheduler_type 'cosine_with_min_lr': transformers cannot build it "
            "with lr_scheduler_kwargs {}: ",
            "; pass what it names with --trl 'lr_scheduler_kwargs={...}', or leave lr_scheduler_type unset for the "
            "default (linear)",
        ),
    ],
)
def test_an_optimizer_or_schedule_transformers_cannot_build_stops_before_any_work(
    tmp_path: Path, trl: str, start: str, end: str
) -> None:
    # transformers builds both when training starts: these failed after the baseline evaluation, with a traceback.
    # The middle is transformers' own reason, which names the package or the missing argument.
    out = tmp_path / "run"
    result = grpo("train", "--env", "graph-coloring@1", "--trl", trl, "--output", out)
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert result.stderr.strip().startswith(start) and result.stderr.strip().endswith(end), result.stderr
    assert not out.exists()


def test_dry_run_prints_plan_memory_and_cost() -> None:
    result = grpo("train", "--env", "graph-coloring@1", "--dry-run", "--gpu", "a100", "--max-cost-usd", "0.01")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "2. 100 GRPO steps, a checkpoint every 25" in out
    assert "frozen 16-bit weights" in out and "KV cache (one group)" in out
    assert "fits A100 80 GB" in out
    assert "time and cost on A100 80 GB: 100 steps x 0.7 s = 70.0 s of training, $0.03 at $1.090/h" in out
    assert "warning: the projection passes maxCostUSD 0.01: training will stop early" in out


@pytest.mark.parametrize(
    "args",
    [
        ["--loss-type", "bogus"],
        ["--trl", "top_pp=0.9"],
        ["--sft-warmup-steps", "4", "--beta", "0.04"],
        ["--method", "QLoRA", "--distributed-strategy", "FSDP", "--distributed-processes", "2"],
        ["--distributed-strategy", "FSDP", "--distributed-processes", "3"],
        ["--trl", "loss_type=grpo"],
        ["--trl", "top_p=abc"],
        ["--trl", "gradient_accumulation_steps=0"],  # TRL accepted it, then failed after the baseline
        ["--trl", 'generation_kwargs={"num_beams": 0}'],  # so did this one
        ["--trl", 'generation_kwargs={"no_repeat_ngram_sise": 3}'],  # and this one was silently ignored
        ["--trl", 'generation_kwargs={"suppress_tokens": [151936]}'],  # past SmolLM2's vocabulary: ignored too
        ["--train-tasks", "1"],  # fewer than a round's 2 prompts: it trained no step and said "completed"
        ["--max-completion-length", "9000"],  # past the embedded model's context of 8192
        ["--max-cost-usd", "5"],
        ["--limit", "wall_tme_s=3"],
        ["--limit", "wall_time_s=-1"],
        ["--method", "Full", "--lora-r", "16"],
        ["--seed", "4294967296"],
    ],
)
def test_the_dry_run_refuses_what_the_run_would_refuse(args: list[str]) -> None:
    # A plan that says "fits, $0.04" for a job that the run then refuses would be a wrong answer.
    dry = grpo("train", "--env", "graph-coloring@1", "--dry-run", *args)
    assert dry.returncode == 2 and "Traceback" not in dry.stderr
    assert len(dry.stderr.strip().splitlines()) == 1 and dry.stderr.startswith("grpo: error: ")


@pytest.mark.parametrize(
    ("args", "line"),
    [
        # Steps as TRL counts them: 200 tasks x 4 generations / batch 8 = 100, each round trained on twice (over two
        # steps, so checkpoints fall between rounds).
        (
            ["--trl", "num_iterations=2"],
            "2. 200 GRPO steps, a checkpoint every 26 (saveSteps 25 rounded up to whole rounds of completions)",
        ),
        (["--trl", "gradient_accumulation_steps=2"], "2. 50 GRPO steps, a checkpoint every 25"),
        (
            ["--generation-batch-size", "16", "--trl", "num_iterations=2"],
            "2. 200 GRPO steps, a checkpoint every 28 (saveSteps 25 rounded up to whole rounds of completions)",
        ),
    ],
)
def test_dry_run_counts_steps_and_checkpoints_as_trl_takes_them(args: list[str], line: str) -> None:
    dry = grpo("train", "--env", "graph-coloring@1", "--dry-run", *args)
    assert dry.returncode == 0, dry.stderr
    assert line in dry.stdout


def test_dry_run_of_a_model_not_downloaded_yet_still_plans(tmp_path: Path) -> None:
    model = "hf://Qwen/Qwen3-0.6B@c1899de289a04d12100db370d81485cdf75e47ca"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    result = subprocess.run(
        [GRPO, "train", "--env", "graph-coloring@1", "--model", model, "--dry-run", "--gpu", "h100"],
        capture_output=True, text=True, timeout=600, env=env,
    )
    assert result.returncode == 0, result.stderr
    assert "memory: not estimated: model hf://Qwen/Qwen3-0.6B@c1899de2" in result.stdout
    assert "its config.json is not in the local Hugging Face cache" in result.stdout
    assert "grpo estimate --model path/to/config.json" in result.stdout
    assert "time and cost on H100 SXM 80 GB: 100 steps x 0.45 s" in result.stdout


def test_dry_run_of_an_fsdp_job_counts_every_gpu() -> None:
    result = grpo(
        "train", "--env", "graph-coloring@1", "--dry-run", "--gpu", "h100", "--distributed-strategy", "FSDP",
        "--distributed-processes", "4",
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "2. 100 GRPO steps, a checkpoint every 25, FSDP over 4 GPUs" in out
    assert "FSDP divides the weights, gradients and optimizer state over the GPUs" in out
    assert "100 steps x 0.45 s = 45.00 s of training, $0.13 at $10.400/h" in out and "; 4 GPUs" in out
