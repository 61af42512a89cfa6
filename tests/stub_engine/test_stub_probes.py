"""The stub engine answers lanectl's correctness probes well enough to pass, deterministically, and each
output fault fails its probe: selected by STUB_FAULT at start, or at run time through /admin/fault."""

from __future__ import annotations

import json

import httpx
import pytest

from lanectl.bench.probes import load_probe, run_probe

from .conftest import Spawn
from .stubproc import MODEL_NAME, REPO

PROBES = REPO / "recipes" / "workloads" / "probes"
DEMO_PROBES = ("gauntlet", "thinking", "soak-demo", "needle-4k")
FAULT_FAILS = {"broken_tool_json": "gauntlet", "leak_reasoning": "thinking", "loop": "soak-demo",
               "miss_needle": "needle-4k"}


def results(url: str) -> dict[str, dict]:
    return {name: run_probe(url, MODEL_NAME, load_probe(PROBES / f"{name}.yaml").probe).summary()
            for name in DEMO_PROBES}


def test_a_healthy_stub_passes_every_probe_and_each_runtime_fault_fails_only_its_own(spawn: Spawn) -> None:
    url = spawn(env={"STUB_ADMIN": "1"}).url
    assert {name: (r["passed"], r["total"]) for name, r in results(url).items()} == {
        "gauntlet": (12, 12), "thinking": (16, 16), "soak-demo": (4, 4), "needle-4k": (1, 1)}
    for fault, probe in FAULT_FAILS.items():
        assert httpx.post(f"{url}/admin/fault", json={"fault": fault}).status_code == 200
        failed = {name for name, r in results(url).items() if not r["ok"]}
        assert failed == {probe}, (fault, failed)
        assert httpx.post(f"{url}/admin/fault", json={"fault": "clear"}).status_code == 200
    assert all(r["ok"] for r in results(url).values())


@pytest.mark.parametrize("fault", ["leak_reasoning", "miss_needle"])
def test_stub_fault_at_start_fails_its_probe_from_the_first_request(spawn: Spawn, fault: str) -> None:
    url = spawn(env={"STUB_FAULT": fault}).url
    probe = FAULT_FAILS[fault]
    report = run_probe(url, MODEL_NAME, load_probe(PROBES / f"{probe}.yaml").probe)
    assert report.summary()["passed"] == 0


def chat(url: str, body: dict) -> httpx.Response:
    return httpx.post(f"{url}/v1/chat/completions", json={"model": MODEL_NAME, **body}, timeout=10)


def test_replies_are_vllm_shaped_and_deterministic(spawn: Spawn) -> None:
    url = spawn().url
    tool = {"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"n": {"type": "integer", "minimum": 3, "maximum": 4},
                                         "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "minItems": 2}},
        "required": ["n", "tags"]}}}
    body = {"messages": [{"role": "user", "content": "go"}], "tools": [tool], "tool_choice": "required"}
    first = chat(url, body).json()
    assert first == {**first, "object": "chat.completion"}
    [choice] = first["choices"]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    [called] = choice["message"]["tool_calls"]
    arguments = json.loads(called["function"]["arguments"])
    assert called["type"] == "function" and called["function"]["name"] == "f"
    assert arguments["n"] in (3, 4) and len(arguments["tags"]) == 2 and set(arguments["tags"]) <= {"a", "b"}
    assert chat(url, body).json()["choices"][0]["message"] == choice["message"]
    thinking = chat(url, {"messages": [{"role": "user", "content": "why?"}],
                          "chat_template_kwargs": {"thinking": True}, "max_tokens": 64}).json()["choices"][0]["message"]
    assert thinking["reasoning"] and thinking["content"] and "<think>" not in thinking["content"]
    # Without thinking asked for: plain text, no reasoning field, as a model without a reasoning parser.
    plain = chat(url, {"messages": [{"role": "user", "content": "why?"}]}).json()["choices"][0]["message"]
    assert "reasoning" not in plain and plain["content"]
    # A reply longer than max_tokens is cut there, as an engine cuts it.
    cut = chat(url, {**body, "max_tokens": 3}).json()["choices"][0]
    assert cut["finish_reason"] == "length" and len(cut["message"]["tool_calls"][0]["function"]["arguments"]) == 12
    streamed = chat(url, {**body, "stream": True})
    assert streamed.status_code == 400 and "without stream" in streamed.json()["error"]["message"]


def test_a_loop_fault_repeats_the_stream_and_the_config_names_every_fault(spawn: Spawn) -> None:
    url = spawn(env={"STUB_FAULT": "loop"}).url
    text = httpx.post(f"{url}/v1/completions", json={"model": MODEL_NAME, "prompt": "x", "max_tokens": 60},
                      timeout=10).json()["choices"][0]["text"].split()
    assert text[32:38] == text[26:32] == text[38:44] and len(set(text[:32])) > 10
    bad = spawn(env={"STUB_FAULT": "loops"}, ready=False)
    assert bad.wait_exit(10) == 2
    assert "broken_tool_json, leak_reasoning, loop, miss_needle" in bad.output
