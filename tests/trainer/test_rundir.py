import json
from decimal import Decimal
from pathlib import Path

import pytest
from nodus.trainer.rundir import COMPLETE_MARKER, RunDir, RunDirectoryConflict
from nodus.trainer.spec import load_job


def canonical(**overrides: object) -> dict[str, object]:
    return load_job(None, {"spec.environment.name": "graph-coloring@1", **overrides}).canonical()


def test_same_spec_resumes_and_a_different_one_is_refused(tmp_path: Path) -> None:
    run = RunDir(tmp_path / "run")
    assert run.claim(canonical()) is False
    assert run.claim(canonical()) is True
    assert run.claim(canonical(**{"spec.maxCostUSD": "9.50"})) is True  # raising the cap to continue is allowed
    with pytest.raises(RunDirectoryConflict) as error:
        run.claim(canonical(**{"spec.parameters.beta": 0.1}))
    assert str(error.value) == (
        f"{tmp_path / 'run'} holds a run of a different spec (spec.parameters.beta: 0.0 -> 0.1); to start fresh, "
        f"pass a new --output directory or remove {tmp_path / 'run'}; to continue that run, repeat its spec"
    )


def test_a_run_saved_before_a_field_existed_still_resumes(tmp_path: Path) -> None:
    # A job.json written by an older nodus lacks the fields added since (here sftWarmupSteps and fastPath).
    old = canonical()
    del old["spec"]["parameters"]["sftWarmupSteps"], old["spec"]["parameters"]["fastPath"]
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "job.json").write_text(json.dumps(old))
    run = RunDir(tmp_path / "run")
    assert run.claim(canonical()) is True
    with pytest.raises(RunDirectoryConflict, match=r"spec.parameters.sftWarmupSteps: 0 -> 5"):
        run.claim(canonical(**{"spec.parameters.sftWarmupSteps": 5}))


def test_a_foreign_directory_is_refused(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(RunDirectoryConflict, match="exists and is not a nodus run"):
        RunDir(tmp_path).claim(canonical())
    assert (tmp_path / "notes.txt").read_text() == "mine"  # nothing lost


@pytest.mark.parametrize(
    ("job_json", "message"),
    [
        (
            "{garbage",
            "{job} cannot be read as JSON (Expecting property name enclosed in double quotes: line 1 column 2 "
            "(char 1)); pass a new --output directory, or move {run} away to start fresh there",
        ),
        (
            "[1, 2]",
            "{job} is not a nodus job spec (no spec mapping); pass a new --output directory, or move {run} "
            "away to start fresh there",
        ),
    ],
)
def test_a_damaged_or_foreign_job_json_is_named_and_kept(tmp_path: Path, job_json: str, message: str) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "job.json").write_text(job_json)
    with pytest.raises(RunDirectoryConflict) as error:
        RunDir(run).claim(canonical())
    assert str(error.value) == message.format(job=run / "job.json", run=run)
    assert (run / "job.json").read_text() == job_json  # nothing lost


def test_an_output_that_is_a_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("mine")
    with pytest.raises(RunDirectoryConflict) as error:
        RunDir(tmp_path / "afile").claim(canonical())
    assert str(error.value) == f"--output {tmp_path / 'afile'} is a file; pass a directory (a new one starts a run)"
    assert (tmp_path / "afile").read_text() == "mine"


def test_an_output_below_a_file_is_refused_in_one_line(tmp_path: Path) -> None:
    from nodus.trainer.rundir import RunDirectoryUnusable

    (tmp_path / "afile").write_text("mine")
    with pytest.raises(RunDirectoryUnusable) as error:  # was a NotADirectoryError traceback
        RunDir(tmp_path / "afile" / "sub").claim(canonical())
    assert str(error.value) == (
        f"--output {tmp_path / 'afile' / 'sub'} cannot be written (Not a directory); pass a directory you can write to"
    )


