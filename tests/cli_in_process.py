"""The CLI run in the test's own process, as a subprocess would run it but without a Python start-up and the
imports of every call (about a third of a CPU-second each, hundreds of calls per suite).

Same app, same root group (which reports domain errors and exit codes as the installed command does), same
parsing; typer's CliRunner swaps stdin, stdout and stderr for the call. What a run could leave behind is put
back: the environment is exactly `env` during the call and os.environ's own afterwards, the current folder is
restored, the consoles are made afresh for each run (lanectl.cli.app), and no signal handler is installed
(only `main()` sets one; lanectl's own interrupt handling restores the previous handlers itself).

Tests of the installed command's own contract (the entry point, signals, a process's exit status) keep
running it as a subprocess.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import traceback
from collections.abc import Mapping
from pathlib import Path


def run_cli(*args: str, cwd: Path, env: Mapping[str, str], timeout: float = 180) -> subprocess.CompletedProcess[str]:
    """`lanectl ARGS` in folder `cwd` with environment `env` (the whole of it), as subprocess.run would
    report it. An exception that escapes the CLI fails the test with its traceback, as the real command
    would print one; a run that hangs past `timeout` ends the test run with every thread's traceback, as a
    subprocess's timeout would end the test."""
    import faulthandler

    from typer.testing import CliRunner

    from lanectl.cli.app import app

    overrides: dict[str, str | None] = {key: None for key in os.environ if key not in env}
    overrides.update(env)
    faulthandler.dump_traceback_later(timeout, exit=True)
    try:
        with contextlib.chdir(cwd):
            result = CliRunner().invoke(app, list(args), env=overrides, prog_name="lanectl")
    finally:
        faulthandler.cancel_dump_traceback_later()
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise AssertionError(f"lanectl {' '.join(args)} raised:\n"
                             + "".join(traceback.format_exception(result.exception))
                             + f"\nstderr:\n{result.stderr}")
    return subprocess.CompletedProcess(["lanectl", *args], result.exit_code, result.stdout, result.stderr)
