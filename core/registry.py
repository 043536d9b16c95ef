"""The registry of installed environments: resolves ids to environment classes.

Every error says what exists and how to fix the request: a "did you mean" for a misspelt name, the
``pip install`` line for one that is not installed, and the installed versions for an unknown version.
"""

from __future__ import annotations

import difflib
import importlib.metadata
import inspect
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import pluggy
from nodus.core.environment import Environment
from nodus.core.errors import (
    DuplicateEnvironment,
    InvalidEnvironmentId,
    PluginLoadError,
    UnknownEnvironment,
    UnknownVersion,
    first_line,
)
from nodus.core.ids import DEFAULT_NAMESPACE, EnvId, distribution_name, format_env_id, parse_env_id
from nodus.core.plugins import DISABLE_AUTOLOAD_ENV, describe_plugin, distribution_of, get_plugin_manager
from pydantic import BaseModel, ValidationError


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


class EnvironmentLoadError(PluginLoadError):
    """A load error of one environment whose id is known: asking for that id shows it, and only it."""

    def __init__(self, message: str, env_id: EnvId) -> None:
        super().__init__(message)
        self.env_id = env_id

    def __reduce__(self) -> tuple[Any, ...]:  # pickles (to a worker process, say) with its id
        return (type(self), (str(self), self.env_id))


@dataclass(frozen=True)
class Resolution:
    spec: EnvironmentSpec
    note: str | None  # set when the id named no version and the newest was chosen


class Registry:
    def __init__(self, specs: Iterable[EnvironmentSpec] = (), load_errors: Iterable[PluginLoadError] = ()) -> None:
        self._specs: dict[EnvId, EnvironmentSpec] = {}
        # Plugins and environments that failed to load: reported when they could be why a name is unknown.
        self.load_errors = list(load_errors)
        # Set when NODUS_DISABLE_PLUGIN_AUTOLOAD kept the installed plugins from loading: said when a name is unknown.
        self.autoload_disabled = False
        for spec in specs:
            self.add(spec)

    @classmethod
    def from_plugin_manager(cls, pm: pluggy.PluginManager, load_errors: Iterable[PluginLoadError] = ()) -> Registry:
        """The environments the plugins of ``pm`` register. A broken plugin or environment class is left out and
        kept in ``load_errors`` (one line each): one author's mistake must not take the other environments down."""
        registry = cls(load_errors=load_errors)
        claims: dict[EnvId, list[EnvironmentSpec]] = {}
        hookimpls = pm.hook.nodus_register_environments.get_hookimpls()
        for hookimpl in hookimpls:
            specs, errors = _registrations(hookimpl)
            registry.load_errors += errors
            for spec in specs:
                claims.setdefault(spec.env_id, []).append(spec)
        for env_id, specs in claims.items():
            specs = list(dict.fromkeys(specs))  # the same class registered twice by one plugin is harmless
            if len(specs) == 1:
                registry.add(specs[0])
                continue
            # Keep none of them: which one came first depends on the order of sys.path and of the file system,
            # so keeping it would silently pick a different environment on another machine (or in a worker).
            registry.load_errors.append(
                EnvironmentLoadError(
                    f"environment {format_env_id(env_id)} is registered by "
                    f"{' and '.join(spec.distribution for spec in specs)}, so it is left out; "
                    "uninstall all but one of them",
                    env_id,
                )
            )
        hooked = {hookimpl.plugin_name for hookimpl in hookimpls}
        for name, plugin in pm.list_name_plugin():
            if plugin is not None and name not in hooked:  # e.g. the author dropped @hookimpl: pluggy sees no hook
                registry.load_errors.append(
                    PluginLoadError(
                        f"{describe_plugin(name)} registered no environments: {getattr(plugin, '__name__', name)} has "
                        "no nodus_register_environments marked @hookimpl; decorate it with @hookimpl (from "
                        "nodus.core import hookimpl), or point the entry point at the module that defines it"
                    )
                )
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
        own = self._own_errors(env_id)
        if own and (not versions or (env_id.version is not None and env_id.version not in versions)):
            # Installed but left out: its own error is the answer; a "did you mean" or the other plugins' errors
            # would only bury it.
            error = UnknownVersion if versions else UnknownEnvironment
            raise error(f"{format_env_id(env_id)} is installed but cannot be used: " + "; ".join(map(str, own)))
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
                f"{installed}; upgrade with 'pip install -U {distribution_name(env_id.name)}'" + self._notes()
            )
        return Resolution(self._specs[env_id], None)

    def _own_errors(self, env_id: EnvId) -> list[EnvironmentLoadError]:
        """The load errors of ``env_id`` (of any of its versions when it names none)."""
        return [
            error
            for error in self.load_errors
            if isinstance(error, EnvironmentLoadError)
            and error.env_id.unversioned == env_id.unversioned
            and env_id.version in (None, error.env_id.version)
        ]

    def _notes(self) -> str:
        """The load errors that may be why a name is not installed, appended to the message: a plugin that failed to
        import, say. Not those of another environment's id: they cannot be why, and there may be dozens."""
        return "".join(f"; note: {error}" for error in self.load_errors if not isinstance(error, EnvironmentLoadError))

    def _unknown_name_message(self, env_id: EnvId) -> str:
        names = sorted({format_env_id(key.unversioned) for key in self._specs})
        wanted = format_env_id(env_id.unversioned)
        close = difflib.get_close_matches(wanted, names, n=1)
        installed = ", ".join(names) if names else "none"
        broken = self._notes()
        if self.autoload_disabled:  # no installed plugin was looked at: the likely cause, not a typo or a pip line
            return (
                f"no environment named {wanted!r} is registered; registered: {installed}; {DISABLE_AUTOLOAD_ENV} is "
                "set, so installed plugins are not loaded; unset it to use them" + broken
            )
        if close:  # most likely a typo: a pip line would name a distribution that may not exist (or a squatter's)
            return (
                f"no environment named {wanted!r} is installed; did you mean {close[0]!r}? installed: {installed}"
                + broken
            )
        if env_id.namespace != DEFAULT_NAMESPACE:  # only nodus' own namespace follows the naming convention
            fix = f"install the distribution that provides the {env_id.namespace!r} namespace"
        elif (version := _installed_version(distribution_name(env_id.name))) is not None:
            # Installed, yet it registered no such environment: a pip line would only reinstall the broken plugin.
            fix = (
                f"{distribution_name(env_id.name)} {version} is installed but provides no {wanted!r} environment; "
                "'grpo envs' lists what it provides and any error loading it"
            )
        else:
            fix = f"to add it: pip install {distribution_name(env_id.name)}"
        return f"no environment named {wanted!r} is installed; installed: {installed}; {fix}{broken}"


