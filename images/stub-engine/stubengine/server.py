"""The HTTP API: vLLM's OpenAI-compatible routes on a thread-per-connection server.

Threads rather than asyncio because http.server gives correct HTTP/1.1 parsing and keep-alive for
free, and a handler thread that only blocks on its request's event queue costs nothing while it
waits; the timing that matters (one chunk per stream per step) lives in the engine thread.
"""

from __future__ import annotations

import json
import re
import socket
import threading
from email.utils import formatdate
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from . import __version__, answers, decoding, logs, protocol
from .config import Config
from .engine import Engine, EngineDeadError, EngineSleepingError, Request
from .faults import RUNTIME_FAULTS, FaultState
from .metrics import Metrics
from .sleep import Sleeper, SleepError

MAX_BODY = 64 * 1024 * 1024
# Mounted only with VLLM_SERVER_DEV_MODE=1, as vLLM does; the other method of each answers 405, as FastAPI does.
DEV_ROUTES = ("/sleep", "/wake_up", "/reset_prefix_cache", "/abort_requests")
DEV_GET_ROUTES = ("/is_sleeping",)
# FastAPI's reading of a bool query parameter.
TRUE_WORDS = ("1", "true", "on", "yes")
# What uvicorn's parsers take as a request line (httptools' llhttp, which vLLM's fastapi[standard] installs, and
# h11 alike; run byte by byte against uvicorn 0.55.0): METHOD SP TARGET SP HTTP/1.x with a target of visible ASCII
# only. Any other byte (\r, \v, \f, \x1c-\x1e, \x85, ...) makes the line "Invalid HTTP request received.": a 400
# and no access line, so a client cannot write a line break of any kind into the engine's log.
REQUEST_LINE = re.compile(rb"[!#$%&'*+.^_`|~0-9A-Za-z-]+ [\x21-\x7e]+ HTTP/1\.[01]\r?\n")
INVALID_REQUEST = "Invalid HTTP request received."
# What a request that needs vLLM's renderer gets once a stop began: AsyncLLM.shutdown shuts the renderer's thread
# pool before it stops the engine core (v1/engine/async_llm.py), and tokenizing on it raises this RuntimeError
# (concurrent/futures/thread.py), which vLLM's error handler answers 500 (the GPU record shows it too).
RENDERER_CLOSED = "cannot schedule new futures after shutdown"
_RENDERER_TRACEBACK = (
    "Traceback (most recent call last):\n"
    '  File "/usr/local/lib/python3.12/dist-packages/vllm/renderers/base.py", line 665, in '
    "_tokenize_singleton_prompt_async\n"
    "    prompt = await self._tokenize_prompt_async(prompt, params)\n"
    '  File "/usr/lib/python3.12/concurrent/futures/thread.py", line 170, in submit\n'
    "    raise RuntimeError('cannot schedule new futures after shutdown')\n"
    f"RuntimeError: {RENDERER_CLOSED}")


class RendererClosed(protocol.ApiError):
    """A request that needs the renderer after a stop began: 500, then uvicorn logs the exception, as it logs one
    that Starlette's error middleware re-raises once vLLM's handler answered."""

    def __init__(self) -> None:
        super().__init__(500, RENDERER_CLOSED, "InternalServerError")

    def log(self) -> None:
        logs.uvicorn.error("Exception in ASGI application")
        logs.raw(_RENDERER_TRACEBACK)


class StubHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    # A benchmark opens 32 connections at once; the default backlog of 5 makes the kernel drop SYNs
    # and the client retries a second later, which shows up as a bogus time to first token.
    request_queue_size = 256

    def __init__(self, cfg: Config, engine: Engine, metrics: Metrics, faults: FaultState, sleeper: Sleeper) -> None:
        self.cfg = cfg
        self.engine = engine
        self.metrics = metrics
        self.faults = faults
        self.sleeper = sleeper
        # Open connections, each True while it serves a request (uvicorn's server_state.connections): a shutdown
        # closes the idle ones and waits for the others, as uvicorn's does.
        self._connections: dict[Handler, bool] = {}
        self._changed = threading.Condition()
        self.closing = False
        self.renderer_closed = False
        super().__init__((cfg.host, cfg.port), Handler)

    def track(self, handler: Handler, busy: bool) -> None:
        with self._changed:
            self._connections[handler] = busy

    def untrack(self, handler: Handler) -> None:
        with self._changed:
            self._connections.pop(handler, None)
            self._changed.notify_all()

    def close_idle_connections(self) -> int:
        """Close every connection that waits for its next request; returns how many are still serving one."""
        self.closing = True
        with self._changed:
            for handler, busy in self._connections.items():
                if not busy:
                    _shut(handler.connection)
            return sum(self._connections.values())

    def wait_for_connections(self) -> None:
        with self._changed:
            while self._connections:
                self._changed.wait(0.5)

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that went away mid-answer; uvicorn logs nothing for it either


