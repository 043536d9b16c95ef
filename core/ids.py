"""Environment ids: ``[namespace/]name[@version]``.

One grammar, one parser and one formatter; ``parse_env_id(format_env_id(x)) == x`` and formatting drops the
default namespace, so ``nodus/graph-coloring@1`` and ``graph-coloring@1`` are the same id.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from nodus.core.errors import InvalidEnvironmentId

DEFAULT_NAMESPACE = "nodus"

_NAME = r"[a-z0-9]+(?:-[a-z0-9]+)*"
_ID_RE = re.compile(rf"^(?:(?P<namespace>{_NAME})/)?(?P<name>{_NAME})(?:@(?P<version>[0-9]+))?$")


@dataclass(frozen=True, order=True)
class EnvId:
    """A parsed environment id. ``version`` is None when the id named no version ("the newest")."""

    namespace: str
    name: str
    version: int | None = None

    def with_version(self, version: int) -> EnvId:
        return EnvId(self.namespace, self.name, version)

    @property
    def unversioned(self) -> EnvId:
        return EnvId(self.namespace, self.name, None)

    def __str__(self) -> str:
        return format_env_id(self)


def parse_env_id(text: str) -> EnvId:
    """Parse ``[namespace/]name[@version]``; names are lower-case words joined by single hyphens."""
    match = _ID_RE.match(text.strip())
    if match is None:
        raise InvalidEnvironmentId(
            f"invalid environment id {text!r}: expected [namespace/]name[@version] with lower-case "
            "letters, digits and single hyphens, and a positive integer version, e.g. graph-coloring@1"
        )
    version_text = match.group("version")
    version = None if version_text is None else int(version_text)
    if version is not None and (version < 1 or version_text != str(version)):
        raise InvalidEnvironmentId(
            f"invalid environment id {text!r}: the version must be a positive integer without leading "
            f"zeros, e.g. {match.group('name')}@1"
        )
    return EnvId(match.group("namespace") or DEFAULT_NAMESPACE, match.group("name"), version)


def format_env_id(env_id: EnvId) -> str:
    """The canonical text of an id: the default namespace is left out."""
    prefix = "" if env_id.namespace == DEFAULT_NAMESPACE else f"{env_id.namespace}/"
    suffix = "" if env_id.version is None else f"@{env_id.version}"
    return f"{prefix}{env_id.name}{suffix}"


def distribution_name(name: str) -> str:
    """The conventional PyPI distribution of an environment: ``nodus-env-<name>``."""
    return f"nodus-env-{name}"
