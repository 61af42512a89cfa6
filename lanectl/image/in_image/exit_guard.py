"""lanectl's exit guard: the ENTRYPOINT of every lane image, with the engine's own entrypoint as its arguments.

vLLM's API server exits with code 0 when its engine core dies (gpu/record: the engine core SIGKILLed,
completions answered 500, the port closed, exit 0). A restart policy that restarts failures only (Docker's
`on-failure`, Swarm's `Condition: on-failure`) then leaves the lane dead for good. This guard runs the
engine as its child and passes on the signals that ask it to stop; when the engine exits 0 and nothing
asked it to, the guard says so on stderr and exits EXIT_UNASKED instead, so that policy restarts it.
Everything else keeps its meaning: an exit 0 after SIGTERM (docker stop, a Swarm update) stays 0, any
other code is passed on, and an engine killed by signal N exits 128 + N, as a shell reports it.

Stdlib only: it runs on the image's python3 (vLLM's images and the stub's both have one). Keep in step
with EXIT_UNASKED in lanectl/health/engine_exit.py.
"""

from __future__ import annotations

import signal
import subprocess
import sys

EXIT_UNASKED = 70  # sysexits' EX_SOFTWARE: the engine stopped by itself, which is a failure of the lane
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT, signal.SIGHUP)


def main(argv: list[str]) -> int:
    if not argv:
        print("exit_guard: no engine command to run", file=sys.stderr, flush=True)
        return 2
    asked: list[int] = []
    # Signals that arrive before the engine exists are remembered and sent as soon as it does.
    for stop in STOP_SIGNALS:
        signal.signal(stop, lambda signum, _frame: asked.append(signum))
    try:
        engine = subprocess.Popen(argv)
    except OSError as error:
        print(f"exit_guard: cannot start {argv[0]}: {error}", file=sys.stderr, flush=True)
        return 127

    def forward(signum: int, _frame: object) -> None:
        asked.append(signum)
        engine.send_signal(signum)

    for stop in STOP_SIGNALS:
        signal.signal(stop, forward)
    for early in list(asked):
        engine.send_signal(early)
    code = engine.wait()
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
