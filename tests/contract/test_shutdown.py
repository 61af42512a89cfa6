"""shutdown and sleep modes: what a stop signal and `POST /sleep?mode=` do to requests in flight, held to vLLM
0.31.0's own code.

- **the flag**: every shipped role's `--shutdown-timeout`, parsed by `vllm serve`'s parser, is the drain budget
  lanectl reports (lanectl.recipe.shutdown.drain_seconds); the stub reads the flag as vLLM's parser and VllmConfig do.
- **the answers**: a request vLLM's engine core refuses while it stops (`EngineCoreProc._reject_add_in_shutdown`,
  run here) and a request it aborts in flight become, through vLLM's own completion serving code, the responses the
  stub gives in the same situation; an unknown pause mode fails as vLLM's app answers the engine core's failure.
- **the lines**: the stub's stop prints, in each process's order, messages the named vLLM files print.
"""

from __future__ import annotations

import asyncio
import json
import queue
import re
import signal
import threading
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any, get_args

import httpx
import pytest
import vllm_oracle as oracle
from lanes import baked_args, lanes, uses_vllm_entrypoint
from test_stub_lines import _calls_in, vllm_record
from vllm_server import VllmServer, vllm_server

from lanectl.recipe.shutdown import TEARDOWN_SECONDS, drain_seconds
from tests.stub_engine.stubproc import STUB_DIR, StubProcess, stream_into, wait_until

ROLES = [role for lane in lanes() if uses_vllm_entrypoint(lane) for role in baked_args(lane)]
MODEL = "stub-test"
EXIT_WAIT = 120  # a hang detector, not a figure


# -- the flag -----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("role", ROLES, ids=lambda role: role.name)
def test_every_role_stops_with_the_drain_lanectl_reports_and_it_fits_the_stop_timeout(role, tmp_path) -> None:
    parsed = oracle.engine_args(list(role.args), tmp_path / "model").shutdown_timeout
    engine = role.lane.spec.engine if role.role == "primary" else role.lane.spec.companions[role.role].engine
    assert parsed == drain_seconds(role.lane.spec, role.role), (
        f"{role.where()}: vLLM 0.31.0 parses --shutdown-timeout {parsed} from {role.name}'s args, lanectl reports "
        f"a drain of {drain_seconds(role.lane.spec, role.role)} s")
    assert parsed > 0, f"{role.name} would abort every request in flight on a stop (vLLM's 0)"
    assert parsed + TEARDOWN_SECONDS <= engine.stop_timeout_seconds


def test_vllms_default_is_to_abort() -> None:
    from stubengine.config import Config

    assert oracle.parse_serve_args(["/model"]).shutdown_timeout == 0 == Config("m", ["m"]).shutdown_timeout


@pytest.mark.parametrize("value", ["abc", "1.5", "-1"])
def test_the_stub_refuses_a_shutdown_timeout_vllm_refuses(value: str) -> None:
    from vllm.config import VllmConfig

    try:
        oracle.parse_serve_args(["/model", "--shutdown-timeout", value])
        refusal = None
    except AssertionError as exc:  # argparse's type=int
        refusal = str(exc)
    if refusal is None:  # the parser took it: VllmConfig's own constraint decides
        (constraint,) = VllmConfig.__pydantic_fields__["shutdown_timeout"].metadata
        assert int(value) < constraint.ge
    stub = StubProcess({}, ["--shutdown-timeout", value], STUB_DIR, 0)
    assert stub.wait_exit(EXIT_WAIT) == 2, stub.output
    assert refusal is None or refusal.removeprefix("vllm serve: error: ") in stub.output


# -- the answers --------------------------------------------------------------------------------------------------

