"""Startup: the load phase with vLLM's log lines, then the API server, in vLLM's order.

The HTTP port is bound only after loading, as with vLLM, whose API server does not accept
connections until the engine core is up: a health gate sees "connection refused" while a lane loads.
"""

from __future__ import annotations

import os
import threading
import time

from . import faults, gpu, logs, splitkv
from .config import Config
from .engine import Engine, draft_steps
from .faults import FaultState
from .gpu import GpuLedger, request_memory
from .metrics import Metrics
from .server import StubHTTPServer
from .shutdown import Serving
from .sleep import Sleeper

log = logs.get("startup")  # sites by message: logs.SITES

MODEL_GIB = 12.3
# flashinfer keys its cache by workspace and config hash (kernel_warmup.py).
AUTOTUNE_CACHE = ("/root/.cache/vllm/flashinfer_autotune_cache/ws-0/ws/5f0c2a91d3e4b7a6/"
                  "autotune_configs.json")
# The Engram table of DeepSeek-V4.1-Flash, as the production lane logs it (one rank).
ENGRAM_ROWS = 48_002_473
ENGRAM_DIM = 256
ENGRAM_GIB = 11.80


def _describe_flags(ignored: list[tuple[str, list[str]]]) -> str:
    return ", ".join(" ".join([name, *values]) for name, values in ignored)


def announce(cfg: Config, attention: splitkv.DecodeAttention) -> None:
    log.info(
        "Starting vLLM API server (stub engine) pid=%d model=%s served_model_name=%s",
        os.getpid(),
        cfg.model,
        ",".join(cfg.served_model_names),
    )
    if cfg.dev_mode:
        # vLLM's own warning: these routes put the engine to sleep and run arbitrary engine methods.
        log.warning("SECURITY WARNING: Development endpoints are enabled! This should NOT be used in production!")
    if cfg.ignored_flags:
        log.info("Ignoring vLLM flags the stub engine does not model: %s", _describe_flags(cfg.ignored_flags))
    if cfg.mega_splitkv > 1 and not attention.available:
        log.warning(attention.description)  # asked for and not delivered: worth a warning
    else:
        log.info(attention.description)
    tokens = 1 + draft_steps(1, cfg.num_speculative_tokens)
    if attention.num_splits > 1 and tokens != attention.max_tokens:
        log.warning(
            "split-KV overlay: will never engage: a single request's step has %d query tokens, "
            "VLLM_DSV41_MEGA_SPLITKV_MAX_TOKENS=%d",
            tokens,
            attention.max_tokens,
        )


def load(cfg: Config) -> GpuLedger:
    """Sleep through the load phase, logging vLLM 0.31.0's milestones; may inject a start failure or a stall."""
    total = cfg.slow_start_seconds if cfg.fault == "slow_start" else cfg.load_seconds
    t0 = time.monotonic()

    def until(fraction: float) -> float:
        delay = t0 + fraction * total - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        return time.monotonic() - t0

    # vLLM's worker takes its share of the GPU before it loads anything (request_memory in init_device).
    ledger = GpuLedger(cfg.gpu_ledger, cfg.gpu_total_gib)
    free_gib = ledger.free_gib()
    short = request_memory(ledger, cfg.gpu_memory_utilization)
    if short is not None:
        faults.fail_to_start(f"ValueError: {short}")
    ledger.hold(cfg.gpu_memory_utilization * cfg.gpu_total_gib)
    log.info("Starting to load model %s...", cfg.model)
    elapsed = until(0.5)
    if cfg.fault == "crash_on_start":
        faults.crash_on_start("STUB_FAULT=crash_on_start")
    log.info("Loading weights took %.2f seconds", elapsed)
    if cfg.cpu_offload_gb:
        # model_executor/offloader/uva.py: format_gib prints a bare number of GiB, no unit.
        log.info("Total CPU offloaded parameters: %s", round(cfg.cpu_offload_gb, 2))
    if cfg.engram_cpu_offload:
        log.info("Engram table offloaded to pinned host memory: %d rows x %d, %.2f GiB %s",
                 ENGRAM_ROWS, ENGRAM_DIM, ENGRAM_GIB, "per rank")
    log.info("Model loading took %.4f GiB memory and %.6f seconds", MODEL_GIB, until(0.55))
    until(0.7)
    gpu.log_startup_memory(ledger, free_gib, cfg.gpu_memory_utilization)
    tokens, max_len = f"{cfg.kv_cache_tokens:,}", f"{cfg.max_model_len:,}"
    concurrency = cfg.kv_cache_tokens / cfg.max_model_len
    if cfg.vllm_version == "0.26.0":
        log.info("GPU KV cache size: %s tokens", tokens)
        log.info("Maximum concurrency for %s tokens per request: %.2fx", max_len, concurrency)
    else:
        log.info("%s KV cache size: %s tokens, Maximum concurrency for %s tokens per request: %.2fx",
                 "GPU", tokens, max_len, concurrency)
    until(0.8)
    # kernel_warmup.py's flashinfer_autotune(): the cache is loaded, then autotune(tune_mode=True) runs
    # on every start; a warm cache ends it at once, a cold one retunes for over an hour.
    logs.flashinfer.info("[Autotuner]: Loaded %d configs from %s", cfg.autotune_configs, AUTOTUNE_CACHE)
    logs.flashinfer.info("[Autotuner]: Autotuning process starts ...")
    if cfg.autotune_stall:
        threading.Event().wait()
    logs.flashinfer.info("[Autotuner]: Autotuning process ends")
    until(0.9)
    # The variant vLLM prints when nothing was compiled (--enforce-eager); a compiled start adds
    # " (compilation: %.2f s)".
    log.info("init engine (profile, create kv cache, warmup model) took %.2f s", until(1.0))
    return ledger


