"""vLLM's sleep mode: POST /sleep?level=N, POST /wake_up, GET /is_sleeping (development routes).

A sleeping vLLM keeps its process, its port and its CUDA context, copies its weights to host memory
(level 1; level 2 discards them), frees its KV cache and answers generation with an error until it is
woken. The stub keeps the same contract and vLLM's log lines, takes STUB_SLEEP_SECONDS to fall asleep
and STUB_WAKE_SECONDS to wake, and injects the faults that make a standby dangerous (faults.py).
"""

from __future__ import annotations

import threading
import time

from . import logs
from .config import Config
from .engine import Engine
from .faults import FaultState

log = logs.get("executor")

# What a sleeping vLLM frees and what it keeps (its CUDA context and graphs; upstream reports 1-16 GiB).
FREED_GIB = 72.3
RESIDENT_GIB = 1.0


class SleepError(Exception):
    """A sleep or wake request the engine refused or failed; answered with `status`."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class Sleeper:
    """The engine's sleep state. Sleep and wake hold one lock, so they never interleave."""

    def __init__(self, cfg: Config, engine: Engine, fault_state: FaultState) -> None:
        self.cfg = cfg
        self.engine = engine
        self.faults = fault_state
        self.level = 0  # 0: awake
        # Added to the token seed after a wake that corrupted the weights (wake_altered, or waking from
        # level 2 without reloading them): the endpoint answers, the text is different.
        self.seed_offset = 0
        self._lock = threading.Lock()

    @property
    def asleep(self) -> bool:
        return self.level > 0

    def sleep(self, level: int) -> None:
        if not self.cfg.enable_sleep_mode:
            raise SleepError(400, "Sleep mode is not enabled: start the server with --enable-sleep-mode")
        if level not in (1, 2):
            raise SleepError(400, f"level must be 1 or 2, got {level}")
        with self._lock:
            if self.asleep:
                log.warning("Executor is already sleeping.")
                return
            started = time.monotonic()
            self.engine.set_sleeping(True)  # requests in flight are aborted, as vLLM's default mode does
            time.sleep(self.cfg.sleep_seconds)
            log.info("Sleep mode freed %.2f GiB memory, %.2f GiB memory is still in use.", FREED_GIB, RESIDENT_GIB)
            log.info("It took %.6f seconds to fall asleep.", time.monotonic() - started)
            self.level = level
        if self.cfg.fault == "die_asleep":
            self.faults.schedule("crash", self.cfg.fault_after_s, "STUB_FAULT=die_asleep: died while asleep")

    def wake_up(self, tags: list[str] | None) -> None:
        log.info("wake up the engine with tags: %s", tags)
        with self._lock:
            if not self.asleep:
                log.warning("Executor is not sleeping.")
                return
            started = time.monotonic()
            time.sleep(self.cfg.wake_seconds)
            if self.cfg.fault == "wake_fail":
                log.error("Failed to wake up: CUDA error: out of memory (stub engine: STUB_FAULT=wake_fail)")
                raise SleepError(500, "CUDA error: out of memory")
            if self.cfg.fault == "wake_altered" or self.level == 2:
                self.seed_offset += 1
            self.level = 0
            self.engine.set_sleeping(False)
            log.info("It took %.6f seconds to wake up tags %s.", time.monotonic() - started,
                     tags or ["weights", "kv_cache"])