def _registrations(hookimpl: pluggy.HookImpl) -> tuple[list[EnvironmentSpec], list[PluginLoadError]]:
    """What one plugin registers, and its errors. A bad class is skipped alone; a hook that raises loses all."""
    label = describe_plugin(hookimpl.plugin_name)
    distribution = distribution_of(hookimpl.plugin_name)
    specs: list[EnvironmentSpec] = []
    errors: list[PluginLoadError] = []

    def register(env_cls: type[Environment]) -> None:
        try:
            specs.append(_spec_for(env_cls, distribution, label))
        except PluginLoadError as error:
            # Kept with its id, to be the answer when that id is asked for; not so for an instance registered in
            # place of its class, which another plugin may well provide.
            env_id = _declared_id(env_cls) if isinstance(env_cls, type) else None
            errors.append(error if env_id is None else EnvironmentLoadError(str(error), env_id))

    try:
        hookimpl.function(*({"register": register}[arg] for arg in hookimpl.argnames))
    except Exception as error:  # it stopped midway: what it registered so far need not be what it meant
        failure = PluginLoadError(
            f"{label} failed while registering its environments ({type(error).__name__}: {first_line(error)}); "
            "reinstall or upgrade it"
        )
        return [], [*errors, failure]
    if not specs and not errors:
        errors.append(
            PluginLoadError(
                f"{label} registered no environments: its nodus_register_environments never called register(...); "
                "call register(YourEnvironment) for each environment class"
            )
        )
    return specs, errors


