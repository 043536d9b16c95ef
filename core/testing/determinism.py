"""A fingerprint of an environment's tasks, computed here and in a subprocess with another PYTHONHASHSEED."""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import subprocess
import sys

from nodus.core.environment import SPLITS, Environment

OTHER_HASH_SEED = "4242"
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


def fingerprint_in_subprocess(env: Environment, seed: int, count: int) -> str:
    """The same fingerprint from a fresh interpreter with a different PYTHONHASHSEED (and our sys.path)."""
    path = class_path(env)
    if path is None:
        raise RuntimeError(f"{type(env).__qualname__} is not importable from another process")
    request = json.dumps({"class": path, "params": env.params.model_dump(mode="json"), "seed": seed, "count": count})
    environ = {**os.environ, "PYTHONHASHSEED": OTHER_HASH_SEED, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    result = subprocess.run(
        [sys.executable, "-m", "nodus.core.testing.determinism", request],
        capture_output=True,
        text=True,
        env=environ,
        timeout=SUBPROCESS_TIMEOUT_S,
        check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(f"subprocess failed: {result.stderr.strip().splitlines()[-1:] or result.returncode}")
    return result.stdout.strip()


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
