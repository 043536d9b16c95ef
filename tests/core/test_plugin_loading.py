"""Broken plugins, as a plugin author breaks them: each is a real distribution (a dist-info folder and a module on
sys.path, as pip installs them), is left out with one line naming it and the fix, and never hides the others."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from nodus.core.cli import cli
from nodus.core.errors import PluginLoadError, UnknownEnvironment, UnknownVersion
from nodus.core.plugins import DISABLE_AUTOLOAD_ENV, get_plugin_manager
from nodus.core.registry import get_registry

Install = Callable[..., None]

# A minimal environment; a test changes one thing in it to break it the way an author would.
ENVIRONMENT = """\
import random
from nodus.core import Environment, Grade, Task, hookimpl
from pydantic import BaseModel, ConfigDict, Field


class Params(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    count: int = COUNT_FIELD


class WordCount(Environment):
    name = "ENV_NAME"
    version = VERSION
    description = "Count the words."
    Params = Params
    grading_params = frozenset(GRADING_PARAMS)

    def generate(self, rng: random.Random) -> dict:
        return {"n": rng.randint(1, 10**6)}

    def prompt_text(self, task: Task) -> str:
        return f"Say {task.data['n']}."

    def grade(self, task: Task, completion: str) -> Grade:
        return Grade(score=1.0, passed=True, details="ok")

    def reference(self, task: Task) -> str:
        return str(task.data["n"])


"""
REGISTER = "@hookimpl\ndef nodus_register_environments(register):\n    register(WordCount)\n"


def environment(
    hook: str = REGISTER,
    name: str = "word-count",
    version: str = "1",
    count_field: str = "Field(4, ge=2, le=20)",
    grading_params: str = "()",
) -> str:
    replacements = {
        "ENV_NAME": name, "VERSION": version, "COUNT_FIELD": count_field, "GRADING_PARAMS": grading_params
    }
    source = ENVIRONMENT
    for placeholder, value in replacements.items():
        source = source.replace(placeholder, value)
    return source + hook


@pytest.fixture
def install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Install]:
    """``install(distribution, source)`` puts a distribution on sys.path: its module (named after it, from
    ``source`` unless None) and a ``nodus`` entry point, ``word_count`` unless ``entry_points`` says otherwise."""
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv(DISABLE_AUTOLOAD_ENV, raising=False)

    def install_one(distribution: str, source: str | None, entry_points: dict[str, str] | None = None) -> None:
        module = distribution.replace("-", "_")
        if source is not None:
            (tmp_path / f"{module}.py").write_text(source)
        dist_info = tmp_path / f"{module}-0.1.0.dist-info"
        dist_info.mkdir()
        (dist_info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {distribution}\nVersion: 0.1.0\n")
        lines = "".join(f"{name} = {target}\n" for name, target in (entry_points or {"word_count": module}).items())
        (dist_info / "entry_points.txt").write_text(f"[nodus]\n{lines}")
        importlib.invalidate_caches()  # the import system and importlib.metadata cache directory listings

    yield install_one
    for name, module in list(sys.modules.items()):
        if str(getattr(module, "__file__", None) or "").startswith(str(tmp_path)):
            del sys.modules[name]


def only_error(install: Install, distribution: str, source: str) -> str:
    """Install one plugin built from ``source``; check it is left out alone, and return its one load error."""
    install(distribution, source)
    registry = get_registry()
    assert registry.resolve("graph-coloring@1").spec.env_id.name == "graph-coloring"
    assert [str(spec.env_id) for spec in registry.all() if spec.env_id.name == "word-count"] == []
    (error,) = registry.load_errors
    assert "\n" not in str(error)
    return str(error)


@pytest.mark.parametrize(
    ("hook", "message"),
    [
        (  # a misspelt hook name: pluggy would report it only in check_pending, for every plugin at once
            "@hookimpl\ndef nodus_register_environment(register):\n    register(WordCount)\n",
            "implements unknown hook 'nodus_register_environment'; nodus hooks: nodus_register_environments(register)",
        ),
        (
            "@hookimpl\ndef nodus_register_environments(regster):\n    regster(WordCount)\n",
            "has an invalid hook implementation (hookimpl definition: nodus_register_environments(regster); "
            "Argument(s) {'regster'} are declared in the hookimpl but can not be found in the hookspec); nodus hooks: "
            "nodus_register_environments(register)",
        ),
        (
            "@hookimpl\ndef nodus_register_environments(register):\n    register(WordCount())\n",
            "registered an instance of WordCount, which is not a nodus.core.Environment subclass; register(...) "
            "takes the environment class",
        ),
        (  # it stopped midway: what it registered so far is dropped too
            "@hookimpl\ndef nodus_register_environments(register):\n    register(WordCount)\n    1 / 0\n",
            "failed while registering its environments (ZeroDivisionError: division by zero); reinstall or upgrade it",
        ),
    ],
)
def test_a_hook_mistake_is_reported_and_only_that_plugin_skipped(install: Install, hook: str, message: str) -> None:
    error = only_error(install, "nodus-env-word-count", environment(hook=hook))
    assert error == f"plugin 'word_count' from nodus-env-word-count 0.1.0 {message}"


def test_without_a_list_of_errors_a_hook_mistake_raises_one_line(install: Install) -> None:
    hook = "@hookimpl\ndef nodus_register_environment(register):\n    register(WordCount)\n"
    install("nodus-env-word-count", environment(hook=hook))
    with pytest.raises(PluginLoadError, match=r"^plugin 'word_count' from nodus-env-word-count 0.1.0 implements"):
        get_plugin_manager()


@pytest.mark.parametrize(
    ("version", "shown"), [('"1.0"', "'1.0'"), ("1.0", "1.0"), ('"1"', "'1'"), ("0", "0"), ("True", "True")]
)
def test_an_invalid_version_skips_only_that_plugin(install: Install, version: str, shown: str) -> None:
    assert only_error(install, "nodus-env-word-count", environment(version=version)) == (
        f"plugin 'word_count' from nodus-env-word-count 0.1.0 registered WordCount with namespace='nodus', "
        f"name='word-count', version={shown}; a namespace and a name are lower-case letters and digits in words "
        "joined by single hyphens and the version is a positive int, e.g. name = 'graph-coloring', version = 1"
    )


def test_an_invalid_name_skips_only_that_plugin(install: Install) -> None:
    assert only_error(install, "nodus-env-word-count", environment(name="Word_Count")).startswith(
        "plugin 'word_count' from nodus-env-word-count 0.1.0 registered WordCount with namespace='nodus', "
        "name='Word_Count', version=1; a namespace and a name are lower-case"
    )


@pytest.mark.parametrize(
    ("count_field", "problem"),
    [
        ("Field(50, ge=2, le=20)", "default count=50 fails validation: Input should be less than or equal to 20"),
        ("Field(5, ge=10, le=2)", "default count=5 fails validation: Input should be less than or equal to 2"),
        ("Field(ge=2)", "field 'count' has no default"),
    ],
)
def test_a_default_outside_its_own_bounds_is_reported(install: Install, count_field: str, problem: str) -> None:
    assert only_error(install, "nodus-env-word-count", environment(count_field=count_field)) == (
        f"plugin 'word_count' from nodus-env-word-count 0.1.0 registered WordCount, whose Params {problem}; give "
        "every parameter a default within its own bounds"
    )


def test_grading_params_must_name_parameters(install: Install) -> None:
    assert only_error(install, "nodus-env-word-count", environment(grading_params='{"strict", "count"}')) == (
        "plugin 'word_count' from nodus-env-word-count 0.1.0 registered WordCount, whose grading_params names "
        "'strict', not a field of Params; its fields are: count"
    )


def test_a_bad_class_leaves_out_only_itself(install: Install) -> None:
    # The plugin's other environment still works: the mistake is in one class, not in the plugin.
    source = environment(count_field="Field(50, ge=2, le=20)", hook="") + (
        "from nodus.core.environment import EmptyParams\n\n\n"
        "class WordCountV2(WordCount):\n    version = 2\n    Params = EmptyParams\n\n\n"
        "@hookimpl\ndef nodus_register_environments(register):\n    register(WordCount)\n    register(WordCountV2)\n"
    )
    install("nodus-env-word-count", source)
    registry = get_registry()
    assert registry.resolve("word-count").spec.env_id.version == 2
    (error,) = registry.load_errors
    assert str(error).startswith("plugin 'word_count' from nodus-env-word-count 0.1.0 registered WordCount, whose")
    with pytest.raises(UnknownVersion) as raised:  # the version left out says why, and only that
        registry.resolve("word-count@1")
    assert str(raised.value) == f"word-count@1 is installed but cannot be used: {error}"


def test_a_plugin_without_hookimpl_is_reported_and_not_offered_for_install(install: Install) -> None:
    hook = "def nodus_register_environments(register):\n    register(WordCount)\n"  # @hookimpl dropped
    assert only_error(install, "nodus-env-word-count", environment(hook=hook)) == (
        "plugin 'word_count' from nodus-env-word-count 0.1.0 registered no environments: nodus_env_word_count has "
        "no nodus_register_environments marked @hookimpl; decorate it with @hookimpl (from nodus.core import "
        "hookimpl), or point the entry point at the module that defines it"
    )
    with pytest.raises(UnknownEnvironment) as raised:
        get_registry().resolve("word-count@1")
    message = str(raised.value)
    assert "pip install" not in message
    assert message.startswith("no environment named 'word-count' is installed; installed: graph-coloring")
    assert (
        "; nodus-env-word-count 0.1.0 is installed but provides no 'word-count' environment; 'grpo envs' lists what "
        "it provides and any error loading it; note: plugin 'word_count' from nodus-env-word-count 0.1.0 registered "
        "no environments: "
    ) in message


def test_a_hook_that_registers_nothing_is_reported(install: Install) -> None:
    hook = "@hookimpl\ndef nodus_register_environments(register):\n    pass\n"
    assert only_error(install, "nodus-env-word-count", environment(hook=hook)) == (
        "plugin 'word_count' from nodus-env-word-count 0.1.0 registered no environments: its "
        "nodus_register_environments never called register(...); call register(YourEnvironment) for each "
        "environment class"
    )


def test_the_same_id_from_two_distributions_keeps_neither_and_names_both(install: Install) -> None:
    install("nodus-env-word-count", environment())
    install("word-count-fork", environment(), {"fork": "word_count_fork"})
    registry = get_registry()
    assert registry.resolve("graph-coloring@1").spec.env_id.name == "graph-coloring"
    duplicate = (
        "environment word-count@1 is registered by nodus-env-word-count 0.1.0 and word-count-fork 0.1.0, so it is "
        "left out; uninstall all but one of them"
    )
    assert [str(error) for error in registry.load_errors] == [duplicate]
    with pytest.raises(UnknownEnvironment) as raised:
        registry.resolve("word-count@1")
    assert str(raised.value) == f"word-count@1 is installed but cannot be used: {duplicate}"


def test_asking_for_an_id_left_out_gives_its_own_error_alone(install: Install) -> None:
    # It led with "did you mean 'word-len'?" and then every other plugin's load error, in one "line".
    broken_site(install)
    install("nodus-env-word-len", environment(name="word-len"), {"word_len": "nodus_env_word_len"})
    install("nodus-env-word-count", environment())
    install("word-count-fork", environment(), {"fork": "word_count_fork"})
    registry = get_registry()
    assert len(registry.load_errors) == 4
    for asked in ("word-count", "word-count@1"):
        with pytest.raises(UnknownEnvironment) as raised:
            registry.resolve(asked)
        assert str(raised.value) == (
            f"{asked} is installed but cannot be used: environment word-count@1 is registered by nodus-env-word-count "
            "0.1.0 and word-count-fork 0.1.0, so it is left out; uninstall all but one of them"
        )


def test_an_abstract_class_is_left_out_when_it_loads(install: Install) -> None:
    # It was listed by grpo envs, and grpo tasks and check then failed with a TypeError traceback.
    source = environment(hook="") + (
        "from abc import abstractmethod\n\n\n"
        "class Unfinished(WordCount):\n    @abstractmethod\n    def grade(self, task, completion): ...\n\n\n"
        "@hookimpl\ndef nodus_register_environments(register):\n    register(Unfinished)\n"
    )
    error = only_error(install, "nodus-env-word-count", source)
    assert error == (
        "plugin 'word_count' from nodus-env-word-count 0.1.0 registered Unfinished, which leaves abstract methods "
        "unimplemented: grade; define each in the class, without @abstractmethod"
    )
    with pytest.raises(UnknownEnvironment) as raised:
        get_registry().resolve("word-count@1")
    assert str(raised.value) == f"word-count@1 is installed but cannot be used: {error}"


def test_grpo_envs_json_shows_defaults_that_are_not_json_values(install: Install) -> None:
    # One plugin's date default made grpo envs --json fail with a TypeError traceback for everyone.
    source = environment(hook="") + (
        "import datetime\n\n\n"
        "class DatedParams(Params):\n"
        "    start: datetime.date = datetime.date(2024, 1, 1)\n"
        "    tags: frozenset[str] = frozenset({'b', 'a'})\n\n\n"
        "class Dated(WordCount):\n    name = 'dated'\n    Params = DatedParams\n\n\n"
        "@hookimpl\ndef nodus_register_environments(register):\n    register(Dated)\n"
    )
    install("nodus-env-dated", source)
    result = CliRunner().invoke(cli, ["envs", "--json"])
    assert result.exit_code == 0, result.output
    (row,) = [row for row in json.loads(result.stdout) if row["id"] == "dated@1"]
    parameters = row["parameters"]
    assert (parameters["count"]["default"], parameters["start"]["default"]) == (4, "2024-01-01")
    assert sorted(parameters["tags"]["default"]) == ["a", "b"]


def test_two_distributions_may_use_the_same_entry_point_name(install: Install) -> None:
    # Both scaffolded as word_count: the second must not be silently dropped for the name alone.
    install("nodus-env-word-count", environment())
    install("nodus-env-word-len", environment(name="word-len"))
    registry = get_registry()
    assert registry.load_errors == []
    assert registry.resolve("word-count@1").spec.distribution == "nodus-env-word-count 0.1.0"
    assert registry.resolve("word-len@1").spec.distribution == "nodus-env-word-len 0.1.0"


def test_two_entry_points_to_one_module_are_reported(install: Install) -> None:
    install("nodus-env-word-count", environment(), {"a": "nodus_env_word_count"})
    install("nodus-env-copy", None, {"b": "nodus_env_word_count"})
    registry = get_registry()
    assert registry.resolve("word-count@1").spec.distribution in {"nodus-env-word-count 0.1.0", "nodus-env-copy 0.1.0"}
    (error,) = registry.load_errors
    assert "loads the same module as plugin" in str(error) and "remove one of the two entry points" in str(error)


def broken_site(install: Install) -> None:
    typo = "@hookimpl\ndef nodus_register_environment(register):\n    pass\n"
    install("nodus-env-typo", environment(hook=typo), {"typo": "nodus_env_typo"})
    bad_default = environment(count_field="Field(50, le=20)", name="bad-default")
    install("nodus-env-bad-default", bad_default, {"bad_default": "nodus_env_bad_default"})
    # A default of the wrong type made pydantic print a serializer warning on every command, whatever its env.
    wrong_type = environment(count_field='Field("five")', name="wrong-type")
    install("nodus-env-wrong-type", wrong_type, {"wrong_type": "nodus_env_wrong_type"})


def test_grpo_envs_lists_the_healthy_and_warns_once_per_broken_plugin(install: Install, tmp_path: Path) -> None:
    broken_site(install)
    # The installed console script, as a user runs it: no traceback, one warning line per broken plugin.
    result = subprocess.run(
        [str(Path(sys.executable).with_name("grpo")), "envs"], capture_output=True, text=True, timeout=60,
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("graph-coloring@1  nodus-env-graph-coloring 0.1.0  Color a graph")
    assert result.stderr.splitlines() == [
        "warning: plugin 'typo' from nodus-env-typo 0.1.0 implements unknown hook 'nodus_register_environment'; "
        "nodus hooks: nodus_register_environments(register)",
        "warning: plugin 'bad_default' from nodus-env-bad-default 0.1.0 registered WordCount, whose Params default "
        "count=50 fails validation: Input should be less than or equal to 20; give every parameter a default "
        "within its own bounds",
        "warning: plugin 'wrong_type' from nodus-env-wrong-type 0.1.0 registered WordCount, whose Params default "
        "count='five' fails validation: Input should be a valid integer, unable to parse string as an integer; give "
        "every parameter a default within its own bounds",
    ]


def test_grpo_tasks_of_a_healthy_environment_works_beside_broken_plugins(install: Install) -> None:
    broken_site(install)
    result = CliRunner().invoke(cli, ["tasks", "--env", "graph-coloring@1", "--split", "heldout", "-n", "1"])
    assert result.exit_code == 0, result.output
    assert "Vertices: 0, 1, 2" in result.stdout


def test_grpo_check_without_a_sandbox_warns_once(install: Install, tmp_path: Path) -> None:
    # The sandbox's warning came once per batch graded: 7 lines for one check. (The jail cannot import a plugin from
    # PYTHONPATH, so this runs with --sandbox none; test_cli has the sandbox's own grader-error lines.)
    source = environment(hook="") + (
        "class Raising(WordCount):\n"
        "    def grade(self, task, completion):\n"
        "        if not completion.strip():\n"
        "            raise IndexError('list index out of range')\n"
        "        return super().grade(task, completion)\n\n"
        "    def mutations(self, task):\n"
        "        return [str(task.data['n'] + 1)]\n\n\n"
        "@hookimpl\ndef nodus_register_environments(register):\n    register(Raising)\n"
    )
    install("nodus-env-word-count", source)
    result = subprocess.run(
        [str(Path(sys.executable).with_name("grpo")), "check", "--env", "word-count@1", "--examples", "2", "--sandbox",
         "none"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
    )
    assert result.returncode == 1, result.stderr
    assert "FAIL grade_in_range_never_raises" in result.stdout and "raised IndexError: list index" in result.stdout
    assert result.stderr.splitlines() == [
        "warning: grading with --sandbox none: in this process, without isolation or limits other than wall time; "
        "only for trusted graders"
    ]