def _engine_core_refusal() -> Any:
    """What vLLM's engine core sends for a request added while it shuts down: its own _reject_add_in_shutdown."""
    from vllm.v1.engine.core import EngineCoreProc, EngineShutdownState

    core = SimpleNamespace(shutdown_state=EngineShutdownState.SHUTTING_DOWN, output_queue=queue.Queue())
    core._send_finish_outputs_to_client = lambda *a: EngineCoreProc._send_finish_outputs_to_client(core, *a)
    core._send_abort_outputs_to_client = lambda *a: EngineCoreProc._send_abort_outputs_to_client(core, *a)
    assert EngineCoreProc._reject_add_in_shutdown(core, SimpleNamespace(request_id="r", client_index=0))
    _, outputs = core.output_queue.get_nowait()
    (output,) = outputs.outputs
    return output


def _request_output(tokens: list[int], finish_reason: str | None) -> Any:
    from vllm.outputs import CompletionOutput, RequestOutput

    return RequestOutput(request_id="r", prompt="x", prompt_token_ids=[1], prompt_logprobs=None, finished=finish_reason
                         is not None, outputs=[CompletionOutput(index=0, text=" w" * len(tokens), token_ids=tokens,
                                                                cumulative_logprob=None, logprobs=None,
                                                                finish_reason=finish_reason)])


def _vllm_completion(outputs: list[Any], stream: bool) -> list[Any]:
    """The client's view of a completion whose engine outputs are `outputs`, made by vLLM's own
    OpenAIServingCompletion (its stream generator, or its non-streaming response)."""
    from vllm.entrypoints.generate.base.protocol import RequestResponseMetadata
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest
    from vllm.entrypoints.openai.completion.serving import OpenAIServingCompletion

    client = SimpleNamespace(model_config=SimpleNamespace(get_diff_sampling_param=lambda: {}, generation_config="vllm"),
                             renderer=None, input_processor=None, vllm_config=None)
    serving = OpenAIServingCompletion(client, SimpleNamespace(), online_renderer=None, request_logger=None)
    request = CompletionRequest(model=MODEL, prompt="x", max_tokens=16, stream=stream,
                                stream_options={"include_usage": True} if stream else None)
    metadata = RequestResponseMetadata(request_id="r")
    if not stream:
        return [json.loads(serving.request_output_to_completion_response(
            outputs[-1:], request, "r", 0, MODEL, None, metadata).model_dump_json())]

    async def results() -> Any:
        for output in outputs:
            yield 0, output

    async def collect() -> list[str]:
        return [c async for c in serving.completion_stream_generator(request, [SimpleNamespace()], results(), "r", 0,
                                                                     MODEL, 1, None, metadata)]

    return [_sse(chunk) for chunk in asyncio.run(collect())]


def _sse(chunk: str) -> Any:
    payload = chunk.removeprefix("data: ").strip()
    return payload if payload == "[DONE]" else json.loads(payload)


def shape(events: list[Any]) -> list[Any]:
    """What a client acts on: each chunk's choices (text present?, finish_reason), the usage, [DONE]."""
    out: list[Any] = []
    for event in events:
        if event == "[DONE]":
            out.append(event)
            continue
        out += [("choice", bool(c.get("text")), c.get("finish_reason")) for c in event.get("choices") or []]
        if event.get("usage"):
            out.append(("usage", event["usage"]["completion_tokens"] > 0))
    return out


@pytest.fixture(scope="module")
def draining() -> Iterator[StubProcess]:
    """A stub stopped with a drain of 600 s and one long request in flight: it refuses every new one."""
    stub = StubProcess({"STUB_DECODE_TOKENS_PER_S": "50"}, ["--shutdown-timeout", "600"], STUB_DIR, 0)
    stub.wait_ready(timeout=EXIT_WAIT)
    events: list[Any] = []
    threading.Thread(target=lambda: _stream(stub.url, 30_000, events), daemon=True).start()
    wait_until(lambda: any(isinstance(e, dict) and e.get("choices") for e in events), what="a token")
    stub.signal(signal.SIGTERM)
    stub.wait_line(r"\[shutdown\] EngineCore: draining in-flight requests count=1", timeout=EXIT_WAIT)
    yield stub
    stub.kill()


