"""lanectl as a user installs it: the wheel built from this checkout, in a clean venv outside it.

An editable install finds every file in the checkout and hides a file the wheel forgot; this test runs
the demo's commands with nothing but the installed wheel, from a project `lanectl init` made.

Offline: `pip wheel` builds with build isolation (setuptools and wheel from pip's configured index; here
the local file index), and the venv gets lanectl's dependencies the same way.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.docker

# What the wheel is built from: the package, pyproject and readme; images/ for the link to the stub engine.
SOURCES = ("lanectl", "images", "pyproject.toml", "README.md")


def run(*args: str | Path, cwd: Path, env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, f"{args}: exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    return result


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The `lanectl` script of a fresh venv holding the wheel (and its dependencies) only."""
    work = tmp_path_factory.mktemp("wheel")
    source = work / "source"
    for name in SOURCES:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, source / name, symlinks=True,
                            ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            shutil.copy2(REPO / name, source / name)
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "VIRTUAL_ENV")}
    run(sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", work / "dist", source, cwd=work, env=env)
    (wheel,) = (work / "dist").glob("lanectl-*.whl")
    venv = work / "venv"
    run(sys.executable, "-m", "venv", venv, cwd=work, env=env)
    run(venv / "bin" / "python", "-m", "pip", "install", "-q", wheel, cwd=work, env=env, timeout=600)
    return venv / "bin" / "lanectl"


def test_the_installed_wheel_runs_the_demo_commands_from_a_fresh_project(installed, tmp_path):
    env = {key: value for key, value in os.environ.items()
           if key not in ("PYTHONPATH", "VIRTUAL_ENV") and not key.startswith("LANECTL_")}
    env.update({"LANECTL_STATE_DIR": str(tmp_path / "state"), "COLUMNS": "200"})
    name = f"wheel-{uuid.uuid4().hex[:8]}"
    where = run(installed.parent / "python", "-c", "import lanectl; print(lanectl.__file__)", cwd=tmp_path, env=env)
    assert where.stdout.startswith(str(installed.parent.parent)), "lanectl must come from the venv, not the checkout"

    run(installed, "init", name, cwd=tmp_path, env=env)
    project = tmp_path / name
    recipe = project / "recipes" / "starter.yaml"
    recipe.write_text(recipe.read_text().replace("host: 18100", f"host: {free_port()}"))
    try:
        assert run(installed, "validate", cwd=project, env=env).stdout == "ok: 2 lanes in 1 recipes (stub-a, stub-b)\n"
        built = run(installed, "build", "stub-a", cwd=project, env=env, timeout=600)
        assert built.stdout.startswith("built     stub-a: "), built.stdout
        up = run(installed, "up", "stub-a", "--no-gpu", cwd=project, env=env, timeout=300)
        assert up.stdout.startswith("ok: "), up.stdout
        cron = run(installed, "watchdog", "install", "--cron", "--dry-run", cwd=project, env=env).stdout
        assert f"{installed.parent / 'python'} -m lanectl watchdog check" in cron
        assert f"LANECTL_RECIPES={project / 'recipes'}" in cron
        down = run(installed, "down", cwd=project, env=env, timeout=120)
        assert "stub-a" in down.stdout
    finally:
        subprocess.run(["docker", "rm", "-f", f"{name}-stub-a"], capture_output=True)
        images = subprocess.run(["docker", "images", "-q", f"lanectl/{name}"], capture_output=True, text=True)
        if images.stdout.split():
            subprocess.run(["docker", "rmi", "-f", *sorted(set(images.stdout.split()))], capture_output=True)
