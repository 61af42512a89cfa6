"""`python3 -m stubengine serve MODEL_PATH --served-model-name NAME ...`"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Sequence

from . import config, logs, startup

_SIGNALS = {signal.SIGTERM, signal.SIGINT}


def _exit_on_signal(signum: int, _frame: object = None) -> None:
    logs.uvicorn.info("Shutting down")
    logs.uvicorn.info("Finished server process [%d]", os.getpid())
    # No graceful drain: in-flight streams are cut as a container stop cuts them, and nothing can
    # keep the process alive past the signal.
    os._exit(0)


def _serve(cfg: config.Config) -> None:
    try:
        startup.serve(cfg)
    except BaseException:  # noqa: BLE001 - any escape from the server thread must end the process
        logs.get("api_server").exception("API server failed")
        os._exit(1)


def main(argv: Sequence[str] | None = None) -> int:
    logs.setup()
    try:
        cfg = config.load(sys.argv[1:] if argv is None else argv)
    except config.ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 2
    # Handlers make SIGTERM deliverable even to PID 1 (the kernel drops default-handled signals sent
    # to init); blocking the signals in every thread and taking them with sigwait on the main thread
    # makes the exit immediate whatever the other threads are blocked in.
    for sig in _SIGNALS:
        signal.signal(sig, _exit_on_signal)
    signal.pthread_sigmask(signal.SIG_BLOCK, _SIGNALS)
    threading.Thread(target=_serve, args=(cfg,), name="APIServer", daemon=True).start()
    _exit_on_signal(signal.sigwait(_SIGNALS))
    return 0


if __name__ == "__main__":
    sys.exit(main())
