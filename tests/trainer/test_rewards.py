"""The reward function TRL calls: scores from the sandbox, and None (never 0) for an infrastructure failure."""

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
    assert grader.stats.infrastructure_failures == 1 and grader.stats.retries == 2


def test_plain_and_conversational_completions() -> None:
    assert completion_text("abc") == "abc"
    assert completion_text([{"role": "assistant", "content": "x"}, {"role": "assistant", "content": "y"}]) == "xy"
