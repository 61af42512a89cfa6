"""The stub's log as vLLM 0.31.0 writes it (SHAPE.md): the process prefix on vLLM's own records (every line of a
record, tracebacks included), vLLM's and flashinfer's record formats, the real message texts, and the 0.26.0
differences the GPU record shows (two KV lines; every line a process writes prefixed).

Every line is also read through lanectl's own parser (lanectl.health.engine_log), so what the stub prints and
what lanectl's rules believe cannot drift apart without a red test here.
"""

from __future__ import annotations

import signal
import socket

import httpx
import pytest
from stubengine import logs

from lanectl.health.engine_log import OTHER, RECORD, TRACEBACK, fatal_engine_lines, log_lines, parse

from .stubproc import PROCESS_PREFIX

ONE_KV_LINE = "GPU KV cache size: 4,400,013 tokens, Maximum concurrency for 32,768 tokens per request: 134.28x"


def _records(lines: list[str]) -> list[tuple[str | None, str | None, str]]:
    """(process, file, message) of each engine record."""
    parsed = [parse(line) for line in lines]
    return [(p.process, p.source.split(":")[0] if p.source else None, p.message) for p in parsed if p.kind == RECORD]


def test_vllms_records_carry_their_process_prefix_and_every_line_parses_as_lanectl_reads_it(spawn) -> None:
    p = spawn(env={"STUB_ADMIN": "1"})
    assert httpx.get(p.url + "/EngineDeadError").status_code == 404
    assert httpx.post(p.url + "/admin/fault", json={"fault": "crash"}).status_code == 200
    assert p.wait_exit(5) == 0
    lines = list(p.lines)
    parsed = [parse(line) for line in lines]

    # vLLM's own records, every line of a multi-line one included, carry the prefix; in 0.31.0 uvicorn's lines
    # (the access log too) and flashinfer's do not.
    vllm_records = [line for line, p in zip(lines, parsed, strict=True)
                    if p.kind == RECORD and "flashinfer" not in line]
    assert vllm_records and all(PROCESS_PREFIX.match(line) for line in vllm_records)
    uvicorn = [line for line in lines if line.startswith("INFO:     ")]
    assert uvicorn and all(parse(line).kind == OTHER for line in uvicorn)
    assert any("GET /EngineDeadError HTTP/1.1" in line for line in uvicorn)
    assert not any(PROCESS_PREFIX.match(line) for line in lines if "flashinfer.jit" in line or line in uvicorn)
    # A traceback is part of its record: the record's header, then the traceback's line as the message.
    assert any(p.kind == RECORD and p.message == "Traceback (most recent call last):" for p in parsed)
    assert not any(p.kind == TRACEBACK for p in parsed)
    records = _records(lines)
    assert ("EngineCore", "kv_cache_utils.py", ONE_KV_LINE) in records
    assert (None, "autotuner.py", "[Autotuner]: Autotuning process ends") in records
    assert ("EngineCore", "core.py", "EngineCore encountered a fatal error.") in records
    assert ("APIServer", "core_client.py",
            "[shutdown] MPClient: engine core exited unexpectedly; starting cleanup") in records
    # The two processes have different pids, as vLLM's API server and engine core do.
    assert len({p.pid for p in parsed if p.pid is not None}) == 2


def test_each_message_is_printed_from_the_module_vllm_prints_it_from(spawn) -> None:
    p = spawn(args=["--cpu-offload-gb", "60", "--engram-config", '{"cpu_offload": true}'])
    p.signal(signal.SIGTERM)
    p.wait_exit(5)
    by_text = {message: (process, file) for process, file, message in _records(list(p.lines))}

    assert by_text["Total CPU offloaded parameters: 60.0"] == ("EngineCore", "uva.py")
    engram = next(m for m in by_text if m.startswith("Engram table offloaded to pinned host memory: "))
    assert engram == "Engram table offloaded to pinned host memory: 48002473 rows x 256, 11.80 GiB per rank"
    assert by_text[ONE_KV_LINE] == ("EngineCore", "kv_cache_utils.py")
    for fmt, site in logs.SITES.items():
        head = fmt.split("%", 1)[0].split("\n", 1)[0]
        for message, (process, file) in by_text.items():
            if head and message.startswith(head):
                # flashinfer's lines name no process in 0.31.0: their file says where they come from.
                assert (process or site.process, file) == (site.process, site.file), message


