"""What users do: pip install an environment from built distributions into a fresh virtual environment."""

import os
import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def run(*args: str | Path, cwd: Path | None = None) -> str:
    env = {k: v for k, v in os.environ.items() if k not in {"VIRTUAL_ENV", "PYTHONPATH"}}
    result = subprocess.run([str(a) for a in args], capture_output=True, text=True, cwd=cwd, env=env, timeout=900)
    assert result.returncode == 0, f"{args} failed:\n{result.stdout}\n{result.stderr}"
    return result.stdout


def test_install_and_uninstall_from_built_distributions(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    for project in (REPO, REPO / "plugins" / "graph_coloring"):
        run(sys.executable, "-m", "build", "--no-isolation", "--wheel", "--sdist", "--outdir", dist, project)
    names = sorted(p.name for p in dist.iterdir())
    assert any(n.startswith("nodus-0.2.0") and n.endswith(".whl") for n in names), names
    assert "nodus_env_graph_coloring-0.1.0.tar.gz" in names, names
    # The wheel holds every module of the source tree (an editable install would hide a package left out of it).
    (wheel,) = dist.glob("nodus-0.2.0-*.whl")
    in_wheel = {name for name in zipfile.ZipFile(wheel).namelist() if name.endswith(".py")}
    for folder in ("core", "sandbox", "trainer"):
        for module in (REPO / folder).rglob("*.py"):
            assert f"nodus/{folder}/{module.relative_to(REPO / folder)}" in in_wheel, f"{module} is not in {wheel.name}"

    venv = tmp_path / "venv"
    run(sys.executable, "-m", "venv", venv)
    pip, grpo = venv / "bin" / "pip", venv / "bin" / "grpo"
    # As a user would: the plugin pulls nodus in; their other dependencies come from the package index.
    run(pip, "install", "-q", "--find-links", dist, "nodus-env-graph-coloring")
    assert run(grpo, "envs").startswith("graph-coloring@1  nodus-env-graph-coloring 0.1.0")
    run(pip, "uninstall", "-q", "-y", "nodus-env-graph-coloring")
    assert run(grpo, "envs").startswith("no environments installed")
    run(pip, "install", "-q", "--find-links", dist, "nodus-env-graph-coloring")
    assert "graph-coloring@1" in run(grpo, "envs")
    # What an environment author runs next: the conformance checks (in the sandbox), and pytest with nodus' plugin
    # (which pytest loads through the pytest11 entry point: its module must be installed).
    assert "PASS" in run(grpo, "check", "--env", "graph-coloring@1", "--examples", "2")
    python = venv / "bin" / "python"
    plugin = "import importlib.metadata as m; (e,) = m.entry_points(group='pytest11', name='nodus'); print(e.module)"
    module = run(python, "-c", plugin).strip()
    assert run(python, "-c", f"import importlib.util as u; print(u.find_spec({module!r}) is not None)") == "True\n"
