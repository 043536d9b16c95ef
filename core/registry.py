"""The registry of installed environments: resolves ids to environment classes.

Every error says what exists and how to fix the request: a "did you mean" for a misspelt name, the
``pip install`` line for one that is not installed, and the installed versions for an unknown version.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import pluggy
from nodus.core.environment import Environment
from nodus.core.errors import DuplicateEnvironment, PluginLoadError, UnknownEnvironment, UnknownVersion
from nodus.core.ids import DEFAULT_NAMESPACE, EnvId, distribution_name, format_env_id, parse_env_id
from nodus.core.plugins import distribution_of, get_plugin_manager
from pydantic import BaseModel


@dataclass(frozen=True)
class EnvironmentSpec:
    """An installed environment: its id, its class and the distribution that provides it."""

    env_id: EnvId
    cls: type[Environment]
    distribution: str

    @property
    def description(self) -> str:
        return self.cls.description

    def make(self, params: BaseModel | Mapping[str, Any] | None = None) -> Environment:
        return self.cls(params)


@dataclass(frozen=True)
class Resolution:
    spec: EnvironmentSpec
    note: str | None  # set when the id named no version and the newest was chosen


class Registry:
    def __init__(self, specs: Iterable[EnvironmentSpec] = (), load_errors: Iterable[PluginLoadError] = ()) -> None:
        self._specs: dict[EnvId, EnvironmentSpec] = {}
        # Plugins that failed to import: reported when they could be the reason a name is unknown.
        self.load_errors = list(load_errors)
        for spec in specs:
            self.add(spec)

    @classmethod
    def from_plugin_manager(cls, pm: pluggy.PluginManager, load_errors: Iterable[PluginLoadError] = ()) -> Registry:
        registry = cls(load_errors=load_errors)
        for hookimpl in pm.hook.nodus_register_environments.get_hookimpls():
            distribution = distribution_of(hookimpl.plugin_name)

            def register(env_cls: type[Environment], _distribution: str = distribution) -> None:
                registry.add(_spec_for(env_cls, _distribution))

            try:
                hookimpl.function(register=register)
            except (DuplicateEnvironment, PluginLoadError):
                raise
            except Exception as error:
                raise PluginLoadError(
                    f"plugin {hookimpl.plugin_name!r} from {distribution} failed while registering its "
                    f"environments ({type(error).__name__}: {error}); reinstall or upgrade it"
                ) from error
        return registry

    def add(self, spec: EnvironmentSpec) -> None:
        existing = self._specs.get(spec.env_id)
        if existing is not None:
            raise DuplicateEnvironment(
                f"environment {format_env_id(spec.env_id)} is registered by both {existing.distribution} "
                f"and {spec.distribution}; uninstall one of them"
            )
        self._specs[spec.env_id] = spec

    def all(self) -> list[EnvironmentSpec]:
        return [self._specs[key] for key in sorted(self._specs)]

    def versions(self, env_id: EnvId) -> list[int]:
        return sorted(
            v for key in self._specs if key.unversioned == env_id.unversioned and (v := key.version) is not None
        )

    def resolve(self, text: str) -> Resolution:
        env_id = parse_env_id(text)
        versions = self.versions(env_id)
        if not versions:
            raise UnknownEnvironment(self._unknown_name_message(env_id))
        if env_id.version is None:
            newest = env_id.with_version(versions[-1])
            note = f"{format_env_id(env_id)} resolved to the newest installed version, {format_env_id(newest)}"
            return Resolution(self._specs[newest], note)
        if env_id.version not in versions:
            installed = ", ".join(format_env_id(env_id.with_version(v)) for v in versions)
            raise UnknownVersion(
                f"{format_env_id(env_id.unversioned)} has no version {env_id.version}; installed: "
                f"{installed}; upgrade with 'pip install -U {distribution_name(env_id.name)}'"
            )
        return Resolution(self._specs[env_id], None)

    def _unknown_name_message(self, env_id: EnvId) -> str:
        names = sorted({format_env_id(key.unversioned) for key in self._specs})
        wanted = format_env_id(env_id.unversioned)
        close = difflib.get_close_matches(wanted, names, n=1)
        installed = ", ".join(names) if names else "none"
        broken = "".join(f"; note: {error}" for error in self.load_errors)
        if close:  # most likely a typo: a pip line would name a distribution that may not exist (or a squatter's)
            return (
                f"no environment named {wanted!r} is installed; did you mean {close[0]!r}? installed: {installed}"
                + broken
            )
        if env_id.namespace != DEFAULT_NAMESPACE:  # only nodus' own namespace follows the naming convention
            fix = f"install the distribution that provides the {env_id.namespace!r} namespace"
        else:
            fix = f"to add it: pip install {distribution_name(env_id.name)}"
        return f"no environment named {wanted!r} is installed; installed: {installed}; {fix}{broken}"


def _spec_for(env_cls: Any, distribution: str) -> EnvironmentSpec:
    if not (isinstance(env_cls, type) and issubclass(env_cls, Environment)):
        raise PluginLoadError(
            f"{distribution} registered {env_cls!r}, which is not a nodus.core.Environment subclass; "
            "register(...) takes the environment class"
        )
    missing = [attr for attr in ("name", "version", "description") if not hasattr(env_cls, attr)]
    if missing:
        raise PluginLoadError(
            f"{distribution} registered {env_cls.__name__} without {', '.join(missing)}; set them as class attributes"
        )
    env_id = parse_env_id(f"{env_cls.namespace}/{env_cls.name}@{env_cls.version}")
    return EnvironmentSpec(env_id=env_id, cls=env_cls, distribution=distribution)


def get_registry(pm: pluggy.PluginManager | None = None) -> Registry:
    """The registry of every installed environment (or of those registered with ``pm``).

    A plugin that fails to import is left out and kept in ``load_errors``: one broken distribution must not
    stop the others from working (a grader worker loads every plugin to find one environment).
    """
    if pm is not None:
        return Registry.from_plugin_manager(pm)
    errors: list[PluginLoadError] = []
    pm = get_plugin_manager(load_errors=errors)
    return Registry.from_plugin_manager(pm, errors)


def load_environment(
    text: str, params: BaseModel | Mapping[str, Any] | None = None, registry: Registry | None = None
) -> Environment:
    """Resolve ``text`` and build the environment with validated ``params``."""
    return (registry or get_registry()).resolve(text).spec.make(params)
