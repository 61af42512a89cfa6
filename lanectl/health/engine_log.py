"""What a line of a vLLM container's log is, and which of its text the engine itself wrote.

A vLLM container's stdout mixes three writers: vLLM's own loggers, Python tracebacks, and uvicorn,
whose access log carries the request line a client chose (`GET /EngineDeadError HTTP/1.1`). vLLM's
request log (`--enable-log-requests`) is a vLLM record, but its message echoes the prompt. A rule that
searched whole lines would let any client that reaches the port write a "fatal line" and have a
healthy lane restarted (issue 23). So every reader of engine logs (the health gate, the watchdog, the
benchmark gate) splits a log into lines here (`log_lines`: at "\n" only, as Docker frames them) and asks
this module for the *believed message* of each line, and applies rules to that only.

A record is what vLLM or uvicorn wrote as one line. uvicorn refuses a request line holding any byte but
visible ASCII (httptools and h11 alike: "Invalid HTTP request received."), so a request line can never
become several records, provided the reader splits where Docker does: str.splitlines() also breaks at
\r, \v, \f, \x1c-\x1e, \x85, \u2028 and \u2029, and would turn one access line into a forged record.
Records that echo what a request sent (`_REQUEST_ECHO`) all begin with vLLM's own words (the contract
suite reads that from vLLM 0.31.0's code), so a rule anchored at the message's start (`^`) cannot be set
off by a client; a recipe's unanchored `forbid`/`fatal_log_lines` rule is refused (recipe/model.py).

Shapes (vLLM 0.31.0, `vllm/logger.py`; the process prefix comes from vLLM's child-process stdout
prefixing and is optional, as older vLLM and the stub's own tooling may lack it):

    (EngineCore pid=412) INFO 12-01 08:30:01 [kv_cache_utils.py:1234] GPU KV cache size: ...
    (EngineCore pid=412) 2026-12-01 08:30:02,258 - INFO - autotuner.py:446 - flashinfer.jit: [Autotuner]: ...
    (APIServer pid=1) Traceback (most recent call last):
    (APIServer pid=1)   File "/usr/lib/python3.12/asyncio/runners.py", line 195, in run
    (APIServer pid=1) vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. ...
    (APIServer pid=1) INFO:     172.17.0.1:51402 - "GET /EngineDeadError HTTP/1.1" 404 Not Found   <- never believed
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from lanectl.records import frozen

RECORD = "record"  # a record of vLLM's own loggers
TRACEBACK = "traceback"  # a traceback header, frame or exception line
OTHER = "other"  # anything else: uvicorn (access log included), continuation lines, third-party output

# `(APIServer pid=1) `, `(EngineCore_DP0 pid=412) `, `(Worker_TP1 pid=77) `.
_PREFIX = re.compile(r"^\((?P<process>[A-Za-z][\w-]*) pid=(?P<pid>\d+)\) ")
# `%(levelname)s %(asctime)s [%(fileinfo)s:%(lineno)d] %(message)s`, date format `%m-%d %H:%M:%S`.
_RECORD = re.compile(
    r"^(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL) (?P<time>\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?) "
    r"\[(?P<source>[\w.-]+\.py:\d+)\] (?P<message>.*)$"
)
# flashinfer's own logger (its autotuner runs in the engine core):
# `%(asctime)s - %(levelname)s - %(filename)s:%(lineno)d - flashinfer.jit: %(message)s`.
_FLASHINFER_RECORD = re.compile(
    r"^(?P<time>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) - (?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL) - "
    r"(?P<source>[\w.-]+\.py:\d+) - flashinfer(?:\.\w+)*: (?P<message>.*)$"
)
_TRACEBACK_HEADER = re.compile(r"^Traceback \(most recent call last\):$")
_TRACEBACK_FRAME = re.compile(r'^  File "[^"]*", line \d+(?:, in .*)?$')
# `RuntimeError: ...`, `vllm.v1.engine.exceptions.EngineDeadError: ...`, `torch.AcceleratorError: ...`.
_EXCEPTION = re.compile(r"^(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception|Exit|Interrupt)(?:: .*)?$")
# Records whose message echoes what a request sent, in vLLM 0.31.0: the request log (the prompt, the
# output, the parameters; serve/utils/request_logger.py), a request's own lines with its id (which a
# client picks with X-Request-Id; v1/engine/async_llm.py), and `Error with model %s` (the model name a
# client asked for; openai/chat_completion/serving.py). Nothing in them is the engine's own word.
_REQUEST_ECHO = re.compile(r"^(?:Received request|Generated response|Added request|Request|Error with model) ")


@frozen
class EngineLine:
    """One physical log line, taken apart."""

    text: str
    kind: str  # RECORD | TRACEBACK | OTHER
    process: str | None = None
    pid: int | None = None
    level: str | None = None
    source: str | None = None  # "core.py:711"
    message: str = ""  # after the record header; a traceback line without the prefix; "" for OTHER

    @property
    def record_message(self) -> str | None:
        """The message of a record vLLM's own loggers wrote, unless it echoes a request; else None."""
        if self.kind == RECORD and not _REQUEST_ECHO.match(self.message):
            return self.message
        return None

    @property
    def believed(self) -> str | None:
        """What fatal-line rules read: a record's message (as `record_message`) or a traceback line. An
        exception line can end in text a request caused, so the built-in patterns are anchored at its start."""
        return self.message if self.kind == TRACEBACK else self.record_message


