"""The run directory: what a run writes, how a re-run finds its place, and how nothing is half-written.

job.json           the resolved spec; a re-run with a different spec is refused
baseline.json      held-out evaluation before training (reused on resume: never graded twice)
sft.json           the SFT warm-up's summary and the held-out evaluation after it (when sftWarmupSteps > 0)
checkpoints/       TRL checkpoints; one counts only once it carries COMPLETE (written last, atomically)
metrics.jsonl      one line per logged training step
spend.json         wall seconds spent on the run so far, across resumes (the cost meter's record)
final.json         held-out evaluation after training
adapter/           the trained adapter (or model, for method Full)
results.json       the summary; reward.png its plot
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import tempfile
from pathlib import Path
from typing import Any

from nodus.core.errors import NodusError

COMPLETE_MARKER = "COMPLETE.json"
# Fields that may change between runs on the same directory: raising the cost cap to continue is the point.
RESUMABLE_CHANGES = {"maxCostUSD"}


class RunDirectoryConflict(NodusError):
    """The output directory holds a run of a different spec."""


class RunDirectoryUnusable(NodusError):
    """The output directory cannot be created or written (read-only, a file in its path, no space)."""


def write_json_atomic(path: Path, data: Any) -> None:
    """Write JSON so that a reader (or a kill -9) sees the old file or the new one, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    # Created as open() creates files (0666 less the umask): mkstemp's 0600 hid results from the rest of a team.
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "w") as handle:
            json.dump(data, handle, indent=2, sort_keys=True)
            handle.write("\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)  # a full disk must not leave a stray temporary file behind
        raise


def read_json(path: Path) -> Any:
    return json.loads(path.read_text())


class RunDir:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.job = path / "job.json"
        self.baseline = path / "baseline.json"
        self.sft = path / "sft.json"
        self.final = path / "final.json"
        self.metrics = path / "metrics.jsonl"
        self.results = path / "results.json"
        self.plot = path / "reward.png"
        self.adapter = path / "adapter"
        self.checkpoints = path / "checkpoints"
        self.spend = path / "spend.json"

    def claim(self, canonical_job: dict[str, Any]) -> bool:
        """Start a run here, or continue the one already here; True when continuing.

        Refuses a directory that holds a run of a different spec, naming the first difference, and one that cannot
        be written (before any work, rather than when the first file is due).
        """
        try:
            continuing = self._claim(canonical_job)
            self._check_writable()
        except OSError as error:
            reason = error.strerror or str(error)
            raise RunDirectoryUnusable(
                f"--output {self.path} cannot be written ({reason}); pass a directory you can write to"
            ) from None
        return continuing

    def _check_writable(self) -> None:
        fd, probe = tempfile.mkstemp(dir=self.path, prefix=".write-probe.")
        os.close(fd)
        os.unlink(probe)

    def _claim(self, canonical_job: dict[str, Any]) -> bool:
        if self.path.exists() and not self.path.is_dir():
            raise RunDirectoryConflict(f"--output {self.path} is a file; pass a directory (a new one starts a run)")
        if self.job.exists():
            from nodus.trainer.spec import with_current_defaults

            saved = with_current_defaults(self.saved_job())
            difference = first_difference(saved, canonical_job)
            if difference is not None:
                raise RunDirectoryConflict(
                    f"{self.path} holds a run of a different spec ({difference}); to start fresh, pass a new "
                    f"--output directory or remove {self.path}; to continue that run, repeat its spec"
                )
            return True  # only resumable fields may differ: save_spec records them once the run goes on
        if self.path.exists() and any(self.path.iterdir()):
            raise RunDirectoryConflict(
                f"{self.path} exists and is not a nodus run (no job.json); pass an empty or new --output directory"
            )
        write_json_atomic(self.job, canonical_job)
        return False

    def saved_job(self) -> dict[str, Any]:
        """job.json as saved; a damaged one (or one nodus did not write) is named, never overwritten."""
        fix = f"pass a new --output directory, or move {self.path} away to start fresh there"
        try:
            saved = read_json(self.job)
        except (OSError, ValueError) as error:
            raise RunDirectoryConflict(f"{self.job} cannot be read as JSON ({error}); {fix}") from None
        if not (isinstance(saved, dict) and isinstance(saved.get("spec"), dict)):
            raise RunDirectoryConflict(f"{self.job} is not a nodus job spec (no spec mapping); {fix}")
        return saved

    def save_spec(self, canonical_job: dict[str, Any]) -> None:
        """Record the spec this attempt runs with (a changed resumable field, such as a raised cost cap)."""
        if read_json(self.job) != canonical_job:
            write_json_atomic(self.job, canonical_job)

    def complete_checkpoints(self) -> list[Path]:
        """Checkpoints marked complete, oldest first (reads only)."""
        folders = [f for f in self.checkpoints.glob("checkpoint-*") if (f / COMPLETE_MARKER).exists()]
        return sorted(folders, key=lambda folder: int(folder.name.rpartition("-")[2]))

    def latest_checkpoint(self) -> Path | None:
        """The newest complete checkpoint; incomplete ones (a kill during a save) are removed."""
        for folder in self.checkpoints.glob("checkpoint-*"):
            if not (folder / COMPLETE_MARKER).exists():
                shutil.rmtree(folder, ignore_errors=True)
        complete = self.complete_checkpoints()
        return complete[-1] if complete else None

    def mark_complete(self, checkpoint: Path, state: dict[str, Any]) -> None:
        write_json_atomic(checkpoint / COMPLETE_MARKER, state)

    def checkpoint_state(self, checkpoint: Path) -> dict[str, Any]:
        state: dict[str, Any] = read_json(checkpoint / COMPLETE_MARKER)
        return state

    def saved_spend(self) -> float:
        """Wall seconds spent on this run by earlier processes (kept across kills, updated every step)."""
        return float(read_json(self.spend)["seconds"]) if self.spend.exists() else 0.0

    def save_spend(self, seconds: float) -> None:
        write_json_atomic(self.spend, {"seconds": round(seconds, 3)})

    def read_metrics(self) -> list[dict[str, Any]]:
        if not self.metrics.exists():
            return []
        rows = []
        for line in self.metrics.read_text().splitlines():
            try:
                rows.append(json.loads(line))
            except ValueError:  # a line cut by a kill: drop it
                continue
        return rows

    def truncate_metrics(self, last_step: int) -> None:
        """Drop metrics logged after ``last_step``: on resume those steps run again."""
        kept = [row for row in self.read_metrics() if row.get("step", 0) <= last_step]
        tmp = self.metrics.with_suffix(".tmp")
        tmp.write_text("".join(json.dumps(row, sort_keys=True) + "\n" for row in kept))
        os.replace(tmp, self.metrics)

    def append_metrics(self, row: dict[str, Any]) -> None:
        with self.metrics.open("a") as handle:
            handle.write(json.dumps(row, sort_keys=True) + "\n")


def first_difference(saved: Any, wanted: Any, path: str = "") -> str | None:
    """The first field where two specs differ (other than resumable fields), as 'path: old -> new'."""
    if isinstance(saved, dict) and isinstance(wanted, dict):
        for key in sorted(set(saved) | set(wanted)):
            if key in RESUMABLE_CHANGES:
                continue
            found = first_difference(saved.get(key), wanted.get(key), f"{path}.{key}" if path else key)
            if found:
                return found
        return None
    if saved != wanted:
        return f"{path}: {json.dumps(saved)} -> {json.dumps(wanted)}"
    return None
