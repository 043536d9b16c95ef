"""The plugin manager: finds installed environment plugins through the ``nodus`` entry-point group."""

from __future__ import annotations

import importlib.metadata
import os

import pluggy
from nodus.core import hookspecs
from nodus.core.errors import PluginLoadError, first_line

ENTRY_POINT_GROUP = "nodus"
DISABLE_AUTOLOAD_ENV = "NODUS_DISABLE_PLUGIN_AUTOLOAD"
# Joins a distribution and its entry-point name into a plugin name: distribution names cannot contain it.
QUALIFIER = ":"


def get_plugin_manager(
    autoload: bool | None = None, load_errors: list[PluginLoadError] | None = None
) -> pluggy.PluginManager:
    """A plugin manager with every installed plugin loaded.

    Autoloading is on unless ``NODUS_DISABLE_PLUGIN_AUTOLOAD`` is set to a non-empty value (or
    ``autoload=False``), so tests can register plugins in-process with ``pm.register(module)``.
    A plugin that fails to import or does not match the hooks raises :class:`PluginLoadError`, or is skipped
    and appended to ``load_errors`` when a list is given (so one broken plugin does not take the others down).
    """
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    if autoload is None:
        autoload = not os.environ.get(DISABLE_AUTOLOAD_ENV)
    if autoload:
        load_entry_points(pm, load_errors)
    return pm


def load_entry_points(pm: pluggy.PluginManager, load_errors: list[PluginLoadError] | None = None) -> None:
    """Import and register each plugin of the group; every failure names the plugin and its distribution."""
    for entry_point in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        name = plugin_name(entry_point)
        if pm.get_plugin(name) is not None or pm.is_blocked(name):
            continue
        label = describe_plugin(name)
        try:
            plugin = entry_point.load()
        except Exception as error:
            dist = entry_point.dist.name if entry_point.dist is not None else entry_point.value
            _fail(
                PluginLoadError(
                    f"{label} failed to import ({type(error).__name__}: {first_line(error)}); reinstall it or "
                    f"remove it with 'pip uninstall {dist}'"
                ),
                load_errors,
                error,
            )
            continue
        if (message := _register(pm, plugin, name, label)) is not None:
            _fail(PluginLoadError(message), load_errors)


def _register(pm: pluggy.PluginManager, plugin: object, name: str, label: str) -> str | None:
    """Register ``plugin``; a plugin that does not match the hooks is left unregistered and its error returned."""
    if (other := pm.get_name(plugin)) is not None:  # pluggy refuses one object under two names
        return f"{label} loads the same module as {describe_plugin(other)}; remove one of the two entry points"
    try:
        pm.register(plugin, name=name)
    except pluggy.PluginValidationError as error:  # e.g. a misspelt argument: pluggy validates before registering
        detail = "; ".join(str(error).splitlines()[1:]) or str(error)
        return f"{label} has an invalid hook implementation ({detail}); nodus hooks: {_hooks(pm)}"
    except Exception as error:  # whatever else pluggy refuses: still one line, and the other plugins still load
        return f"{label} could not be registered ({type(error).__name__}: {first_line(error)})"
    # pluggy reports a misspelt hook name only in check_pending, for all plugins at once: check this one now.
    unknown = sorted(
        hook.name for hook in pm.get_hookcallers(plugin) or []
        if not hook.has_spec() and any(impl.plugin is plugin and not impl.optionalhook for impl in hook.get_hookimpls())
    )
    if unknown:
        pm.unregister(plugin)
        return f"{label} implements unknown hook {', '.join(map(repr, unknown))}; nodus hooks: {_hooks(pm)}"
    return None


def _hooks(pm: pluggy.PluginManager) -> str:
    """The hooks a plugin may implement, as it would write them: ``nodus_register_environments(register)``."""
    return ", ".join(
        f"{hook.name}({', '.join(hook.spec.argnames)})" for hook in vars(pm.hook).values()
        if isinstance(hook, pluggy.HookCaller) and hook.spec is not None
    )


def _fail(error: PluginLoadError, load_errors: list[PluginLoadError] | None, cause: Exception | None = None) -> None:
    if load_errors is None:
        raise error from cause
    load_errors.append(error)


def plugin_name(entry_point: importlib.metadata.EntryPoint) -> str:
    """The plugin's name in the manager: qualified by its distribution, because two distributions may well pick
    the same entry-point name (both scaffolded as ``word_count``, say) and pluggy keeps one plugin per name."""
    if entry_point.dist is None:
        return entry_point.name
    return f"{entry_point.dist.name}{QUALIFIER}{entry_point.name}"


def describe_plugin(plugin_name: str) -> str:
    """How every message names a plugin: ``plugin 'word_count' from nodus-env-word-count 0.1.0``."""
    entry_point_name = plugin_name.partition(QUALIFIER)[2] or plugin_name
    return f"plugin {entry_point_name!r} from {distribution_of(plugin_name)}"


def distribution_of(plugin_name: str) -> str:
    """``name version`` of the distribution whose entry point registered ``plugin_name``."""
    dist, qualified, _ = plugin_name.partition(QUALIFIER)
    if qualified:
        try:
            return f"{dist} {importlib.metadata.version(dist)}"
        except importlib.metadata.PackageNotFoundError:
            pass
    # A plugin registered in-process under its entry point's plain name (as a plugin's own tests may do).
    for entry_point in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP, name=plugin_name):
        if entry_point.dist is not None:
            return f"{entry_point.dist.name} {entry_point.dist.version}"
    return f"{plugin_name} (registered in-process)"
