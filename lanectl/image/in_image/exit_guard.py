"""lanectl's exit guard: the ENTRYPOINT of every lane image, with the engine's own entrypoint as its arguments.

vLLM's API server exits with code 0 when its engine core dies (gpu/record: the engine core SIGKILLed,
completions answered 500, the port closed, exit 0). A restart policy that restarts failures only (Docker's
`on-failure`, Swarm's `Condition: on-failure`) then leaves the lane dead for good. This guard runs the
engine as its child and passes on the signals that ask it to stop; when the engine exits 0 and nothing
asked it to, the guard says so on stderr and exits EXIT_UNASKED instead, so that policy restarts it.
Everything else keeps its meaning: a stop (docker stop, a Swarm update) exits 0, any other code is passed on,
and an engine killed by another signal N exits 128 + N, as a shell reports it.

A stop can come at any moment, the first milliseconds of the container included:
- the guard takes the stop signals in its first statements, before anything else is imported (the image runs
  it with `python3 -S`: no site-packages to read first). A signal before then finds Python's default: it ends
  the guard (143 under an init) or, the guard being PID 1 without one, the kernel drops it;
- a signal that comes before the engine exists is remembered and sent as soon as it does;
- an engine that dies of a stop signal the guard passed on was stopped, whatever it had installed by then:
  vLLM spends its first seconds importing with no handler (SIGTERM's default kills it), and until its server
  runs turns SIGTERM into a KeyboardInterrupt (entrypoints/launchers/api_server/entry.py `_interrupt_init`),
  which ends Python by SIGINT. Either is the stop that was asked for: exit 0.

Stdlib only: it runs on the image's python3 (vLLM's images and the stub's both have one). Keep in step
with EXIT_UNASKED in lanectl/health/engine_exit.py.
"""

from __future__ import annotations

import signal
import sys

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT, signal.SIGHUP)
asked: list[int] = []
for _stop in STOP_SIGNALS:
    signal.signal(_stop, lambda signum, _frame: asked.append(signum))

import subprocess  # noqa: E402 - after the handlers: a stop during this import must not be lost

EXIT_UNASKED = 70  # sysexits' EX_SOFTWARE: the engine stopped by itself, which is a failure of the lane


def main(argv: list[str]) -> int:
    if not argv:
        print("exit_guard: no engine command to run", file=sys.stderr, flush=True)
        return 2
    try:
        engine = subprocess.Popen(argv)
    except OSError as error:
        print(f"exit_guard: cannot start {argv[0]}: {error}", file=sys.stderr, flush=True)
        return 127

    def forward(signum: int, _frame: object) -> None:
        asked.append(signum)
        engine.send_signal(signum)

    # Held while the handlers change, so that each stop signal is sent on exactly once: those that came before the
    # engine existed from the list, any later one by `forward`.
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    early = list(asked)
    for stop in STOP_SIGNALS:
        signal.signal(stop, forward)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
    for signum in early:
        engine.send_signal(signum)
    return exit_code(engine.wait(), asked)


def exit_code(code: int, asked: list[int]) -> int:
    """The guard's exit code for the engine's `code` (negative: killed by that signal) after the stops `asked`."""
    if code < 0 and asked and -code in STOP_SIGNALS:
        return 0
    if code < 0:
        return 128 - code
    if code == 0 and not asked:
        print(f"exit_guard: the engine exited 0 although nothing asked it to stop (vLLM does when its engine "
              f"core dies); exiting {EXIT_UNASKED} so that a restart policy sees the failure",
              file=sys.stderr, flush=True)
        return EXIT_UNASKED
    return code


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
