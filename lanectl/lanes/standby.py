"""Talking to a lane's engine about sleep: vLLM's development routes and the wake check.

`POST /sleep?level=1`, `POST /wake_up` and `GET /is_sleeping` exist only with `VLLM_SERVER_DEV_MODE=1`
(docs.vllm.ai/en/latest/features/sleep_mode/). vLLM 0.31.0 answers both POSTs with an empty 200 once done, and
`/is_sleeping` with `{"is_sleeping": bool}`; lanectl asks `/is_sleeping` after each, rather than trusting
the 200. Before sleeping, `POST /reset_prefix_cache` drops cached prefixes: a wake that kept them has served
wrong text (vllm#17103). It answers 200 either way, with `{"success": false}` when blocks are still held (by
running requests, or in-flight KV transfers), so its body is read, not only its status. After the sleep the
engine's own gauge `vllm:engine_sleep_state` (awake / weights_offloaded / discard_all, as vLLM's API server
records it) must say the same as `/is_sleeping`: an engine whose two reports disagree is not trusted as a
standby. Every failure is a `StandbyError` whose message says what the engine answered.
"""

from __future__ import annotations

import re
import threading
from typing import Any

from lanectl.health.engine_http import EngineAnswer, EngineHttp, EngineUnanswered, engine_url
from lanectl.recipe.catalog import ROLE_PRIMARY, Lane
from lanectl.recipe.model import Engine

# vLLM's worker logs this once asleep: "Sleep mode freed 71.25 GiB memory, 1.38 GiB memory is still in use."
RESIDENT_LINE = re.compile(r"Sleep mode freed [0-9.]+ GiB memory, ([0-9.]+) GiB memory is still in use")
# One sample of the gauge in Prometheus text: `vllm:engine_sleep_state{engine="0",...,sleep_state="awake"} 1.0`.
SLEEP_STATE_SAMPLE = re.compile(r'^vllm:engine_sleep_state\{([^}]*)\}\s+(\S+)', re.MULTILINE)
SLEEP_STATE_LABEL = re.compile(r'sleep_state="([^"]*)"')
# What the gauge reads after a sleep at each level (vLLM's record_sleep_state): 1 for the level's own state.
EXPECTED_SLEEP_STATE = {
    0: {"awake": 0.0, "weights_offloaded": 0.0, "discard_all": 0.0},
    1: {"awake": 0.0, "weights_offloaded": 1.0, "discard_all": 0.0},
    2: {"awake": 0.0, "weights_offloaded": 0.0, "discard_all": 1.0},
}


# Requests in flight, on /metrics: `vllm:num_requests_running{engine="0",model_name="m"} 8.0`, and `_waiting`.
IN_FLIGHT = re.compile(r"^vllm:num_requests_(?:running|waiting)(?:\{[^}]*\})? ([0-9.eE+-]+)$", re.MULTILINE)
METRICS_TIMEOUT_SECONDS = 2.0
# How long a sleep lets the requests in flight finish when the role's drain is not known (an engine of its own).
DEFAULT_DRAIN_SECONDS = 30.0


class StandbyError(Exception):
    """A sleep, a wake or a wake check that did not do what it must."""


def role_engine(lane: Lane, role: str) -> Engine:
    return lane.spec.engine if role == ROLE_PRIMARY else lane.spec.companions[role].engine


def role_base_url(lane: Lane, role: str) -> str:
    """The role's first published port, on loopback when it is published on every address."""
    ports = role_engine(lane, role).ports
    if not ports:
        raise StandbyError(f"{lane.name}'s {role} publishes no port, so lanectl cannot reach its sleep routes")
    return engine_url(ports[0].host_ip, ports[0].published)


def resident_gib(log_text: str) -> float | None:
    """GPU memory a sleeping engine still holds, from its own last report; None if it logged none."""
    found = RESIDENT_LINE.findall(log_text)
    return float(found[-1]) if found else None


