"""An environment's tasks, drawn here and in subprocesses with other PYTHONHASHSEEDs, and where two draws differ."""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import subprocess
import sys
from typing import Any

from nodus.core.environment import SPLITS, Environment

# Fixed seeds, compared with each other, so the verdict is the same in every run: the parent's seed is random, and
# comparing it with one fixed seed caught a generator that picks list(set_of_strings)[0] in only 6 runs of 8. Two
# seeds agree on the first of a random set of 3 to 12 words 18% of the time (0 and 1 both put "alpha" first of the
# eight Greek letters); four agree about 1% of the time (measured on 3000 such sets), and the parent is compared too:
# a chance more to catch it, never a false alarm. 0 is the seed the sandbox grades under. The subprocesses run at
# once: on two cores the four cost ~0.5 s more than two did, on more cores about nothing.
HASH_SEEDS = ("0", "1", "2", "3")
SUBPROCESS_TIMEOUT_S = 120
# Why generate() may differ between processes, said with the first difference found.
USUAL_CAUSES = (
    "the usual causes are iterating over a set (sort it first, or use a list) and hash() of a str (use hashlib)"
)


def task_rows(env: Environment, seed: int, count: int) -> list[dict[str, Any]]:
    """Id, prompt and data of the first ``count`` tasks of both splits, as JSON values (as another process sends
    them): what must be the same in every process."""
    rows = [
        {"id": task.id, "draw": task.draw, "prompt": env.prompt_text(task), "data": task.data}
        for split in SPLITS
        for task in env.tasks(split, seed, count)
    ]
    return list(json.loads(canonical(rows)))


def digest(rows: list[dict[str, Any]]) -> str:
    """sha256 of task rows: equal iff they are."""
    return hashlib.sha256(canonical(rows).encode()).hexdigest()


def canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False, default=repr)


def first_difference(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> str:
    """Where two lists of task rows first differ: ``task train-42-0 (draw 0) data['label']: 'alpha' vs 'eta'``.

    Tasks of the same draw are compared first: they come from the same RNG, so what differs is what generate() did
    besides it. (By position, a changed prompt moves a draw to the other split, and the tasks compared would be two
    different draws.)"""
    same_draw = {row.get("draw"): row for row in b}
    pairs = [(row, same_draw[row.get("draw")]) for row in a if row.get("draw") in same_draw]
    for row_a, row_b in [*pairs, *zip(a, b, strict=False)]:
        for field in ("data", "prompt", "id"):  # the data first: the prompt is usually made from it
            where = _difference(row_a.get(field), row_b.get(field), field)
            if where is not None:
                return f"task {row_a.get('id')} (draw {row_a.get('draw')}) {where}"
    return f"{len(a)} tasks vs {len(b)}"


def _difference(a: Any, b: Any, path: str) -> str | None:
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b), key=str):
            if key not in a or key not in b:
                return f"{path} has the key {key!r} in one draw only"
            where = _difference(a[key], b[key], f"{path}[{key!r}]")
            if where is not None:
                return where
        return None
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for index, (item_a, item_b) in enumerate(zip(a, b, strict=True)):
            where = _difference(item_a, item_b, f"{path}[{index}]")
            if where is not None:
                return where
        return None
    if canonical(a) == canonical(b):
        return None
    return f"{path}: {_short(a)} vs {_short(b)}"


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def class_path(env: Environment) -> str | None:
    """``module:qualname`` of the environment's class, or None when another process cannot import it."""
    cls = type(env)
    if cls.__module__ == "__main__" or "<locals>" in cls.__qualname__:
        return None
    return f"{cls.__module__}:{cls.__qualname__}"


def rows_in_subprocesses(env: Environment, seed: int, count: int) -> dict[str, list[dict[str, Any]]]:
    """The same task rows from fresh interpreters, one per seed of HASH_SEEDS (run at once; our sys.path)."""
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
    results: dict[str, list[dict[str, Any]]] = {}
    try:
        for hash_seed, process in running.items():
            stdout, stderr = process.communicate(timeout=SUBPROCESS_TIMEOUT_S)
            if process.returncode != 0:
                last = (stderr.strip().splitlines() or [f"exit code {process.returncode}"])[-1][:200]
                raise RuntimeError(f"a subprocess with PYTHONHASHSEED={hash_seed} failed: {last}")
            # The last line: what generate() or an import printed comes before it.
            results[hash_seed] = json.loads((stdout.strip().splitlines() or ["null"])[-1])
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
    print(canonical(task_rows(target(request["params"]), request["seed"], request["count"])))
    return 0


if __name__ == "__main__":
    raise SystemExit(_main(sys.argv[1:]))
