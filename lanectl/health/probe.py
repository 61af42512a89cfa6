"""The engine's HTTP endpoints as the health gate (and later the watchdog) asks them.

Every answer, including a refused connection or a timeout, is a `ProbeResult`, never an exception:
while a real vLLM loads (8+ minutes) it does not listen on its port at all, so "connection refused"
is an ordinary answer that the caller weighs against its budget.
"""

from __future__ import annotations

import time
from typing import Any

from lanectl.errors import BadInput
from lanectl.health.engine_http import EngineAnswer, EngineHttp, EngineUnanswered, engine_url
from lanectl.recipe.catalog import Lane
from lanectl.recipe.model import Health
from lanectl.records import frozen

COMPLETIONS_PATH = "/v1/completions"


def probe_base_url(lane: Lane) -> str:
    """Where the lane's primary answers on this host: its first published port."""
    if not lane.spec.engine.ports:
        raise BadInput(f"lane {lane.name}: the primary publishes no port, so its health cannot be probed")
    port = lane.spec.engine.ports[0]
    return engine_url(port.host_ip, port.published)


@frozen
class ProbeResult:
    """One probe of an endpoint: whether it passed, why not, and how long it took."""

    ok: bool
    detail: str
    seconds: float


class EndpointProbe:
    """`/health`, `/v1/models` and a 1-3 token generation against one engine's base URL.

    Each request carries the recipe's timeout and its own connection (see `engine_http`), so one probe may
    serve several threads at once.
    """

    def __init__(self, base_url: str, health: Health) -> None:
        self.engine = EngineHttp(base_url)
        self.health = health
        self._timeout = health.request_timeout_seconds

    def health_ok(self) -> ProbeResult:
        """`/health` answers 200.

        vLLM answers 503 once the engine is dead, but can answer 200 while it is stuck (vllm#39863),
        so this alone never proves the lane serves.
        """
        return _health(self.engine, self.health.health_path, self._timeout)

    def models_lists_served_model(self) -> ProbeResult:
        """`/v1/models` lists the recipe's served model name (vLLM answers it without the engine)."""
        path, name = self.health.models_path, self.health.served_model_name
        started = time.monotonic()
        try:
            response = self.engine.request("GET", path, timeout=self._timeout)
        except EngineUnanswered as exc:
            return _failed(path, exc, self._timeout, started)
        seconds = time.monotonic() - started
        if response.status != 200:
            return ProbeResult(False, _answered(path, response), seconds)
        ids = _model_ids(response)
        if ids is None:
            return ProbeResult(False, f"{path} answered 200 but not with an OpenAI model list", seconds)
        if name in ids:
            return ProbeResult(True, f"{path} lists '{name}'", seconds)
        return ProbeResult(False, f"{path} does not list '{name}' (it lists: {', '.join(ids) or 'nothing'})", seconds)

    def generate(self) -> ProbeResult:
        """A completion of at most 3 tokens: the only probe that proves the engine still steps."""
        probe = self.health.generation_probe
        started = time.monotonic()
        try:
            response = self.engine.request(
                "POST", COMPLETIONS_PATH,
                json_body={
                    "model": self.health.served_model_name,
                    "prompt": probe.prompt,
                    "max_tokens": probe.max_tokens,
                    "temperature": 0,
                    "stream": False,
                },
                timeout=probe.timeout_seconds,
            )
        except EngineUnanswered as exc:
            if exc.failure != "timeout":
                return _failed(COMPLETIONS_PATH, exc, probe.timeout_seconds, started)
            seconds = time.monotonic() - started
            return ProbeResult(
                False,
                f"generation probe timed out after {probe.timeout_seconds:.1f} s ({self._health_while_stuck()})",
                seconds,
            )
        seconds = time.monotonic() - started
        if response.status != 200:
            return ProbeResult(False, _answered(COMPLETIONS_PATH, response), seconds)
        generated = _generated(response)
        if generated is None:
            return ProbeResult(False, f"{COMPLETIONS_PATH} answered 200 with no generated token", seconds)
        return ProbeResult(True, f"{COMPLETIONS_PATH} generated {generated} in {seconds:.2f} s", seconds)

    def _health_while_stuck(self) -> str:
        # A timed-out generation with /health at 200 is the stuck engine of vllm#39863; say so.
        health = self.health_ok()
        return "health 200: engine stuck?" if health.ok else health.detail


def health_at(base_url: str, path: str, timeout: float) -> ProbeResult:
    """`EndpointProbe.health_ok` with no recipe to read the endpoint from: a lane shown from its labels."""
    return _health(EngineHttp(base_url), path, timeout)


def _health(engine: EngineHttp, path: str, timeout: float) -> ProbeResult:
    started = time.monotonic()
    try:
        response = engine.request("GET", path, timeout=timeout)
    except EngineUnanswered as exc:
        return _failed(path, exc, timeout, started)
    return ProbeResult(response.status == 200, _answered(path, response), time.monotonic() - started)


def _answered(path: str, response: EngineAnswer) -> str:
    message = response.error_message() if response.status != 200 else ""
    return f"{path} answered {response.status}" + (f": {message}" if message else "")


def _failed(path: str, exc: EngineUnanswered, timeout: float, started: float) -> ProbeResult:
    reason = f"no answer within {timeout:.1f} s" if exc.failure == "timeout" else str(exc)
    return ProbeResult(False, f"{path}: {reason}", time.monotonic() - started)


def _model_ids(response: EngineAnswer) -> list[str] | None:
    try:
        body: Any = response.json()
    except ValueError:
        return None
    data = body.get("data") if isinstance(body, dict) else None
    if not isinstance(data, list):
        return None
    return [str(item["id"]) for item in data if isinstance(item, dict) and "id" in item]


def _generated(response: EngineAnswer) -> str | None:
    """What the completion generated ("3 tokens", or the text when usage is absent); None for nothing."""
    try:
        body: Any = response.json()
    except ValueError:
        return None
    if not isinstance(body, dict):
        return None
    usage = body.get("usage")
    tokens = usage.get("completion_tokens") if isinstance(usage, dict) else None
    if isinstance(tokens, int) and not isinstance(tokens, bool):
        return f"{tokens} token{'s' if tokens != 1 else ''}" if tokens > 0 else None
    choices = body.get("choices")
    first = choices[0] if isinstance(choices, list) and choices else None
    text = first.get("text") if isinstance(first, dict) else None
    return repr(text) if isinstance(text, str) and text else None