class SleepEndpoints:
    """One engine's sleep routes and a greedy completion, with one timeout for every request."""

    def __init__(self, base_url: str, timeout: float) -> None:
        self.engine = EngineHttp(base_url)
        self.timeout = timeout

    def _request(self, method: str, path: str, json_body: Any = None, *, timeout: float | None = None) -> EngineAnswer:
        try:
            response = self.engine.request(method, path, timeout=timeout or self.timeout, json_body=json_body)
        except EngineUnanswered as exc:
            raise StandbyError(f"{method} {path}: {exc}") from None
        if response.status != 200:
            hint = " (is VLLM_SERVER_DEV_MODE=1 set in the image?)" if response.status == 404 else ""
            raise StandbyError(f"{method} {path} answered {response.status}: "
                               f"{response.error_message() or '(empty)'}{hint}")
        return response

    def is_sleeping(self) -> bool:
        response = self._request("GET", "/is_sleeping")
        try:
            answer = response.json()
        except ValueError:
            answer = None
        if not isinstance(answer, dict) or not isinstance(answer.get("is_sleeping"), bool):
            raise StandbyError(f"GET /is_sleeping answered {response.text[:100]!r}, not {{\"is_sleeping\": bool}}")
        return answer["is_sleeping"]

    def reset_prefix_cache(self) -> None:
        response = self._request("POST", "/reset_prefix_cache")
        if not response.body.strip():
            return  # vLLM before 0.31.0 answered an empty 200
        try:
            answer = response.json()
        except ValueError:
            answer = None
        if not isinstance(answer, dict) or not isinstance(answer.get("success"), bool):
            raise StandbyError(f"POST /reset_prefix_cache answered {response.text[:100]!r}, "
                               "not {\"success\": bool}")
        if not answer["success"]:
            raise StandbyError('POST /reset_prefix_cache answered 200 {"success": false}: the engine still holds '
                               "cached blocks (requests running?), so a wake could serve stale prefixes")

    def sleep_state(self) -> dict[str, float]:
        """The engine's `vllm:engine_sleep_state` gauge, state -> value (one engine; several must agree)."""
        response = self._request("GET", "/metrics")
        states: dict[str, float] = {}
        for labels, value in SLEEP_STATE_SAMPLE.findall(response.text):
            state = SLEEP_STATE_LABEL.search(labels)
            try:
                number = float(value)
            except ValueError:
                raise StandbyError(f"GET /metrics: vllm:engine_sleep_state{{{labels}}} is {value!r}, "
                                   "not a number") from None
            if state is None:
                continue
            if states.setdefault(state.group(1), number) != number:
                raise StandbyError(f"GET /metrics: the engines disagree on vllm:engine_sleep_state "
                                   f"{state.group(1)!r}")
        if not states:
            raise StandbyError("GET /metrics has no vllm:engine_sleep_state gauge (vLLM 0.31.0 always serves it)")
        return states

    def in_flight(self) -> int | None:
        """Requests the engine runs or has waiting (`vllm:num_requests_running` + `waiting` on /metrics); None when
        it does not say."""
        try:
            response = self.engine.request("GET", "/metrics", timeout=min(self.timeout, METRICS_TIMEOUT_SECONDS))
        except EngineUnanswered:
            return None
        values = IN_FLIGHT.findall(response.text) if response.status == 200 else []
        return round(sum(float(value) for value in values)) if values else None

    def sleep(self, level: int, drain_seconds: float = DEFAULT_DRAIN_SECONDS) -> str:
        """Put the engine to sleep once the requests it is answering have finished, waiting for them at most
        `drain_seconds`; past that, the rest are aborted (POST /abort_requests) and the sleep goes on. Returns what
        became of them. vLLM's level >= 1 sleep clears the prefix cache itself once they are done, so a wake cannot
        serve stale prefixes (a separate /reset_prefix_cache would fail while they run)."""
        in_flight = self.in_flight()
        answered: dict[str, Any] = {}

        def ask() -> None:
            try:
                answered["ok"] = self._request("POST", f"/sleep?level={level}&mode=wait",
                                               timeout=drain_seconds + self.timeout)
            except StandbyError as exc:
                answered["error"] = exc

        asking = threading.Thread(target=ask, daemon=True)
        asking.start()
        asking.join(drain_seconds)
        cut = 0
        if asking.is_alive() and self.in_flight():
            answer = self._request("POST", "/abort_requests", {}).json()
            cut = int(answer.get("aborted") or 0) if isinstance(answer, dict) else 0
        asking.join(self.timeout + drain_seconds)
        if asking.is_alive():
            raise StandbyError(f"POST /sleep?level={level}&mode=wait: no answer within "
                               f"{drain_seconds + self.timeout:g} s")
        if "error" in answered:
            raise answered["error"]
        self._check_asleep(level)
        if cut:
            return (f"{cut} request(s) still in flight after the drain's {drain_seconds:g} s were CUT (aborted, "
                    f"finish_reason \"abort\") before it slept")
        if in_flight:
            return f"{in_flight} request(s) in flight, all finished before it slept"
        return "no request in flight"

    def _check_asleep(self, level: int) -> None:
        if not self.is_sleeping():
            raise StandbyError(f"POST /sleep?level={level} answered 200 but /is_sleeping still says false")
        states = self.sleep_state()
        expected = EXPECTED_SLEEP_STATE[level]
        if {name: states.get(name) for name in expected} != expected:
            shown = ", ".join(f"{name}={states[name]:g}" for name in sorted(states))
            raise StandbyError(f"/is_sleeping says asleep after POST /sleep?level={level}, but vllm:engine_sleep_state "
                               f"says {shown} (a level-{level} sleep reads "
                               f"{', '.join(f'{n}={v:g}' for n, v in sorted(expected.items()))})")

    def wake_up(self) -> None:
        self._request("POST", "/wake_up")
        if self.is_sleeping():
            raise StandbyError("POST /wake_up answered 200 but /is_sleeping still says true")

    def greedy_text(self, model: str, prompt: str, max_tokens: int) -> str:
        """The text of a temperature-0 completion: what a wake check compares."""
        response = self._request("POST", "/v1/completions", {
            "model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": False})
        try:
            text = response.json()["choices"][0]["text"]
        except (ValueError, KeyError, IndexError, TypeError):
            raise StandbyError(f"/v1/completions answered 200 without a completion: {response.text[:100]!r}") from None
        if not isinstance(text, str):
            raise StandbyError(f"/v1/completions answered a {type(text).__name__} as text")
        return text
