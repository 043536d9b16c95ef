"""`distributed.strategy: FSDP`: one `grpo train` process per device, started with torchrun, sharded with FSDP2.

The command (or the Python API) that asked for FSDP becomes a launcher: it writes the resolved job to a file,
starts `python -m torch.distributed.run --nproc_per_node N -m nodus.trainer.distributed FILE` and waits. Each of
the N processes runs the ordinary `grpo train` code (`nodus.trainer.run.train`) with the process group set up;
`nodus.trainer.ranks.Ranks` decides what happens once. TRL and accelerate do the sharding: the GRPOConfig gets
`fsdp="full_shard auto_wrap"` with FSDP version 2 and full state dicts, which is what saves a loadable adapter
(with FSDP1, peft 0.21 saves an adapter with no tensors; with sharded state dicts the trainer saves nothing).

On CPU (for tests of this machinery; gloo backend) accelerate 1.x silently drops FSDP and trains with DDP:
`allow_fsdp_on_cpu` restores FSDP there. It changes nothing on GPUs.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
from datetime import timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

from nodus.core.errors import NodusError

PROCESS_GROUP_TIMEOUT_HOURS = 6
CHILD_ENV = "NODUS_DISTRIBUTED_CHILD"  # set in the processes torchrun starts: they train instead of launching

# What the GRPOConfig gets under FSDP (transformers' TrainingArguments names).
FSDP_SETTINGS: dict[str, Any] = {
    "fsdp": "full_shard auto_wrap",
    "fsdp_config": {
        "version": 2,
        "state_dict_type": "FULL_STATE_DICT",  # SHARDED_STATE_DICT makes save_model write nothing
        "auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
        "reshard_after_forward": True,
    },
}


class DistributedRunFailed(NodusError):
    """A process of a distributed run exited with an error (its own message was printed above)."""


def in_child() -> bool:
    return os.environ.get(CHILD_ENV) == "1"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def launch(job: Any, options: Any, processes: int) -> dict[str, Any]:
    """Run `job` in `processes` processes and return its results.json."""
    payload = {
        "job": job.canonical(),
        "output": str(options.output),
        "gpu": options.gpu,
        "gpuRate": None if options.gpu_rate is None else str(options.gpu_rate),
        "quiet": options.quiet,
        "reportTo": list(options.report_to),
    }
    with tempfile.NamedTemporaryFile("w", prefix="nodus-job-", suffix=".json", delete=False) as handle:
        json.dump(payload, handle)
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc_per_node={processes}",
        "--master_addr=127.0.0.1",
        f"--master_port={free_port()}",
        "-m",
        "nodus.trainer.distributed",
        handle.name,
    ]
    # One thread per process unless the user chose otherwise (torchrun would set 1 and say so on every run).
    env = {**os.environ, CHILD_ENV: "1", "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    # Its own session, so that stopping the launcher (Ctrl-C, a scheduler's SIGTERM) stops every process with it
    # instead of leaving them training into the run directory.
    process = subprocess.Popen(command, env=env, start_new_session=True)
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        status = process.wait()
    except KeyboardInterrupt:
        _stop(process)
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)
        Path(handle.name).unlink(missing_ok=True)
    if status != 0:
        raise DistributedRunFailed(
            f"the distributed run stopped: a process exited with status {status} (its message is above); "
            f"re-running the same command resumes from the last checkpoint in {options.output}"
        )
    results: dict[str, Any] = json.loads((Path(options.output) / "results.json").read_text())
    return results


def _raise_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def _stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM to torchrun and its processes, then SIGKILL if they have not ended within 30 s."""
    try:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    except ProcessLookupError:
        pass


def allow_fsdp_on_cpu() -> None:
    """Make accelerate keep FSDP on a CPU-only (gloo) process group instead of silently running DDP.

    accelerate's AcceleratorState turns on FSDP only for accelerator device types; on CPU it builds the FSDP plugin
    and drops it (the distributed type stays MULTI_CPU). FSDP2 itself runs on CPU tensors with gloo.
    """
    import torch
    from accelerate import state as accelerate_state
    from accelerate.utils import DistributedType

    original = accelerate_state.AcceleratorState.__init__
    if getattr(original, "_nodus_cpu_fsdp", False):
        return

    def init(self: Any, *args: Any, fsdp_plugin: Any = None, **kwargs: Any) -> None:
        original(self, *args, fsdp_plugin=fsdp_plugin, **kwargs)
        wanted = os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true"
        if fsdp_plugin is not None and wanted and self.distributed_type == DistributedType.MULTI_CPU:
            self.distributed_type = DistributedType.FSDP
            self.fsdp_plugin = fsdp_plugin
            accelerate_state.PartialState._shared_state["distributed_type"] = DistributedType.FSDP
            accelerate_state.PartialState._shared_state["device"] = torch.device("cpu")

    init._nodus_cpu_fsdp = True  # type: ignore[attr-defined]
    accelerate_state.AcceleratorState.__init__ = init


def child_main(job_file: str) -> None:
    """One process of a distributed run (started by torchrun)."""
    import torch
    from accelerate import PartialState
    from nodus.trainer.run import RunOptions, train
    from nodus.trainer.spec import TrainingJob

    payload = json.loads(Path(job_file).read_text())
    on_gpu = torch.cuda.is_available()
    if not on_gpu:
        allow_fsdp_on_cpu()
    # The process group (NCCL on GPUs, gloo on CPU). The other processes wait in a collective while rank 0 grades
    # the held-out tasks and evaluates the result, which can take longer than NCCL's default 10 minutes.
    state = PartialState(cpu=not on_gpu, timeout=timedelta(hours=PROCESS_GROUP_TIMEOUT_HOURS))
    options = RunOptions(
        output=Path(payload["output"]),
        gpu=payload["gpu"],
        gpu_rate=None if payload["gpuRate"] is None else Decimal(payload["gpuRate"]),
        quiet=payload["quiet"],
        report_to=payload["reportTo"],
    )
    try:
        train(TrainingJob.model_validate(payload["job"]), options)
    except NodusError as error:
        where = "" if state.is_main_process else f" (process {state.process_index})"
        print(f"grpo: error{where}: {error}", file=sys.stderr, flush=True)
        sys.exit(2)


if __name__ == "__main__":
    child_main(sys.argv[1])
