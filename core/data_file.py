"""Environments whose tasks come from a generator, or from the user's data file (the ``data`` parameter)."""

from __future__ import annotations

import copy
import random
from abc import abstractmethod
from functools import cached_property
from typing import Any, Protocol

from nodus.core.environment import Environment, seed_params


class DataFile(Protocol):
    """The loaded records of a task file, and a digest of their content (not of the path or the order)."""

    @property
    def records(self) -> tuple[dict[str, Any], ...]: ...

    @property
    def digest(self) -> str: ...


class FileBackedEnvironment(Environment):
    """Built-in tasks from ``generate_built_in``, or records of ``params.data`` when it is set.

    The file is seeded by its content digest in place of its path: a changed file draws different tasks, a moved
    or reordered one the same. It is loaded on first use, not in ``__init__``: a sandbox worker rebuilding the
    environment to grade needs only ``task.data``, and the file need not exist inside the jail.
    """

    @abstractmethod
    def load_data_file(self, path: str) -> DataFile:
        """Read and validate ``path``; a bad file is a one-line NodusError naming the file, line and fix."""

    @abstractmethod
    def generate_built_in(self, rng: random.Random) -> dict[str, Any]:
        """One built-in task drawn with ``rng``."""

    @cached_property
    def data_file(self) -> DataFile | None:
        return None if self.params.data is None else self.load_data_file(self.params.data)

    def seed_inputs(self) -> list[Any]:
        if self.data_file is None:
            return super().seed_inputs()
        return [seed_params(self.params, exclude={"data", *self.grading_params}), self.data_file.digest]

    def generate(self, rng: random.Random) -> dict[str, Any]:
        if self.data_file is None:
            return self.generate_built_in(rng)
        return copy.deepcopy(dict(rng.choice(self.data_file.records)))