def log_lines(text: str) -> list[str]:
    """A container log's lines, split where Docker splits them: at "\n" (a trailing "\r" kept on its line)."""
    lines = text.split("\n")
    return lines[:-1] if lines and lines[-1] == "" else lines


def parse(line: str) -> EngineLine:
    text = line.rstrip("\r\n")
    rest = text
    process = pid = None
    prefix = _PREFIX.match(rest)
    if prefix is not None:
        process, pid = prefix["process"], int(prefix["pid"])
        rest = rest[prefix.end():]
    record = _RECORD.match(rest) or _FLASHINFER_RECORD.match(rest)
    if record is not None:
        return EngineLine(text, RECORD, process, pid, record["level"], record["source"], record["message"])
    if _TRACEBACK_HEADER.match(rest) or _TRACEBACK_FRAME.match(rest) or _EXCEPTION.match(rest):
        return EngineLine(text, TRACEBACK, process, pid, message=rest)
    return EngineLine(text, OTHER, process, pid)


def believed_message(line: str) -> str | None:
    return parse(line).believed


# vLLM's own texts for a dead engine (BRIEF §4, §8), anchored at the start of a believed message, so
# a record that merely quotes one (a request log's prompt, an error naming a path) never matches.
# An exception class may lead: `RuntimeError: CUDA error: ...`, `vllm....EngineDeadError: ...`.
_EXCEPTION_LEAD = r"(?:(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception): )?"
FATAL_ENGINE_LINES: tuple[re.Pattern[str], ...] = tuple(
    re.compile(pattern)
    for pattern in (
        r"^EngineCore encountered a fatal error\.",  # v1/engine/core.py
        r"^EngineCore failed to start\.",
        r"^(?:[A-Za-z_]\w*\.)*EngineDeadError\b",  # only ever the exception line of a traceback
        r"^Worker proc \S.* died unexpectedly",  # (exit code: N), shutting down executor.
        r"^(?:\[shutdown\] )?(?:MPClient: )?[Ee]ngine core exited unexpectedly",  # core_client.py
        r"^" + _EXCEPTION_LEAD + r"CUDA error: an illegal memory access was encountered",  # torch
    )
)


def fatal_engine_line(line: str, patterns: Sequence[re.Pattern[str]] = FATAL_ENGINE_LINES) -> bool:
    message = believed_message(line)
    return message is not None and any(pattern.search(message) for pattern in patterns)


def fatal_engine_lines(lines: Iterable[str], extra: Sequence[str] = ()) -> list[str]:
    """The lines among `lines` that say the engine is dead: the built-in texts, plus a recipe's `extra` regexes
    (searched in the believed message, like every rule)."""
    patterns = [*FATAL_ENGINE_LINES, *(re.compile(p) for p in extra)]
    return [line for line in lines if fatal_engine_line(line, patterns)]


def record_message(line: str) -> str | None:
    return parse(line).record_message


def startup_match(pattern: re.Pattern[str], line: str) -> bool:
    """A recipe's `startup_log` regex against one line: searched in the message of a vLLM record only, so
    `^` anchors at the message's start and no access or request-log line can satisfy or trip a rule."""
    message = record_message(line)
    return message is not None and pattern.search(message) is not None
