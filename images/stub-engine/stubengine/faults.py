"""Injected failures, each reproducing one way a real vLLM lane fails, with vLLM's own log lines.

- crash:          the engine core dies ("EngineCore encountered a fatal error."), the process exits 1.
- crash_on_start: the engine core dies while loading ("EngineCore failed to start."), exit 1.
- hang:           the engine loop stops stepping while /health and /v1/models keep answering 200
                  (vllm#39863): only a probe that generates a token notices.
- unhealthy:      the engine is dead but the process lives: /health and generation answer 503
                  (EngineDeadError); requests in flight end with an error.
- fatal_log:      a fatal CUDA line is logged and the server keeps serving, so only a log watcher sees it.
- slow_start:     loading takes STUB_SLOW_START_SECONDS (handled by startup.py).

Sleep-mode faults (handled by sleep.py), each a way a standby has failed upstream:
- wake_fail:      POST /wake_up answers 500 (CUDA out of memory) and the engine stays asleep.
- wake_altered:   the wake succeeds and /health says 200, but every token after it differs from before the
                  sleep: the "healthy endpoint, corrupt output" wake (vllm#17103).
- die_asleep:     the process dies STUB_FAULT_AFTER_S after falling asleep, as a crash does.

Output faults (answers.py, decoding.py): the engine stays healthy and fast, but a correctness probe fails.
- broken_tool_json: tool-call arguments lose their closing brace (a tool parser that cuts the last token).
- leak_reasoning:   the reasoning is returned inside the answer as <think>...</think>, not apart (a
                    missing or mismatched --reasoning-parser).
- loop:             after LOOP_AFTER tokens every generation repeats its last LOOP_PERIOD tokens for ever.
- miss_needle:      a long-context question is answered as if the needle were not in the prompt.
"""

from __future__ import annotations

import os
import threading
import traceback
from collections.abc import Callable

from . import logs

log = logs.get("core")

OUTPUT_FAULTS = ("broken_tool_json", "leak_reasoning", "loop", "miss_needle")
RUNTIME_FAULTS = ("crash", "hang", "unhealthy", "fatal_log", *OUTPUT_FAULTS, "clear")
SLEEP_FAULTS = ("wake_fail", "wake_altered", "die_asleep")

FATAL_CUDA_LINE = "CUDA error: an illegal memory access was encountered"


def _traceback(message: str) -> str:
    def run_engine_core() -> None:
        raise RuntimeError(message)

    try:
        run_engine_core()
    except RuntimeError:
        return traceback.format_exc()
    return ""  # unreachable: keeps type checkers content


def die(headline: str, message: str, trailer: str) -> None:
    """Log like a dying vLLM engine core and exit 1 at once: no cleanup that could hang the exit."""
    log.error("%s\n%s%s", headline, _traceback(message), trailer)
    os._exit(1)


def crash(reason: str) -> None:
    die(
        "EngineCore encountered a fatal error.",
        f"stub engine: injected crash ({reason})",
        "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. "
        "See stack trace (above) for the root cause.",
    )


def crash_on_start(reason: str) -> None:
    die(
        "EngineCore failed to start.",
        f"stub engine: injected start failure ({reason})",
        "RuntimeError: Engine core initialization failed. See root cause above. "
        "Failed core proc(s): {'EngineCore_DP0': 1}",
    )


class FaultState:
    """The engine's health as the HTTP server and the engine loop see it."""

    def __init__(self, on_change: Callable[[], None] = lambda: None) -> None:
        self._lock = threading.Lock()
        self.mode = "ok"  # ok | hang | unhealthy
        self.output: str | None = None  # one of OUTPUT_FAULTS while injected
        self.on_change = on_change

    @property
    def stuck(self) -> bool:
        return self.mode == "hang"

    @property
    def dead(self) -> bool:
        return self.mode == "unhealthy"

    def apply(self, fault: str, reason: str) -> None:
        if fault == "crash":
            crash(reason)
        elif fault == "fatal_log":
            log.error(FATAL_CUDA_LINE)
        elif fault in OUTPUT_FAULTS:
            # Nothing is logged: a probe of the outputs must catch it, not a log watcher.
            self.output = fault
        elif fault in ("hang", "unhealthy", "clear"):
            with self._lock:
                self.mode = "ok" if fault == "clear" else fault
                if fault == "clear":
                    self.output = None
            # Neither mode logs a fatal line: each must be caught by the probe it exists to test (a
            # generating probe for hang, /health for unhealthy), not by a log watcher.
            if fault == "unhealthy":
                log.warning("Stub engine marked unhealthy (%s): /health and generation answer 503", reason)
            elif fault == "clear":
                log.info("Injected faults cleared")
            self.on_change()
        else:
            raise ValueError(f"unknown fault {fault!r}; expected one of {', '.join(RUNTIME_FAULTS)}")

    def schedule(self, fault: str, after_s: float, reason: str = "") -> None:
        """Inject `fault` `after_s` seconds from now (STUB_FAULT with STUB_FAULT_AFTER_S)."""
        timer = threading.Timer(after_s, self.apply, args=(fault, reason or f"STUB_FAULT={fault}"))
        timer.daemon = True
        timer.start()
