"""Streaming completions in flight, as clients of a lane see them: how each ended (finish_reason, a final chunk or
none, an error), for the tests that stop, sleep or switch a lane under them."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field

import httpx


@dataclass
class Stream:
    tokens: int = 0
    finish_reason: str | None = None
    done: bool = False  # [DONE] arrived
    error: str | None = None


@dataclass
class Streams:
    url: str
    model: str
    count: int = 8
    max_tokens: int = 300
    streams: list[Stream] = field(default_factory=list)
    threads: list[threading.Thread] = field(default_factory=list)

    def start(self) -> Streams:
        for _ in range(self.count):
            stream = Stream()
            self.streams.append(stream)
            self.threads.append(threading.Thread(target=self._run, args=(stream,), daemon=True))
        for thread in self.threads:
            thread.start()
        return self

    def _run(self, stream: Stream) -> None:
        body = {"model": self.model, "prompt": "Write a long story about the sea.", "max_tokens": self.max_tokens,
                "stream": True, "ignore_eos": True, "stream_options": {"include_usage": True}}
        try:
            # A stream that stalls (no chunk for 20 s) is a client left hanging: that is an outcome too.
            with httpx.stream("POST", self.url + "/v1/completions", json=body,
                              timeout=httpx.Timeout(10.0, read=20.0)) as response:
                for line in response.iter_lines():
                    if line == "data: [DONE]":
                        stream.done = True
                    elif line.startswith("data: {"):
                        event = json.loads(line[len("data: "):])
                        for choice in event.get("choices") or []:
                            stream.finish_reason = choice.get("finish_reason") or stream.finish_reason
                        if event.get("usage"):
                            stream.tokens = event["usage"].get("completion_tokens", stream.tokens)
        except httpx.HTTPError as exc:
            stream.error = f"{type(exc).__name__}: {exc}"

    def running(self, at_least: int | None = None, timeout: float = 30) -> None:
        """Wait until the engine says the streams run (vLLM's /metrics), so a stop or sleep finds them in flight."""
        wanted = self.count if at_least is None else at_least
        deadline = time.monotonic() + timeout
        while True:
            text = httpx.get(self.url + "/metrics", timeout=5).text
            running = sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                          if line.startswith("vllm:num_requests_running"))
            if running >= wanted:
                return
            assert time.monotonic() < deadline, f"only {running:g} of {wanted} streams started"
            time.sleep(0.05)

    def ends(self, timeout: float = 90) -> list[str | None]:
        """How each stream ended once all have: its finish_reason ("length": whole; "abort": cut), else None."""
        for thread in self.threads:
            thread.join(timeout)
        return [stream.finish_reason for stream in self.streams]
