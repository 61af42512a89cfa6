"""routes: lanectl's EndpointProbe, SleepEndpoints and wake check against the vLLM release's own API routers.

vLLM's app (vllm_server.py) answers as vLLM does, failures included: `/health` 503 for a dead engine,
a sleep that waits for the requests in flight, the count of an abort, 500 with the error for a failed
wake, 404 for the sleep routes without development mode. lanectl must read each the way it claims to. Where releases
differ (0.31.0 answers a sleep and a wake with an empty 200, 0.32.0 with `{"status": …}`), lanectl reads the engine's
state (`/is_sleeping`), not the answer's body, and these tests hold it to that on each release.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import httpx
import pytest
import vllm_oracle as oracle
from vllm_server import VllmServer, dev_mode_routes, vllm_server

from lanectl.health.probe import EndpointProbe
from lanectl.lanes.standby import SleepEndpoints, StandbyError
from lanectl.recipe.model import DEV_MODE_ROUTES, Health

MODEL = "contract-model"


@pytest.fixture(scope="module")
def server() -> Iterator[VllmServer]:
    with vllm_server(MODEL) as running:
        yield running


@pytest.fixture(autouse=True)
def fresh(server: VllmServer) -> None:
    engine = server.engine
    engine.wake_error = None
    if engine.sleeping:
        asyncio.run(engine.wake_up())
    engine.dead = engine.prefix_cache_held = False
    engine.calls.clear()
    server.completions.requests.clear()


def probe(server: VllmServer, name: str = MODEL) -> EndpointProbe:
    return EndpointProbe(server.url, Health(startup_budget_minutes=1, served_model_name=name))


def test_health_is_200_while_the_engine_lives_and_503_once_it_is_dead(server: VllmServer) -> None:
    alive = probe(server).health_ok()
    assert alive.ok, f"vLLM answers /health 200 for a live engine; lanectl's EndpointProbe.health_ok: {alive}"
    server.engine.dead = True
    result = probe(server).health_ok()
    assert not result.ok and "503" in result.detail, (
        f"vLLM answers /health 503 for a dead engine; lanectl's EndpointProbe.health_ok made of it: {result}")


def test_the_models_list_names_the_served_model(server: VllmServer) -> None:
    assert probe(server).models_lists_served_model().ok
    other = probe(server, "another-model").models_lists_served_model()
    assert not other.ok and MODEL in other.detail, other


def test_the_generation_probe_is_a_request_vllm_accepts_and_its_answer_one_lanectl_reads(server: VllmServer) -> None:
    result = probe(server).generate()
    assert result.ok, result
    (request,) = server.completions.requests
    assert request.model == MODEL and request.max_tokens <= 3 and request.temperature == 0


def test_a_sleep_waits_for_the_requests_in_flight_at_the_level_asked(server: VllmServer) -> None:
    """mode=wait: vLLM's route passes it to the engine, whose level >= 1 sleep drains, then clears the prefix
    cache itself (v1/engine/core.py sleep -> pause_scheduler(clear_cache=True)): no separate reset is asked."""
    SleepEndpoints(server.url, timeout=5).sleep(1)
    assert server.engine.calls == [("sleep", 1, "wait")]
    assert server.engine.sleeping


def test_the_abort_lanectl_sends_past_a_drain_is_a_route_vllm_answers_with_a_count(server: VllmServer) -> None:
    """POST /abort_requests (the rlhf development router): lanectl reads `aborted` from its answer. With no ids it
    aborts everything the AsyncLLM tracks; with ids, those (this fake engine client is no AsyncLLM, so ids)."""
    answer = httpx.post(server.url + "/abort_requests", json={"request_ids": ["a", "b"]})
    assert (answer.status_code, answer.json()) == (200, {"status": "aborted", "aborted": 2})
    assert server.engine.calls == [("abort", ["a", "b"], False)]


def test_a_sleep_leaves_vllms_sleep_state_gauge_at_the_level_slept(server: VllmServer) -> None:
    SleepEndpoints(server.url, timeout=5).sleep(1)
    metrics = httpx.get(server.url + "/metrics").text
    assert 'sleep_state="weights_offloaded"} 1.0' in metrics, [m for m in metrics.splitlines() if "sleep_state" in m]


def test_a_wake_that_vllm_answers_500_fails_with_vllms_error(server: VllmServer) -> None:
    asyncio.run(server.engine.sleep(1))
    server.engine.wake_error = "CuMemAllocator: cannot map 54.84 GiB back"
    with pytest.raises(StandbyError, match="500.*cannot map 54.84 GiB back"):
        SleepEndpoints(server.url, timeout=5).wake_up()


def test_a_wake_is_confirmed_by_is_sleeping(server: VllmServer) -> None:
    asyncio.run(server.engine.sleep(1))
    server.engine.calls.clear()
    endpoints = SleepEndpoints(server.url, timeout=5)
    assert endpoints.is_sleeping()
    endpoints.wake_up()
    assert server.engine.calls == [("wake_up", None)] and not endpoints.is_sleeping()


def test_the_wake_check_reads_vllms_completion(server: VllmServer) -> None:
    server.completions.text = " fingerprint"
    try:
        assert SleepEndpoints(server.url, timeout=5).greedy_text(MODEL, "Reply with OK.", 3) == " fingerprint"
    finally:
        server.completions.text = "OK"
    (request,) = server.completions.requests
    assert request.temperature == 0 and not request.stream


def test_without_development_mode_the_sleep_routes_are_absent_and_lanectl_says_why() -> None:
    with vllm_server(MODEL, dev_mode=False) as plain:
        with pytest.raises(StandbyError, match="404.*VLLM_SERVER_DEV_MODE=1"):
            SleepEndpoints(plain.url, timeout=5).sleep(1)


def test_sleep_and_wake_answers_are_read_by_the_state_they_leave_not_their_body(server: VllmServer) -> None:
    """vLLM 0.31.0 answers 200 with an empty body; 0.32.0 and later `{"status": "sleeping", "level": N}` and
    `{"status": "awake"|"sleeping", "tags": …}`. SleepEndpoints confirms both through /is_sleeping."""
    slept = httpx.post(server.url + "/sleep", params={"level": 1})
    assert slept.status_code == 200, slept.text
    assert slept.content == b"" or slept.json().get("status") == "sleeping", slept.text
    woke = httpx.post(server.url + "/wake_up")
    assert woke.status_code == 200 and not server.engine.sleeping, woke.text
    assert woke.content == b"" or woke.json().get("status") == "awake", woke.text
    endpoints = SleepEndpoints(server.url, timeout=5)
    endpoints.sleep(1)
    endpoints.wake_up()
    assert not endpoints.is_sleeping()


def test_a_wake_that_leaves_the_engine_asleep_fails_whatever_the_release_answers(server: VllmServer) -> None:
    """A partial wake (`tags`) answers 200 on every release (0.32.0 adds `"status": "sleeping"`): only /is_sleeping
    tells that the lane is still asleep, and lanectl's wake must fail on it."""
    asyncio.run(server.engine.sleep(1))
    partial = httpx.post(server.url + "/wake_up", params={"tags": "weights"})
    assert partial.status_code == 200 and server.engine.sleeping, partial.text
    assert partial.content == b"" or partial.json().get("status") == "sleeping", partial.text
    endpoints = SleepEndpoints(server.url, timeout=5)
    engine_wake = server.engine.wake_up
    server.engine.wake_up = lambda tags=None: engine_wake(tags=["weights"])  # type: ignore[method-assign]
    try:
        with pytest.raises(StandbyError, match="still says true"):
            endpoints.wake_up()
    finally:
        server.engine.wake_up = engine_wake  # type: ignore[method-assign]


def test_every_development_route_is_one_lanectl_warns_about() -> None:
    """A route development mode mounts for anyone who reaches the port must be named where lanectl refuses to publish
    a dev-mode lane off the box (lanectl/recipe/model.py DEV_MODE_ROUTES, and the warning in docs/standby.md)."""
    named = {path for paths in DEV_MODE_ROUTES.values() for path in paths}
    unnamed = sorted(dev_mode_routes() - named)
    assert not unnamed, (f"{oracle.RELEASE} mounts {unnamed} in development mode, which lanectl/recipe/model.py "
                         "DEV_MODE_ROUTES (and the exposed-routes warning in docs/standby.md) do not name")
