"""The CI workflow to copy (.github/workflows/images.yml): actionlint finds nothing in it, and every lanectl
command it runs exists and takes the flags it is given, so a renamed flag breaks this test, not a release."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import typer.core
import typer.main
import yaml
from typer.testing import CliRunner

from lanectl.cli.app import app
from lanectl.project import Project
from lanectl.recipe.catalog import load_catalog
from tests.conftest import REPO

WORKFLOW = REPO / ".github" / "workflows" / "images.yml"
SHELL_OPERATORS = {"|", "||", "&&", ";", ">", ">>", "<", "2>", "&"}
IMAGE_INPUTS = ["recipes/**", "images/**", "kernels/**", "patches/**"]


def workflow() -> dict:
    # PyYAML reads the key `on` as True (YAML 1.1); GitHub reads it as "on".
    data = yaml.safe_load(WORKFLOW.read_text())
    return {("on" if key is True else key): value for key, value in data.items()}


def run_scripts(data: dict) -> list[tuple[str, str]]:
    """(job, script) of every `run:` step."""
    return [(name, step["run"]) for name, job in data["jobs"].items() for step in job["steps"] if "run" in step]


def lanectl_invocations(script: str) -> list[list[str]]:
    """The arguments of each lanectl command in a shell script (line continuations joined, redirections cut)."""
    found = []
    for line in script.replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True)
        command: list[str] = []
        for word in words + [";"]:
            if word in SHELL_OPERATORS:
                if command and Path(command[0]).name == "lanectl":
                    found.append(command[1:])
                command = []
            else:
                command.append(word)
    return found


def problems(arguments: list[str], lanes: set[str]) -> tuple[str, list[str]]:
    """The command path (e.g. `patches check`) and what is wrong with how it is called."""
    # Typer's own command objects (it vendors click): a group answers get_command, options carry opts and is_flag.
    command = typer.main.get_command(app)
    path: list[str] = []
    wrong: list[str] = []
    words = list(arguments)
    positional: list[str] = []
    while words:
        word = words.pop(0)
        if word.startswith("-"):
            name = word.split("=", 1)[0]
            option = next((p for p in command.params if isinstance(p, typer.core.TyperOption) and name in p.opts),
                          None)
            if option is None:
                wrong.append(f"lanectl {' '.join(path) or '(root)'} has no option {name}")
            elif not option.is_flag and "=" not in word:
                words.pop(0)  # the option's value
        elif hasattr(command, "get_command") and not positional:
            sub = command.get_command(None, word)
            if sub is None:
                wrong.append(f"lanectl {' '.join(path)} has no command {word!r}".replace("  ", " "))
                break
            command, path = sub, [*path, word]
        else:
            positional.append(word)
    if path == ["build"]:
        wrong += [f"no lane {lane!r} in the recipes" for lane in positional if lane not in lanes]
    return " ".join(path), wrong


@pytest.fixture(scope="module")
def lanes() -> set[str]:
    return set(load_catalog(Project.locate(REPO / "recipes")).lanes)


def test_every_lanectl_command_in_the_workflow_exists_with_its_flags(lanes: set[str]):
    data = workflow()
    calls = [(job, problems(arguments, lanes)) for job, script in run_scripts(data)
             for arguments in lanectl_invocations(script)]
    wrong = [f"{job}: {problem}" for job, (_, found) in calls for problem in found]
    assert not wrong, "\n".join(wrong)
    commands = {(job, path) for job, (path, _) in calls}
    assert {("demo", "validate"), ("demo", "patches check"), ("demo", "build"), ("production", "build")} <= commands
    runner = CliRunner()
    for path in {path for _, path in commands}:
        shown = runner.invoke(app, [*path.split(), "--help"])
        assert shown.exit_code == 0, shown.output


def test_both_jobs_push_and_keep_the_json_report_and_run_on_changes_to_image_inputs():
    data = workflow()
    for trigger in ("push", "pull_request"):
        assert set(IMAGE_INPUTS) <= set(data["on"][trigger]["paths"])
    for job in ("demo", "production"):
        builds = [arguments for name, script in run_scripts(data) if name == job
                  for arguments in lanectl_invocations(script) if arguments[:1] == ["build"]]
        assert any("--push" in b and "--json" in b for b in builds), job
        uploads = [step for step in data["jobs"][job]["steps"]
                   if str(step.get("uses", "")).startswith("actions/upload-artifact")]
        assert uploads and uploads[0]["if"] == "always()", f"{job}: a failed build's report is kept too"
    assert data["jobs"]["production"]["runs-on"][0] == "self-hosted"
    assert "gpu-builder" in data["jobs"]["production"]["runs-on"]


def test_the_checker_finds_a_wrong_flag_a_wrong_command_and_an_unknown_lane(lanes: set[str]):
    (call,) = lanectl_invocations('.venv/bin/lanectl build demo-h1 no-such-lane --pushh --registry "$R" --json > x')
    path, found = problems(call, lanes)
    assert path == "build"
    assert found == ["lanectl build has no option --pushh", "no lane 'no-such-lane' in the recipes"]
    assert problems(["patches", "chek"], lanes)[1] == ["lanectl patches has no command 'chek'"]
    assert problems(["--recipes", "recipes", "validate", "--json"], lanes) == ("validate", [])


def actionlint() -> str | None:
    # The venv's own (the test extra installs it), else one on PATH.
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    return shutil.which("actionlint", path=path)


def test_the_workflow_lints_clean_with_actionlint():
    binary = actionlint()
    if binary is None:
        reason = "actionlint is not installed (the test extra installs it: pip install -e '.[test]')"
        if os.environ.get("LANECTL_CI"):
            pytest.fail(f"CI must lint the workflow: {reason}")
        pytest.skip(reason)
    result = subprocess.run([binary, "-no-color", str(WORKFLOW.relative_to(REPO))], cwd=REPO, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    broken = WORKFLOW.read_text().replace("runs-on: ubuntu-24.04", "runs-on: ubuntu-24.04\n    timeout-minutes: soon")
    refused = subprocess.run([binary, "-no-color", "-"], input=broken, cwd=REPO, capture_output=True, text=True,
                             timeout=60)
    assert refused.returncode == 1 and "timeout-minutes" in refused.stdout, "actionlint really checks"