def _spec_for(env_cls: Any, distribution: str, label: str) -> EnvironmentSpec:
    """Check what an author can get wrong in a class, so it shows when the plugin loads, naming the class, and
    not later as a puzzling failure of whichever command uses it (e.g. a default that its own bounds reject)."""
    if not (isinstance(env_cls, type) and issubclass(env_cls, Environment)):
        what = repr(env_cls) if isinstance(env_cls, type) else f"an instance of {type(env_cls).__name__}"
        raise PluginLoadError(
            f"{label} registered {what}, which is not a nodus.core.Environment subclass; "
            "register(...) takes the environment class"
        )
    where = f"{label} registered {env_cls.__name__}"
    if inspect.isabstract(env_cls):  # else it is listed, and every command that builds it fails with a traceback
        methods = ", ".join(sorted(env_cls.__abstractmethods__))
        raise PluginLoadError(
            f"{where}, which leaves abstract methods unimplemented: {methods}; define each in the class, without "
            "@abstractmethod"
        )
    missing = [attr for attr in ("name", "version", "description") if not hasattr(env_cls, attr)]
    if missing:
        raise PluginLoadError(f"{where} without {', '.join(missing)}; set them as class attributes")
    namespace, name, version = env_cls.namespace, env_cls.name, env_cls.version
    env_id = _declared_id(env_cls)
    if env_id is None:
        raise PluginLoadError(
            f"{where} with namespace={namespace!r}, name={name!r}, version={version!r}; a namespace and a name are "
            "lower-case letters and digits in words joined by single hyphens and the version is a positive int, "
            "e.g. name = 'graph-coloring', version = 1"
        )
    params = env_cls.Params
    if not (isinstance(params, type) and issubclass(params, BaseModel)):
        raise PluginLoadError(f"{where} with Params = {params!r}; Params must be a pydantic BaseModel subclass")
    try:  # pydantic does not validate defaults, so validate them as given values, as --param values are
        # warnings=False: a wrong-typed default is reported below in one line, not as pydantic's serializer warning
        params.model_validate(params().model_dump(by_alias=True, warnings=False))
    except ValidationError as error:
        first = error.errors()[0]
        field = ".".join(str(part) for part in first["loc"])
        message = first["msg"].removeprefix("Value error, ")
        if first["type"] == "missing":
            problem = f"field {field!r} has no default"
        else:
            problem = f"default {field}={first.get('input')!r}" if field else "defaults"
            problem += f" fails validation: {message}"
        raise PluginLoadError(
            f"{where}, whose {params.__name__} {problem}; give every parameter a default within its own bounds"
        ) from None
    unknown = sorted(set(env_cls.grading_params) - set(params.model_fields))
    if unknown:
        raise PluginLoadError(
            f"{where}, whose grading_params names {', '.join(map(repr, unknown))}, not a field of "
            f"{params.__name__}; its fields are: {', '.join(params.model_fields) or 'none'}"
        )
    return EnvironmentSpec(env_id=env_id, cls=env_cls, distribution=distribution)


def _declared_id(env_cls: Any) -> EnvId | None:
    """The id a class declares, or None when it has none or it is not in canonical form."""
    try:
        env_id = EnvId(env_cls.namespace, env_cls.name, env_cls.version)
        # the round trip also refuses what parses but is not the canonical form: version "1", padded names
        return env_id if parse_env_id(f"{env_id.namespace}/{env_id.name}@{env_id.version}") == env_id else None
    except (AttributeError, InvalidEnvironmentId):
        return None


def _installed_version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def get_registry(pm: pluggy.PluginManager | None = None) -> Registry:
    """The registry of every installed environment (or of those registered with ``pm``).

    A plugin that fails to import, does not match the hooks, or registers a broken environment (or an id another
    distribution registers too) is left out and kept in ``load_errors``: one broken distribution must not stop
    the others from working (a grader worker loads every plugin to find one environment).
    """
    if pm is not None:
        return Registry.from_plugin_manager(pm)
    errors: list[PluginLoadError] = []
    autoload = not os.environ.get(DISABLE_AUTOLOAD_ENV)
    registry = Registry.from_plugin_manager(get_plugin_manager(autoload=autoload, load_errors=errors), errors)
    registry.autoload_disabled = not autoload
    return registry


def load_environment(
    text: str, params: BaseModel | Mapping[str, Any] | None = None, registry: Registry | None = None
) -> Environment:
    """Resolve ``text`` and build the environment with validated ``params``."""
    return (registry or get_registry()).resolve(text).spec.make(params)
