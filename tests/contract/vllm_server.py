"""The vLLM release's own API app (`build_app`: its routers, middleware and exception handlers), served by uvicorn on
loopback, in front of a small in-memory engine client that implements just what those routes call.

The engine client is the one part that is not vLLM's: on a CPU there is no engine. Everything between the socket
and it (routing, query parsing, request validation, status codes, error bodies) is vLLM's code.
"""

from __future__ import annotations

import asyncio
import functools
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import uvicorn
import vllm_oracle as oracle


@functools.cache
def stat_logger(served_model_name: str) -> Any:
    """vLLM's own Prometheus stat logger (v1/metrics/loggers.py), which serves `vllm:engine_sleep_state` on
    /metrics; built once per process (it registers its metrics globally) from the few config values it reads."""
    from vllm.v1.metrics.loggers import PrometheusStatLogger

    config = SimpleNamespace(
        observability_config=SimpleNamespace(show_hidden_metrics=False, kv_cache_metrics=False,
                                             enable_mfu_metrics=False, kv_cache_metrics_sample=0.0,
                                             custom_histogram_buckets=None),
        model_config=SimpleNamespace(served_model_name=served_model_name, max_model_len=8192, is_diffusion=False),
        speculative_config=None, kv_transfer_config=None, ec_transfer_config=None, watermark_config=None,
        cache_config=SimpleNamespace(num_gpu_blocks=1, enable_prefix_caching=True),
        parallel_config=SimpleNamespace(data_parallel_size=1), lora_config=None, scheduler_config=SimpleNamespace())
    return PrometheusStatLogger(config, [0])  # type: ignore[arg-type]


@dataclass
class FakeEngineClient:
    """What /health, the sleep routes, /reset_prefix_cache and /v1/models ask of `app.state.engine_client`. Its
    sleep and wake record the sleep state in vLLM's stat logger as vLLM's AsyncLLM does (v1/engine/async_llm.py)."""

    served_model_name: str = "contract-model"

    max_model_len: int = 8192
    sleeping: bool = False
    dead: bool = False
    prefix_cache_held: bool = False  # vLLM's reset fails (success: false) while blocks are still held
    wake_error: str | None = None
    sleep_error: Exception | None = None  # what MPClient raises for a sleep the engine core failed
    calls: list[tuple[Any, ...]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.model_config = SimpleNamespace(max_model_len=self.max_model_len, max_logprobs=20)
        self.renderer = None
        self.input_processor = None

    async def check_health(self) -> None:
        from vllm.v1.engine.exceptions import EngineDeadError

        if self.dead:
            raise EngineDeadError()

    async def sleep(self, level: int = 1, mode: str = "abort") -> None:
        self.calls.append(("sleep", level, mode))
        if self.sleep_error is not None:
            raise self.sleep_error
        self.sleeping = True
        stat_logger(self.served_model_name).record_sleep_state(1, level)

    async def wake_up(self, tags: list[str] | None = None) -> bool:
        """Wakes every part; a wake of some `tags` only leaves the engine asleep. The answer (fully awake?) is what
        vLLM 0.32.0's route reports (`{"status": "awake"|"sleeping"}`); 0.31.0's ignores it."""
        self.calls.append(("wake_up", tags))
        if self.wake_error:
            raise RuntimeError(self.wake_error)
        if tags is None:
            self.sleeping = False
            stat_logger(self.served_model_name).record_sleep_state(0, 0)
        return not self.sleeping

    async def is_sleeping(self) -> bool:
        return self.sleeping

    async def abort(self, request_id: str | list[str], internal: bool = False) -> None:
        self.calls.append(("abort", request_id, internal))

    async def reset_prefix_cache(self, reset_running_requests: bool = False, reset_external: bool = False) -> bool:
        self.calls.append(("reset_prefix_cache", reset_running_requests, reset_external))
        return not self.prefix_cache_held


@dataclass
class FakeCompletions:
    """`app.state.openai_serving_completion`: receives the request *after* vLLM's route validated it into its own
    `CompletionRequest`, and answers a `CompletionResponse` built from vLLM's models."""

    text: str = "OK"
    requests: list[Any] = field(default_factory=list)
    error: Exception | None = None  # what rendering the request raised, if it did

    async def create_completion(self, request: Any, raw_request: Any) -> Any:
        from vllm.entrypoints.openai.completion.protocol import CompletionResponse, CompletionResponseChoice
        from vllm.entrypoints.serve.engine.protocol import UsageInfo

        self.requests.append(request)
        if self.error is not None:
            raise self.error
        tokens = min(request.max_tokens or 1, 3)
        return CompletionResponse(model=request.model, choices=[CompletionResponseChoice(
            index=0, text=self.text, finish_reason="length")],
            usage=UsageInfo(prompt_tokens=4, completion_tokens=tokens, total_tokens=4 + tokens))


@dataclass
class VllmServer:
    url: str
    engine: FakeEngineClient
    completions: FakeCompletions


def vllm_app(served_model_name: str, dev_mode: bool) -> Any:
    """vLLM's app for `vllm serve /model --served-model-name NAME`, with `VLLM_SERVER_DEV_MODE` as given."""
    import vllm.envs as envs
    from vllm.entrypoints.launchers.app import build_app

    saved = os.environ.get("VLLM_SERVER_DEV_MODE")
    os.environ["VLLM_SERVER_DEV_MODE"] = "1" if dev_mode else "0"
    if hasattr(envs, "disable_envs_cache"):
        envs.disable_envs_cache()
    try:
        args = oracle.parse_serve_args(["/model", "--served-model-name", served_model_name])
        return args, build_app(args, supported_tasks=("generate",))
    finally:
        if saved is None:
            os.environ.pop("VLLM_SERVER_DEV_MODE", None)
        else:
            os.environ["VLLM_SERVER_DEV_MODE"] = saved


def dev_mode_routes() -> set[str]:
    """The paths vLLM's app mounts only in development mode."""
    def paths(dev_mode: bool) -> set[str]:
        return {route.path for route in vllm_app("contract-model", dev_mode)[1].routes if hasattr(route, "path")}

    return paths(True) - paths(False)


@contextmanager
def vllm_server(served_model_name: str = "contract-model", *, dev_mode: bool = True) -> Iterator[VllmServer]:
    """vLLM's app (vllm_app) served on loopback, with the in-memory engine client behind it."""
    from vllm.entrypoints.openai.models.protocol import BaseModelPath
    from vllm.entrypoints.openai.models.serving import OpenAIServingModels

    args, app = vllm_app(served_model_name, dev_mode)
    engine, completions = FakeEngineClient(served_model_name), FakeCompletions()
    stat_logger(served_model_name).record_sleep_state(0, 0)
    app.state.engine_client = engine
    app.state.openai_serving_models = OpenAIServingModels(engine, [BaseModelPath(served_model_name, "/model")])
    app.state.openai_serving_completion = completions
    app.state.args = args
    # lifespan off: vLLM's lifespan starts the engine's stats loop, which needs a real engine.
    config = uvicorn.Config(app, host="127.0.0.1", port=0, lifespan="off", log_level="warning", access_log=False)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=lambda: asyncio.run(server.serve()), daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("vLLM's app did not start under uvicorn")
        time.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield VllmServer(f"http://127.0.0.1:{port}", engine, completions)
    finally:
        server.should_exit = True
        thread.join(timeout=10)
