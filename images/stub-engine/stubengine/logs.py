"""Log output as a vLLM container writes it on stdout (see SHAPE.md).

vLLM's own records are `(APIServer pid=N) LEVEL MM-DD hh:mm:ss [file.py:NNN] message`, and a record of
several lines (a message with its traceback) repeats that whole header on every line (vLLM's
`NewLineFormatter`). Where the process prefix comes from is what changed between the two versions the
stub speaks:
- 0.31.0 (the default): vLLM's log format itself carries `(%(vllm_process_name)s pid=%(process)d)`, so only
  vLLM's records have it; flashinfer's autotuner lines (`YYYY-MM-DD hh:mm:ss,mmm - LEVEL - autotuner.py:NNN -
  flashinfer.jit: message`), uvicorn's (`INFO:     message`, the access log included) and a traceback
  Python prints itself have none.
- 0.26.0 (`STUB_VLLM_VERSION=0.26.0`, the GPU record's): vLLM wrapped each process's stdout, so every
  physical line has the prefix, uvicorn's access lines included (gpu/record/*/engine.log).

Where vLLM prints a message from (process, file, line) is one table, `SITES`, keyed by the message's
format string, so the stub's modules log with plain `log.info(FORMAT, ...)` and the contract suite can
read the table. A message not in the table is printed from its logger's default site.
lanectl's health gate and watchdog read these lines, so the formats are part of the stub's interface.
"""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass

API_SERVER = "APIServer"
ENGINE_CORE = "EngineCore"

# vLLM's own logger format (vllm/logger.py) and date format.
VLLM_FORMAT = "%(levelname)s %(asctime)s [%(vllm_file)s:%(vllm_line)d] %(message)s"
VLLM_DATEFMT = "%m-%d %H:%M:%S"
# FlashInfer's autotuner logs through flashinfer's own logger, with its own format.
FLASHINFER_FORMAT = "%(asctime)s - %(levelname)s - %(vllm_file)s:%(vllm_line)d - flashinfer.jit: %(message)s"


@dataclass(frozen=True)
class Site:
    process: str
    file: str
    line: int


