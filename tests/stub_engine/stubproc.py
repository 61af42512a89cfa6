"""The stub engine as a real process, the way a lane container runs it."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
STUB_DIR = REPO / "images" / "stub-engine"
PATCH = REPO / "patches" / "stub-engine" / "0001-rejection-sampler-guard.patch"
KERNEL_SRC = REPO / "kernels" / "src" / "stub-splitkv"
MODEL_NAME = "stub-test"

# In-process unit tests import the package straight from the image source tree.
if str(STUB_DIR) not in sys.path:
    sys.path.insert(0, str(STUB_DIR))

READY = re.compile(r"Uvicorn running on http://([\d.]+):(\d+) ")
# vLLM's stdout prefixing: every line a process writes starts with it (test_stub_log.py holds the stub to that).
PROCESS_PREFIX = re.compile(r"^\((?:APIServer|EngineCore) pid=\d+\) ")


def unprefixed(line: str) -> str:
    return PROCESS_PREFIX.sub("", line, count=1)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class StubProcess:
    """One stub engine process; stdout is collected line by line on a reader thread."""

    def __init__(self, env: Mapping[str, str], args: Sequence[str], pythonpath: Path, port: int) -> None:
        full_env = {k: v for k, v in os.environ.items() if not k.startswith(("STUB_", "VLLM_"))}
        full_env.update(
            {
                "PYTHONPATH": str(pythonpath),
                "PYTHONDONTWRITEBYTECODE": "1",
                "STUB_LOAD_SECONDS": "0.2",
                "STUB_DECODE_TOKENS_PER_S": "500",
            }
        )
        full_env.update(env)
        # -S: no site-packages, so anything beyond the stdlib fails here as it would in the image.
        cmd = [
            sys.executable,
            "-S",
            "-m",
            "stubengine",
            "serve",
            "/model",
            "--served-model-name",
            MODEL_NAME,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            *args,
        ]
        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            cmd, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1
        )
        self.lines: list[str] = []
        self._cond = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.port = port
        self.url = ""

    def _read(self) -> None:
        assert self.proc.stdout is not None
        try:
            for line in self.proc.stdout:
                with self._cond:
                    self.lines.append(line.rstrip("\n"))
                    self._cond.notify_all()
        except ValueError:
            pass  # kill() closed the pipe while a process the stub started still held its other end
        with self._cond:
            self._cond.notify_all()

    @property
    def output(self) -> str:
        with self._cond:
            return "\n".join(self.lines)

    def wait_line(self, pattern: str, timeout: float = 10.0, *, prefixed: bool = False) -> re.Match[str]:
        """The first line matching `pattern`, searched after the process prefix (in the whole line with
        `prefixed`), so `^INFO` means a record's start."""
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout
        seen = 0
        with self._cond:
            while True:
                for line in self.lines[seen:]:
                    m = regex.search(line if prefixed else unprefixed(line))
                    if m:
                        return m
                seen = len(self.lines)
                left = deadline - time.monotonic()
                if left <= 0 or (self.proc.poll() is not None and not self._reader.is_alive()):
                    raise AssertionError(f"no line matching {pattern!r}; output:\n" + "\n".join(self.lines))
                self._cond.wait(min(left, 0.1))

    def wait_ready(self, timeout: float = 10.0) -> str:
        m = self.wait_line(READY.pattern, timeout)
        self.port = int(m.group(2))
        self.url = f"http://127.0.0.1:{self.port}"
        return self.url

    def wait_exit(self, timeout: float) -> int:
        rc = self.proc.wait(timeout=timeout)
        self._reader.join(timeout=2)
        return rc

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        try:
            self.proc.wait(timeout=5)
        finally:
            if self.proc.stdout is not None:
                self.proc.stdout.close()


def wait_until(condition: Callable[[], bool], timeout: float = 30.0, what: str = "the condition") -> None:
    """Poll until `condition()` holds; a generous timeout, so only a stub that never gets there fails."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {timeout} s")
        time.sleep(0.02)


def stream_events(url: str, path: str, body: dict, timeout: float = 30.0) -> list[tuple[float, object]]:
    """POST a streaming request; return (arrival time, parsed data) per SSE event, "[DONE]" kept as str."""
    events: list[tuple[float, object]] = []
    stream_into(lambda at, event: events.append((at, event)), url, path, body, timeout)
    return events


def stream_into(on_event: Callable[[float, object], None], url: str, path: str, body: dict,
                timeout: float = 30.0) -> None:
    """As stream_events, handing each event to `on_event` as it arrives (for a test that acts mid-stream)."""
    import httpx

    with httpx.stream("POST", url + path, json={**body, "stream": True}, timeout=timeout) as resp:
        assert resp.status_code == 200, resp.read()
        assert resp.headers["content-type"].startswith("text/event-stream")
        for line in resp.iter_lines():
            if not line:
                continue
            assert line.startswith("data: "), line
            payload = line[len("data: ") :]
            on_event(time.monotonic(), payload if payload == "[DONE]" else json.loads(payload))


def metric(text: str, name: str, **labels: str) -> float:
    """The value of one sample in Prometheus text; every label given must match."""
    for line in text.splitlines():
        if not line.startswith(name + "{"):
            continue
        head, value = line.rsplit(" ", 1)
        if all(f'{k}="{v}"' in head for k, v in labels.items()):
            return float(value)
    raise AssertionError(f"no sample {name} {labels} in:\n{text}")


@contextmanager
def stub_spawner(defaults: Mapping[str, str], args: Sequence[str] = ()) -> Iterator[Callable[..., StubProcess]]:
    """spawn(env=None) -> a ready stub with `defaults` under `env`, started with `args`; all killed on exit.
    For test modules outside tests/stub_engine that need only these two knobs."""
    procs: list[StubProcess] = []

    def spawn(env: Mapping[str, str] | None = None) -> StubProcess:
        p = StubProcess({**defaults, **(env or {})}, args, STUB_DIR, 0)
        procs.append(p)
        p.wait_ready()
        return p

    try:
        yield spawn
    finally:
        for p in procs:
            p.kill()
