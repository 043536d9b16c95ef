"""A fingerprint of an environment's tasks, computed here and in subprocesses with other PYTHONHASHSEEDs."""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import subprocess
import sys

from nodus.core.environment import SPLITS, Environment

# Two fixed seeds, compared with each other, so the verdict is the same in every run: the parent's seed is
# random, and comparing it with one fixed seed caught a generator that picks list(set_of_strings)[0] in only 6
# runs of 8. Two seeds can still agree on one such pick (0 and 4242 both put "alpha" first of eight words; 0 and 1
# do not), so the parent is compared too: a chance more to catch it, never a false alarm. 0 is the seed the
# sandbox grades under. A third seed would cost another interpreter start (~0.5 s) in every run.
HASH_SEEDS = ("0", "1")
SUBPROCESS_TIMEOUT_S = 120


def fingerprint(env: Environment, seed: int, count: int) -> str:
    """sha256 over ids, prompts and data of the first ``count`` tasks of both splits."""
    rows = [[task.id, env.prompt_text(task), task.data] for split in SPLITS for task in env.tasks(split, seed, count)]
    return hashlib.sha256(json.dumps(rows, sort_keys=True, ensure_ascii=False).encode()).hexdigest()


def class_path(env: Environment) -> str | None:
    """``module:qualname`` of the environment's class, or None when another process cannot import it."""
    cls = type(env)
    if cls.__module__ == "__main__" or "<locals>" in cls.__qualname__:
        return None
    return f"{cls.__module__}:{cls.__qualname__}"


def fingerprints_in_subprocesses(env: Environment, seed: int, count: int) -> dict[str, str]:
    """The same fingerprint from fresh interpreters, one per seed of HASH_SEEDS (run at once; our sys.path)."""
    path = class_path(env)
    if path is None:
        raise RuntimeError(f"{type(env).__qualname__} is not importable from another process")
    request = json.dumps({"class": path, "params": env.params.model_dump(mode="json"), "seed": seed, "count": count})
    python_path = os.pathsep.join(p for p in sys.path if p)
    running = {
        hash_seed: subprocess.Popen(
            [sys.executable, "-m", "nodus.core.testing.determinism", request],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONHASHSEED": hash_seed, "PYTHONPATH": python_path},
        )
        for hash_seed in HASH_SEEDS
    }
    results: dict[str, str] = {}
    try:
        for hash_seed, process in running.items():
            stdout, stderr = process.communicate(timeout=SUBPROCESS_TIMEOUT_S)
            if process.returncode != 0:
                last = (stderr.strip().splitlines() or [f"exit code {process.returncode}"])[-1][:200]
                raise RuntimeError(f"a subprocess with PYTHONHASHSEED={hash_seed} failed: {last}")
            results[hash_seed] = stdout.strip()
    finally:
        for process in running.values():
            if process.poll() is None:
                process.kill()
                process.wait()
    return results


def _main(argv: list[str]) -> int:
    request = json.loads(argv[0])
    module_name, _, qualname = request["class"].partition(":")
    target: object = importlib.import_module(module_name)
    for part in qualname.split("."):
        target = getattr(target, part)
    if not (isinstance(target, type) and issubclass(target, Environment)):
        raise TypeError(f"{request['class']} is not an Environment subclass")
    print(fingerprint(target(request["params"]), request["seed"], request["count"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(_main(sys.argv[1:]))