def test_json_files_are_readable_by_others_and_a_failed_write_leaves_nothing(tmp_path: Path) -> None:
    import os

    from nodus.trainer.rundir import write_json_atomic

    mask = os.umask(0o022)
    try:
        write_json_atomic(tmp_path / "results.json", {"a": 1})
    finally:
        os.umask(mask)
    assert (tmp_path / "results.json").stat().st_mode & 0o777 == 0o644  # was 0600 (mkstemp's)
    with pytest.raises(TypeError):
        write_json_atomic(tmp_path / "results.json", {"a": object()})  # fails half-way, as a full disk does
    assert [p.name for p in tmp_path.iterdir()] == ["results.json"], "no stray temporary file"
    assert json.loads((tmp_path / "results.json").read_text()) == {"a": 1}


def test_only_marked_checkpoints_count_and_half_written_ones_are_removed(tmp_path: Path) -> None:
    run = RunDir(tmp_path)
    for step in (25, 50, 75):
        (run.checkpoints / f"checkpoint-{step}").mkdir(parents=True)
    run.mark_complete(run.checkpoints / "checkpoint-25", {"step": 25})
    run.mark_complete(run.checkpoints / "checkpoint-50", {"step": 50})
    assert run.latest_checkpoint() == run.checkpoints / "checkpoint-50"
    assert not (run.checkpoints / "checkpoint-75").exists()  # killed mid-save: not complete, removed
    assert json.loads((run.checkpoints / "checkpoint-50" / COMPLETE_MARKER).read_text()) == {"step": 50}


def test_metrics_after_the_checkpoint_are_dropped_on_resume(tmp_path: Path) -> None:
    run = RunDir(tmp_path)
    for step in range(1, 6):
        run.append_metrics({"step": step, "reward": step / 10})
    with run.metrics.open("a") as handle:
        handle.write('{"step": 6, "rew')  # a line cut by kill -9
    run.truncate_metrics(3)
    assert [row["step"] for row in run.read_metrics()] == [1, 2, 3]


def test_rates_are_per_gpu_and_a_run_over_several_gpus_pays_for_each() -> None:
    from decimal import Decimal

    from nodus.trainer.run import RunOptions, hourly_rate

    assert hourly_rate(RunOptions(output=Path("x"), gpu="h100"), gpus=4) == (Decimal("10.400"), 0.45)
    assert hourly_rate(RunOptions(output=Path("x"), gpu_rate=Decimal("2.5")), gpus=2)[0] == Decimal("5.0")
    assert hourly_rate(RunOptions(output=Path("x"))) == (None, None)


def test_a_failure_record_keeps_what_an_earlier_attempt_finished_with(tmp_path: Path) -> None:
    from nodus.trainer.run import finished_note, record_failure
    from nodus.trainer.rundir import write_json_atomic

    job = load_job(None, {"spec.environment.name": "graph-coloring@1", "spec.maxCostUSD": "4.00"})
    run = RunDir(tmp_path / "run")
    run.claim(job.canonical())
    capped = {"status": "stopped_by_cost_cap", "cost": {"actualUSD": "1.98", "maxCostUSD": "2.00"}}
    assert finished_note(capped, None) is None  # the cap removed: continue
    assert finished_note(capped, job.spec.max_cost_usd) is None  # raised above the spend: continue
    assert "above what it has spent" in str(finished_note(capped, Decimal("1.99")))
    write_json_atomic(run.results, capped)

    # The continuation fails: its record replaces results.json, and the cost-capped one is inside it.
    message = record_failure(run, job, "nodus-env-graph-coloring", RuntimeError("boom\nmore"), capped)
    record = json.loads(run.results.read_text())
    assert record["status"] == "failed" and record["error"] == "RuntimeError: boom"
    assert record["previous"] == capped
    assert message.startswith(f"run failed; recorded in {run.results}; repeat the command with --output")

    # This attempt already wrote its finished results (then, say, the plot failed): they stand.
    done = {"status": "completed"}
    write_json_atomic(run.results, done)
    assert "it stands" in record_failure(run, job, "nodus-env-graph-coloring", KeyboardInterrupt(), capped)
    assert json.loads(run.results.read_text()) == done
