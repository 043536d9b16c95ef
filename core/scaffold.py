"""``grpo new-env NAME``: write a new environment distribution that installs and passes the kit as generated."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import shutil
import sys
from pathlib import Path
from string import Template

from nodus.core import scaffold_templates as templates
from nodus.core.environment import SPLITS, Environment
from nodus.core.errors import NodusError
from nodus.core.ids import DEFAULT_NAMESPACE, distribution_name, parse_env_id


class ScaffoldError(NodusError):
    """The environment cannot be scaffolded as asked; the message says how to fix it."""


def scaffold_environment(name: str, dest: Path) -> Path:
    """Write the distribution of environment ``name`` into ``dest/<name with underscores>`` and return it.

    The result has a pyproject with the ``nodus`` entry point, an environment with typed parameters, a
    grader, a reference and mutations, a README and tests (golden hash pinned now, the kit, hypothesis).
    """
    env_id = parse_env_id(name)
    if env_id.namespace != DEFAULT_NAMESPACE or env_id.version is not None or "/" in name or "@" in name:
        raise ScaffoldError(
            f"new-env takes a bare environment name such as 'word-count', not {name!r}; "
            "the version starts at 1 and the namespace is set in the generated class"
        )
    module = env_id.name.replace("-", "_")
    target = Path(dest) / module
    if target.exists():
        raise ScaffoldError(f"{target} already exists; choose another name or remove that directory first")
    package = f"nodus_env_{module}"
    values = {
        "name": env_id.name,
        "env_id": f"{env_id.name}@1",
        "distribution": distribution_name(env_id.name),
        "module": module,
        "package": package,
        "cls": class_name(env_id.name),
    }
    files = {
        "pyproject.toml": templates.PYPROJECT,
        "README.md": templates.README,
        f"{package}/__init__.py": templates.INIT,
        f"{package}/environment.py": templates.ENVIRONMENT,
        f"{package}/py.typed": "",
    }
    try:
        for relative, text in files.items():
            path = target / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(Template(text).substitute(values))
        golden = _golden_digests(target / package / "environment.py", values["cls"])
        test = Template(templates.TEST).substitute(
            values, golden_train=golden["train"], golden_heldout=golden["heldout"]
        )
        (target / "tests").mkdir()
        (target / "tests" / f"test_{module}.py").write_text(test)
    except BaseException:
        shutil.rmtree(target, ignore_errors=True)  # never leave half a distribution behind
        raise
    return target


def class_name(name: str) -> str:
    """``word-count`` -> ``WordCount``; a name starting with a digit gets an ``Env`` prefix to be an identifier."""
    camel = "".join(part.capitalize() for part in name.split("-"))
    return camel if camel.isidentifier() else f"Env{camel}"


def _golden_digests(environment_file: Path, class_name: str) -> dict[str, str]:
    """Pin what the generated environment draws now, computed exactly as the generated golden test does."""
    spec = importlib.util.spec_from_file_location(f"_nodus_scaffold_{class_name}", environment_file)
    if spec is None or spec.loader is None:
        raise ScaffoldError(f"cannot load the generated {environment_file}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # pydantic resolves the Params annotations through sys.modules
    try:
        spec.loader.exec_module(module)
        env: Environment = getattr(module, class_name)()
        digests: dict[str, str] = {}
        for split in SPLITS:
            tasks = [[t.id, env.prompt_text(t), t.data] for t in env.tasks(split, 42, 8)]
            digests[split] = hashlib.sha256(json.dumps(tasks, sort_keys=True).encode()).hexdigest()
        return digests
    finally:
        del sys.modules[spec.name]
