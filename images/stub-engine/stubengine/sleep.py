"""vLLM's sleep mode: POST /sleep?level=N&mode=M, POST /wake_up?tags=T, GET /is_sleeping (development routes).

As vLLM 0.31.0 (`EngineCore.sleep`, `wake_up`, `is_sleeping`; `Executor.sleep`, `wake_up`):
- every sleep first pauses the scheduler (`mode`: abort, wait or keep; see engine.PAUSE_MODES). A paused
  engine *queues* new requests and serves them once woken; nothing refuses them, and /health and
  /v1/models keep answering 200. Level 0 stops there (no memory moves).
- level 1 copies the weights to host memory and frees the KV cache; level 2 discards both. Either leaves
  the executor with the sleeping tags {weights, kv_cache}.
- `wake_up` with no tags wakes every tag; with tags, only those (`scheduling` alone resumes a level-0
  pause). The scheduler resumes only once no tag sleeps any more: after `tags=weights` alone the engine
  still sleeps and still queues.
- `is_sleeping` is true while the scheduler is paused or any tag sleeps.
The stub takes STUB_SLEEP_SECONDS to fall asleep and STUB_WAKE_SECONDS per wake, prints vLLM's log lines,
and injects the faults that make a standby dangerous (faults.py).
"""

from __future__ import annotations

import threading
import time

from . import logs
from .config import Config
from .engine import PAUSE_MODES, Engine
from .faults import CORE_DEAD_MESSAGE, FaultState
from .gpu import GpuLedger
from .metrics import Metrics

log = logs.get("executor")
log_worker = logs.get("gpu_worker")
log_allocator = logs.get("cumem")
log_core = logs.get("core")
log_api = logs.get("api_router")

# What a sleeping vLLM frees and what it keeps (its CUDA context and graphs; upstream reports 1-16 GiB).
FREED_GIB = 72.3


