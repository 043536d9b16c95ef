"""The contract every environment implements, and the task splits built on it.

An author subclasses :class:`Environment` and writes five methods: ``generate`` (task data from a seeded
RNG), ``prompt_text``, ``grade``, ``reference`` and ``mutations`` (near-misses the conformance kit grades). The base
class owns everything that must be the same for every environment: seeding, the train/held-out split, task ids and
chat formatting.
"""

from __future__ import annotations

import hashlib
import json
import random
from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any, ClassVar, Literal

from nodus.core.errors import InvalidParameters, TaskGenerationError
from nodus.core.ids import EnvId, format_env_id
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic_core import to_jsonable_python

Split = Literal["train", "heldout"]
SPLITS: tuple[Split, ...] = ("train", "heldout")

DEFAULT_TRAIN_TASKS = 200
DEFAULT_HELD_OUT_TASKS = 64
# Split sizes a command accepts: generating a split is linear in its size, so a mistyped count would look like a
# hang rather than an error.
MAX_TRAIN_TASKS = 1_000_000
MAX_HELD_OUT_TASKS = 100_000
# Seeds are 0 .. 2**32 - 1 in every command: the run seeds numpy, torch and TRL with the same number, and numpy
# accepts no other.
MAX_SEED = 2**32 - 1

# A drawn task belongs to the held-out split iff the hash of its prompt falls in the first
# HELD_OUT_BUCKETS of 256 buckets. Deciding by content (not by index) makes the splits disjoint by
# construction: two draws with the same prompt always land in the same split. Changing this changes what
# every version generates, so it is part of the contract.
HELD_OUT_BUCKETS = 32
# How many draws a split may take per task it needs before we decide the parameter space is too small.
MAX_DRAWS_PER_TASK = 64
# What an environment without mutations() is told, by the base method and by the conformance kit.
MISSING_MUTATIONS = (
    "the environment has no mutations(task) method; add one returning wrong-but-close completions that must score "
    "below 1, e.g. def mutations(self, task): return [str(task.data['answer'] + 1)]"
)


class Task(BaseModel):
    """One task of one split. ``data`` is the environment's own JSON-able description of it."""

    model_config = ConfigDict(frozen=True)

    env: str = Field(description="Canonical id of the environment, e.g. graph-coloring@1.")
    id: str = Field(description="Stable id, unique within (env, parameters, seed).")
    split: Split
    seed: int
    index: int = Field(description="Position in its split, from 0.")
    draw: int = Field(description="Which draw of the seeded stream produced it (for reproduction).")
    data: dict[str, Any]


class Grade(BaseModel):
    """The grader's verdict on one completion."""

    # A grader that builds a Grade and then adjusts it (grade.score += bonus) is held to the same bounds.
    model_config = ConfigDict(validate_assignment=True)

    score: float = Field(ge=0.0, le=1.0)
    passed: bool
    details: str = Field(description="Why: the reason for a failure, or what was checked.")


class EmptyParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Environment(ABC):
    """Base class of every environment. Subclasses set the class attributes and the five methods."""

    namespace: ClassVar[str] = "nodus"
    name: ClassVar[str]
    version: ClassVar[int]
    description: ClassVar[str]
    Params: ClassVar[type[BaseModel]] = EmptyParams
    system_prompt: ClassVar[str | None] = None
    # Overrides of nodus.sandbox.SandboxLimits fields for this environment's grader.
    sandbox_limits: ClassVar[dict[str, Any]] = {}
    # True for environments that run model-written code: each completion then runs isolated from the others.
    isolate_each_completion: ClassVar[bool] = False
    # Parameters that change only how completions are graded, not which tasks are drawn: they are left out
    # of the seed, so turning on e.g. partial credit keeps the same held-out tasks.
    grading_params: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, params: BaseModel | Mapping[str, Any] | None = None) -> None:
        self.params: Any = validate_params(type(self), params)

    # --- what an author writes -------------------------------------------------------------------------

    @abstractmethod
    def generate(self, rng: random.Random) -> dict[str, Any]:
        """Return the JSON-able data of one task drawn with ``rng`` (the only source of randomness)."""

    @abstractmethod
    def prompt_text(self, task: Task) -> str:
        """The user message that poses the task."""

    @abstractmethod
    def grade(self, task: Task, completion: str) -> Grade:
        """Grade a completion. Must not raise for any text: a bad completion scores 0 with the reason."""

    @abstractmethod
    def reference(self, task: Task) -> str:
        """A completion that scores 1.0: used by tests, property checks and SFT warm-up."""

    def mutations(self, task: Task) -> list[str]:
        """Wrong-but-close completions of ``task`` that must score below 1: the reference with a digit changed, two
        colors swapped, a sign flipped, the answer outside its tags.

        The conformance kit (``grpo check``) grades them to show the grader is not gullible: one that passes anything
        shaped like an answer fails. Not abstract, so that an environment without it still loads and runs, but the kit
        fails until it is written (an empty default would pass that check without checking anything)."""
        raise NotImplementedError(MISSING_MUTATIONS)

    def warm_up(self) -> None:
        """Load what grading needs (lazy imports, compiled patterns, tables) before the first grade.

        The sandbox calls it once per worker before a completion's wall-time limit starts, so that loading the
        grader is never charged to a completion (a correct answer that ran into the limit while a library was
        imported would score 0). Override it when ``grade`` imports or builds something on first use. It must
        finish within 12 s (``nodus.sandbox.worker.PREPARE_LIMIT_S``), or grading fails as the grader's error."""
        return None  # nothing to load by default

    # --- what the framework provides -------------------------------------------------------------------

    @classmethod
    def env_id(cls) -> EnvId:
        return EnvId(cls.namespace, cls.name, cls.version)

    @classmethod
    def id_text(cls) -> str:
        return format_env_id(cls.env_id())

    def prompt(self, task: Task) -> list[dict[str, str]]:
        """The task as chat messages, the form trainers and chat templates take."""
        messages = [] if self.system_prompt is None else [{"role": "system", "content": self.system_prompt}]
        return [*messages, {"role": "user", "content": self.prompt_text(task)}]

    def seed_inputs(self) -> list[Any]:
        """What, besides the id, seed and draw, decides which tasks are drawn: the generation parameters.

        An environment backed by a data file overrides this to give the file's content digest in place of its
        path, so a moved file draws the same tasks and an edited one different tasks.
        """
        return [seed_params(self.params, exclude=set(self.grading_params))]

    def draw_rng(self, seed: int, draw: int) -> random.Random:
        """The RNG of one draw: a pure function of (id, version, seed inputs, seed, draw).

        Seeded from a SHA-256 of canonical JSON, never from ``hash()`` (which PYTHONHASHSEED changes) and
        never from the global RNG, so every process and machine draws the same task.
        """
        material = json.dumps([self.id_text(), *self.seed_inputs(), seed, draw], sort_keys=True, separators=(",", ":"))
        return random.Random(int.from_bytes(hashlib.sha256(material.encode()).digest()[:16], "big"))

    def split_key(self, task: Task) -> str:
        """What makes two tasks the same problem, for the split: by default the prompt text.

        Override it when one problem can be worded several ways (e.g. the prompt picks among templates): return
        the problem itself (say, canonical JSON of the numbers), so that no rewording of a held-out problem lands
        in the train split. It decides which tasks a version draws: changing it needs a new version."""
        return self.prompt_text(task)

    def split_of(self, key: str) -> Split:
        bucket = hashlib.sha256(key.encode()).digest()[0]
        return "heldout" if bucket < HELD_OUT_BUCKETS else "train"

    def tasks(self, split: Split, seed: int, count: int) -> list[Task]:
        """The first ``count`` tasks of ``split`` for ``seed``.

        Both splits come from one seeded stream of draws; each draw goes to the split its split key (by default
        its prompt) hashes to, and a key already taken is skipped. So no problem is ever in both splits or twice in
        one, and the first k tasks of a split never depend on how many tasks the other split has.
        """
        if split not in SPLITS:
            raise TaskGenerationError(f"unknown split {split!r}: use one of {', '.join(SPLITS)}")
        if count < 0:
            raise TaskGenerationError(f"the number of tasks must be 0 or more, got {count}")
        tasks: list[Task] = []
        seen: set[str] = set()
        max_draws = MAX_DRAWS_PER_TASK * count + 1024
        draw = 0
        while len(tasks) < count:
            if draw >= max_draws:
                raise TaskGenerationError(
                    f"{self.id_text()} with parameters {self.params.model_dump(mode='json')} yields only "
                    f"{len(tasks)} distinct {split} tasks in {max_draws} draws; ask for fewer tasks or use "
                    "parameters with more possible tasks"
                )
            data = self.generate(self.draw_rng(seed, draw))
            if not isinstance(data, Mapping):  # else pydantic's "1 validation error for Task" says nothing of why
                raise TaskGenerationError(
                    f"{type(self).__name__}.generate() returned a {type(data).__name__}, not a dict; return the "
                    "task's data as a dict of JSON values, e.g. {'numbers': [3, 1, 2]}"
                )
            candidate = Task(env=self.id_text(), id="", split=split, seed=seed, index=len(tasks), draw=draw, data=data)
            key = self.split_key(candidate)
            if self.split_of(key) == split and key not in seen:
                seen.add(key)
                tasks.append(candidate.model_copy(update={"id": f"{split}-{seed}-{len(tasks)}"}))
            draw += 1
        return tasks

    def task(self, split: Split, seed: int, index: int) -> Task:
        if index < 0:
            raise TaskGenerationError(f"task index must be 0 or more, got {index}")
        return self.tasks(split, seed, index + 1)[index]

    def task_from_dict(self, payload: Mapping[str, Any]) -> Task:
        task = Task.model_validate(payload)
        if task.env != self.id_text():
            raise TaskGenerationError(f"task {task.id} belongs to {task.env}, not to {self.id_text()}")
        return task


