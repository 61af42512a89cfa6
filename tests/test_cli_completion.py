"""`--version` and shell completion, through the real entry point as a shell would call it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from lanectl import __version__
from tests.test_cli import lanectl
from tests.test_recipe_validation import GOOD


def complete(words: str, cwd: Path, *, shell: str = "bash") -> subprocess.CompletedProcess[str]:
    """What typer's generated script asks lanectl when Tab is pressed after `words`."""
    env = {key: value for key, value in os.environ.items() if key != "LANECTL_RECIPES"}
    env["_LANECTL_COMPLETE"] = f"complete_{shell}"
    if shell == "bash":
        env.update({"COMP_WORDS": words, "COMP_CWORD": str(len(words.split(" ")) - 1)})
    else:
        env["_TYPER_COMPLETE_ARGS"] = words
        if shell == "fish":
            env["_TYPER_COMPLETE_FISH_ACTION"] = "get-args"
    return subprocess.run([sys.executable, "-m", "lanectl"], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=60)


def offered(result: subprocess.CompletedProcess[str], shell: str = "bash") -> list[str]:
    """The candidates in the shell's format: one a line (bash; fish as `value<TAB>help`), or zsh's
    `_arguments '*: :(("a" "b"))'`."""
    assert (result.returncode, result.stderr) == (0, "")
    if shell == "zsh":
        return re.findall(r'"([^"]+)"', result.stdout)
    return [line.split("\t")[0] for line in result.stdout.splitlines() if line.strip()]


def test_version_prints_the_version_and_exits_0(tmp_path):
    result = lanectl("--version", cwd=tmp_path)
    assert (result.returncode, result.stdout, result.stderr) == (0, f"lanectl {__version__}\n", "")


def test_a_missing_command_is_still_a_usage_error(tmp_path):
    result = lanectl("--recipes", str(tmp_path), cwd=tmp_path)
    assert result.returncode == 2
    assert "Missing command" in result.stderr


@pytest.mark.parametrize(("shell", "marker"), [
    ("bash", "complete -o default -F _lanectl_completion lanectl"),
    ("zsh", "#compdef lanectl"),
    ("fish", "complete --command lanectl"),
])
def test_completion_scripts_generate_for_each_shell(tmp_path, shell, marker):
    env = {key: value for key, value in os.environ.items()} | {"_LANECTL_COMPLETE": f"source_{shell}"}
    result = subprocess.run([sys.executable, "-m", "lanectl"], cwd=tmp_path, env=env, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert marker in result.stdout
    assert "_LANECTL_COMPLETE" in result.stdout


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_lane_names_complete_from_the_catalog(project, write_recipe, shell):
    write_recipe(GOOD.replace("  b:\n", "  bb:\n"))
    assert offered(complete("lanectl up ", project, shell=shell), shell) == ["a", "bb"]
    assert offered(complete("lanectl up b", project, shell=shell), shell) == ["bb"]


def test_lane_completion_reads_the_recipes_option_and_every_lane_argument(project, write_recipe, tmp_path):
    write_recipe(GOOD)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    recipes = str(project / "recipes")
    for words in (f"lanectl --recipes {recipes} up ", f"lanectl --recipes {recipes} render ",
                  f"lanectl --recipes {recipes} build a ", f"lanectl --recipes {recipes} rollback --to ",
                  f"lanectl --recipes {recipes} down ", f"lanectl --recipes {recipes} logs ",
                  f"lanectl --recipes {recipes} gate a --control "):
        assert offered(complete(words, elsewhere)) == ["a", "b"], words


def test_lane_completion_fails_silently_on_a_broken_recipe(project, write_recipe):
    write_recipe(GOOD.replace("host: 18000", "host: 0"))
    result = complete("lanectl up ", project)
    assert (result.returncode, result.stdout.strip(), result.stderr) == (0, "", "")


def test_recipe_paths_complete_for_validate(project, write_recipe):
    write_recipe(GOOD, "box/one.yaml")
    write_recipe(GOOD.replace("id: t", "id: u"), "box/two.yaml")
    (project / "recipes" / "notes.yaml").write_text("not: a recipe\n")
    assert offered(complete("lanectl validate recipes/box/t", project)) == ["recipes/box/two.yaml"]
    assert offered(complete("lanectl validate ", project)) == ["recipes/box/one.yaml", "recipes/box/two.yaml"]
