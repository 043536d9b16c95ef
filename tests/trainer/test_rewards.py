"""The reward function TRL calls: scores from the sandbox, and None (never 0) for an infrastructure failure."""

from pathlib import Path

import pytest
from nodus.core import load_environment
from nodus.core.grading import Grader
from nodus.trainer.rewards import SandboxReward, completion_text, prompt_dataset


def test_infrastructure_failures_are_none_and_counted() -> None:
    env = load_environment("test/letters@1")
    tasks = env.tasks("train", 0, 2)
    dataset = prompt_dataset(env, tasks)
    assert dataset[0]["prompt"] == env.prompt(tasks[0])
    with Grader(env, workers=1) as grader:
        reward = SandboxReward(grader)
        completions = [[{"role": "assistant", "content": "aaaa"}], [{"role": "assistant", "content": "CRASH"}]]
        rewards = reward(prompts=dataset["prompt"], completions=completions, task=dataset["task"])
    assert rewards == [1.0, None]
    assert reward.state() == {"graded": 1, "infrastructureFailures": 1, "rewardCounts": {"1.0": 1}}
    # A grader that raises is not retried: the same code on the same payload would raise again.
    assert grader.stats.infrastructure_failures == 1 and grader.stats.retries == 0


def test_the_reward_grades_the_decoded_completion_as_the_evaluations_do(tiny_model: Path) -> None:
    """With a tokenizer that has a response template or schema, TRL hands the reward only the parsed `content`
    (here as if the whole answer had been split off as reasoning); the held-out evaluations grade the decoded
    completion. The reward decodes the completion's ids as they do."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    env = load_environment("test/letters@1")
    dataset = prompt_dataset(env, env.tasks("train", 0, 1))
    ids = tokenizer("aaaa", add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    parsed = [[{"role": "assistant", "content": "", "reasoning_content": "aaaa"}]]
    with Grader(env, workers=1) as grader:
        decoded = SandboxReward(grader, tokenizer)
        assert decoded(dataset["prompt"], parsed, dataset["task"], completion_ids=[ids]) == [1.0]
        assert SandboxReward(grader)(dataset["prompt"], parsed, dataset["task"], completion_ids=[ids]) == [0.0]


def test_plain_and_conversational_completions() -> None:
    assert completion_text("abc") == "abc"
    assert completion_text([{"role": "assistant", "content": "x"}, {"role": "assistant", "content": "y"}]) == "xy"


def test_reward_signal_warns_when_every_group_had_zero_variance() -> None:
    """Rewards that differ between prompts but never within a group: every advantage is 0 although two values
    occur, which once read "ok"."""
    from nodus.trainer.results import reward_signal

    state = {"rewardCounts": {"0.0": 8, "1.0": 8}, "graded": 16}
    flat = reward_signal(state, [{"step": 1, "zero_variance_groups": 1.0}, {"step": 2, "zero_variance_groups": 1.0}])
    assert flat["rewardSignal"].startswith("warning: within every group the rewards were equal (zero variance)")
    assert flat["zeroVarianceGroupFraction"] == 1.0
    varied = reward_signal(state, [{"step": 1, "zero_variance_groups": 1.0}, {"step": 2, "zero_variance_groups": 0.5}])
    assert varied["rewardSignal"] == "ok" and varied["zeroVarianceGroupFraction"] == 0.75


def test_trls_dump_of_each_none_reward_is_left_out(caplog: pytest.LogCaptureFixture) -> None:
    """An infrastructure failure is one line from the sandbox pool and a count on the progress line; TRL also
    printed three lines for each, with the task and the raw completion, even under --quiet."""
    import logging

    from nodus.trainer.run import quiet_libraries
    from trl.trainer import grpo_trainer

    quiet_libraries()
    logger = logging.getLogger("trl.trainer.grpo_trainer")
    assert grpo_trainer.logger.logger is logger  # the logger TRL's warning goes through
    with caplog.at_level(logging.WARNING):
        logger.warning("All reward functions returned None for the following kwargs:\n{'task': ...}\nPlease ...")
        logger.warning("another warning")
    assert [record.getMessage() for record in caplog.records] == ["another warning"]
