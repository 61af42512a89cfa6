"""`python3 -m stubengine serve MODEL_PATH --served-model-name NAME ...`"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Sequence

from . import config, logs, shutdown, startup

_SIGNALS = {signal.SIGTERM, signal.SIGINT}


def _serve(cfg: config.Config, up: startup.Up) -> None:
    try:
        startup.serve(cfg, up)
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
    # hands the stop to one place whatever the other threads are blocked in. Signals after the first stay
    # blocked, so they change nothing, as vLLM's handler ignores a second one.
    for sig in _SIGNALS:
        signal.signal(sig, lambda *_: None)
    signal.pthread_sigmask(signal.SIG_BLOCK, _SIGNALS)
    up = startup.Up()
    threading.Thread(target=_serve, args=(cfg, up), name="APIServer", daemon=True).start()
    signum = signal.sigwait(_SIGNALS)
    serving = up.serving()
    if serving is None:
        shutdown.exit_before_serving()
    os._exit(shutdown.stop(cfg, serving, signum))


if __name__ == "__main__":
    sys.exit(main())