def _stream(url: str, max_tokens: int, events: list[Any]) -> None:
    try:
        body = {"model": MODEL, "prompt": "x", "max_tokens": max_tokens, "stream_options": {"include_usage": True}}
        stream_into(lambda _, e: events.append(e), url, "/v1/completions", body, timeout=EXIT_WAIT)
    except httpx.HTTPError:
        pass


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_a_request_of_token_ids_refused_while_the_engine_drains_looks_as_vllm_makes_it(
        draining: StubProcess, stream: bool) -> None:
    """A prompt of token ids needs no tokenizing: it reaches the engine core, which refuses it."""
    refusal = _engine_core_refusal()
    assert (refusal.new_token_ids, str(refusal.finish_reason)) == ([], "abort")
    vllm = _vllm_completion([_request_output(refusal.new_token_ids, str(refusal.finish_reason))], stream)
    body = {"model": MODEL, "prompt": [1, 2, 3], "max_tokens": 16}
    if stream:
        stub: list[Any] = []
        stream_into(lambda _, e: stub.append(e), draining.url, "/v1/completions",
                    {**body, "stream_options": {"include_usage": True}}, timeout=EXIT_WAIT)
    else:
        stub = [httpx.post(draining.url + "/v1/completions", json=body, timeout=EXIT_WAIT).json()]
    assert shape(stub) == shape(vllm), f"vLLM 0.31.0 answers {vllm}; the stub {stub}"
    if not stream:
        assert (stub[0]["choices"][0]["text"], stub[0]["usage"]["completion_tokens"]) == ("", 0)


def test_a_stop_shuts_the_renderer_before_it_stops_the_engine_core() -> None:
    """vLLM's own AsyncLLM.shutdown, run on a stand-in that records what it shuts and in which order."""
    from vllm.v1.engine.async_llm import AsyncLLM

    order: list[str] = []
    core = SimpleNamespace(shutdown=lambda timeout: order.append(f"engine core {timeout}"))
    engine = SimpleNamespace(renderer=SimpleNamespace(shutdown=lambda: order.append("renderer")), engine_core=core,
                             output_handler=None)
    AsyncLLM.shutdown(engine, timeout=30)  # type: ignore[arg-type]
    assert order == ["renderer", "engine core 30"]