class Up:
    """Hands the running server to the main thread, which handles the stop signals."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._serving: Serving | None = None

    def set(self, serving: Serving) -> None:
        with self._lock:
            self._serving = serving

    def serving(self) -> Serving | None:
        """The server once it answers requests; None while the engine still loads."""
        with self._lock:
            return self._serving


def serve(cfg: Config, up: Up) -> None:
    """Load, bind, serve forever. Runs off the main thread, which waits for signals."""
    attention = splitkv.select(cfg.mega_splitkv, cfg.mega_splitkv_max_tokens)
    announce(cfg, attention)
    ledger = load(cfg)
    metrics = Metrics(cfg.served_model_name)
    state = FaultState(core_death_seconds=cfg.core_death_seconds)
    engine = Engine(
        step_seconds=cfg.step_seconds,
        max_num_seqs=cfg.max_num_seqs,
        num_speculative_tokens=cfg.num_speculative_tokens,
        kv_cache_tokens=cfg.kv_cache_tokens,
        attention=attention,
        metrics=metrics,
        faults=state,
        oob_log_every=cfg.oob_log_every,
        stats_interval_s=cfg.stats_interval_s,
    )
    state.on_change = engine.wake
    if cfg.fault in faults.OUTPUT_FAULTS and cfg.fault_after_s == 0:
        # From the first request on: a timer could let an early request through unfaulted.
        state.apply(cfg.fault, f"STUB_FAULT={cfg.fault}")
    engine.start()
    try:
        httpd = StubHTTPServer(cfg, engine, metrics, state, Sleeper(cfg, engine, state, metrics, ledger))
    except OSError as exc:
        log.error("Cannot bind the API server to %s:%d: %s", cfg.host, cfg.port, exc)
        os._exit(1)
    host, port = httpd.server_address[:2]
    logs.uvicorn.info("Started server process [%d]", os.getpid())
    logs.uvicorn.info("Waiting for application startup.")
    logs.uvicorn.info("Application startup complete.")
    logs.uvicorn.info("Uvicorn running on http://%s:%d (Press CTRL+C to quit)", host, port)
    if cfg.fault and cfg.fault not in ("crash_on_start", "slow_start", *faults.SLEEP_FAULTS) and not (
            cfg.fault in faults.OUTPUT_FAULTS and cfg.fault_after_s == 0):
        state.schedule(cfg.fault, cfg.fault_after_s)
    # From here a stop runs vLLM's shutdown (shutdown.stop); its httpd.shutdown() waits for this loop to end.
    up.set(Serving(engine, httpd))
    # A short poll: httpd.shutdown() waits up to one poll for the loop to notice, and every stop of a lane pays it.
    httpd.serve_forever(poll_interval=0.05)