class Handler(BaseHTTPRequestHandler):
    server: StubHTTPServer
    protocol_version = "HTTP/1.1"
    # Tokens go out as one small write each; Nagle plus the client's delayed ACK would hold them ~40 ms.
    disable_nagle_algorithm = True

    # -- plumbing -------------------------------------------------------------------------------

    def version_string(self) -> str:
        return "uvicorn"

    def setup(self) -> None:
        super().setup()
        self.server.track(self, busy=False)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.server.untrack(self)

    def handle_one_request(self) -> None:
        super().handle_one_request()
        self.server.track(self, busy=False)
        if self.server.closing:
            self.close_connection = True  # uvicorn ends keep-alive once it shuts down

    def parse_request(self) -> bool:
        self.server.track(self, busy=True)
        if not REQUEST_LINE.fullmatch(self.raw_requestline):
            self._invalid_request()
            return False
        return super().parse_request()

    def _invalid_request(self) -> None:
        """uvicorn's answer to a request line its parser refuses (httptools_impl.send_400_response)."""
        logs.uvicorn.warning(INVALID_REQUEST)
        head = (f"HTTP/1.1 400 Bad Request\r\ndate: {formatdate(usegmt=True)}\r\nserver: uvicorn\r\n"
                f"content-type: text/plain; charset=utf-8\r\ncontent-length: {len(INVALID_REQUEST)}\r\n"
                "connection: close\r\n\r\n")
        self.close_connection = True
        self.wfile.write(head.encode() + INVALID_REQUEST.encode())

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        """uvicorn's access line: `ADDR - "METHOD TARGET HTTP/1.1" 200 OK`, a `"` in the target written %22."""
        if not hasattr(self, "path"):
            return  # no request line was read (one over http.server's 64 KiB): uvicorn's parser logs none either
        try:
            phrase = HTTPStatus(int(code)).phrase
        except ValueError:
            phrase = ""
        host, port = self.client_address[:2]
        target = self.path.replace('"', "%22")
        logs.uvicorn.info('%s:%s - "%s %s %s" %s %s', host, port, self.command, target, self.request_version, code,
                          phrase)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server's signature
        pass  # parse errors are answered with a status line; the access line is enough

    def _send(self, status: int, body: bytes, content_type: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, status: int, obj: Any) -> None:
        self._send(status, json.dumps(obj).encode())

    def _error(self, err: protocol.ApiError) -> None:
        self._json(err.status, err.body())

    def _body(self) -> Any:
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            raise protocol.ApiError(400, "bad Content-Length") from None
        if length > MAX_BODY:
            raise protocol.ApiError(413, "request body too large")
        raw = self.rfile.read(length) if length else b""
        try:
            return json.loads(raw or b"null")
        except ValueError as exc:
            raise protocol.ApiError(400, f"invalid JSON body: {exc}") from None

    # -- routes ---------------------------------------------------------------------------------

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/health":
            self._send(self.server.faults.health_status, b"")
        elif path == "/v1/models":
            self._json(200, self._models())
        elif path == "/metrics":
            self._send(200, self.server.metrics.render().encode(), "text/plain; version=0.0.4; charset=utf-8")
        elif path == "/version":
            self._json(200, {"version": __version__})
        elif path == "/is_sleeping" and self.server.cfg.dev_mode:
            self._json(200, {"is_sleeping": self.server.sleeper.asleep})
        elif path in DEV_ROUTES and self.server.cfg.dev_mode:
            self._method_not_allowed("POST")
        else:
            self._json(404, {"detail": "Not Found"})

    def do_POST(self) -> None:
        path = self.path.split("?", 1)[0]
        try:
            if path in ("/v1/completions", "/v1/chat/completions"):
                self._generate(chat=path == "/v1/chat/completions")
            elif path in ("/tokenize", "/detokenize"):
                self._tokenize(path)
            elif path == "/admin/fault" and self.server.cfg.admin:
                self._admin_fault()
            elif path in DEV_ROUTES and self.server.cfg.dev_mode:
                self._dev_route(path, self._body())
            elif path in DEV_GET_ROUTES and self.server.cfg.dev_mode:
                self._body()
                self._method_not_allowed("GET")
            else:
                self._body()  # drain it, or the next request on this connection would read it
                self._json(404, {"detail": "Not Found"})
        except protocol.ApiError as err:
            self._error(err)
            if isinstance(err, RendererClosed):
                err.log()

    def _method_not_allowed(self, allowed: str) -> None:
        body = json.dumps({"detail": "Method Not Allowed"}).encode()
        self.send_response(405)
        self.send_header("Allow", allowed)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _dev_route(self, path: str, body: Any) -> None:
        """vLLM's development routes (VLLM_SERVER_DEV_MODE=1): /sleep and /wake_up answer 200 with an empty
        body once done, /reset_prefix_cache 200 with {"success": bool}, as vLLM 0.31.0 answers."""
        query = parse_qs(urlsplit(self.path).query)
        if path == "/reset_prefix_cache":
            self._json(200, {"success": self._reset_prefix_cache(query)})
            return
        if path == "/abort_requests":
            # vLLM's rlhf router: a JSON body ({} or {"request_ids": [...]}); with no ids everything is aborted.
            if not isinstance(body, dict) or body.get("request_ids"):
                raise protocol.ApiError(400, "the stub aborts everything only: send {}", "BadRequestError")
            self._json(200, {"status": "aborted", "aborted": self.server.engine.abort_all()})
            return
        try:
            if path == "/sleep":
                raw = query.get("level", ["1"])[-1]
                if not raw.isdigit():
                    raise SleepError(400, f"invalid literal for int() with base 10: {raw!r}")
                self.server.sleeper.sleep(int(raw), query.get("mode", ["abort"])[-1])
            elif path == "/wake_up":
                self.server.sleeper.wake_up(query.get("tags") or None)
        except SleepError as exc:
            kind = "InternalServerError" if exc.status >= 500 else "BadRequestError"
            raise protocol.ApiError(exc.status, exc.message, kind) from None
        self._send(200, b"")

    def _tokenize(self, path: str) -> None:
        cfg = self.server.cfg
        if self.server.renderer_closed:
            self._body()
            raise RendererClosed()
        if path == "/tokenize":
            self._json(200, protocol.tokenize_answer(self._body(), served_names=cfg.served_model_names,
                                                     max_model_len=cfg.max_model_len))
        else:
            self._json(200, protocol.detokenize_answer(self._body()))

    def _reset_prefix_cache(self, query: dict[str, list[str]]) -> bool:
        """vLLM's reset succeeds only when no block is held: not while requests run (unless
        reset_running_requests=true preempts them), and never under STUB_FAULT=prefix_cache_held."""
        logs.get("api_router").info("Resetting prefix cache...")
        if self.server.cfg.fault == "prefix_cache_held":
            return False
        preempt = query.get("reset_running_requests", ["false"])[-1].lower() in TRUE_WORDS
        return preempt or self.server.engine.gauges().running == 0

    def _models(self) -> dict[str, Any]:
        cfg = self.server.cfg
        data = [
            {
                "id": name,
                "object": "model",
                "created": 0,
                "owned_by": "vllm",
                "root": cfg.model,
                "parent": None,
                "max_model_len": cfg.max_model_len,
            }
            for name in cfg.served_model_names
        ]
        return {"object": "list", "data": data}

    def _admin_fault(self) -> None:
        body = self._body()
        fault = body.get("fault") if isinstance(body, dict) else None
        if fault not in RUNTIME_FAULTS:
            raise protocol.ApiError(400, f"fault must be one of {', '.join(RUNTIME_FAULTS)}", param="fault")
        if fault == "crash":
            # Answer first, so the caller learns the fault was accepted before the process dies.
            self._json(200, {"fault": fault})
            timer = threading.Timer(0.05, self.server.faults.apply, args=(fault, "POST /admin/fault"))
            timer.start()
            return
        self.server.faults.apply(fault, "POST /admin/fault")
        self._json(200, {"fault": fault, "mode": self.server.faults.mode})

    # -- generation -----------------------------------------------------------------------------

    def _generate(self, chat: bool) -> None:
        srv = self.server
        gen = protocol.parse(
            self._body(), chat=chat, served_names=srv.cfg.served_model_names, max_model_len=srv.cfg.max_model_len
        )
        if srv.renderer_closed and not gen.sent_as_ids:
            raise RendererClosed()
        seed = srv.cfg.token_seed + srv.sleeper.seed_offset
        fault = srv.faults.output
        tokens = decoding.TokenStream(gen.prompt_ids, seed, srv.cfg.flip_every, srv.cfg.prefill_flip_from,
                                       loop=fault == "loop")
        answer = answers.answer(gen.body, gen.prompt, tokens, fault) if chat else None
        if answer is not None:
            if gen.stream:
                raise protocol.ApiError(400, "the stub engine answers tools, response_format, thinking and "
                                             "format requests only without stream", param="stream")
            answer = answer.truncated(gen.max_tokens)
        request_id = srv.engine.next_id("chatcmpl" if chat else "cmpl")
        # A structured reply takes as many engine steps as it has tokens, like a model that stops at its end.
        steps = answer.tokens() if answer is not None else gen.max_tokens
        req = Request(request_id, gen.prompt_tokens, min(steps, gen.max_tokens), tokens)
        try:
            srv.engine.submit(req)
        except EngineDeadError as exc:
            raise protocol.ApiError(*srv.faults.dead_error(str(exc))) from None
        except EngineSleepingError as exc:  # only with STUB_SLEEP_REFUSES=1: vLLM queues the request
            raise protocol.ApiError(503, str(exc), "EngineSleepingError") from None
        render = protocol.Renderer(gen, request_id, tokens, answer)
        if gen.stream:
            self._stream(req, render)
        else:
            self._complete(req, render)

    def _complete(self, req: Request, render: protocol.Renderer) -> None:
        while True:
            event = req.events.get()
            if event[0] == "stall":
                self._await_disconnect()
                return
            if event[0] == "error":
                raise _engine_error(event[1], self.server.faults)
            if event[0] == "abort":
                self._json(200, render.response(event[1], "abort"))
                return
            _, index, count, finish = event
            if finish is not None:
                self._json(200, render.response(index + count, finish))
                return

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))

    def _sse(self, obj: Any) -> None:
        self._chunk(b"data: " + json.dumps(obj).encode() + b"\n\n")

    def _stream(self, req: Request, render: protocol.Renderer) -> None:
        # Headers go out at once, as with Starlette's StreamingResponse; tokens follow as SSE events.
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        try:
            first = True
            while True:
                event = req.events.get()
                if event[0] == "stall":
                    self._await_disconnect()
                    return
                if event[0] == "error":
                    self._sse(_engine_error(event[1], self.server.faults).body())
                    break
                if event[0] == "abort":
                    # An aborted request (a sleep or a stop in abort mode, a request refused while the engine
                    # stops) ends as vLLM's completion_stream_generator ends it: the role chunk of a chat, then a
                    # last chunk with no token and finish_reason "abort" -- unless no token was ever sent, which it
                    # skips as an empty chunk ("Chunked prefill case"): the stream then ends without a finish_reason.
                    if first and render.gen.chat:
                        self._sse(render.role_chunk())
                    if event[1] > 0:
                        self._sse(render.token_chunk(event[1], "abort", count=0))
                    if render.gen.include_usage:
                        self._sse(render.usage_chunk(event[1]))
                    break
                _, index, count, finish = event
                if first and render.gen.chat:
                    self._sse(render.role_chunk())
                first = False
                self._sse(render.token_chunk(index, finish, count))
                if finish is not None:
                    if render.gen.include_usage:
                        self._sse(render.usage_chunk(index + count))
                    break
            self._chunk(b"data: [DONE]\n\n")
            self.wfile.write(b"0\r\n\r\n")
        except OSError:
            # The client went away: stop spending engine steps on it, as vLLM aborts the request.
            self.server.engine.abort(req)
            self.close_connection = True


    def _await_disconnect(self) -> None:
        """The engine core was killed with this request unfinished: vLLM's API server never answers it, and
        uvicorn keeps the connection (and the process) until the client closes it."""
        self.close_connection = True
        try:
            while self.connection.recv(65536):
                pass
        except OSError:
            pass


def _shut(connection: socket.socket) -> None:
    try:
        connection.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


def _engine_error(message: str, faults: FaultState) -> protocol.ApiError:
    """A request the engine ended because it died (500 when its core died, as vLLM answers then)."""
    return protocol.ApiError(*faults.dead_error(message))