def test_a_text_request_while_the_engine_drains_fails_as_vllms_app_answers_it(
        draining: StubProcess, vllm_app: VllmServer) -> None:
    """With its renderer shut, tokenizing a text prompt runs vLLM's make_async on a shut executor; vLLM's app
    answers what that raises."""
    from concurrent.futures import ThreadPoolExecutor

    from vllm.utils.async_utils import make_async

    executor = ThreadPoolExecutor(max_workers=1)
    executor.shutdown(wait=False)
    tokenize = make_async(lambda prompt: prompt, executor=executor)

    async def tokenize_after_shutdown() -> Any:
        return await tokenize("x")

    with pytest.raises(RuntimeError) as raised:
        asyncio.run(tokenize_after_shutdown())
    vllm_app.completions.error = raised.value
    try:
        vllm = httpx.post(vllm_app.url + "/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 5})
    finally:
        vllm_app.completions.error = None
    stub = httpx.post(draining.url + "/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 5},
                      timeout=EXIT_WAIT)
    assert (stub.status_code, stub.json()) == (vllm.status_code, vllm.json())


def test_a_stream_aborted_in_flight_ends_as_vllm_ends_it() -> None:
    """vLLM 0.31.0's default stop (--shutdown-timeout 0): the engine core aborts the request, whose last output has
    no new token; vLLM's stream generator makes of it the chunks the stub sends."""
    vllm = _vllm_completion([_request_output([5], None), _request_output([], "abort")], stream=True)
    stub_process = StubProcess({"STUB_DECODE_TOKENS_PER_S": "50"}, [], STUB_DIR, 0)
    try:
        stub_process.wait_ready(timeout=EXIT_WAIT)
        stub: list[Any] = []
        reader = threading.Thread(target=lambda: _stream(stub_process.url, 30_000, stub))
        reader.start()
        wait_until(lambda: any(isinstance(e, dict) and e.get("choices") for e in stub), what="a token")
        stub_process.signal(signal.SIGTERM)
        reader.join(EXIT_WAIT)
        assert stub_process.wait_exit(EXIT_WAIT) == 0
    finally:
        stub_process.kill()
    assert shape(stub)[-3:] == shape(vllm)[-3:] == [("choice", False, "abort"), ("usage", True), "[DONE]"]


@pytest.fixture(scope="module")
def vllm_app() -> Iterator[VllmServer]:
    with vllm_server(MODEL) as running:
        yield running


def test_the_sleep_routes_pause_modes_and_default_are_vllms(vllm_app: VllmServer) -> None:
    from stubengine.engine import PAUSE_MODES
    from vllm.v1.engine import PauseMode

    assert PAUSE_MODES == get_args(PauseMode)
    assert httpx.post(vllm_app.url + "/sleep?level=1").status_code == 200
    assert vllm_app.engine.calls[-1] == ("sleep", 1, "abort"), "vLLM's route: mode defaults to abort"
    asyncio.run(vllm_app.engine.wake_up())
    stub = StubProcess({"VLLM_SERVER_DEV_MODE": "1", "STUB_DECODE_TOKENS_PER_S": "50", "STUB_SLEEP_SECONDS": "0"},
                       ["--enable-sleep-mode"], STUB_DIR, 0)
    try:
        stub.wait_ready(timeout=EXIT_WAIT)
        events: list[Any] = []
        reader = threading.Thread(target=lambda: _stream(stub.url, 30_000, events))
        reader.start()
        wait_until(lambda: any(isinstance(e, dict) and e.get("choices") for e in events), what="a token")
        assert httpx.post(stub.url + "/sleep?level=1", timeout=EXIT_WAIT).status_code == 200
        reader.join(EXIT_WAIT)
    finally:
        stub.kill()
    assert shape(events)[-3:] == [("choice", False, "abort"), ("usage", True), "[DONE]"]


def test_an_unknown_pause_mode_fails_as_vllms_app_answers_the_engine_cores_failure(vllm_app: VllmServer) -> None:
    """The engine core's pause_scheduler refuses the mode inside its utility call; MPClient raises the failure as a
    plain Exception (core_client.py), which vLLM's own error handler answers."""
    from vllm.v1.engine import UtilityOutput
    from vllm.v1.engine.core import EngineCoreProc

    output = UtilityOutput(call_id=0)
    EngineCoreProc._invoke_utility_method(
        "sleep", lambda: EngineCoreProc.pause_scheduler(SimpleNamespace(), mode="drain"), output, lambda _: None)
    vllm_app.engine.sleep_error = Exception(output.failure_message)
    try:
        vllm = httpx.post(vllm_app.url + "/sleep?level=1&mode=drain")
    finally:
        vllm_app.engine.sleep_error = None
    stub = StubProcess({"VLLM_SERVER_DEV_MODE": "1"}, ["--enable-sleep-mode"], STUB_DIR, 0)
    try:
        stub.wait_ready(timeout=EXIT_WAIT)
        answer = httpx.post(stub.url + "/sleep?level=1&mode=drain", timeout=EXIT_WAIT)
    finally:
        stub.kill()
    assert (answer.status_code, answer.json()) == (vllm.status_code, vllm.json())


# -- the lines ----------------------------------------------------------------------------------------------------

def _step(file: str, fragment: str) -> oracle.LogCall:
    return oracle.find_call(f"vllm/{file}", fragment)


def _api_server_steps(killed: bool) -> list[oracle.LogCall]:
    """The API server's side of a stop, in the order its code runs it (launcher.serve_http's handle_shutdown calling
    MPClient.shutdown, which runs v1/utils.shutdown on the engine core process)."""
    steps = [_step("entrypoints/launchers/launcher.py", "shutdown triggered"),
             _step("entrypoints/launchers/launcher.py", "stopping engine client"),
             _step("v1/engine/core_client.py", "MPClient: start timeout"),
             _step("v1/engine/core_client.py", "stopping engine manager"),
             _step("v1/utils.py", "Process manager: send sigterm")]
    if killed:
        steps += [_step("v1/utils.py", "Process manager: force killing remaining processes"),
                  _step("v1/utils.py", "Process manager: force killing remaining process %s")]
    return steps + [_step("v1/engine/core_client.py", "engine manager stopped"),
                    _step("v1/engine/core_client.py", "cleaning up background resources"),
                    _step("v1/engine/core_client.py", "MPClient: complete"),
                    _step("entrypoints/launchers/launcher.py", "engine client stopped"),
                    _step("entrypoints/launchers/launcher.py", "signalling HTTP server shutdown"),
                    _step("entrypoints/launchers/launcher.py", "shutting down FastAPI HTTP server")]


def _engine_core_steps(mode: str, finished: bool) -> list[oracle.LogCall]:
    """The engine core's: its signal handler, then _handle_shutdown (and run_engine_core once its loop ends)."""
    steps = [_step("v1/engine/core.py", "trigger received signal"),
             _step("v1/engine/core.py", "EngineCore: start mode"),
             _step("v1/engine/core.py", "aborting in-flight requests" if mode == "abort" else "draining in-flight")]
    if finished:
        steps += [_step("v1/engine/core.py", "request processing complete"),
                  _step("v1/engine/core.py", "EngineCore: exiting busy loop")]
    return steps


STOPS = {
    # case: (stub args, its env, tokens per request, (mode, the engine core got through, it was killed))
    "drain that fits": (["--shutdown-timeout", "60"], {}, 40, ("drain", True, False)),
    "abort": ([], {}, 30_000, ("abort", True, True)),
    "drain past its deadline": (["--shutdown-timeout", "1"], {"STUB_DECODE_TOKENS_PER_S": "20"}, 30_000,
                                ("drain", False, True)),
}


@pytest.mark.parametrize("case", list(STOPS))
def test_the_stubs_stop_prints_vllms_lines_in_each_processs_order(case: str) -> None:
    args, env, tokens, (mode, finished, killed) = STOPS[case]
    stub = StubProcess({"STUB_DECODE_TOKENS_PER_S": "50", **env}, args, STUB_DIR, 0)
    try:
        stub.wait_ready(timeout=EXIT_WAIT)
        events: list[Any] = []
        reader = threading.Thread(target=lambda: _stream(stub.url, tokens, events), daemon=True)
        reader.start()
        wait_until(lambda: any(isinstance(e, dict) and e.get("choices") for e in events), what="a token")
        stub.signal(signal.SIGTERM)
        stub.wait_line(r"\[shutdown\] API server: shutting down FastAPI HTTP server$", timeout=EXIT_WAIT)
    finally:
        stub.kill()
    record = vllm_record()
    printed: dict[str, list[tuple[str, str, str]]] = {"APIServer": [], "EngineCore": []}
    for line in stub.lines:
        m = record.fullmatch(line)
        if m and m["message"].startswith("[shutdown] "):
            printed[m["process"]].append((m["file"].rsplit("/", 1)[-1], m["level"], m["message"]))
    expected = {"APIServer": _api_server_steps(killed), "EngineCore": _engine_core_steps(mode, finished)}
    for process, steps in expected.items():
        assert len(printed[process]) == len(steps), (process, printed[process], [s.template for s in steps])
        for (file, level, message), step in zip(printed[process], steps, strict=True):
            same = (file, level) == (step.file.rsplit("/", 1)[-1], step.level)
            assert same and re.fullmatch(step.pattern(), message), (
                f"{process} printed [{file}] {level} {message!r}; vLLM 0.31.0's next step is {step.where} "
                f"{step.level} {step.template!r}")
        for file, _, message in printed[process]:
            assert any(re.fullmatch(c.pattern(), message) for c in _calls_in(file)), message
