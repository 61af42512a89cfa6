"""A stop signal (SIGTERM, SIGINT), as vLLM 0.31.0's API server and engine core handle it.

vLLM's order (entrypoints/launchers/launcher.py serve_http, v1/engine/core_client.py MPClient.shutdown,
v1/utils.py shutdown, v1/engine/core.py _handle_shutdown):
1. the API server stops its engine client with `--shutdown-timeout` T ("0 = abort, >0 = wait"); the HTTP server
   keeps answering meanwhile, but AsyncLLM.shutdown shuts its renderer first: a new request with a text prompt (or
   chat messages) fails to tokenize, 500 "cannot schedule new futures after shutdown";
2. its process manager sends the engine core SIGTERM and gives it T seconds. The engine core refuses every request
   that still reaches it (token ids: `_reject_add_in_shutdown` ends it at once as aborted, without a token) and,
   with T = 0, aborts the ones in flight (their streams end with finish_reason "abort"); with T > 0 it keeps
   stepping until none is left, then exits;
3. an engine core still alive at the deadline is SIGKILLed. With T = 0 the deadline is the same moment: the abort
   outputs race the kill (STUB_ABORT_LOST=1: the kill wins). Requests the kill leaves unfinished never get another
   byte;
4. uvicorn shuts down: it stops listening, closes idle connections and waits for the others to close -- for ever,
   if a stream was left unfinished and its client keeps reading -- then the process exits 0.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass

from . import logs
from .config import Config
from .engine import Engine
from .server import StubHTTPServer

log_api = logs.get("api_server")
log_core = logs.get("core")

# How long uvicorn's shutdown gives connections to finish before it says it waits for them (Server.shutdown).
UVICORN_GRACE_SECONDS = 0.1


@dataclass
class Serving:
    """What a stop acts on, once the server is up."""

    engine: Engine
    httpd: StubHTTPServer


def stop(cfg: Config, serving: Serving, signum: int) -> int:
    """Run vLLM's shutdown for the first stop signal and return the process's exit code."""
    timeout = cfg.shutdown_timeout
    mode = "abort" if timeout == 0 else "drain"
    if cfg.vllm_version == "0.26.0":
        # 0.26.0 let uvicorn take the signal too: it stopped listening at once (the GPU record: new requests refused
        # from the first moment of every drain). 0.31.0 runs uvicorn without its handlers (launcher.NoSignalServer),
        # so the port stays open until the engine client stopped.
        logs.uvicorn.info("Shutting down")
        serving.httpd.shutdown()
        serving.httpd.server_close()
        serving.httpd.close_idle_connections()
    log_api.info("[shutdown] API server: shutdown triggered")
    log_api.info("[shutdown] API server: stopping engine client mode=%s timeout=%ss", mode, timeout)
    serving.httpd.renderer_closed = True  # AsyncLLM.shutdown shuts the renderer first, then stops the engine core
    log_api.info("[shutdown] MPClient: start timeout=%s", f"{timeout}s")
    log_api.info("[shutdown] MPClient: stopping engine manager")
    log_api.info("[shutdown] Process manager: send sigterm to process %s", logs.ENGINE_CORE)
    deadline = time.monotonic() + timeout
    engine = serving.engine
    if timeout == 0 and cfg.abort_lost:
        _force_kill(engine)
    else:
        _engine_core_stops(engine, timeout, deadline)
    for message in ("[shutdown] MPClient: engine manager stopped", "[shutdown] MPClient: cleaning up background "
                    "resources", "[shutdown] MPClient: complete", "[shutdown] API server: engine client stopped",
                    "[shutdown] API server: signalling HTTP server shutdown",
                    "[shutdown] API server: shutting down FastAPI HTTP server"):
        log_api.info(message)
    _uvicorn_shutdown(serving.httpd)
    return 0


def _engine_core_stops(engine: Engine, timeout: int, deadline: float) -> None:
    # The engine core's own lines: its signal handler, then _handle_shutdown at its next loop. With T = 0 the
    # process manager's kill follows the SIGTERM at once; the engine core, quick to abort, still gets its lines out
    # (gpu/record/exit-guard: vLLM 0.26.0 stopped idle at 0 logged them, then exited before the kill mattered).
    log_core.info("[shutdown] EngineCore: trigger received signal=%s", signal.Signals.SIGTERM.name)
    log_core.info("[shutdown] EngineCore: start mode=%s timeout=%ds", "abort" if timeout == 0 else "drain", timeout)
    unfinished = engine.stop(timeout)
    if unfinished and timeout == 0:
        log_core.info("[shutdown] EngineCore: aborting in-flight requests count=%d", unfinished)
    elif unfinished:
        log_core.info("[shutdown] EngineCore: draining in-flight requests count=%d timeout=%ds", unfinished, timeout)
    finished = timeout == 0 or engine.drained(deadline)
    if finished:
        log_core.info("[shutdown] EngineCore: request processing complete; starting resource teardown")
        log_core.info("[shutdown] EngineCore: exiting busy loop")
    if timeout == 0 or not finished:
        _force_kill(engine)


def _force_kill(engine: Engine) -> None:
    log_api.warning("[shutdown] Process manager: force killing remaining processes count=%d", 1)
    log_api.warning("[shutdown] Process manager: force killing remaining process %s pid %d", logs.ENGINE_CORE,
                    logs.process_pid(logs.ENGINE_CORE))
    engine.kill()


def _uvicorn_shutdown(httpd: StubHTTPServer) -> None:
    logs.uvicorn.info("Shutting down")
    httpd.shutdown()
    httpd.server_close()
    if httpd.close_idle_connections():
        time.sleep(UVICORN_GRACE_SECONDS)
    if httpd.close_idle_connections():
        logs.uvicorn.info("Waiting for connections to close. (CTRL+C to force quit)")
        httpd.wait_for_connections()
    logs.uvicorn.info("Waiting for application shutdown.")
    logs.uvicorn.info("Application shutdown complete.")


def exit_before_serving() -> None:
    """A stop before the server is up: nothing is in flight, the process ends at once."""
    logs.uvicorn.info("Shutting down")
    logs.uvicorn.info("Finished server process [%d]", os.getpid())
    os._exit(0)
