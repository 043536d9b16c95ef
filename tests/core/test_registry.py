import sys
import textwrap
from pathlib import Path

import pytest
from nodus.core.errors import PluginLoadError, UnknownEnvironment, UnknownVersion
from nodus.core.plugins import get_plugin_manager
from nodus.core.registry import Registry, get_registry

from tests.conftest import EchoNumber, EchoNumberV2, plugin_module


def test_unversioned_id_resolves_to_newest_and_says_so(registry: Registry) -> None:
    resolution = registry.resolve("test/echo")
    assert resolution.spec.env_id.version == 2
    assert resolution.note == "test/echo resolved to the newest installed version, test/echo@2"
    assert registry.resolve("test/echo@1").note is None


def test_unknown_name_suggests_the_closest_without_a_pip_line(registry: Registry) -> None:
    # A typo: a pip line would name a distribution that need not exist (or that a squatter registered).
    with pytest.raises(UnknownEnvironment) as error:
        registry.resolve("test/ecco@1")
    assert str(error.value) == (
        "no environment named 'test/ecco' is installed; did you mean 'test/echo'? installed: test/echo"
    )


def test_unknown_name_gives_the_pip_line_only_in_the_nodus_namespace(registry: Registry) -> None:
    with pytest.raises(UnknownEnvironment) as error:
        registry.resolve("sudoku@1")
    assert str(error.value) == (
        "no environment named 'sudoku' is installed; installed: test/echo; to add it: pip install nodus-env-sudoku"
    )
    with pytest.raises(UnknownEnvironment) as error:
        registry.resolve("acme/sudoku@1")
    assert str(error.value) == (
        "no environment named 'acme/sudoku' is installed; installed: test/echo; install the distribution that "
        "provides the 'acme' namespace"
    )


def test_unknown_version_lists_installed_versions(registry: Registry) -> None:
    with pytest.raises(UnknownVersion) as error:
        registry.resolve("test/echo@7")
    assert str(error.value) == (
        "test/echo has no version 7; installed: test/echo@1, test/echo@2; upgrade with 'pip install -U nodus-env-echo'"
    )


def test_same_id_from_two_plugins_keeps_neither_and_names_both(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NODUS_DISABLE_PLUGIN_AUTOLOAD", "1")
    pm = get_plugin_manager()
    pm.register(plugin_module("first", EchoNumber, EchoNumberV2), name="first")
    pm.register(plugin_module("second", EchoNumber), name="second")
    registry = Registry.from_plugin_manager(pm)
    assert [str(spec.env_id) for spec in registry.all()] == ["test/echo@2"]
    assert [str(error) for error in registry.load_errors] == [
        "environment test/echo@1 is registered by first (registered in-process) and second (registered in-process), "
        "so it is left out; uninstall all but one of them"
    ]


def test_registering_a_non_environment_names_the_plugin(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NODUS_DISABLE_PLUGIN_AUTOLOAD", "1")
    pm = get_plugin_manager()
    pm.register(plugin_module("broken", object), name="broken")  # type: ignore[arg-type]
    pm.register(plugin_module("echo_plugin", EchoNumber), name="echo_plugin")
    registry = Registry.from_plugin_manager(pm)
    assert registry.resolve("test/echo@1").spec.cls is EchoNumber
    assert [str(error) for error in registry.load_errors] == [
        "plugin 'broken' from broken (registered in-process) registered <class 'object'>, which is not a "
        "nodus.core.Environment subclass; register(...) takes the environment class"
    ]


def test_autoload_can_be_switched_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NODUS_DISABLE_PLUGIN_AUTOLOAD", "1")
    assert Registry.from_plugin_manager(get_plugin_manager()).all() == []
    monkeypatch.delenv("NODUS_DISABLE_PLUGIN_AUTOLOAD")
    assert "graph-coloring@1" in [str(spec.env_id) for spec in Registry.from_plugin_manager(get_plugin_manager()).all()]


def test_plugin_import_error_is_wrapped_with_its_distribution(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A real installed distribution (a dist-info on sys.path) whose entry point fails to import.
    (tmp_path / "nodus_env_broken.py").write_text("raise ImportError('no module named numpyy')\n")
    dist_info = tmp_path / "nodus_env_broken-0.3.0.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: nodus-env-broken\nVersion: 0.3.0\n")
    (dist_info / "entry_points.txt").write_text(
        textwrap.dedent("""\
        [nodus]
        broken = nodus_env_broken
    """)
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("NODUS_DISABLE_PLUGIN_AUTOLOAD", raising=False)
    with pytest.raises(PluginLoadError) as error:
        get_plugin_manager()
    assert str(error.value) == (
        "plugin 'broken' from nodus-env-broken 0.3.0 failed to import (ImportError: no module named numpyy); "
        "reinstall it or remove it with 'pip uninstall nodus-env-broken'"
    )
    sys.modules.pop("nodus_env_broken", None)


def test_a_broken_plugin_does_not_hide_the_others(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "nodus_env_broken2.py").write_text("raise ImportError('boom')\n")
    dist_info = tmp_path / "nodus_env_broken2-0.1.0.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: nodus-env-broken2\nVersion: 0.1.0\n")
    (dist_info / "entry_points.txt").write_text("[nodus]\nbroken2 = nodus_env_broken2\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("NODUS_DISABLE_PLUGIN_AUTOLOAD", raising=False)
    registry = get_registry()
    assert registry.resolve("graph-coloring@1").spec.env_id.name == "graph-coloring"
    with pytest.raises(UnknownEnvironment) as error:
        registry.resolve("broken2@1")
    # nodus-env-broken2 is installed: the fix is in the note, not in a pip line that would change nothing.
    assert str(error.value).endswith(
        "; nodus-env-broken2 0.1.0 is installed but provides no 'broken2' environment; 'grpo envs' lists what it "
        "provides and any error loading it; note: plugin 'broken2' from nodus-env-broken2 0.1.0 failed to import "
        "(ImportError: boom); reinstall it or remove it with 'pip uninstall nodus-env-broken2'"
    )
    sys.modules.pop("nodus_env_broken2", None)


def test_an_unknown_name_with_autoload_switched_off_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    # It said "nodus-env-graph-coloring 0.1.0 is installed but provides no 'graph-coloring' environment".
    monkeypatch.setenv("NODUS_DISABLE_PLUGIN_AUTOLOAD", "1")
    with pytest.raises(UnknownEnvironment) as error:
        get_registry().resolve("graph-coloring@1")
    assert str(error.value) == (
        "no environment named 'graph-coloring' is registered; registered: none; NODUS_DISABLE_PLUGIN_AUTOLOAD is "
        "set, so installed plugins are not loaded; unset it to use them"
    )
