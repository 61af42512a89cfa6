"""Control characters from outside lanectl (engine logs, webhook bodies, state files, results, paths) reach
the terminal escaped, in every view: through the real CLI (`python -m lanectl`) and the real renderer."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from lanectl.cli.terminal import shown
from tests.cli_in_process import run_cli
from tests.conftest import REPO

# A window-title OSC, a screen clear, a C1 CSI, a bidi override, a CR overwrite and a forged line.
HOSTILE = "a\x1b]0;owned\x07b\x1b[2Jc\u009b31md\u202ee\rf\nlanectl: forged"
ESCAPED_LINE = "a\\x1b]0;owned\\x07b\\x1b[2Jc\\x9b31md\\u202ee\\x0df\\x0alanectl: forged"
RAW = ("\x1b", "\x07", "\u009b", "\u202e", "\r")


def lanectl(*args: str, state: Path, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("LANECTL_")}
    env.update({"LANECTL_STATE_DIR": str(state), "LANECTL_RECIPES": str(REPO / "recipes"), "COLUMNS": "400"})
    result = run_cli(*args, cwd=cwd, env=env)
    assert "Traceback" not in result.stderr, result.stderr
    return result


def assert_no_raw_controls(result: subprocess.CompletedProcess[str]) -> None:
    for char in RAW:
        assert char not in result.stdout + result.stderr, (char, result.stdout, result.stderr)


@pytest.fixture
def state(tmp_path: Path) -> Path:
    directory = tmp_path / "state"
    directory.mkdir(mode=0o700)
    return directory


def test_the_rule_escapes_c0_c1_esc_bidi_and_undecodable_bytes_and_keeps_tabs():
    assert shown(HOSTILE) == ESCAPED_LINE
    assert shown("a\tb\nc", keep_newlines=True) == "a\tb\nc"
    assert shown("a\x00b\x7fc\u2028d") == "a\\x00b\\x7fc\\u2028d"
    assert shown(os.fsdecode(b"x\x9by")) == "x\\x9by"  # a non-UTF-8 byte of a file name: C1 CSI if printed raw
    assert shown("plain: é ✓ [core.py:10]") == "plain: é ✓ [core.py:10]"


def test_a_disarm_reason_is_escaped_in_history_and_watchdog_status(state: Path):
    assert lanectl("watchdog", "disarm", "--for", "1h", "--reason", HOSTILE, state=state).returncode == 0

    history = lanectl("history", state=state)
    status = lanectl("watchdog", "status", state=state)

    for result in (history, status):
        assert result.returncode == 0, result.stderr
        assert_no_raw_controls(result)
        assert ESCAPED_LINE in result.stdout
        assert not any(row.startswith("lanectl: forged") for row in result.stdout.splitlines())


@pytest.mark.docker
def test_a_disarm_reason_is_escaped_in_status(state: Path):
    assert lanectl("watchdog", "disarm", "--for", "1h", "--reason", HOSTILE, state=state).returncode == 0

    result = lanectl("status", state=state)

    assert result.returncode == 0, result.stderr
    assert_no_raw_controls(result)
    assert ESCAPED_LINE in result.stdout


def test_a_webhook_error_body_in_the_journal_is_escaped_in_history(state: Path):
    record = {"ts": "2026-12-01T10:00:00.000Z", "who": "root@box", "pid": 1, "kind": "watchdog", "event": "alert",
              "severity": "critical", "title": "lane down", "delivered": False,
              "detail": f"webhook answered 500: {HOSTILE}"}
    (state / "journal.jsonl").write_text(json.dumps(record) + "\n")

    result = lanectl("history", state=state)

    assert result.returncode == 0, result.stderr
    assert_no_raw_controls(result)
    assert ESCAPED_LINE in result.stdout


def test_a_state_file_text_is_escaped_in_watchdog_check(state: Path, tmp_path: Path):
    (state / "state.json").write_text(json.dumps({"version": 1, "active": HOSTILE}))
    (tmp_path / "kern.log").write_text("")

    result = lanectl("watchdog", "check", "--kernel-log", f"file:{tmp_path / 'kern.log'}", state=state)

    assert result.returncode == 2
    assert_no_raw_controls(result)
    assert f"the active lane {ESCAPED_LINE} is not in the recipes" in result.stdout


def test_results_text_is_escaped_in_report(state: Path, tmp_path: Path):
    run = tmp_path / "run"
    run.mkdir()
    gate = {"candidate": "b", "control": "a", "bar": 1.025, "verdict": "fail", "order": "ABA", "cells": {},
            "reasons": [HOSTILE], "arms": [], "probes": {}, "fidelity": {}, "calibration": None, "promoted": None}
    (run / "results.json").write_text(json.dumps({"gate": gate}))

    result = lanectl("report", str(run), state=state)

    assert result.returncode == 0, result.stderr
    assert_no_raw_controls(result)
    assert f"  - {ESCAPED_LINE}" in result.stdout.splitlines()


def test_paths_echoed_by_validate_and_init_are_escaped(state: Path, tmp_path: Path):
    name = "p\x1b]0;owned\x07q"
    missing = lanectl("validate", str(tmp_path / f"{name}.yaml"), state=state)
    made = lanectl("init", name, state=state, cwd=tmp_path)

    assert missing.returncode == 2
    assert made.returncode == 0, made.stderr
    for result in (missing, made):
        assert_no_raw_controls(result)
    assert "p\\x1b]0;owned\\x07q.yaml: no such recipe file or folder" in missing.stderr
    assert "wrote p\\x1b]0;owned\\x07q/lanectl.schema.json" in made.stdout.splitlines()


def test_a_failed_lanes_log_tail_is_escaped_by_the_cli_renderer(capsys: pytest.CaptureFixture[str]):
    """`up`'s view of a lane that failed its gate: its log tail is what any HTTP client could write."""
    import typer

    from lanectl.cli.app import show
    from lanectl.output import Result

    access_line = f'(APIServer pid=7) INFO:     127.0.0.1:5 - "GET /{HOSTILE} HTTP/1.1" 404 Not Found'
    result = Result("switch", {"result": "rolled-back", "message": "demo-h2 failed its gate", "lane": "demo-h2",
                               "steps": [], "diagnostics": {"log_tail": [access_line]}}, exit_code=1)

    with pytest.raises(typer.Exit):
        show(result)

    captured = capsys.readouterr()
    for char in RAW:
        assert char not in captured.out + captured.err
    assert f'  (APIServer pid=7) INFO:     127.0.0.1:5 - "GET /{ESCAPED_LINE} HTTP/1.1" 404 Not Found' in (
        captured.err.splitlines())


