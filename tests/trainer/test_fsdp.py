"""distributed.strategy FSDP on CPU: two real processes (torchrun, gloo), sharded with FSDP2, through the CLI.

On CPU this tests the machinery users rely on with several GPUs: the launch, what rank 0 alone does (the run
directory, printing, the held-out evaluation), the reward tallies merged over processes, a loadable adapter from a
sharded model, and resuming. Whether accelerate really sharded (it has fallen back to DDP silently) is recorded in
results.json and checked here.
"""

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

GRPO = str(Path(sys.executable).with_name("grpo"))


def job_file(
    tmp_path: Path, model: Path, distributed: str, method: str = "LoRA", batch: int = 8, generations: int = 4
) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(
        f"""apiVersion: nodus.dev/v1beta1
kind: TrainingJob
spec:
  model: {{uri: "{model}"}}
  environment: {{name: test/letters@1, trainTasks: 32, heldOutTasks: 8, seed: 42}}
  parameters: {{numGenerations: {generations}, batchSize: {batch}, maxCompletionLength: 8, maxSteps: 2, saveSteps: 1,
                method: {method}}}
  distributed: {distributed}
"""
    )
    return path


def grpo(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([GRPO, *map(str, args)], capture_output=True, text=True, timeout=600)


def rerun_after_a_kill(job: Path, out: Path) -> tuple[str, dict[str, Any]]:
    """Remove what a finished run writes last (adapter, final evaluation, results), as a kill before it would have left
    the directory, and run the same command again: its stderr and results.json."""
    shutil.rmtree(out / "adapter")
    (out / "results.json").unlink()
    (out / "final.json").unlink()
    result = grpo("train", "-f", job, "--output", out)
    assert result.returncode == 0, result.stderr
    return result.stderr, json.loads((out / "results.json").read_text())


def test_two_fsdp_processes_train_save_a_loadable_adapter_and_resume(tiny_model: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    # One group of 8 completions, 4 on each process: the launcher once refused it (its TRL check saw 1 process).
    job = job_file(tmp_path, tiny_model, "{strategy: FSDP, processes: 2}", generations=8)
    result = grpo("train", "-f", job, "--output", out)
    assert result.returncode == 0, result.stderr
    assert result.stderr.count("FSDP over 2 processes") == 1, "only rank 0 speaks"
    assert result.stderr.count("step 2/2") == 1
    results = json.loads((out / "results.json").read_text())
    assert results["status"] == "completed"
    assert results["training"]["distributed"] == {"processes": 2, "accelerate": "FSDP"}, "sharded, not DDP"
    assert results["diagnostics"]["graded"] == 16, "2 steps x 8 completions, graded across both processes"
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 2, "one row per step, not one per process"
    # The per-step count is gathered from every process (a collective in the logging callback: no hang).
    assert rows[-1]["infrastructure_failures"] == results["diagnostics"]["infrastructureFailures"]
    assert results["final"]["scored"] == 8

    # The adapter gathered from the shards loads into a plain peft model and changes its outputs.
    import torch
    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    tensors = load_file(out / "adapter" / "adapter_model.safetensors")
    assert len(tensors) == 28 and all(t.abs().sum() > 0 for k, t in tensors.items() if "lora_B" in k)
    base = AutoModelForCausalLM.from_pretrained(tiny_model)
    ids = torch.tensor([[5, 6, 7, 8]])
    before = base(input_ids=ids).logits
    adapted = PeftModel.from_pretrained(base, out / "adapter")(input_ids=ids).logits
    assert not torch.allclose(before, adapted)

    # As if killed after the first checkpoint: all processes resume from it, and the tally continues from its own.
    shutil.rmtree(out / "checkpoints" / "checkpoint-2")
    stderr, resumed = rerun_after_a_kill(job, out)
    assert stderr.count("resuming from checkpoint-1 (step 1)") == 1
    assert "reusing the saved baseline evaluation" in stderr
    assert resumed["diagnostics"]["graded"] == 16
    assert [row["step"] for row in resumed["training"]["rewardPerStep"]] == [1, 2]

    # As if killed during the final evaluation: no step is trained again (it took a third), the last checkpoint's
    # weights are evaluated.
    stderr, finished = rerun_after_a_kill(job, out)
    assert stderr.count("training finished at checkpoint-2: loading it for the final evaluation") == 1
    assert finished["status"] == "completed" and finished["diagnostics"]["graded"] == 16
    assert [row["step"] for row in finished["training"]["rewardPerStep"]] == [1, 2]
    assert finished["final"]["scored"] == 8
    saved = load_file(out / "checkpoints" / "checkpoint-2" / "adapter_model.safetensors")
    assert load_file(out / "adapter" / "adapter_model.safetensors").keys() == saved.keys()
    left_out = {"optimizer.bin", "pytorch_model_fsdp.bin", "scheduler.pt", "trainer_state.json", "COMPLETE.json"}
    assert left_out <= {path.name for path in (out / "checkpoints" / "checkpoint-2").iterdir()}, "the test's premise"
    kept = {path.name for path in (out / "adapter").iterdir()}
    assert {"adapter_model.safetensors", "adapter_config.json", "tokenizer.json"} <= kept and not kept & left_out


@pytest.mark.parametrize(
    ("distributed", "method", "batch", "message"),
    [
        (
            "{strategy: FSDP}",
            "LoRA",
            8,
            "grpo: error: distributed.strategy FSDP shards the model over several GPUs and none is visible; on CPU "
            "(to test the setup) set distributed.processes, e.g. 2",
        ),
        (
            "{strategy: FSDP, processes: 1}",
            "LoRA",
            8,
            "grpo: error: distributed.strategy FSDP needs at least 2 processes (1 process here): remove "
            "spec.distributed to train on one device",
        ),
        (
            "{strategy: FSDP, processes: 3}",
            "LoRA",
            8,
            "grpo: error: batchSize=8 must be a multiple of the 3 FSDP processes, because each process trains on an "
            "equal share of a step's completions; change batchSize or distributed.processes",
        ),
        (
            "{strategy: FSDP, processes: 2}",
            "QLoRA",
            8,
            "grpo: error: distributed.strategy FSDP does not support method QLoRA (4-bit weights need FSDP's "
            "quantized storage settings) in this version; train on one device (remove spec.distributed) or change "
            "that setting",
        ),
    ],
)
def test_fsdp_settings_that_cannot_run_are_refused_before_any_work(
    tiny_model: Path, tmp_path: Path, distributed: str, method: str, batch: int, message: str
) -> None:
    out = tmp_path / "run"
    result = grpo("train", "-f", job_file(tmp_path, tiny_model, distributed, method, batch), "--output", out)
    assert result.returncode != 0
    assert result.stderr.strip().splitlines()[-1] == message
    assert "Traceback" not in result.stderr
    assert not out.exists()
