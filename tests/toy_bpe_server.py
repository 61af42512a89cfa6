"""A toy completions server whose tokenizer merges what its model generated apart.

The tokenizer is BPE-like: longest match over a small vocabulary, so two ":" written side by side read
back as one "::". The model is a fixed rule from the ids before a position to the next one: after
`class Stack:` its greedy continuation is ":" ":" " Multipart" "\n" " pass" ..., as the real tiny model's
was (issue 22), and that text joined and tokenized again starts "::" ":". It answers POST /v1/completions
in vLLM's shapes (text or token-id prompts, logprobs, prompt_logprobs keyed by id, return_token_ids),
on 127.0.0.1 only, so teacher forcing can be tested against a real HTTP server that tokenizes as a real
one does.
"""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

VOCAB = ("class", " Stack", ":", "::", " Multipart", "\n", " pass", " def")
COLON, DOUBLE_COLON, MULTIPART, NEWLINE, PASS = 2, 3, 4, 5, 6
TOP_P, RUNNER_UP_P = 0.9, 0.06
MODEL = "toy-bpe"


def tokenize(text: str) -> list[int]:
    """Longest match first, as merges do: "::" wins over ":" ":"."""
    ids, at = [], 0
    by_length = sorted(range(len(VOCAB)), key=lambda i: -len(VOCAB[i]))
    while at < len(text):
        match = next((i for i in by_length if text.startswith(VOCAB[i], at)), None)
        if match is None:
            raise ValueError(f"no token for {text[at:]!r}")
        ids.append(match)
        at += len(VOCAB[match])
    return ids


def detokenize(ids: list[int]) -> str:
    return "".join(VOCAB[i] for i in ids)


def next_token(before: list[int]) -> int:
    """The model's top token after `before`: up to three ":" in a row, then " Multipart", then lines of " pass"."""
    run = 0
    while run < len(before) and before[-1 - run] == COLON:
        run += 1
    if 0 < run < 3:
        return COLON
    if run == 3 or before[-1:] == [DOUBLE_COLON]:
        return MULTIPART
    return PASS if before[-1:] == [NEWLINE] else NEWLINE


@dataclass(frozen=True)
class Toy:
    returns_token_ids: bool = True  # False: an engine that ignores return_token_ids (vLLM before 0.10.2)
    flip_positions: frozenset[int] = field(default_factory=frozenset)  # absolute positions where the runner-up wins

    def ranked(self, before: list[int]) -> list[tuple[int, float]]:
        """Every token at the position after `before`, best first, with its probability."""
        top = next_token(before)
        order = [top, *(t for t in range((top + 1) % len(VOCAB), len(VOCAB)) if t != top),
                 *(t for t in range(0, (top + 1) % len(VOCAB)) if t != top)]
        if len(before) in self.flip_positions:
            order[0], order[1] = order[1], order[0]
        rest = (1.0 - TOP_P - RUNNER_UP_P) / (len(VOCAB) - 2)
        return [(t, TOP_P if r == 0 else RUNNER_UP_P if r == 1 else rest) for r, t in enumerate(order)]

    def complete(self, body: dict[str, Any]) -> dict[str, Any]:
        prompt = body.get("prompt")
        if isinstance(prompt, str):
            ids = tokenize(prompt)
        elif isinstance(prompt, list) and all(isinstance(t, int) and 0 <= t < len(VOCAB) for t in prompt):
            ids = list(prompt)
        else:
            raise ValueError(f"prompt must be text or token ids in [0, {len(VOCAB)}), got {prompt!r}")
        prompt_ids = list(ids)
        k = body.get("logprobs")
        generated: list[int] = []
        logprobs: dict[str, list[Any]] = {"text_offset": [], "token_logprobs": [], "tokens": [], "top_logprobs": []}
        for _ in range(int(body.get("max_tokens") or 16)):
            ranked = self.ranked(ids)
            chosen, p = ranked[0]
            logprobs["text_offset"].append(len(detokenize(generated)))
            logprobs["tokens"].append(VOCAB[chosen])
            logprobs["token_logprobs"].append(math.log(p))
            logprobs["top_logprobs"].append({VOCAB[t]: math.log(q) for t, q in ranked[: max(1, k or 0)]})
            generated.append(chosen)
            ids.append(chosen)
        choice: dict[str, Any] = {"index": 0, "text": detokenize(generated),
                                  "logprobs": logprobs if k is not None else None,
                                  "finish_reason": "length", "stop_reason": None}
        if body.get("prompt_logprobs") is not None:
            choice["prompt_logprobs"] = self.prompt_logprobs(prompt_ids, int(body["prompt_logprobs"]))
        if body.get("return_token_ids") and self.returns_token_ids:
            choice["prompt_token_ids"], choice["token_ids"] = prompt_ids, generated
        return {"id": "cmpl-toy", "object": "text_completion", "created": 0, "model": MODEL, "choices": [choice],
                "usage": {"prompt_tokens": len(prompt_ids), "completion_tokens": len(generated),
                          "total_tokens": len(prompt_ids) + len(generated)}}

    def prompt_logprobs(self, ids: list[int], k: int) -> list[dict[str, dict[str, Any]] | None]:
        """As vLLM: None for the first token, then the prompt's own token (its rank) and the top k, keyed by id."""
        out: list[dict[str, dict[str, Any]] | None] = [None]
        for position in range(1, len(ids)):
            ranked = self.ranked(ids[:position])
            own = ids[position]
            rank = next(r for r, (t, _) in enumerate(ranked, start=1) if t == own)
            entry = {str(own): {"logprob": math.log(ranked[rank - 1][1]), "rank": rank, "decoded_token": VOCAB[own]}}
            for r, (t, q) in enumerate(ranked[:k], start=1):
                entry.setdefault(str(t), {"logprob": math.log(q), "rank": r, "decoded_token": VOCAB[t]})
            out.append(entry)
        return out


class _Handler(BaseHTTPRequestHandler):
    server: _ToyHTTPServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server's signature
        pass

    def _send(self, status: int, obj: Any) -> None:
        body = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.path != "/v1/completions":
            self._send(404, {"detail": "Not Found"})
            return
        try:
            self._send(200, self.server.toy.complete(json.loads(raw)))
        except ValueError as exc:
            self._send(400, {"error": {"message": str(exc), "type": "BadRequestError", "param": "prompt",
                                       "code": 400}})


class _ToyHTTPServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, toy: Toy) -> None:
        self.toy = toy
        super().__init__(("127.0.0.1", 0), _Handler)


@contextmanager
def toy_server(toy: Toy | None = None) -> Iterator[str]:
    """The toy served on a free loopback port for the block; yields its base URL."""
    server = _ToyHTTPServer(toy or Toy())
    thread = threading.Thread(target=server.serve_forever, name="toy-bpe", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