# The module vLLM 0.31.0 prints each message from; line numbers are fixed and plausible, never read.
SITES: dict[str, Site] = {
    "Starting to load model %s...": Site(ENGINE_CORE, "gpu_model_runner.py", 3617),
    "Loading weights took %.2f seconds": Site(ENGINE_CORE, "default_loader.py", 291),
    "Total CPU offloaded parameters: %s": Site(ENGINE_CORE, "uva.py", 65),
    "Engram table offloaded to pinned host memory: %d rows x %d, %.2f GiB %s": Site(ENGINE_CORE, "engram.py", 693),
    "Model loading took %.4f GiB memory and %.6f seconds": Site(ENGINE_CORE, "gpu_model_runner.py", 3714),
    "%s KV cache size: %s tokens, Maximum concurrency for %s tokens per request: %.2fx":
        Site(ENGINE_CORE, "kv_cache_utils.py", 1348),
    # vLLM 0.26.0 (the GPU record) printed the two halves on two lines.
    "GPU KV cache size: %s tokens": Site(ENGINE_CORE, "kv_cache_utils.py", 1087),
    "Maximum concurrency for %s tokens per request: %.2fx": Site(ENGINE_CORE, "kv_cache_utils.py", 1091),
    "[Autotuner]: Loaded %d configs from %s": Site(ENGINE_CORE, "autotuner.py", 431),
    "[Autotuner]: Autotuning process starts ...": Site(ENGINE_CORE, "autotuner.py", 446),
    "[Autotuner]: Autotuning process ends": Site(ENGINE_CORE, "autotuner.py", 455),
    "init engine (profile, create kv cache, warmup model) took %.2f s": Site(ENGINE_CORE, "core.py", 259),
    # A record with its traceback: the message, then the traceback's lines, each with the prefix.
    "EngineCore encountered a fatal error.\n%s": Site(ENGINE_CORE, "core.py", 1024),
    "EngineCore failed to start.\n%s": Site(ENGINE_CORE, "core.py", 1015),
    "[shutdown] MPClient: engine core exited unexpectedly; starting cleanup": Site(API_SERVER, "core_client.py", 712),
    "AsyncLLM output_handler failed.\n%s": Site(API_SERVER, "async_llm.py", 689),
    "Engine 000: Avg prompt throughput: %.1f tokens/s, Avg generation throughput: %.1f tokens/s, "
    "Running: %d reqs, Waiting: %d reqs, GPU KV cache usage: %.1f%%, Prefix cache hit rate: 0.0%%":
        Site(API_SERVER, "loggers.py", 257),
    "Sleep mode freed %.2f GiB memory, %.2f GiB memory is still in use.": Site(ENGINE_CORE, "gpu_worker.py", 131),
    "It took %.6f seconds to fall asleep.": Site(ENGINE_CORE, "core.py", 433),
    "It took %.6f seconds to wake up tags %s.": Site(ENGINE_CORE, "core.py", 452),
    "wake up the engine with tags: %s": Site(API_SERVER, "api_server.py", 1071),
    # A stop signal (shutdown.py), in the order vLLM prints it; the API server's side, then the engine core's.
    "[shutdown] API server: shutdown triggered": Site(API_SERVER, "launcher.py", 128),
    "[shutdown] API server: stopping engine client mode=%s timeout=%ss": Site(API_SERVER, "launcher.py", 144),
    "[shutdown] MPClient: start timeout=%s": Site(API_SERVER, "core_client.py", 762),
    "[shutdown] MPClient: stopping engine manager": Site(API_SERVER, "core_client.py", 764),
    "[shutdown] Process manager: send sigterm to process %s": Site(API_SERVER, "utils.py", 638),
    "[shutdown] Process manager: force killing remaining processes count=%d": Site(API_SERVER, "utils.py", 658),
    "[shutdown] Process manager: force killing remaining process %s pid %d": Site(API_SERVER, "utils.py", 663),
    "[shutdown] MPClient: engine manager stopped": Site(API_SERVER, "core_client.py", 766),
    "[shutdown] MPClient: cleaning up background resources": Site(API_SERVER, "core_client.py", 767),
    "[shutdown] MPClient: complete": Site(API_SERVER, "core_client.py", 769),
    "[shutdown] API server: engine client stopped": Site(API_SERVER, "launcher.py", 153),
    "[shutdown] API server: signalling HTTP server shutdown": Site(API_SERVER, "launcher.py", 156),
    "[shutdown] API server: shutting down FastAPI HTTP server": Site(API_SERVER, "launcher.py", 178),
    "[shutdown] EngineCore: trigger received signal=%s": Site(ENGINE_CORE, "core.py", 1409),
    "[shutdown] EngineCore: start mode=%s timeout=%ds": Site(ENGINE_CORE, "core.py", 1558),
    "[shutdown] EngineCore: aborting in-flight requests count=%d": Site(ENGINE_CORE, "core.py", 1567),
    "[shutdown] EngineCore: draining in-flight requests count=%d timeout=%ds": Site(ENGINE_CORE, "core.py", 1578),
    "[shutdown] EngineCore: request processing complete; starting resource teardown":
        Site(ENGINE_CORE, "core.py", 1589),
    "[shutdown] EngineCore: exiting busy loop": Site(ENGINE_CORE, "core.py", 1422),
    "Waiting for in-flight requests to complete before sleeping...": Site(ENGINE_CORE, "core.py", 953),
    "Invocation of %s method failed\n%s": Site(ENGINE_CORE, "core.py", 1673),
}

# Where a logger's other messages come from (the stub's own lines: split-KV overlay, ignored flags, ...).
_DEFAULT_SITES = {
    "startup": Site(API_SERVER, "api_server.py", 1899),
    "api_server": Site(API_SERVER, "api_server.py", 1899),
    "core": Site(ENGINE_CORE, "core.py", 1024),
    "engine": Site(ENGINE_CORE, "gpu_model_runner.py", 2470),
    "executor": Site(ENGINE_CORE, "gpu_worker.py", 131),
    "gpu_worker": Site(ENGINE_CORE, "gpu_worker.py", 131),
    # The shared-GPU ledger's start-up memory line. It has vLLM 0.26.0's words (the GPU machine's release), which
    # no logger call of the pin (0.31.0) prints as such: it is named as the stub's own, not as gpu_worker.py.
    "gpu_ledger": Site(ENGINE_CORE, "stub_gpu_ledger.py", 83),
    "cumem": Site(ENGINE_CORE, "cumem.py", 271),
    "api_router": Site(API_SERVER, "api_router.py", 38),
    "flashinfer": Site(ENGINE_CORE, "autotuner.py", 446),
}


