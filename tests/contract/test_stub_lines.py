"""the stub's own lines: the stub engine prints, for vLLM 0.31.0, the texts 0.31.0's format strings produce, in
0.31.0's record format, from the files 0.31.0 prints them from, in the order a healthy start prints them.

Regexes come from vLLM's and flashinfer's installed code (vllm/logger.py's format, flashinfer's handler format,
each logger call's format string), never from the stub or this file.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
import vllm_oracle as oracle

from tests.stub_engine.stubproc import STUB_DIR, StubProcess

# The stub as h1-REF's primary starts: UVA expert offload, the Engram table offloaded, a long context.
STUB_ARGS = ["--offload-backend", "uva", "--cpu-offload-gb", "60", "--cpu-offload-params", "routed_experts.w13_weight",
             "--engram-config", '{"cpu_offload": true}', "--max-model-len", "1048576", "--speculative-config",
             '{"method":"dspark","num_speculative_tokens":5}', "--enable-sleep-mode"]


def _record_regex(fmt: str, datefmt: str) -> re.Pattern[str]:
    """A logging format string (`%(levelname)s %(asctime)s ...`) as the regex of the lines it prints."""
    date = re.escape(datefmt)
    for code, digits in (("%Y", r"\d{4}"), ("%m", r"\d\d"), ("%d", r"\d\d"), ("%H", r"\d\d"), ("%M", r"\d\d"),
                         ("%S", r"\d\d")):
        date = date.replace(re.escape(code), digits).replace(code, digits)
    fields = {"vllm_process_name": r"(?P<process>[A-Za-z][\w-]*)", "process": r"\d+",
              "levelname": r"(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL)", "asctime": date,
              "fileinfo": r"(?P<file>[\w./-]+\.py)", "filename": r"(?P<file>[\w.-]+\.py)", "lineno": r"\d+",
              "message": r"(?P<message>.*)"}
    out, last = [], 0
    for m in re.finditer(r"%\((\w+)\)[sd]", fmt):
        out.append(re.escape(fmt[last:m.start()]))
        out.append(fields[m.group(1)])
        last = m.end()
    out.append(re.escape(fmt[last:]))
    return re.compile("".join(out))


def vllm_record() -> re.Pattern[str]:
    from vllm import logger as vllm_logger

    return _record_regex(vllm_logger._FORMAT, vllm_logger._DATE_FORMAT)


def flashinfer_record() -> re.Pattern[str]:
    from flashinfer.jit.core import logger as fi_logger

    formatter = fi_logger.handlers[0].formatter
    assert formatter is not None and formatter._fmt is not None
    # logging's default asctime: "%Y-%m-%d %H:%M:%S" then ",%03d" milliseconds.
    return _record_regex(formatter._fmt.replace("%(asctime)s", "%(asctime)s,%(msecs)03d"), "%Y-%m-%d %H:%M:%S")


# A line that claims to be a vLLM record, with or without the process prefix 0.31.0 prints.
LOOKS_LIKE_RECORD = re.compile(r"(?:^|\) )(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d \[")
LOOKS_LIKE_FLASHINFER = re.compile(r" - flashinfer[\w.]*: ")


@pytest.fixture(scope="module")
def stub_lines() -> Iterator[list[str]]:
    process = StubProcess({"STUB_LOAD_SECONDS": "0.2", "VLLM_SERVER_DEV_MODE": "1"}, STUB_ARGS, STUB_DIR, 0)
    try:
        process.wait_ready(timeout=60)
        yield list(process.lines)
    finally:
        process.kill()


def _fix_msecs(pattern: re.Pattern[str]) -> re.Pattern[str]:
    return re.compile(pattern.pattern.replace(r"%\(msecs\)03d", r"\d{3}").replace("%(msecs)03d", r"\d{3}"))


def test_every_record_the_stub_prints_has_vllms_record_format(stub_lines: list[str]) -> None:
    record = vllm_record()
    wrong = [line for line in stub_lines if LOOKS_LIKE_RECORD.search(line) and not record.fullmatch(line)]
    assert not wrong, (f"these stub lines are not in vLLM 0.31.0's record format {record.pattern!r} "
                       "(vllm/logger.py _FORMAT):\n" + "\n".join(wrong))


def test_every_flashinfer_line_the_stub_prints_has_flashinfers_format(stub_lines: list[str]) -> None:
    record = _fix_msecs(flashinfer_record())
    lines = [line for line in stub_lines if LOOKS_LIKE_FLASHINFER.search(line)]
    wrong = [line for line in lines if not record.fullmatch(line)]
    assert lines and not wrong, f"not in flashinfer's format {record.pattern!r}:\n" + "\n".join(wrong or stub_lines)


def _calls_in(basename: str) -> list[oracle.LogCall]:
    return [c for package in ("vllm", "flashinfer") for c in oracle.log_calls(package)
            if c.file.rsplit("/", 1)[-1] == basename]


def test_every_record_from_a_vllm_file_says_what_that_file_can_print(stub_lines: list[str]) -> None:
    """A stub record naming `[kv_cache_utils.py:NNN]` must be a message some logger call there formats."""
    record = vllm_record()
    wrong = []
    for line in stub_lines:
        m = record.fullmatch(line)
        if not m or not _calls_in(m["file"].rsplit("/", 1)[-1]):
            continue  # not a record, or a file that is the stub's own (the format test above covers the shape)
        calls = _calls_in(m["file"].rsplit("/", 1)[-1])
        if not any(re.fullmatch(c.pattern(), m["message"]) for c in calls):
            wrong.append(f"{line}\n    no logger call of {m['file']} in vLLM 0.31.0 prints this; its calls: "
                         f"{[c.template for c in calls][:8]}")
    assert not wrong, "\n".join(wrong)


def _start_steps() -> list[tuple[str, list[oracle.LogCall]]]:
    """What a healthy start with STUB_ARGS prints, in order, as the logger calls that print it."""
    init = [c for c in oracle.log_calls("vllm") if c.file == "vllm/v1/engine/core.py"
            and c.template.startswith("init engine (profile, create kv cache, warmup model) took")]
    return [
        ("load", [oracle.find_call("vllm/v1/worker/gpu_model_runner.py", "Starting to load model")]),
        ("weights", [oracle.find_call("vllm/model_executor/model_loader/default_loader.py", "Loading weights took")]),
        ("UVA offload", [oracle.find_call("vllm/model_executor/offloader/uva.py", "Total CPU offloaded")]),
        ("Engram offload", [oracle.find_call("vllm/models/deepseek_v41/nvidia/engram.py", "Engram table offloaded")]),
        ("model memory", [oracle.find_call("vllm/v1/worker/gpu_model_runner.py", "Model loading took")]),
        ("KV cache", [oracle.find_call("vllm/v1/core/kv_cache_utils.py", "KV cache size")]),
        ("autotune cache", [oracle.find_call("flashinfer/autotuner/autotuner.py", "configs from")]),
        ("autotune starts", [oracle.find_call("flashinfer/autotuner/autotuner.py", "Autotuning process starts")]),
        ("autotune ends", [oracle.find_call("flashinfer/autotuner/autotuner.py", "Autotuning process ends")]),
        ("init engine", init),
    ]


def _message(line: str) -> tuple[str, str] | None:
    for record in (vllm_record(), _fix_msecs(flashinfer_record())):
        m = record.fullmatch(line)
        if m:
            return m["file"].rsplit("/", 1)[-1], m["message"]
    return None


def test_a_healthy_stub_start_prints_vllms_start_in_vllms_order(stub_lines: list[str]) -> None:
    messages = [(i, parsed) for i, line in enumerate(stub_lines) if (parsed := _message(line))]
    at, missing = -1, []
    for step, calls in _start_steps():
        found = next((i for i, (file, message) in messages if i > at and any(
            file == c.file.rsplit("/", 1)[-1] and re.fullmatch(c.pattern(), message) for c in calls)), None)
        if found is None:
            missing.append(f"{step}: no line after the previous step from {calls[0].file.rsplit('/', 1)[-1]} "
                           f"matching {[c.template for c in calls]} ({calls[0].where})")
        else:
            at = found
    assert not missing, "\n".join(missing) + "\nthe stub printed:\n" + "\n".join(stub_lines)
