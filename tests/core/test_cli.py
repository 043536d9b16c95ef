"""The grpo command line, run as users run it: the installed console script in a subprocess."""

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
from nodus.core.cli import sandbox_log_left_to_the_report
from nodus.sandbox import GraderPool, SandboxLimits

GRPO = str(Path(sys.executable).with_name("grpo"))


def grpo(*args: str, stdin: str | None = None, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [GRPO, *args], input=stdin, capture_output=True, text=True, env={**os.environ, **env}, timeout=120
    )


def assert_user_error(result: subprocess.CompletedProcess[str], message: str) -> None:
    assert result.returncode == 2, result
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1] == message
    assert result.stdout == ""


def test_envs_lists_graph_coloring() -> None:
    result = grpo("envs")
    assert result.returncode == 0
    assert result.stdout.startswith("graph-coloring@1  nodus-env-graph-coloring 0.1.0  Color a graph")
    rows = json.loads(grpo("envs", "--json").stdout)
    row = next(r for r in rows if r["id"] == "graph-coloring@1")
    assert row["distribution"] == "nodus-env-graph-coloring 0.1.0"
    assert row["parameters"]["num_vertices"]["default"] == 10


def test_heldout_json_is_byte_identical_across_hash_seeds_and_disjoint_from_train() -> None:
    args = ("tasks", "--env", "graph-coloring@1", "--seed", "42", "--split", "heldout", "--json")
    first = grpo(*args, PYTHONHASHSEED="1")
    second = grpo(*args, PYTHONHASHSEED="987654")
    assert first.returncode == 0 and first.stdout == second.stdout
    heldout = json.loads(first.stdout)
    assert len(heldout) == 64
    assert {"id", "split", "index", "prompt", "data"} <= set(heldout[0])
    train = json.loads(grpo("tasks", "--env", "graph-coloring@1", "--seed", "42", "--split", "train", "--json").stdout)
    assert len(train) == 200
    assert not {t["prompt"] for t in heldout} & {t["prompt"] for t in train}


def test_unversioned_id_notes_the_version_chosen() -> None:
    result = grpo("tasks", "--env", "graph-coloring", "--split", "heldout", "-n", "1")
    assert result.returncode == 0
    assert result.stderr == "note: graph-coloring resolved to the newest installed version, graph-coloring@1\n"
    assert "Vertices: 0, 1, 2" in result.stdout


def test_unknown_name_suggests_the_closest_and_no_pip_line() -> None:
    result = grpo("tasks", "--env", "graph-colorin@1", "--split", "heldout")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    line = result.stderr.strip()
    assert line.startswith(
        "grpo: error: no environment named 'graph-colorin' is installed; did you mean 'graph-coloring'? "
        "installed: graph-coloring, "
    )
    assert "pip install" not in line  # nodus-env-graph-colorin does not exist: never advise installing it


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ("tasks", "--env", "graph-coloring@3", "--split", "heldout"),
            "grpo: error: graph-coloring has no version 3; installed: graph-coloring@1; "
            "upgrade with 'pip install -U nodus-env-graph-coloring'",
        ),
        (
            ("tasks", "--split", "heldout"),
            "grpo tasks: error: Missing option '--env'. (see 'grpo tasks --help')",
        ),
        (
            ("tasks", "--env", "graph-coloring@1", "--split", "test"),
            "grpo tasks: error: Invalid value for '--split': 'test' is not one of 'train', 'heldout'. "
            "(see 'grpo tasks --help')",
        ),
        (
            ("tasks", "--env", "graph-coloring@1", "--split", "heldout", "--param", "num_vertices=99"),
            "grpo: error: invalid parameter num_vertices=99 for graph-coloring@1: Input should be less than or "
            "equal to 40; see 'grpo envs --env graph-coloring@1' for the parameters and their bounds",
        ),
        (
            ("tasks", "--env", "graph-coloring@1", "--split", "heldout", "--param", "vertices"),
            "grpo: error: --param 'vertices' is not key=value; write e.g. --param num_vertices=12",
        ),
        (
            ("tasks", "--env", "graph-coloring@1", "--split", "heldout", "-n", "65"),
            "grpo: error: -n 65 is more than the 64 tasks of the heldout split; lower -n or raise --held-out-tasks",
        ),
        (
            ("grade", "--env", "graph-coloring@1", "--split", "heldout", "--index", "0"),
            "grpo: error: give exactly one of --completion FILE (or - for stdin) and --reference",
        ),
        (
            (
                "grade",
                "--env",
                "graph-coloring@1",
                "--split",
                "heldout",
                "--index",
                "0",
                "--completion",
                "/nonexistent",
            ),
            "grpo grade: error: Invalid value for '--completion': '/nonexistent': No such file or directory "
            "(see 'grpo grade --help')",
        ),
        (
            ("grade", "--env", "graph-coloring@1", "--split", "heldout", "--index", "64", "--reference"),
            "grpo: error: --index 64 is past the 64 tasks of the heldout split; lower --index or raise "
            "--held-out-tasks",
        ),
        (
            ("tasks", "--env", "graph-coloring@1", "--split", "heldout", "--seed", "-1"),
            "grpo tasks: error: Invalid value for '--seed': -1 is not in the range 0<=x<=4294967295. "
            "(see 'grpo tasks --help')",
        ),
        (
            ("tasks", "--env", "graph-coloring@1", "--split", "heldout", "--held-out-tasks", "100000000000"),
            "grpo tasks: error: Invalid value for '--held-out-tasks': 100000000000 is not in the range 0<=x<=100000. "
            "(see 'grpo tasks --help')",
        ),
        (
            (
                "tasks",
                "--env",
                "graph-coloring@1",
                "--split",
                "heldout",
                "--param",
                "num_vertices=12",
                "--param",
                "num_vertices=13",
            ),
            "grpo: error: --param num_vertices is given twice; give each key once",
        ),
    ],
)
def test_user_errors_are_one_line_with_exit_code_2(args: tuple[str, ...], message: str) -> None:
    assert_user_error(grpo(*args), message)


