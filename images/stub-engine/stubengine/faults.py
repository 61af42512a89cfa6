"""Injected failures, each reproducing one way a real vLLM lane fails, with vLLM's own log lines.

- crash:          the engine core dies ("EngineCore encountered a fatal error."), in the order a real vLLM
                  showed it (BRIEF §8, SHAPE.md): for CORE_DEATH_SECONDS /health still answers 200 while
                  completions answer 500 ("EngineCore encountered an issue. See stack trace (above) for the
                  root cause."), the API server logs that the engine core exited and an EngineDeadError
                  traceback, then the port closes and the process **exits 0**.
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
- die_on_wake:    the engine core dies when asked to wake: the wake answers 500, then the process exits 0.
STUB_FAULT_WAKE=N holds wake_fail, wake_altered and die_on_wake back until the Nth wake (a standby check must
find a fault of a late cycle, not only of the first).

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
from collections.abc import Callable

from . import logs

log = logs.get("core")
api_log = logs.get("api_server")

OUTPUT_FAULTS = ("broken_tool_json", "leak_reasoning", "loop", "miss_needle")
RUNTIME_FAULTS = ("crash", "hang", "unhealthy", "fatal_log", *OUTPUT_FAULTS, "clear")
SLEEP_FAULTS = ("wake_fail", "wake_altered", "die_asleep", "die_on_wake", "sleep_fail")

FATAL_CUDA_LINE = "CUDA error: an illegal memory access was encountered"


# How long the API server outlives its engine core: the record saw /health 200 at 0.3 s, the port closed at 1.3 s.
CORE_DEATH_SECONDS = 1.0
CORE_DEAD_MESSAGE = "EngineCore encountered an issue. See stack trace (above) for the root cause."
_VLLM = "/usr/local/lib/python3.12/dist-packages/vllm"


def _core_traceback(error: str) -> str:
    return (
        "Traceback (most recent call last):\n"
        f'  File "{_VLLM}/v1/engine/core.py", line 1015, in run_engine_core\n'
        "    engine_core.run_busy_loop()\n"
        f'  File "{_VLLM}/v1/engine/core.py", line 1042, in run_busy_loop\n'
        "    self._process_engine_step()\n"
        f"{error}"
    )


_DEAD_TRACEBACK = (
    "Traceback (most recent call last):\n"
    f'  File "{_VLLM}/v1/engine/async_llm.py", line 650, in output_handler\n'
    "    outputs = await engine_core.get_output_async()\n"
    f'  File "{_VLLM}/v1/engine/core_client.py", line 890, in get_output_async\n'
    "    raise self._format_exception(outputs) from None\n"
    f"vllm.v1.engine.exceptions.EngineDeadError: {CORE_DEAD_MESSAGE}"
)


def crash_on_start(reason: str) -> None:
    """The engine core fails while loading: its error and traceback, then the API server gives up (exit 1)."""
    fail_to_start(f"RuntimeError: stub engine: injected start failure ({reason})")


def fail_to_start(error: str) -> None:
    """The engine core fails while loading with `error` (a vLLM exception line), then the API server gives up."""
    log.error("EngineCore failed to start.\n%s", _core_traceback(error))
    api_log.error("%s", "RuntimeError: Engine core initialization failed. See root cause above. "
                        "Failed core proc(s): {'EngineCore': 1}")
    os._exit(1)


def _exit_after_core_death() -> None:
    for message in ("Shutting down", "Waiting for application shutdown.", "Application shutdown complete.",
                    f"Finished server process [{os.getpid()}]"):
        logs.uvicorn.info(message)
    os._exit(0)  # vLLM's API server exits 0 after its engine core died: only the log says otherwise


class FaultState:
    """The engine's health as the HTTP server and the engine loop see it."""

    def __init__(self, on_change: Callable[[], None] = lambda: None, *,
                 core_death_seconds: float = CORE_DEATH_SECONDS) -> None:
        self._lock = threading.Lock()
        self.core_death_seconds = core_death_seconds
        self.mode = "ok"  # ok | hang | unhealthy | core_dead
        self.output: str | None = None  # one of OUTPUT_FAULTS while injected
        self.on_change = on_change

    @property
    def stuck(self) -> bool:
        return self.mode == "hang"

    @property
    def dead(self) -> bool:
        """The engine takes no requests: unhealthy, or its engine core died (crash)."""
        return self.mode in ("unhealthy", "core_dead")

    @property
    def health_status(self) -> int:
        # vLLM's /health asks the engine client, which learns of a dead core only at its next poll.
        return 503 if self.mode == "unhealthy" else 200

    def dead_error(self, message: str) -> tuple[int, str, str]:
        """Status, message and error type a request gets from a dead engine."""
        if self.mode == "core_dead":
            return 500, CORE_DEAD_MESSAGE, "InternalServerError"
        return 503, message, "EngineDeadError"

    def crash(self, reason: str) -> None:
        """The engine core dies, and the API server follows it `core_death_seconds` later with exit code 0."""
        with self._lock:
            if self.mode == "core_dead":
                return
            self.mode = "core_dead"
        log.error("EngineCore encountered a fatal error.\n%s",
                  _core_traceback(f"RuntimeError: stub engine: injected crash ({reason})"))
        self.on_change()
        api_log.warning("[shutdown] MPClient: engine core exited unexpectedly; starting cleanup")
        api_log.error("AsyncLLM output_handler failed.\n%s", _DEAD_TRACEBACK)
        timer = threading.Timer(self.core_death_seconds, _exit_after_core_death)
        timer.daemon = True
        timer.start()

    def apply(self, fault: str, reason: str) -> None:
        if fault == "crash":
            self.crash(reason)
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