def process_pid(process: str) -> int:
    """The stub is one process; the engine core's lines carry a pid of their own, as vLLM's child process does."""
    return os.getpid() + (1 if process == ENGINE_CORE else 0)


def prefix(process: str) -> str:
    return f"({process} pid={process_pid(process)}) "


# 0.26.0 prefixed every line a process wrote to stdout; 0.31.0 prefixes vLLM's own records only.
_stdout_prefixing = False


def prefixed(process: str, text: str) -> str:
    """Every physical line of `text` with the process prefix, as vLLM 0.26.0's stdout prefixing wrote them."""
    head = prefix(process)
    return "\n".join(head + line for line in text.split("\n"))


def _stdout(process: str, text: str) -> str:
    """A line written outside vLLM's loggers (uvicorn, flashinfer, a bare traceback), as this version shows it."""
    return prefixed(process, text) if _stdout_prefixing else text


class _SiteFormatter(logging.Formatter):
    """vLLM's record format: the process prefix and header, repeated on every line of the record."""

    def __init__(self, fmt: str, datefmt: str | None, default: Site) -> None:
        super().__init__(fmt, datefmt)
        self.default = default

    def format(self, record: logging.LogRecord) -> str:
        site = SITES.get(str(record.msg), getattr(record, "site", None) or self.default)
        record.vllm_file, record.vllm_line = site.file, site.line
        text = prefix(site.process) + super().format(record)
        if record.message:
            header = text.split(record.message, 1)[0]
            text = text.replace("\n", "\n" + header)
        return text


class _FlashinferFormatter(logging.Formatter):
    """flashinfer's own logger (its autotuner runs in the engine core): a plain one-line format."""

    def format(self, record: logging.LogRecord) -> str:
        site = SITES.get(str(record.msg), _DEFAULT_SITES["flashinfer"])
        record.vllm_file, record.vllm_line = site.file, site.line
        return _stdout(site.process, super().format(record))


class _UvicornFormatter(logging.Formatter):
    """Uvicorn pads the level so messages line up: "INFO:     Application startup complete."."""

    def format(self, record: logging.LogRecord) -> str:
        head = f"{record.levelname}:".ljust(9)
        return _stdout(API_SERVER, f"{head} {record.getMessage()}")


def _logger(name: str, formatter: logging.Formatter) -> logging.Logger:
    log = logging.getLogger(name)
    log.handlers.clear()
    # StreamHandler flushes after every record, which a `docker logs -f` reader relies on.
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(formatter)
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False
    return log


def setup() -> None:
    global _stdout_prefixing
    try:
        sys.stdout.reconfigure(line_buffering=True)  # type: ignore[attr-defined]
    except (AttributeError, ValueError):
        pass
    # Read before the configuration is (config.py validates the value): a start that fails logs too.
    _stdout_prefixing = os.environ.get("STUB_VLLM_VERSION", "").strip() == "0.26.0"
    for name, site in _DEFAULT_SITES.items():
        formatter: logging.Formatter = (_FlashinferFormatter(FLASHINFER_FORMAT) if name == "flashinfer"
                                        else _SiteFormatter(VLLM_FORMAT, VLLM_DATEFMT, site))
        _logger(f"stubengine.{name}", formatter)
    _logger("stubengine.uvicorn", _UvicornFormatter())


def get(name: str) -> logging.Logger:
    """A vLLM-format logger; `name` is one of the stub's module short names (see `_DEFAULT_SITES`)."""
    if name not in _DEFAULT_SITES:
        raise KeyError(f"no default site for logger {name!r}: add it to logs._DEFAULT_SITES")
    return logging.getLogger(f"stubengine.{name}")


flashinfer = logging.getLogger("stubengine.flashinfer")
uvicorn = logging.getLogger("stubengine.uvicorn")


def raw(text: str, process: str = API_SERVER) -> None:
    """Lines outside any logger, such as a traceback Python prints itself (prefixed as `_stdout` says)."""
    sys.stdout.write(_stdout(process, text.rstrip("\n")) + "\n")
    sys.stdout.flush()
