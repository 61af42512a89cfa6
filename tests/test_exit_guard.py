"""lanectl's exit guard (lanectl/image/in_image/exit_guard.py), run as the image runs it (`python3 -S`), on real
processes with real signals, and in a real container where only Docker shows it (PID 1, Docker's init).

vLLM exits 0 when its engine core dies; the guard must turn that exit into a failure a restart policy sees, and
change nothing else: a stop exits 0 whenever it comes, codes pass through, a death by another signal reads as a
shell reports it, and the stop signal reaches the engine.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from lanectl.health.engine_exit import EXIT_UNASKED, exit_detail

GUARD = Path(__file__).resolve().parent.parent / "lanectl" / "image" / "in_image" / "exit_guard.py"
# An engine that, like vLLM while it imports (its first seconds in the GPU record), has no handler for a while:
# SIGTERM's default kills it. It says when it is up, then holds SIGTERM as vLLM's server does.
LATE_HANDLER = ("import os, sys, time\n"
                "time.sleep(float(os.environ.get('HANDLER_AFTER', '1')))\n"
                "import signal\n"
                "signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))\n"
                "print('handler', flush=True)\n"
                "time.sleep(120)\n")
# vLLM's API server until uvicorn runs (entrypoints/launchers/api_server/entry.py `_interrupt_init`): SIGTERM
# raises KeyboardInterrupt, which nothing catches, so Python ends itself by SIGINT.
INTERRUPT_INIT = ("import signal, time\n"
                  "def interrupt(*_): raise KeyboardInterrupt('terminated')\n"
                  "signal.signal(signal.SIGTERM, interrupt)\n"
                  "print('loading', flush=True)\n"
                  "time.sleep(120)\n")
EXIT_WAIT = 120  # a hang detector: every case below ends long before on any machine


def guarded(code: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-S", str(GUARD), sys.executable, "-c", code],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def holds_stop_signals(pid: int) -> bool:
    """Whether the process has a handler for SIGTERM (its SigCgt mask): from then on a stop cannot be lost."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    caught = next(int(line.split()[1], 16) for line in status.splitlines() if line.startswith("SigCgt:"))
    return bool(caught >> (signal.SIGTERM - 1) & 1)


def children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def wait_for(condition, what: str) -> None:
    deadline = time.monotonic() + EXIT_WAIT
    while not condition():
        assert time.monotonic() < deadline, f"never {what}"
        time.sleep(0.001)


def test_an_engine_that_exits_0_unasked_exits_as_a_failure_and_says_why() -> None:
    guard = guarded("print('engine core died; bye')")
    out, err = guard.communicate(timeout=EXIT_WAIT)
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
    out, err = guard.communicate(timeout=EXIT_WAIT)  # the engine sleeps 60 s: only the forwarded signal ends it sooner
    assert guard.returncode == 0, err
    assert out == "engine got SIGTERM\n"
    assert err == ""


