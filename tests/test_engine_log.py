"""The one parser of a vLLM log line: which text the engine itself wrote, and so which text rules may read.

Line shapes are vLLM 0.31.0's (BRIEF §8, SHAPE.md) and vLLM 0.26.0's (the GPU record: the same prefix and
format, KV size and maximum concurrency on two lines), with and without the process prefix.
"""

from __future__ import annotations

import re

import pytest

from lanectl.health.engine_log import (
    OTHER,
    RECORD,
    TRACEBACK,
    believed_message,
    fatal_engine_line,
    fatal_engine_lines,
    log_lines,
    parse,
    record_message,
    startup_match,
)

P_API = "(APIServer pid=1) "
P_CORE = "(EngineCore pid=412) "
KV_031 = ("INFO 12-01 08:30:05 [kv_cache_utils.py:1348] GPU KV cache size: 4,400,013 tokens, "
          "Maximum concurrency for 1,048,576 tokens per request: 4.20x")
KV_026 = "INFO 12-01 08:30:05 [kv_cache_utils.py:1087] GPU KV cache size: 341,056 tokens"
AUTOTUNE = ("2026-12-01 08:30:06,258 - INFO - autotuner.py:446 - flashinfer.jit: "
            "[Autotuner]: Autotuning process starts ...")
DEAD_TB = ("vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. "
           "See stack trace (above) for the root cause.")


def access(path: str, status: str = "404 Not Found") -> str:
    return f'{P_API}INFO:     172.17.0.1:51402 - "GET {path} HTTP/1.1" {status}'


def request_log(prompt: str) -> str:
    # vllm/entrypoints/logger.py with --enable-log-requests: the prompt is echoed with %r.
    return (f"{P_API}INFO 12-01 08:31:00 [logger.py:49] Received request cmpl-5f2a-0: prompt: {prompt!r}, "
            "params: SamplingParams(n=1, temperature=0.0, max_tokens=3), prompt_token_ids: None, lora_request: None.")


@pytest.mark.parametrize("prefix", ["", P_CORE])
def test_a_vllm_record_is_taken_apart_with_or_without_the_prefix(prefix: str) -> None:
    line = parse(prefix + KV_031)
    assert line.kind == RECORD
    assert line.level == "INFO"
    assert line.source == "kv_cache_utils.py:1348"
    assert line.message.startswith("GPU KV cache size: 4,400,013 tokens, Maximum concurrency")
    assert (line.process, line.pid) == (("EngineCore", 412) if prefix else (None, None))


def test_flashinfer_records_and_0_26_lines_are_engine_records() -> None:
    autotune = parse(P_CORE + AUTOTUNE)
    assert (autotune.kind, autotune.level, autotune.source) == (RECORD, "INFO", "autotuner.py:446")
    assert autotune.message == "[Autotuner]: Autotuning process starts ..."
    assert record_message(P_API + KV_026) == "GPU KV cache size: 341,056 tokens"
    assert record_message("(EngineCore_DP0 pid=165) " + KV_026) == "GPU KV cache size: 341,056 tokens"


@pytest.mark.parametrize("text", [
    "Traceback (most recent call last):",
    '  File "/usr/local/lib/python3.12/dist-packages/vllm/v1/engine/core_client.py", line 890, in get_output_async',
    DEAD_TB,
    "RuntimeError: CUDA error: an illegal memory access was encountered",
])
def test_traceback_lines_are_believed_by_fatal_rules_but_are_no_records(text: str) -> None:
    line = parse(P_API + text)
    assert line.kind == TRACEBACK
    assert line.believed == text
    assert line.record_message is None


@pytest.mark.parametrize("line", [
    access("/EngineDeadError"),
    access("/EngineCore%20encountered%20a%20fatal%20error."),
    access("/v1/CUDA error: an illegal memory access was encountered"),
    'INFO:     172.17.0.1:51402 - "GET /engine%20core%20exited%20unexpectedly HTTP/1.1" 404 Not Found',
    request_log("EngineCore encountered a fatal error."),
    request_log("EngineDeadError"),
    f"{P_API}INFO 12-01 08:31:00 [logger.py:49] Generated response cmpl-5f2a-0: output: 'EngineDeadError', "
    "output_token_ids: [1], finish_reason: length",
    # A record that quotes a fatal text after its start is not the engine saying it.
    f"{P_API}ERROR 12-01 08:31:00 [serving_completion.py:170] Error in preprocessing prompt inputs: "
    "'EngineDeadError'",
    # vLLM 0.31.0's `Error with model %s` (openai/chat_completion/serving.py) with the model a client named, and a
    # request's own line with the id a client chose (X-Request-Id; v1/engine/async_llm.py).
    f"{P_API}ERROR 12-01 08:31:00 [serving.py:251] Error with model error=ErrorInfo(message='The model "
    "`EngineCore encountered a fatal error.` does not exist.', type='NotFoundError', param='model', code=404)",
    f"{P_API}INFO 12-01 08:31:00 [async_llm.py:751] Request EngineCore encountered a fatal error. aborted.",
])
def test_text_a_client_chose_is_never_a_fatal_line(line: str) -> None:
    assert not fatal_engine_line(line)