def test_no_offload_line_without_the_flags_that_ask_for_it(spawn) -> None:
    p = spawn(args=["--engram-config", '{"cpu_offload": false}'])
    out = p.output
    assert "Total CPU offloaded parameters" not in out
    assert "Engram table offloaded" not in out
    assert "Offloaded" not in out  # the stub's old, invented line


def test_vllm_0_26_0_prints_kv_size_and_concurrency_on_two_lines_and_prefixes_every_line(spawn) -> None:
    p = spawn(env={"STUB_VLLM_VERSION": "0.26.0"})
    messages = [message for _, _, message in _records(list(p.lines))]
    # 0.26.0 wrapped each process's stdout: uvicorn's and flashinfer's lines have the prefix too.
    unprefixed = [line for line in p.lines if not PROCESS_PREFIX.match(line)]
    assert not unprefixed, unprefixed

    assert "GPU KV cache size: 4,400,013 tokens" in messages
    assert "Maximum concurrency for 32,768 tokens per request: 134.28x" in messages
    assert ONE_KV_LINE not in messages
    # Nothing else differs.
    assert "[Autotuner]: Autotuning process ends" in messages


def test_an_unknown_vllm_version_is_refused(spawn) -> None:
    p = spawn(env={"STUB_VLLM_VERSION": "0.30.0"}, ready=False)
    assert p.wait_exit(5) == 2
    assert "STUB_VLLM_VERSION='0.30.0': expected one of 0.31.0, 0.26.0" in p.output


# Bytes str.splitlines() breaks a line at, besides "\n": a request line holding one, logged as it came, would be
# two lines to a reader that splits so, the second a forged record.
LINE_BREAKS = [b"\r", b"\x0b", b"\x0c", b"\x1c", b"\x1d", b"\x1e", b"\x85", "\x85".encode(), "\u2028".encode()]
FORGED = b"INFO 12-01 08:30:00 [core.py:1024] EngineCore encountered a fatal error."


def _raw_request(port: int, request_line: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(request_line + b"\r\nHost: x\r\nConnection: close\r\n\r\n")
        answer = b""
        while chunk := s.recv(65536):
            answer += chunk
    return answer


@pytest.mark.parametrize("brk", LINE_BREAKS, ids=lambda b: repr(b))
def test_a_request_line_uvicorn_would_refuse_is_refused_and_never_reaches_the_log(spawn, brk: bytes) -> None:
    """uvicorn's parsers (httptools and h11) take visible ASCII only in a request target: anything else is a 400
    "Invalid HTTP request received." and no access line, so no client writes a line break into the log."""
    p = spawn()
    answer = _raw_request(p.port, b"GET /a" + brk + FORGED + brk + b" HTTP/1.1")
    assert answer.startswith(b"HTTP/1.1 400 Bad Request\r\n")
    assert answer.endswith(b"\r\n\r\nInvalid HTTP request received.")
    p.wait_line(r"^WARNING:  Invalid HTTP request received\.$")
    assert httpx.get(p.url + "/health").status_code == 200  # the marker: every line before it has arrived
    p.wait_line(r'"GET /health HTTP/1\.1" 200 OK$')
    assert not any("EngineCore encountered a fatal error" in line for line in p.lines)
    log = "\n".join(p.lines) + "\n"
    assert fatal_engine_lines(log_lines(log)) == [] and fatal_engine_lines(log.splitlines()) == []


def test_the_access_line_is_uvicorns_with_a_quote_in_the_target_written_percent_22(spawn) -> None:
    p = spawn()
    assert _raw_request(p.port, b'GET /x"y%20z?q="1" HTTP/1.1').startswith(b"HTTP/1.1 404 Not Found")
    line = p.wait_line(r'"GET /x.*" 404 Not Found$').string
    assert line.endswith(' - "GET /x%22y%20z?q=%221%22 HTTP/1.1" 404 Not Found') and parse(line).kind == OTHER
