"""The guides (docs/guides/) run as written: the blocks each marks `<!-- runnable -->` run in order in one shell,
as a reader would type them, against the real Docker engine and lanectl's CPU stub engine.

Only the project's name and its host port are made unique (`lanectl init my-lanes` becomes `lanectl init
g-<hex> --port <free port>`), so that a run never meets another run's containers; state and lock folders are the
test's own. Blocks a guide does not mark (a GPU build, a root install, a Swarm) are read, not run; every lanectl
command a guide shows, run or not, is checked against the command-line app's commands and options."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import uuid
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from tests.lane_fixtures import free_port

REPO = Path(__file__).resolve().parent.parent
GUIDES = REPO / "docs" / "guides"
JM_FIXTURE = REPO / "tests" / "fixtures" / "jm"
RUNNABLE = re.compile(r"^<!-- runnable -->\n```(?:sh|bash)\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
SHELL = re.compile(r"^```(?:sh|bash)\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
INLINE = re.compile(r"`(lanectl [^`\n]+)`")
HEREDOC = re.compile(r"<<-?\s*['\"]?(\w+)['\"]?")
# What ends one simple command and starts the next in a shell line.
SEPARATORS = {"&&", "||", ";", "|", "(", ")", "&"}
ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")
# Guides that read a vLLM release's source from the package index.
NETWORK = {"moving-the-vllm-pin.md"}
# What each guide's run must print, beyond exiting 0: the outcomes its prose describes.
PRINTED = {
    "moving-the-vllm-pin.md": ["pin check exited 1", "breaks build: vLLM 0.32.0 images need `vllm download-kernels`",
                               "ok: 4 lanes in 2 recipes (dsv41, dsv41-032, stub-a, stub-b)",
                               "dsv41-032 (recipes/dsv41.yaml, pinned to 0.32.0)"],
    "upgrading.md": ["ok: 2 lanes in 1 recipes (stub-a, stub-b)", "LANECTL_STATE_DIR="],
    "gate-and-release-note.md": ["gate exited 0", "verdict: PASS", "# Passed, not promoted: stub-b"],
    "first-lane.md": ["ok: 3 lanes in 2 recipes (dsv41, stub-a, stub-b)", "ok: stub-a is serving"],
    "switching-in-production.md": ["ok: stub-b is serving", "up exited 1",
                                   "rolled-back: stub-broken failed its health gate"],
    "fleet-on-swarm.md": ["ok: 4 lanes in 2 recipes (fleet-a, fleet-b, stub-a, stub-b)",
                          '"Name": "my-fleet-primary-NODE"', '"Kind": "NVIDIA-GPU"', "up exited 2"],
    "watchdog.md": ["check exited 1", "none: healthy", "restarted 1x by the watchdog",
                    "lanectl_watchdog_restarts_total{lane=\"stub-a\"} 1",
                    "LANECTL_LOCK_DIR="],
}


def runnable(markdown: str) -> list[str]:
    return [match.group(1) for match in RUNNABLE.finditer(markdown)]


def guides() -> list[str]:
    return sorted(path.name for path in GUIDES.glob("*.md"))


def test_only_the_blocks_marked_runnable_are_run() -> None:
    text = ("# G\n\n```sh\nlanectl build h2-REF\n```\n\n<!-- runnable -->\n```sh\nlanectl validate\n```\n\n"
            "<!-- runnable -->\n```text\nnot a command\n```\n")
    assert runnable(text) == ["lanectl validate\n"]


@pytest.mark.parametrize("guide", guides())
def test_every_guide_has_runnable_commands_and_an_expectation(guide: str) -> None:
    assert runnable((GUIDES / guide).read_text()), f"{guide}: no block marked <!-- runnable -->"
    assert guide in PRINTED


def shell_lines(block: str) -> list[str]:
    """A shell block's command lines: continued lines joined, here-document bodies (a recipe, a file) left out."""
    lines: list[str] = []
    ending = None
    for line in block.replace("\\\n", " ").splitlines():
        if ending is not None:
            ending = None if line.strip() == ending else ending
            continue
        lines.append(line)
        if heredoc := HEREDOC.search(line):
            ending = heredoc.group(1)
    return lines


