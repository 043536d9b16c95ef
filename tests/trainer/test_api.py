"""The Python API: a reward function plus prompts, trained in one call."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from nodus.core.errors import NodusError
from nodus.core.function_env import InvalidFunctionEnvironment, function_environment
from nodus.trainer import api


def share_of_a(prompt: str, completion: str) -> float:
    letters = [c for c in completion if not c.isspace()]
    return letters.count("a") / len(letters) if letters else 0.0


def test_train_on_a_python_reward_function(tiny_model: Path, tmp_path: Path) -> None:
    prompts = [f"Task {i}: write a" for i in range(80)]
    results = api.train_on_function(
        prompts,
        share_of_a,
        name="letters",
        output=tmp_path / "run",
        quiet=True,
        model=str(tiny_model),
        method="Full",
        learning_rate=1e-2,
        max_steps=60,
        num_generations=4,
        batch_size=8,
        max_completion_length=8,
    )
    assert results["environment"] == "local/letters@1"
    assert results["job"]["spec"]["sandbox"] == "none"
    assert len(results["heldOutTaskIds"]) + results["job"]["spec"]["environment"]["trainTasks"] == 80
    assert results["final"]["meanScore"] > results["baseline"]["meanScore"] + 0.5


def test_function_environment_splits_and_checks_its_reward() -> None:
    env = function_environment("echo", [f"p{i}" for i in range(40)], lambda prompt, completion: 2.0)
    heldout = env.tasks("heldout", 0, 3)
    assert not {t.data["prompt"] for t in heldout} & {t.data["prompt"] for t in env.tasks("train", 0, 30)}
    with pytest.raises(ValueError, match=r"reward function returned 2.0, not a number in \[0, 1\]"):
        env.grade(heldout[0], "x")
    with pytest.raises(InvalidFunctionEnvironment, match="needs at least 2 distinct prompts"):
        function_environment("one", ["same", "same"], lambda prompt, completion: 1.0)


def test_sft_warmup_without_references_is_refused_before_any_work(tmp_path: Path) -> None:
    prompts = [f"Task {i}: write a" for i in range(40)]
    with pytest.raises(Exception) as raised:
        api.train_on_function(prompts, share_of_a, name="letters", output=tmp_path / "run", sft_warmup_steps=4)
    assert str(raised.value) == (
        "sftWarmupSteps needs reference answers, and local/letters@1 has none (function environment 'letters' has "
        "no reference answer for 'Task 6: write a'; pass references=); set sftWarmupSteps to 0 (--sft-warmup-steps 0)"
    )
    assert not (tmp_path / "run").exists(), "refused before anything is written"


def test_unknown_keyword_names_the_known_fields() -> None:
    with pytest.raises(TypeError) as error:
        api.train(env="graph-coloring@1", num_generation=4)
    assert str(error.value).startswith(
        "unknown training field(s) num_generation (did you mean 'num_generations'?); known: batch_size, beta"
    )
    with pytest.raises(TypeError, match=r"for the dry run call api.plan\(...\), which takes no output, quiet or"):
        api.train(env="graph-coloring@1", dry_run=True)


def test_the_api_mirrors_the_cli(tmp_path: Path) -> None:
    # The dry run, the mappings of --param / --limit / --trl, and the CLI's messages for bad values.
    text = api.plan(env="graph-coloring@1", gpu="h100", params={"num_vertices": 12}, limits={"wall_time_s": 30},
                    trl={"top_p": 0.9}, max_steps=10)
    assert "2. 10 GRPO steps, a checkpoint every 25" in text
    assert "time and cost on H100 SXM 80 GB: 10 steps x 0.45 s" in text
    with pytest.raises(NodusError) as error:
        api.plan(env="graph-coloring@1", trl={"top_pp": 0.9})
    assert str(error.value).startswith("spec.parameters.trl.top_pp is not a GRPOConfig field; did you mean 'top_p'?")
    with pytest.raises(NodusError) as error:
        api.train(env="graph-coloring@1", gpu_rate="abc", output=tmp_path / "run")
    assert str(error.value) == "gpu_rate 'abc' is not a number of USD per hour, e.g. 2.60"
    assert not (tmp_path / "run").exists()


def test_too_few_prompts_for_both_splits_says_so() -> None:
    with pytest.raises(NodusError) as error:
        api.train_on_function([f"Task {i}: write a" for i in range(4)], share_of_a, name="letters")
    assert str(error.value) == (
        "train_on_function: none of the 4 distinct prompts falls in the held-out split (a hash of each prompt "
        "decides, about one in eight is held out); pass more prompts, e.g. 40 or more"
    )


def test_a_function_environment_cannot_go_to_the_sandbox() -> None:
    from nodus.core.grading import EnvironmentNotInstalled, Grader

    env = function_environment("echo", ["p1", "p2", "p3"], lambda prompt, completion: 1.0)
    with pytest.raises(EnvironmentNotInstalled) as error:
        Grader(env)
    assert str(error.value) == (
        "local/echo@1 is not an installed plugin, so a sandbox worker cannot load it; install its distribution, "
        "or grade it in this process with sandbox 'none' (trusted code only)"
    )


def test_the_dry_run_needs_no_training_extras(tiny_model: Path) -> None:
    # Planning a GPU job happens on a laptop without torch, transformers or TRL installed.
    code = (
        "import sys\n"
        "for name in ('trl', 'torch', 'transformers', 'peft'): sys.modules[name] = None  # importing them fails\n"
        "from nodus.trainer import plan, spec\n"
        "job = spec.load_job(None, {'spec.environment.name': 'graph-coloring@1', 'spec.model.uri': sys.argv[1]})\n"
        "print(plan.dry_run(job, 'h100', None))\n"
    )
    result = subprocess.run([sys.executable, "-c", code, str(tiny_model)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "time and cost on H100 SXM 80 GB: 100 steps x 0.45 s" in result.stdout



def broken_reward(prompt: str, completion: str) -> float:
    raise RuntimeError("reward bug on purpose")


def test_a_baseline_with_nothing_graded_stops_the_run_and_is_not_reused(tiny_model: Path, tmp_path: Path) -> None:
    # Every held-out task an infrastructure failure: the means were once reported as 0.000 and training went on.
    prompts = [f"Task {i}: write a" for i in range(40)]
    with pytest.raises(NodusError) as error:
        api.train_on_function(
            prompts, broken_reward, name="letters", output=tmp_path / "run", quiet=True, model=str(tiny_model),
            max_steps=2, num_generations=4, batch_size=8, max_completion_length=8,
        )  # fmt: skip
    assert str(error.value).startswith("the baseline evaluation graded none of the ")
    assert "every one was an infrastructure failure (first: RuntimeError: reward bug on purpose); fix the grader" in (
        str(error.value)
    )
    assert str(error.value).endswith("then repeat the command")
    record = json.loads((tmp_path / "run" / "results.json").read_text())
    assert record["status"] == "failed" and record["error"].startswith("NothingGraded: the baseline evaluation")
    assert not (tmp_path / "run" / "baseline.json").exists(), "a repeated command evaluates again"


class Flaky:
    """A reward that works, except while `broken` is set (a grader the sandbox cannot run at the final evaluation)."""

    def __init__(self) -> None:
        self.broken = False

    def __call__(self, prompt: str, completion: str) -> float:
        if self.broken:
            raise RuntimeError("sandbox down on purpose")
        return share_of_a(prompt, completion)


def test_stops_after_training_resume_at_the_final_evaluation_without_training_again(
    tiny_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from nodus.trainer.fast_grpo import FastGRPOTrainer

    prompts = [f"Task {i}: write a" for i in range(40)]
    out = tmp_path / "run"
    reward = Flaky()
    settings = dict(name="letters", output=out, quiet=True, model=str(tiny_model), max_steps=2, save_steps=2,
                    num_generations=4, batch_size=8, max_completion_length=8)  # fmt: skip
    train = FastGRPOTrainer.train

    def train_then_break_the_grader(trainer: FastGRPOTrainer, *args: object, **kwargs: object) -> object:
        result = train(trainer, *args, **kwargs)
        reward.broken = True  # from the final evaluation on
        return result

    monkeypatch.setattr(FastGRPOTrainer, "train", train_then_break_the_grader)
    with pytest.raises(NodusError, match="^the final evaluation graded none of the "):
        api.train_on_function(prompts, reward, **settings)
    monkeypatch.undo()
    failed = json.loads((out / "results.json").read_text())
    # Not "completed" with a final mean of n/a: failed, and the same call evaluates again.
    assert failed["status"] == "failed" and failed["training"]["lastCheckpoint"] == "checkpoint-2"
    assert not (out / "final.json").exists()

    reward.broken = False
    results = api.train_on_function(prompts, reward, **settings)
    assert results["status"] == "completed"
    # Resumed at the last step: not one more step (it trained step 3 of 2), and each step's row once.
    assert results["training"]["steps"] == 2
    assert [row["step"] for row in results["training"]["rewardPerStep"]] == [1, 2]
    assert results["diagnostics"]["graded"] == 16  # 2 steps x 8 completions, none graded twice
    assert results["final"]["scored"] == results["baseline"]["scored"]


def reward_failing_every_fourth_task(prompt: str, completion: str) -> float:
    if int(prompt.split()[1].rstrip(":")) % 4 == 0:
        raise RuntimeError("grader down for this task on purpose")
    return share_of_a(prompt, completion)


def test_partial_grading_failures_are_said_where_the_means_are(
    tiny_model: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    prompts = [f"Task {i}: write a" for i in range(48)]
    results = api.train_on_function(
        prompts, reward_failing_every_fourth_task, name="letters", output=tmp_path / "run", model=str(tiny_model),
        max_steps=2, num_generations=4, batch_size=8, max_completion_length=8,
    )  # fmt: skip
    err = capfd.readouterr().err
    baseline = results["baseline"]
    failed = baseline["infrastructureFailures"]
    assert failed > 0, "the split must hold some failing held-out tasks for this test to mean anything"
    # The means cover the graded tasks only, and the lines say so (they read like a 0.000 over every task).
    assert (
        f"over the {baseline['scored']} of {baseline['scored'] + failed} tasks graded ({failed} grading "
        "infrastructure failures, left out)"
    ) in err
    counts = {
        "training": results["diagnostics"]["infrastructureFailures"],
        "baseline": failed,
        "final": results["final"]["infrastructureFailures"],
    }
    summary = next(line for line in err.splitlines() if line.startswith("done (completed)"))
    listed = ", ".join(f"{count} in {where}" for where, count in counts.items() if count)
    assert summary.endswith(f"; grading infrastructure failures (left out, never scored): {listed}")
