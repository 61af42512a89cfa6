"""shapes: what lanectl sends and what the stub answers, through the vLLM release's own request and response models.

lanectl's own functions (the load generator, teacher-forced scoring, every probe of the gate) talk to a real stub
engine process over loopback; an httpx event hook keeps each request body and each answer. Every body must
validate as vLLM's request model with no field vLLM would ignore, and every answer as vLLM's response model with
no field vLLM does not send: vLLM's models allow extra keys (`OpenAIBaseModel`: extra="allow"), so the walk below
names each key that is not a declared field, at its place in the JSON.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import BaseModel, ValidationError

from lanectl.bench.loadgen import run_arm
from lanectl.bench.probes import load_probe, run_probe
from tests.stub_engine.stubproc import STUB_DIR, StubProcess

REPO = Path(__file__).resolve().parents[2]
PROBES = REPO / "recipes" / "workloads" / "probes"
MODEL = "stub-test"
# The stub as the demo lanes run it: speculative decoding (several tokens a step), tool and reasoning parsers.
STUB_ARGS = ["--speculative-config", '{"method":"dspark","num_speculative_tokens":5}', "--max-num-seqs", "32",
             "--tool-call-parser", "deepseek_v41", "--reasoning-parser", "deepseek_v41", "--enable-auto-tool-choice"]


def unknown_fields(value: Any, data: Any, path: str = "$") -> list[str]:
    """Keys of `data` that `value` (its validated model) has no field for, as JSON paths."""
    if isinstance(value, BaseModel) and isinstance(data, dict):
        names = {}
        for name, info in type(value).model_fields.items():
            names[name] = name
            if info.alias:
                names[info.alias] = name
        out = []
        for key, item in data.items():
            if key not in names:
                out.append(f"{path}.{key}: not a field of vLLM's {type(value).__name__}")
            else:
                out += unknown_fields(getattr(value, names[key]), item, f"{path}.{key}")
        return out
    if isinstance(value, list | tuple) and isinstance(data, list):
        return [p for i, (v, d) in enumerate(zip(value, data, strict=False))
                for p in unknown_fields(v, d, f"{path}[{i}]")]
    if isinstance(value, dict) and isinstance(data, dict):
        return [p for (k, v), d in zip(value.items(), data.values(), strict=False)
                for p in unknown_fields(v, d, f"{path}[{k!r}]")]
    return []


def vllm_shape(model: type[BaseModel], data: Any, what: str) -> list[str]:
    """Why `data` is not exactly a vLLM `model` (empty when it is)."""
    try:
        value = model.model_validate(data)
    except ValidationError as exc:
        return [f"{what}: not a valid vLLM {model.__name__}: {exc}"]
    return [f"{what}: {problem}" for problem in unknown_fields(value, data)]


class Recorder:
    """An httpx client factory whose clients keep every request body and answer (SSE events parsed)."""

    def __init__(self) -> None:
        self.exchanges: list[tuple[str, Any, int, list[Any]]] = []

    def _response(self, response: httpx.Response) -> None:
        response.read()
        request = response.request
        body = json.loads(request.content) if request.content else None
        text = response.text
        if response.headers.get("content-type", "").startswith("text/event-stream"):
            answers = [json.loads(line[6:]) for line in text.splitlines()
                       if line.startswith("data: ") and line != "data: [DONE]"]
        else:
            answers = [json.loads(text)] if text else []
        self.exchanges.append((request.url.path, body, response.status_code, answers))

    def client(self, *_: Any, **kwargs: Any) -> httpx.Client:
        return httpx.Client(timeout=60, event_hooks={"response": [self._response]})

    def of(self, path: str) -> list[tuple[str, Any, int, list[Any]]]:
        return [exchange for exchange in self.exchanges if exchange[0] == path]


@pytest.fixture(scope="module")
def stub() -> Iterator[StubProcess]:
    process = StubProcess({"STUB_LOAD_SECONDS": "0.2", "STUB_DECODE_TOKENS_PER_S": "2000"}, STUB_ARGS, STUB_DIR, 0)
    try:
        process.wait_ready(timeout=60)
        yield process
    finally:
        process.kill()


def _teacher_forcing(client: httpx.Client, url: str) -> Any:
    """The gate's scoring of one prompt, by whichever teacher forcing this checkout has: by token ids
    (lanectl.bench.forcing: a greedy continuation with its ids, then those ids scored), or by text."""
    try:
        from lanectl.bench import forcing  # type: ignore[attr-defined]
    except ImportError:
        from lanectl.bench.loadgen import score_continuation  # type: ignore[attr-defined]

        return score_continuation(client, url, MODEL, "The capital of France is", [" Paris", "."], top=5)
    greedy = forcing.greedy_continuation(client, url, MODEL, "The capital of France is", max_tokens=4,
                                         top_logprobs=5)
    assert not isinstance(greedy, str), greedy
    return forcing.score_continuation(client, url, MODEL, greedy.prompt_token_ids, greedy.token_ids, top=5)


@pytest.fixture(scope="module")
def traffic(stub: StubProcess) -> Recorder:
    """One pass of everything lanectl sends an engine in a gate, recorded."""
    recorder = Recorder()
    run_arm(stub.url, MODEL, ["def add(a, b):", "The capital of France is"], concurrency=2, requests=2,
            max_tokens=8, warmup=0, logprobs=5, client_factory=recorder.client)
    with recorder.client() as client:
        scored = _teacher_forcing(client, stub.url)
        assert not isinstance(scored, str), scored
        for name in ("gauntlet", "thinking", "soak-demo", "needle-4k"):
            run_probe(stub.url, MODEL, load_probe(PROBES / f"{name}.yaml").probe, client=client)
        client.get(stub.url + "/v1/models")
        client.post(stub.url + "/v1/completions", json={"model": "no-such-model", "prompt": "x", "max_tokens": 1})
    return recorder


def test_every_completion_request_lanectl_sends_is_a_vllm_completion_request(traffic: Recorder) -> None:
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest

    sent = [body for _, body, _, _ in traffic.of("/v1/completions") if body["model"] == MODEL]
    assert sent
    problems = [p for i, body in enumerate(sent) for p in vllm_shape(CompletionRequest, body, f"request {i}")]
    assert not problems, "\n".join(problems)


def test_every_chat_request_lanectl_sends_is_a_vllm_chat_request(traffic: Recorder) -> None:
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    sent = [body for _, body, _, _ in traffic.of("/v1/chat/completions")]
    assert sent
    problems = [p for i, body in enumerate(sent) for p in vllm_shape(ChatCompletionRequest, body, f"chat request {i}")]
    assert not problems, "\n".join(problems)


def test_the_stubs_completions_are_vllm_completion_responses(traffic: Recorder) -> None:
    from vllm.entrypoints.openai.completion.protocol import CompletionResponse, CompletionStreamResponse

    problems, kinds = [], set()
    for i, (_, body, status, answers) in enumerate(traffic.of("/v1/completions")):
        if status != 200:
            continue
        if body.get("stream"):
            kinds.add("stream")
            for j, chunk in enumerate(answers):
                problems += vllm_shape(CompletionStreamResponse, chunk, f"answer {i} chunk {j}")
            assert answers[-1].get("usage"), f"answer {i}: no usage in the last chunk (stream_options.include_usage)"
        else:
            kinds.add("prompt_logprobs" if body.get("prompt_logprobs") else "plain")
            problems += vllm_shape(CompletionResponse, answers[0], f"answer {i}")
    assert kinds >= {"stream", "prompt_logprobs"}, kinds
    assert not problems, "\n".join(problems)


def test_the_stubs_chat_answers_are_vllm_chat_responses_with_tool_calls_and_reasoning(traffic: Recorder) -> None:
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionResponse

    problems, seen = [], set()
    for i, (_, _, status, answers) in enumerate(traffic.of("/v1/chat/completions")):
        assert status == 200, answers
        problems += vllm_shape(ChatCompletionResponse, answers[0], f"chat answer {i}")
        message = answers[0]["choices"][0]["message"]
        seen |= {key for key in ("tool_calls", "reasoning") if message.get(key)}
    assert seen == {"tool_calls", "reasoning"}, f"the probes met only {seen}"
    assert not problems, "\n".join(problems)


def test_the_stubs_model_list_is_vllms(traffic: Recorder) -> None:
    from vllm.entrypoints.serve.engine.protocol import ModelList

    ((_, _, status, answers),) = traffic.of("/v1/models")
    assert status == 200
    problems = vllm_shape(ModelList, answers[0], "/v1/models")
    assert not problems, "\n".join(problems)


def test_the_stubs_errors_are_vllm_error_responses(traffic: Recorder) -> None:
    from vllm.entrypoints.serve.engine.protocol import ErrorResponse

    errors = [(status, answers) for _, body, status, answers in traffic.of("/v1/completions") if status != 200]
    assert errors, "the request for an unknown model was answered 200"
    problems = [p for status, answers in errors for p in vllm_shape(ErrorResponse, answers[0], f"error {status}")]
    problems += [f"error {status}: body says code {a[0]['error'].get('code')}" for status, a in errors
                 if a[0].get("error", {}).get("code") != status]
    assert not problems, "\n".join(problems)


def test_the_tokenize_exchanges_are_vllms(traffic: Recorder) -> None:
    """`/tokenize`, where lanectl asks it (teacher forcing by ids): vLLM's request and answer models."""
    from vllm.entrypoints.serve.tokenize.protocol import TokenizeCompletionRequest, TokenizeResponse

    problems = []
    for i, (_, body, status, answers) in enumerate(traffic.of("/tokenize")):
        problems += vllm_shape(TokenizeCompletionRequest, body, f"tokenize request {i}")
        if status == 200:
            problems += vllm_shape(TokenizeResponse, answers[0], f"tokenize answer {i}")
    assert not problems, "\n".join(problems)