def lanectl_calls(line: str) -> list[list[str]]:
    """The words after `lanectl` of each lanectl command in one shell line (`a && lanectl up x || code=$?`)."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    calls: list[list[str]] = []
    command: list[str] = []
    for word in [*lexer, ";"]:
        if word not in SEPARATORS:
            command.append(word)
            continue
        words = command
        while words and ASSIGNMENT.match(words[0]):  # `code=0 lanectl …`, `x=$(lanectl …)`
            words = words[1:]
        if words[:1] == ["lanectl"]:
            calls.append(words[1:])
        command = []
    return calls


def guide_calls(markdown: str) -> list[tuple[str, list[str]]]:
    """Every lanectl command a guide shows, run or not: in its shell blocks, and in its prose as `lanectl …`
    (placeholders such as LANE or `[--json]` are taken as arguments)."""
    found = [(line, words) for block in SHELL.findall(markdown) for line in shell_lines(block)
             for words in lanectl_calls(line)]
    for span in INLINE.findall(markdown):
        words = [word.strip("[]") for word in span.replace("…", " ").replace("|", " ").split()[1:]]
        found.append((span, [word for word in words if word]))
    return found


@cache
def lanectl_command() -> Any:
    import typer

    from lanectl.cli.app import app

    return typer.main.get_command(app)


def unknown_in(words: list[str]) -> str | None:
    """What in `lanectl WORDS` the command-line app does not have (a command or an option); None if all is."""
    import typer

    command = lanectl_command()
    context = typer.Context(command, info_name="lanectl")
    index = 0
    while index < len(words):
        word = words[index]
        if hasattr(command, "list_commands") and not word.startswith("-"):
            child = command.get_command(context, word)
            if child is None:
                return f"the command {context.command_path} {word}"
            command, context = child, typer.Context(child, info_name=word, parent=context)
        elif word.startswith("-"):
            options = {name: param for param in command.get_params(context)
                       for name in param.opts + param.secondary_opts}
            name = word.split("=", 1)[0]
            if name not in options:
                return f"the option {name} of {context.command_path}"
            takes_value = not getattr(options[name], "is_flag", False) and not getattr(options[name], "count", False)
            index += 1 if takes_value and "=" not in word else 0
        index += 1
    return None


def test_the_command_check_reads_shell_lines_as_a_shell_does() -> None:
    block = ("code=0; lanectl up b --no-gpu || code=$?\nx=$(lanectl status --json | jq .data)\n"
             "cat > f <<'EOF'\nlanectl not-a-command\nEOF\nlanectl import jm ../r \\\n  --lane dsv41  # a comment\n")
    assert [words for line in shell_lines(block) for words in lanectl_calls(line)] == [
        ["up", "b", "--no-gpu"], ["status", "--json"], ["import", "jm", "../r", "--lane", "dsv41"]]
    assert guide_calls("Go back: `lanectl rollback --fleet [--to LANE]`.") == [
        ("lanectl rollback --fleet [--to LANE]", ["rollback", "--fleet", "--to", "LANE"])]
    assert unknown_in(["fleet", "status", "--json"]) is None
    assert unknown_in(["--recipes", "r", "history", "-n", "30", "--fleet"]) is None
    assert unknown_in(["fleet", "upgrade"]) == "the command lanectl fleet upgrade"
    assert unknown_in(["up", "x", "--fleet", "--canary=s1", "--nodes-from", "y"]) == (
        "the option --nodes-from of lanectl up")


@pytest.mark.parametrize("guide", guides())
def test_every_command_a_guide_shows_is_one_lanectl_has(guide: str) -> None:
    """Blocks that are read and not run (a GPU build, a Swarm) still name real commands and options."""
    calls = guide_calls((GUIDES / guide).read_text())
    assert calls
    wrong = [f"{shown}: {unknown}" for shown, words in calls if (unknown := unknown_in(words))]
    assert wrong == [], f"{guide} shows what lanectl does not have"


@pytest.mark.docker
@pytest.mark.parametrize("guide", [pytest.param(guide, marks=[pytest.mark.network] if guide in NETWORK else [])
                                   for guide in guides()])
def test_a_guide_runs_as_written(guide: str, tmp_path: Path) -> None:
    name = f"g-{uuid.uuid4().hex[:8]}"
    script = "\n".join(runnable((GUIDES / guide).read_text()))
    script = script.replace("lanectl init my-lanes", f"lanectl init {name} --port {free_port()}")
    script = script.replace("my-lanes", name)
    shutil.copytree(JM_FIXTURE, tmp_path / "J-M-Recipes" / "recipes")
    env = {key: value for key, value in os.environ.items() if not key.startswith("LANECTL_")}
    env.update({"PATH": f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
                "LANECTL_STATE_DIR": str(tmp_path / "state"), "LANECTL_LOCK_DIR": os.environ["LANECTL_LOCK_DIR"],
                "COLUMNS": "200"})
    try:
        result = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=tmp_path, env=env,
                                capture_output=True, text=True, timeout=540)
        assert result.returncode == 0, f"{guide} stopped (exit {result.returncode}):\n{result.stdout}\n{result.stderr}"
        for expected in PRINTED[guide]:
            assert expected in result.stdout, f"{guide}: {expected!r} not printed:\n{result.stdout}"
    finally:
        _remove(name)


def _remove(name: str) -> None:
    containers = subprocess.run(["docker", "ps", "-aq", "--filter", f"label=io.lanectl.recipe={name}"],
                                capture_output=True, text=True).stdout.split()
    if containers:
        subprocess.run(["docker", "rm", "-f", *containers], capture_output=True)
    images = subprocess.run(["docker", "images", "-q", f"lanectl/{name}"], capture_output=True, text=True).stdout
    if images.split():
        subprocess.run(["docker", "rmi", "-f", *sorted(set(images.split()))], capture_output=True)