def test_other_codes_pass_through_and_a_death_by_another_signal_reads_as_128_plus_the_signal() -> None:
    failing = guarded("raise SystemExit(3)")
    failing.communicate(timeout=EXIT_WAIT)
    assert failing.returncode == 3

    killed = guarded("import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
    killed.communicate(timeout=EXIT_WAIT)
    assert killed.returncode == 128 + signal.SIGKILL

    # A stop signal nobody sent the guard is not a stop: the engine's own SIGTERM to itself is a death.
    self_term = guarded("import os, signal; os.kill(os.getpid(), signal.SIGTERM)")
    self_term.communicate(timeout=EXIT_WAIT)
    assert self_term.returncode == 128 + signal.SIGTERM


def test_an_engine_that_cannot_start_is_named() -> None:
    guard = subprocess.run([sys.executable, "-S", str(GUARD), "/nonexistent/vllm", "serve"], capture_output=True,
                           text=True, timeout=EXIT_WAIT)
    assert guard.returncode == 127
    assert "exit_guard: cannot start /nonexistent/vllm" in guard.stderr


@pytest.mark.parametrize("moment", ["as the guard takes the signals", "once the engine process exists",
                                    "while the engine has no handler yet"])
def test_a_stop_in_the_first_moments_exits_0(moment: str) -> None:
    """From the guard's first statement on, a stop at any moment is a stop: before the engine exists it is sent
    as soon as it does; an engine that dies of it before it has a handler (vLLM's imports) was stopped."""
    guard = guarded(LATE_HANDLER, env={"HANDLER_AFTER": "30"})
    wait_for(lambda: holds_stop_signals(guard.pid), "took the stop signals")
    if moment != "as the guard takes the signals":
        wait_for(lambda: children(guard.pid), "started the engine")
    if moment == "while the engine has no handler yet":
        (engine,) = children(guard.pid)
        wait_for(lambda: b"\0-c\0" in Path(f"/proc/{engine}/cmdline").read_bytes(), "ran the engine's python")
    guard.send_signal(signal.SIGTERM)
    out, err = guard.communicate(timeout=EXIT_WAIT)
    assert (guard.returncode, out, err) == (0, "", "")


def test_a_stop_that_vllm_turns_into_a_keyboard_interrupt_while_it_loads_exits_0() -> None:
    guard = guarded(INTERRUPT_INIT)
    assert guard.stdout is not None and guard.stdout.readline() == "loading\n"
    guard.send_signal(signal.SIGTERM)
    _, err = guard.communicate(timeout=EXIT_WAIT)
    assert guard.returncode == 0, err
    assert "KeyboardInterrupt: terminated" in err, "the engine's own traceback passes through"


def test_stops_at_every_moment_of_the_start_all_exit_0() -> None:
    """A stop at each of a spread of moments after the guard took the signals (the engine not started, started
    without a handler, running with one): every one exits 0, and the engine got it (it never ran to its end)."""
    for moment_ms in (0, 1, 3, 10, 30, 100, 300):
        guard = guarded(LATE_HANDLER, env={"HANDLER_AFTER": "0.15"})
        wait_for(lambda guard=guard: holds_stop_signals(guard.pid), "took the stop signals")
        time.sleep(moment_ms / 1000)
        guard.send_signal(signal.SIGTERM)
        out, err = guard.communicate(timeout=EXIT_WAIT)
        assert (guard.returncode, err) == (0, ""), f"a stop {moment_ms} ms in"
        assert out in ("", "handler\n")


# -- in a real container: PID 1 without an init, and Docker's init ------------------------------------------------

BASE_IMAGE = "lanectl/base-python:bookworm"


@pytest.fixture(scope="module")
def docker_client():
    docker = pytest.importorskip("docker")
    client = docker.from_env()
    try:
        client.images.get(BASE_IMAGE)
    except docker.errors.ImageNotFound:
        pytest.skip(f"{BASE_IMAGE} is not built (make base-image)")
    return client


@pytest.mark.docker
@pytest.mark.parametrize("init", [False, True], ids=["guard-as-pid-1", "under-dockers-init"])
def test_docker_stop_while_the_engine_starts_exits_0(docker_client, init: bool) -> None:
    """`docker stop` while the engine has no handler yet (vLLM's first seconds). As PID 1 the guard must hold the
    signal itself (the kernel drops a default-handled one sent to PID 1: the stop would wait out the timeout and
    end in SIGKILL, 137); under Docker's init the engine dies of it (143 before). Both are stops: 0."""
    container = docker_client.containers.run(
        BASE_IMAGE, ["python3", "-S", "/guard/exit_guard.py", "python3", "-c", LATE_HANDLER],
        environment={"HANDLER_AFTER": "60"}, init=init, detach=True, name=f"lanectl-guard-{uuid.uuid4().hex[:8]}",
        volumes={str(GUARD.parent): {"bind": "/guard", "mode": "ro"}},
        labels={"io.lanectl.test": "exit-guard"})
    try:
        container.reload()
        top = container.attrs["State"]["Pid"]
        guard_pid = top if not init else None

        def guard_ready() -> bool:
            nonlocal guard_pid
            if guard_pid is None:
                guard_pid = next(iter(children(top)), None)
            return guard_pid is not None and holds_stop_signals(guard_pid) and bool(children(guard_pid))

        wait_for(guard_ready, "started the guard and its engine")
        container.stop(timeout=EXIT_WAIT)
        container.reload()
        assert container.attrs["State"]["ExitCode"] == 0, container.logs().decode()
    finally:
        container.remove(force=True)