def seed_params(params: BaseModel, exclude: set[str]) -> Any:
    """``params`` as JSON for the seed, with every set and frozenset (at any depth) in sorted order.

    Pydantic lists a set in iteration order, which for str elements PYTHONHASHSEED changes: the same parameters drew
    other tasks in every process. Parameters without a set are dumped exactly as before, so what every environment
    version draws stays the same.
    """
    raw = params.model_dump(exclude=exclude)
    if not _has_set(raw):
        return params.model_dump(mode="json", exclude=exclude)
    return to_jsonable_python(_sort_sets(raw))


def _has_set(value: Any) -> bool:
    if isinstance(value, (set, frozenset)):
        return True
    if isinstance(value, Mapping):
        return any(_has_set(item) for item in value.values())
    return isinstance(value, (list, tuple)) and any(_has_set(item) for item in value)


def _sort_sets(value: Any) -> Any:
    """``value`` with each set a list sorted by its elements' canonical JSON (elements may be of mixed types)."""
    if isinstance(value, (set, frozenset)):
        items = [_sort_sets(item) for item in value]
        return sorted(items, key=lambda item: json.dumps(to_jsonable_python(item), sort_keys=True))
    if isinstance(value, Mapping):
        return {key: _sort_sets(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_sort_sets(item) for item in value]
    return value


def validate_params(cls: type[Environment], params: BaseModel | Mapping[str, Any] | None) -> BaseModel:
    """Validate user parameters against ``cls.Params``; a failure is one line naming the field and rule."""
    if isinstance(params, cls.Params):
        return params
    raw = dict(params.model_dump() if isinstance(params, BaseModel) else params or {})
    # Whatever the author's Params config says about extra keys: a misspelt parameter must not be ignored silently.
    names = {alias for name, f in cls.Params.model_fields.items() for alias in (name, f.alias) if alias}
    unknown = sorted(set(raw) - names)
    if unknown:
        known = ", ".join(cls.Params.model_fields) or "none"
        raise InvalidParameters(f"unknown parameter {unknown[0]!r} for {cls.id_text()}; its parameters are: {known}")
    try:
        return cls.Params.model_validate(raw)
    except ValidationError as error:
        first = error.errors()[0]
        field = ".".join(str(part) for part in first["loc"])
        known = ", ".join(cls.Params.model_fields) or "none"
        if first["type"] == "extra_forbidden":
            raise InvalidParameters(
                f"unknown parameter {field!r} for {cls.id_text()}; its parameters are: {known}"
            ) from None
        message = first["msg"].removeprefix("Value error, ")
        what = f"parameter {field}={first.get('input')!r}" if first["loc"] else f"parameters {raw}"
        raise InvalidParameters(
            f"invalid {what} for {cls.id_text()}: {message}; "
            f"see 'grpo envs --env {cls.id_text()}' for the parameters and their bounds"
        ) from None