def test_grade_runs_in_the_sandbox_by_default() -> None:
    result = grpo("grade", "--env", "graph-coloring@1", "--split", "heldout", "--index", "2", "--reference", "--json")
    assert result.returncode == 0, result.stderr
    outcome = json.loads(result.stdout)
    assert outcome["status"] == "graded" and outcome["score"] == 1.0 and outcome["passed"] is True
    assert outcome["task"] == "heldout-42-2"
    assert result.stderr == ""  # no warning: the sandbox was used


def test_grade_reads_a_completion_from_stdin_and_explains_a_failure() -> None:
    result = grpo(
        "grade",
        "--env",
        "graph-coloring@1",
        "--split",
        "heldout",
        "--index",
        "0",
        "--completion",
        "-",
        stdin='<answer>{"0": 1}</answer>',
    )
    assert result.returncode == 0
    assert result.stdout == "graph-coloring@1 heldout-42-0: score 0.000 (failed): missing vertex 1 and 8 more\n"


def test_grading_without_a_sandbox_warns_every_time() -> None:
    for _ in range(2):
        result = grpo(
            "grade",
            "--env",
            "graph-coloring@1",
            "--split",
            "heldout",
            "--index",
            "0",
            "--reference",
            "--sandbox",
            "none",
        )
        assert result.returncode == 0
        assert "with sandbox='none'" in result.stderr and "only for trusted graders" in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1


def test_sandbox_limits_can_be_overridden_and_are_checked() -> None:
    args = ("grade", "--env", "graph-coloring@1", "--split", "heldout", "--index", "0", "--reference")
    assert grpo(*args, "--limit", "wall_time_s=30").returncode == 0
    assert_user_error(
        grpo(*args, "--limit", "wall_time_s=0"),
        "grpo: error: invalid sandbox limits {'wall_time_s': 0}: wall_time_s: Input should be greater than 0; the "
        "limits and their bounds are the fields of nodus.sandbox.SandboxLimits (wall_time_s, cpu_time_s, memory_mb, "
        "max_processes, max_file_size_mb, max_output_bytes, tmpfs_mb, max_open_files, max_details_chars)",
    )
    assert_user_error(
        grpo(*args, "--limit", "wall"),
        "grpo: error: --limit 'wall' is not key=value; write e.g. --limit wall_time_s=30",
    )


def test_a_completion_that_is_not_utf8_is_a_user_error(tmp_path: Path) -> None:
    completion = tmp_path / "answer.bin"
    completion.write_bytes(b"<answer>\xff\xfe</answer>")
    args = ("grade", "--env", "graph-coloring@1", "--split", "heldout", "--index", "0", "--completion")
    assert_user_error(
        grpo(*args, str(completion)),
        f"grpo: error: the completion in {completion} is not UTF-8 text (byte 8); save it as UTF-8",
    )


def test_a_completion_with_windows_line_ends_is_graded_as_text() -> None:
    args = ("grade", "--env", "graph-coloring@1", "--split", "heldout", "--index", "0", "--completion", "-")
    result = grpo(*args, "--json", stdin='<answer>{"0": 1}</answer>\r\n')
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["details"] == "missing vertex 1 and 8 more"


def test_bare_grpo_prints_its_help_and_version_is_known() -> None:
    result = grpo()
    assert result.returncode == 0 and result.stderr == ""
    assert result.stdout.startswith("Usage: grpo [OPTIONS] COMMAND [ARGS]...")
    assert "train " in result.stdout and "error" not in result.stdout
    version = grpo("--version")
    assert version.returncode == 0 and version.stdout.startswith("grpo (nodus) ")


def test_grpo_check_leaves_a_graders_errors_in_the_sandbox_to_its_table(caplog: pytest.LogCaptureFixture) -> None:
    # grpo check logged "grading infrastructure failure (grader_error) after 1 attempt(s): ..." for each failing job
    # (120 lines for one check): the author's bug, which its table shows, called the machine's failure.
    job = {"target": "nodus.sandbox.demo_targets:raise_error", "payload": {"message": "list index out of range"}}

    def sandbox_lines() -> list[str]:
        return [record.getMessage() for record in caplog.records if record.name == "nodus.sandbox"]

    with GraderPool(SandboxLimits(wall_time_s=5), workers=1) as pool:
        pool.run_many([job])
        (line,) = sandbox_lines()
        assert "(grader_error)" in line and "list index out of range" in line
        caplog.clear()
        with sandbox_log_left_to_the_report():
            assert [outcome.reason for outcome in pool.run_many([job, job])] == ["grader_error"] * 2
            # The machine's own failures still show: the report excuses them, so this is where they are seen.
            logging.getLogger("nodus.sandbox").error("grading infrastructure failure (%s): %s", "pool_error", "down")
    assert sandbox_lines() == ["grading infrastructure failure (pool_error): down"]