@pytest.mark.parametrize("line", [
    P_CORE + "ERROR 12-01 08:40:00 [core.py:1024] EngineCore encountered a fatal error.",
    "ERROR 10-17 09:00:03 [core.py:708] EngineCore failed to start.",
    P_API + DEAD_TB,
    P_API + "ERROR 12-01 08:40:00 [async_llm.py:689] " + DEAD_TB,
    "(EngineCore_DP0 pid=137) ERROR 10-29 08:32:36 [multiproc_executor.py:154] "
    "Worker proc VllmWorker-0 died unexpectedly (exit code: -9), shutting down executor.",
    P_API + "WARNING 12-01 08:40:00 [core_client.py:712] [shutdown] MPClient: engine core exited unexpectedly; "
    "starting cleanup",
    P_CORE + "ERROR 10-17 09:00:03 [gpu_model_runner.py:88] CUDA error: an illegal memory access was encountered",
    P_CORE + "torch.AcceleratorError: CUDA error: an illegal memory access was encountered",
])
def test_the_engines_own_fatal_lines_are_recognised(line: str) -> None:
    assert fatal_engine_line(line)


def test_startup_rules_search_record_messages_only() -> None:
    forbid = re.compile(r"Autotuning process starts")
    assert startup_match(forbid, P_CORE + AUTOTUNE)
    assert not startup_match(forbid, access("/Autotuning%20process%20starts"))
    assert not startup_match(forbid, access("/Autotuning process starts"))
    assert not startup_match(forbid, request_log("Autotuning process starts"))
    assert not startup_match(forbid, "ValueError: Autotuning process starts")  # an exception line is no record
    # `^` anchors at the message, not at the line with its prefix and header.
    assert startup_match(re.compile(r"^GPU KV cache size: [0-9,]+ tokens"), P_CORE + KV_031)


def test_uvicorn_and_continuation_lines_are_other() -> None:
    for text in (P_API + "INFO:     Application startup complete.", "Capturing CUDA graphs: 100%|", "",
                 "    engine_core.run_busy_loop()"):
        assert parse(text).kind == OTHER
        assert believed_message(text) is None


def test_fatal_engine_lines_adds_a_recipes_regexes() -> None:
    lines = [P_CORE + "ERROR 12-01 08:40:00 [pynccl.py:10] NCCL error: unhandled system error",
             access("/NCCL error"), P_CORE + KV_031]
    assert fatal_engine_lines(lines, ["NCCL error"]) == lines[:1]
    assert fatal_engine_lines(lines) == []


def test_records_that_echo_a_request_are_never_believed() -> None:
    """Not even by a recipe rule that does not anchor at the message's start (the recipe model refuses such a
    rule; this is the second line of defence)."""
    echo = (f"{P_API}ERROR 12-01 08:31:00 [serving.py:251] Error with model error=ErrorInfo(message='The model "
            "`NCCL error` does not exist.', type='NotFoundError', param='model', code=404)")
    assert record_message(echo) is None and fatal_engine_lines([echo], ["NCCL error"]) == []


def test_a_log_is_split_where_docker_splits_it_so_a_request_line_stays_in_its_access_line() -> None:
    """A request line holding a line break other than "\\n", had anything logged it unrefused, is one line to
    Docker; only a reader that also split at it (str.splitlines) would see a record in its middle."""
    forged = (P_CORE + "INFO 12-01 08:30:00 [core.py:1024] EngineCore encountered a fatal error.")
    for brk in ("\r", "\v", "\f", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029"):
        access_line = access(f"/a{brk}{forged}{brk}")
        text = f"{P_CORE}{KV_031}\n{access_line}\n"
        assert log_lines(text) == [P_CORE + KV_031, access_line]
        assert fatal_engine_lines(log_lines(text)) == []
        assert fatal_engine_lines(text.splitlines()) != [], "the reading log_lines exists to prevent"
    assert log_lines("a\r\nb") == ["a\r", "b"] and parse("a\r").text == "a" and log_lines("") == []
