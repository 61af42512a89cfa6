"""EndpointProbe's answers and requests, with HTTP faked at the transport (the stub-engine tests use real HTTP)."""

from __future__ import annotations

import json
from collections.abc import Callable

import httpx
import pytest

from lanectl.health.probe import EndpointProbe
from lanectl.recipe.model import GenerationProbe, Health

Handler = Callable[[httpx.Request], httpx.Response]
SETTINGS = Health(
    startup_budget_minutes=20,
    request_timeout_seconds=7,
    served_model_name="demo-model",
    generation_probe=GenerationProbe(prompt="Say OK.", max_tokens=2, timeout_seconds=5),
)


def probe(handler: Handler) -> EndpointProbe:
    return EndpointProbe("http://engine:30006/", SETTINGS, httpx.Client(transport=httpx.MockTransport(handler)))


def models(*names: str) -> httpx.Response:
    return httpx.Response(200, json={"object": "list", "data": [{"id": n, "object": "model"} for n in names]})


def refused(request: httpx.Request) -> httpx.Response:
    raise httpx.ConnectError("[Errno 111] Connection refused", request=request)


def test_health_200_is_ok() -> None:
    result = probe(lambda request: httpx.Response(200)).health_ok()
    assert result.ok and result.detail == "/health answered 200"


def test_health_503_is_a_result() -> None:
    result = probe(lambda request: httpx.Response(503)).health_ok()
    assert not result.ok and result.detail == "/health answered 503"


def test_connection_refused_is_a_result() -> None:
    result = probe(refused).health_ok()
    assert not result.ok and result.detail == "/health: connection refused"


def test_no_answer_names_the_request_timeout() -> None:
    def slow(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("timed out", request=request)

    result = probe(slow).models_lists_served_model()
    assert not result.ok and result.detail == "/v1/models: no answer within 7.0 s"


def test_the_model_list_must_hold_the_served_model() -> None:
    assert probe(lambda request: models("other", "demo-model")).models_lists_served_model().ok
    result = probe(lambda request: models("other")).models_lists_served_model()
    assert not result.ok and result.detail == "/v1/models does not list 'demo-model' (it lists: other)"
    result = probe(lambda request: models()).models_lists_served_model()
    assert result.detail == "/v1/models does not list 'demo-model' (it lists: nothing)"


def test_a_model_list_that_is_not_one_is_a_result() -> None:
    result = probe(lambda request: httpx.Response(200, text="<html>proxy</html>")).models_lists_served_model()
    assert not result.ok and result.detail == "/v1/models answered 200 but not with an OpenAI model list"


def test_generation_sends_a_short_deterministic_request_with_its_own_timeout() -> None:
    seen: list[httpx.Request] = []

    def engine(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={"choices": [{"text": " OK"}], "usage": {"completion_tokens": 2}})

    result = probe(engine).generate()

    assert result.ok and result.detail.startswith("/v1/completions generated 2 tokens in ")
    (request,) = seen
    assert request.method == "POST" and str(request.url) == "http://engine:30006/v1/completions"
    assert json.loads(request.content) == {
        "model": "demo-model",
        "prompt": "Say OK.",
        "max_tokens": 2,
        "temperature": 0,
        "stream": False,
    }
    assert request.extensions["timeout"] == {"connect": 5, "read": 5, "write": 5, "pool": 5}


@pytest.mark.parametrize(
    ("body", "ok", "detail"),
    [
        ({"choices": [{"text": ""}], "usage": {"completion_tokens": 0}}, False, "answered 200 with no generated token"),
        ({"choices": [{"text": " OK"}]}, True, "generated ' OK' in "),
        ({"choices": [{"text": ""}]}, False, "answered 200 with no generated token"),
        ({"choices": []}, False, "answered 200 with no generated token"),
        ({"choices": [{"text": "x"}], "usage": {"completion_tokens": 1}}, True, "generated 1 token in "),
    ],
)
def test_generation_counts_tokens_from_usage_else_text(body: dict, ok: bool, detail: str) -> None:
    result = probe(lambda request: httpx.Response(200, json=body)).generate()
    assert result.ok is ok and detail in result.detail


def test_a_dead_engine_answering_503_shows_its_message() -> None:
    error = {"error": {"message": "EngineCore encountered an issue.", "type": "EngineDeadError", "code": 503}}
    result = probe(lambda request: httpx.Response(503, json=error)).generate()
    assert not result.ok and result.detail == "/v1/completions answered 503: EngineCore encountered an issue."


@pytest.mark.parametrize(("health_status", "diagnosis"), [(200, "health 200: engine stuck?"),
                                                           (503, "/health answered 503")])
def test_a_generation_timeout_says_what_health_answers(health_status: int, diagnosis: str) -> None:
    def engine(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/health":
            return httpx.Response(health_status)
        raise httpx.ReadTimeout("timed out", request=request)

    result = probe(engine).generate()
    assert not result.ok and result.detail == f"generation probe timed out after 5.0 s ({diagnosis})"


def test_every_request_carries_the_request_timeout_whatever_the_client() -> None:
    timeouts = []

    def engine(request: httpx.Request) -> httpx.Response:
        timeouts.append(request.extensions["timeout"])
        return httpx.Response(200, json={"data": [{"id": "demo-model"}]})

    endpoints = probe(engine)
    endpoints.health_ok()
    endpoints.models_lists_served_model()
    assert timeouts == [httpx.Timeout(7).as_dict()] * 2


def test_probes_speak_plain_http_only() -> None:
    # The probe client verifies no certificate (see probe_client): an https URL must not reach it.
    with pytest.raises(ValueError, match="plain HTTP"):
        EndpointProbe("https://127.0.0.1:9", SETTINGS)