class SleepError(Exception):
    """A sleep or wake request the engine refused or failed; answered with `status`."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


SLEEP_TAGS = ("weights", "kv_cache")


class Sleeper:
    """The engine's sleep state. Sleep and wake hold one lock, so they never interleave."""

    def __init__(self, cfg: Config, engine: Engine, fault_state: FaultState, metrics: Metrics,
                 ledger: GpuLedger | None = None) -> None:
        self.cfg = cfg
        self.ledger = ledger or GpuLedger(None, cfg.gpu_total_gib)
        self.wakes = 0  # wakes that moved memory back
        self.engine = engine
        self.faults = fault_state
        self.metrics = metrics
        self.level = 0  # the level of the last sleep that moved memory (1 or 2); 0 once fully awake
        self.sleeping_tags: set[str] = set()  # the executor's: what is not resident on the GPU
        # Added to the token seed after a wake that corrupted the weights (wake_altered, or waking from
        # level 2 without reloading them): the endpoint answers, the text is different.
        self.seed_offset = 0
        self._lock = threading.Lock()
        engine.refuse_while_paused = cfg.sleep_refuses

    @property
    def asleep(self) -> bool:
        """vLLM's is_sleeping: the scheduler is paused or some memory is not resident."""
        return self.engine.paused is not None or bool(self.sleeping_tags)

    def sleep(self, level: int, mode: str = "abort") -> None:
        if mode not in PAUSE_MODES:
            # The engine core's pause_scheduler raises first; its utility call fails, and the API server raises the
            # failure as a plain Exception, which vLLM's error handler answers 500 (core_client.py, core.py).
            log_core.error("Invocation of %s method failed\n%s", "sleep", _pause_traceback(mode))
            raise SleepError(500, f"Call to sleep method failed: Invalid pause mode: {mode}")
        if level not in (0, 1, 2):
            # vLLM does not check (a level above 2 discards everything, as 2 does): the stub refuses instead.
            raise SleepError(400, f"level must be 0, 1 or 2, got {level}")
        if level >= 1 and not self.cfg.enable_sleep_mode:
            raise SleepError(400, "Sleep mode is not enabled: start the server with --enable-sleep-mode")
        if level >= 1 and self.cfg.fault == "sleep_fail":
            # The engine core's sleep failing (its allocator could not offload): vLLM's utility call fails and the
            # API server answers 500 with the error, as for an unknown mode.
            log_core.error("Invocation of %s method failed\n%s", "sleep", "RuntimeError: CuMemAllocator: cannot "
                           "offload the weights (stub engine: STUB_FAULT=sleep_fail)")
            raise SleepError(500, "Call to sleep method failed: CuMemAllocator: cannot offload the weights")
        with self._lock:
            if mode == "wait" and self.engine.paused is None and self.engine.gauges().running:
                log_core.info("Waiting for in-flight requests to complete before sleeping...")
            self.engine.pause(mode)
            if level >= 1:
                self._offload(level)
            # Recorded as vLLM's API server records it: from the request, whatever the executor did.
            self.metrics.set_sleep_state(asleep=True, level=level)
        if level >= 1 and self.cfg.fault == "die_asleep":
            self.faults.schedule("crash", self.cfg.fault_after_s, "STUB_FAULT=die_asleep: died while asleep")

    def _offload(self, level: int) -> None:
        if "weights" in self.sleeping_tags:
            log.warning("Executor is already sleeping.")
            return
        started = time.monotonic()
        time.sleep(self.cfg.sleep_seconds)
        self.sleeping_tags = set(SLEEP_TAGS)
        self.level = level
        backed_up = self.cfg.weights_gib if level == 1 else 0.0
        log_allocator.info("CuMemAllocator: sleep freed %.2f GiB memory in total, of which %.2f GiB is backed up in "
                           "CPU and the rest %.2f GiB is discarded directly.", FREED_GIB, backed_up,
                           FREED_GIB - backed_up)
        log_worker.info("Sleep mode freed %.2f GiB memory, %.2f GiB memory is still in use.", FREED_GIB,
                        self.cfg.resident_gib)
        self.ledger.hold(self.cfg.resident_gib)
        log.info("It took %.6f seconds to fall asleep.", time.monotonic() - started)

    def wake_up(self, tags: list[str] | None) -> None:
        log_api.info("wake up the engine with tags: %s", tags)
        with self._lock:
            if tags is not None and "scheduling" in tags:
                tags = [t for t in tags if t != "scheduling"]
            if tags is None or tags:
                self._resume_memory(tags)
            # A partial wake keeps the scheduler paused: requests stay queued until every tag is back.
            if not self.sleeping_tags:
                self.level = 0
                self.engine.resume()
                self.metrics.set_sleep_state(asleep=False, level=0)

    def _resume_memory(self, tags: list[str] | None) -> None:
        if not self.sleeping_tags:
            log.warning("Executor is not sleeping.")
            return
        for tag in tags or ():
            if tag not in self.sleeping_tags:
                log.warning("Tag %s is not in sleeping tags %s", tag, _tag_set(self.sleeping_tags))
                return
        started = time.monotonic()
        time.sleep(self.cfg.wake_seconds)
        self.wakes += 1
        fault = self.cfg.fault if self.wakes >= self.cfg.fault_wake else None
        if fault == "die_on_wake":
            self.faults.crash("STUB_FAULT=die_on_wake: the engine core died while waking")
            raise SleepError(500, CORE_DEAD_MESSAGE)
        if fault == "wake_fail":
            log.error("Failed to wake up: CUDA error: out of memory (stub engine: STUB_FAULT=wake_fail)")
            raise SleepError(500, "CUDA error: out of memory")
        waking = set(tags) if tags else set(self.sleeping_tags)
        if "weights" in waking and (fault == "wake_altered" or self.level == 2):
            self.seed_offset += 1
        log.info("It took %.6f seconds to wake up tags %s.", time.monotonic() - started,
                 tags if tags else _tag_set(self.sleeping_tags))
        self.sleeping_tags -= waking
        if not self.sleeping_tags:
            self.ledger.hold(self.cfg.gpu_memory_utilization * self.cfg.gpu_total_gib)


def _pause_traceback(mode: str) -> str:
    return ("Traceback (most recent call last):\n"
            '  File "/usr/local/lib/python3.12/dist-packages/vllm/v1/engine/core.py", line 1663, in '
            "_invoke_utility_method\n"
            '  File "/usr/local/lib/python3.12/dist-packages/vllm/v1/engine/core.py", line 2001, in pause_scheduler\n'
            f"ValueError: Invalid pause mode: {mode}")


def _tag_set(tags: set[str]) -> str:
    """A set of tags as vLLM prints its set (the stub in a fixed order)."""
    return "{" + ", ".join(repr(t) for t in sorted(tags, key=SLEEP_TAGS.index)) + "}"
