"""lanectl's exit guard (lanectl/image/in_image/exit_guard.py), run as the image runs it, on real processes.

vLLM exits 0 when its engine core dies; the guard must turn that exit into a failure a restart policy
sees, and change nothing else: an exit 0 that a stop signal asked for stays 0, codes pass through, a
signal death reads as a shell reports it, and the stop signal reaches the engine.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

from lanectl.health.engine_exit import EXIT_UNASKED, exit_detail

GUARD = Path(__file__).resolve().parent.parent / "lanectl" / "image" / "in_image" / "exit_guard.py"


def guarded(code: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, str(GUARD), sys.executable, "-c", code],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_an_engine_that_exits_0_unasked_exits_as_a_failure_and_says_why() -> None:
    guard = guarded("print('engine core died; bye')")
    out, err = guard.communicate(timeout=30)
    assert guard.returncode == EXIT_UNASKED == 70
    assert out == "engine core died; bye\n", "the engine's own output passes through untouched"
    assert "the engine exited 0 although nothing asked it to stop" in err
    assert exit_detail("exited", EXIT_UNASKED) == (
        "exited with code 70 (the engine exited 0 unasked, as vLLM does when its engine core dies; "
        "lanectl's exit guard made it 70)")


def test_an_exit_0_after_a_stop_signal_stays_0_and_the_signal_reached_the_engine() -> None:
    # The engine, like vLLM, handles SIGTERM and shuts down cleanly with 0.
    engine = ("import signal, sys, time\n"
              "signal.signal(signal.SIGTERM, lambda *a: (print('engine got SIGTERM', flush=True), sys.exit(0)))\n"
              "print('ready', flush=True)\n"
              "time.sleep(60)\n")
    guard = guarded(engine)
    assert guard.stdout is not None and guard.stdout.readline() == "ready\n"
    guard.send_signal(signal.SIGTERM)
    out, err = guard.communicate(timeout=30)  # the engine sleeps 60 s: only the forwarded signal ends it sooner
    assert guard.returncode == 0, err
    assert out == "engine got SIGTERM\n"
    assert err == ""


def test_other_codes_pass_through_and_a_signal_death_reads_as_128_plus_the_signal() -> None:
    failing = guarded("raise SystemExit(3)")
    failing.communicate(timeout=30)
    assert failing.returncode == 3

    killed = guarded("import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
    killed.communicate(timeout=30)
    assert killed.returncode == 128 + signal.SIGKILL


def test_an_engine_that_cannot_start_is_named() -> None:
    guard = subprocess.run([sys.executable, str(GUARD), "/nonexistent/vllm", "serve"], capture_output=True,
                           text=True, timeout=30)
    assert guard.returncode == 127
    assert "exit_guard: cannot start /nonexistent/vllm" in guard.stderr