LINES = [[("ok", "green"), ": ", HOSTILE], ["  ", ("✗ red", "bold red"), "  trailing  "], [], [("x", "dim")]]


@pytest.mark.parametrize("stderr", [False, True])
def test_the_plain_console_prints_what_rich_prints_without_a_terminal(stderr: bool,
                                                                      capsys: pytest.CaptureFixture[str],
                                                                      monkeypatch: pytest.MonkeyPatch):
    """Where styles would not show, lanectl prints without rich: the same characters rich would print there."""
    from lanectl.cli.rich_console import TerminalConsole
    from lanectl.cli.terminal import PlainConsole, console

    for name in ("FORCE_COLOR", "TTY_COMPATIBLE"):
        monkeypatch.delenv(name, raising=False)
    rich = TerminalConsole(stderr=stderr, highlight=False, soft_wrap=True, emoji=False)
    plain = console(stderr=stderr)
    assert isinstance(plain, PlainConsole) and not rich.is_terminal  # pytest's capture is no terminal

    def printed(target) -> str:
        target.lines(LINES)
        target.print(f"lanectl: {HOSTILE} [bold]not markup[/bold]\nsecond line", markup=False)
        captured = capsys.readouterr()
        return captured.err if stderr else captured.out

    expected = printed(rich)
    assert printed(plain) == expected
    assert_no_raw_controls(subprocess.CompletedProcess([], 0, expected, ""))
    assert f"ok: {ESCAPED_LINE}" in expected.splitlines()


@pytest.mark.parametrize(("environment", "terminal"), [
    ({}, False), ({"FORCE_COLOR": "1"}, True), ({"FORCE_COLOR": ""}, False), ({"TTY_COMPATIBLE": "1"}, True),
    ({"TTY_COMPATIBLE": "0", "FORCE_COLOR": "1"}, False)])
def test_styles_go_through_rich_exactly_where_rich_would_show_them(environment: dict[str, str], terminal: bool,
                                                                   monkeypatch: pytest.MonkeyPatch):
    from lanectl.cli.rich_console import TerminalConsole
    from lanectl.cli.terminal import console

    for name in ("FORCE_COLOR", "TTY_COMPATIBLE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    chosen = console(stderr=False)
    assert isinstance(chosen, TerminalConsole) is terminal
    assert TerminalConsole().is_terminal is terminal  # rich's own verdict for the same stream and environment
