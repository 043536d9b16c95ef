"""Shared fixtures: a tiny in-process environment plugin, so core tests need no installed distribution."""

from __future__ import annotations

import random
import types
from typing import Any

import pytest
from nodus.core import Environment, Grade, Task, hookimpl
from nodus.core.plugins import get_plugin_manager
from nodus.core.registry import Registry
from pydantic import BaseModel, ConfigDict, Field


class EchoParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    digits: int = Field(3, ge=1, le=6)
    strict: bool = False


class EchoNumber(Environment):
    """Repeat a number: the smallest possible environment, with a parameter space we control."""

    namespace = "test"
    name = "echo"
    version = 1
    description = "Repeat the number."
    Params = EchoParams
    grading_params = frozenset({"strict"})

    def generate(self, rng: random.Random) -> dict[str, Any]:
        return {"number": rng.randrange(10**self.params.digits)}

    def prompt_text(self, task: Task) -> str:
        return f"Repeat {task.data['number']}."

    def grade(self, task: Task, completion: str) -> Grade:
        ok = completion.strip() == str(task.data["number"])
        return Grade(score=float(ok), passed=ok, details="equal" if ok else "different")

    def reference(self, task: Task) -> str:
        return str(task.data["number"])


class EchoNumberV2(EchoNumber):
    version = 2


def plugin_module(name: str, *classes: type[Environment]) -> types.ModuleType:
    module = types.ModuleType(name)

    @hookimpl
    def nodus_register_environments(register: Any) -> None:
        for cls in classes:
            register(cls)

    module.nodus_register_environments = nodus_register_environments  # type: ignore[attr-defined]
    return module


@pytest.fixture
def registry(monkeypatch: pytest.MonkeyPatch) -> Registry:
    monkeypatch.setenv("NODUS_DISABLE_PLUGIN_AUTOLOAD", "1")
    pm = get_plugin_manager()
    pm.register(plugin_module("echo_plugin", EchoNumber, EchoNumberV2), name="echo_plugin")
    return Registry.from_plugin_manager(pm)
