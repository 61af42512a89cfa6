"""The engine loop: one thread that runs batched steps, like vLLM's EngineCore busy loop.

Each step emits, for every running request, the tokens that step accepted: under speculative decoding
(k > 0) one plus the draft tokens the rejection sampler accepted (1 to k + 1), all in one stream chunk, as
vLLM sends them; a request's first step (its prefill) has no drafts yet and emits one. So aggregate
throughput grows with concurrency while the per-stream rate stays at tokens per step / step time.
Steps are scheduled against a monotonic deadline rather than sleeping a fixed time after the work, so
per-step overhead and wake-up jitter do not accumulate into drift: benchmark numbers must reflect the
configured rate, not the stub's overhead.
"""

from __future__ import annotations

import itertools
import queue
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from . import decoding, logs
from .config import ACCEPTED_DRAFTS_CYCLE
from .faults import FaultState
from .metrics import Gauges, Metrics
from .rejection_sampler import rejection_sample
from .splitkv import DecodeAttention

log = logs.get("engine")

# How far behind schedule the loop may fall and still catch up rather than restart its clock.
CATCH_UP_S = 0.1


class EngineDeadError(RuntimeError):
    """The engine cannot take requests (the unhealthy fault); the API answers 503."""


class EngineSleepingError(RuntimeError):
    """The engine is asleep and STUB_SLEEP_REFUSES=1 asks it to refuse new requests (vLLM queues them)."""


DEAD_MESSAGE = "EngineCore encountered an issue. See stack trace for the root cause."
SLEEPING_MESSAGE = "The engine is sleeping: POST /wake_up before generating"

# vLLM 0.31.0's pause modes (`EngineCore.pause_scheduler`), each queueing new requests until resumed:
# abort ends the requests in flight with finish_reason "abort"; wait lets them finish first; keep holds
# them where they are and continues them once resumed.
PAUSE_MODES = ("abort", "wait", "keep")


@dataclass(eq=False)
class Request:
    request_id: str
    prompt_tokens: int
    max_tokens: int
    stream: decoding.TokenStream
    arrival: float = field(default_factory=time.monotonic)
    # ("tokens", first index, count, finish_reason | None), ("abort", generated), ("error", message) or
    # ("stall",) (the engine core was killed: no output will ever come), consumed by the HTTP thread.
    events: queue.SimpleQueue = field(default_factory=queue.SimpleQueue)
    generated: int = 0
    decode_steps: int = 0  # steps that drafted for it (every step after its prefill)
    aborted: bool = False


def draft_steps(num_running: int, num_speculative_tokens: int) -> int:
    """The DSpark schedule: k draft steps, but only 3 while 9-32 requests run (the release note)."""
    if 9 <= num_running <= 32:
        return min(num_speculative_tokens, 3)
    return num_speculative_tokens


def _drafts(row: Sequence[int], decode_step: int) -> list[int]:
    """A request's draft tokens for one step: the first n agree with the target (n from the fixed cycle),
    the next does not, so the rejection sampler accepts exactly n; the rest never count."""
    agree = ACCEPTED_DRAFTS_CYCLE[decode_step % len(ACCEPTED_DRAFTS_CYCLE)]
    return [tok if j < agree else (tok + 1) % decoding.V for j, tok in enumerate(row)]


class Engine:
    def __init__(
        self,
        *,
        step_seconds: float,
        max_num_seqs: int,
        num_speculative_tokens: int,
        kv_cache_tokens: int,
        attention: DecodeAttention,
        metrics: Metrics,
        faults: FaultState,
        oob_log_every: int = 100,
        stats_interval_s: float = 10.0,
    ) -> None:
        self.step_seconds = step_seconds
        self.max_num_seqs = max_num_seqs
        self.k = num_speculative_tokens
        self.kv_cache_tokens = kv_cache_tokens
        self.attention = attention
        self.metrics = metrics
        self.faults = faults
        self.oob_log_every = oob_log_every
        self.stats_interval_s = stats_interval_s
        self._cond = threading.Condition()
        self._waiting: deque[Request] = deque()
        self._running: list[Request] = []
        self._thread = threading.Thread(target=self._loop, name="EngineCore", daemon=True)
        self._ids = itertools.count()
        # None, or the pause mode in force: every mode queues new requests; only "wait" keeps stepping.
        self.paused: str | None = None
        # STUB_SLEEP_REFUSES=1: answer a request sent while paused at once with 503, the stub's old shape,
        # for a test of a client that must give up on a silent engine.
        self.refuse_while_paused = False
        # None, or the mode of a stop in progress ("abort" | "drain"); from then on new adds are refused.
        self.stopping: str | None = None
        # The process manager's SIGKILL of the engine core: nothing steps or answers any more.
        self.killed = False
        metrics.gauges = self.gauges

    def start(self) -> None:
        self._thread.start()

    def next_id(self, prefix: str) -> str:
        return f"{prefix}-{next(self._ids):08x}"

    def submit(self, req: Request) -> None:
        with self._cond:
            if self.faults.dead or self.killed:
                raise EngineDeadError(DEAD_MESSAGE)
            if self.stopping is not None:
                # vLLM's EngineCore._reject_add_in_shutdown: the request ends at once as aborted, no token made.
                req.events.put(("abort", 0))
                self.metrics.finished("abort")
                return
            if self.paused is not None and self.refuse_while_paused:
                raise EngineSleepingError(SLEEPING_MESSAGE)
            self._waiting.append(req)
            self._cond.notify_all()

    def abort(self, req: Request) -> None:
        req.aborted = True

    def pause(self, mode: str) -> None:
        """Stop scheduling as vLLM's pause_scheduler does, and return once the pause is complete: at once for
        abort and keep, after the requests in flight finished for wait. New requests queue meanwhile."""
        if mode not in PAUSE_MODES:
            raise ValueError(f"Invalid pause mode: {mode}")
        with self._cond:
            self.paused = mode
            if mode == "abort":
                self._abort_all()
            self._cond.notify_all()
            while mode == "wait" and self._running and not self.faults.dead:
                self._cond.wait(0.1)

    def stop(self, timeout: int) -> int:
        """vLLM's EngineCore._handle_shutdown on SIGTERM: refuse new adds from now on; with timeout 0 also
        abort every unfinished request (their streams end with finish_reason "abort"), else let them run.
        Returns how many were unfinished."""
        with self._cond:
            unfinished = len(self._running) + len(self._waiting)
            self.stopping = "abort" if timeout == 0 else "drain"
            if timeout == 0:
                self._abort_all()
            self._cond.notify_all()
            return unfinished

    def drained(self, deadline: float) -> bool:
        """Wait until no request is left (True) or the monotonic deadline passed first (False)."""
        with self._cond:
            while self._running or self._waiting:
                left = deadline - time.monotonic()
                if left <= 0 or self.killed:
                    return False
                self._cond.wait(min(left, 0.1))
            return True

    def kill(self) -> None:
        """The engine core is SIGKILLed: nothing more is stepped or sent, so every request in flight waits for
        an output that never comes (its client sees a stream stop without an end)."""
        with self._cond:
            self.killed = True
            for req in itertools.chain(self._running, self._waiting):
                req.events.put(("stall",))
            self._running.clear()
            self._waiting.clear()
            self._cond.notify_all()

    def resume(self) -> None:
        """Resume scheduling: the requests queued while paused (and those kept) run."""
        with self._cond:
            self.paused = None
            self._cond.notify_all()

    def wake(self) -> None:
        """Called when the fault state changes, so a stuck or dead engine reacts at once."""
        with self._cond:
            self._cond.notify_all()

    def gauges(self) -> Gauges:
        with self._cond:
            used = sum(r.prompt_tokens + r.generated for r in self._running)
            return Gauges(len(self._running), len(self._waiting), min(1.0, used / self.kv_cache_tokens))

    def step_time(self, num_running: int) -> tuple[float, bool]:
        """Seconds one step takes with `num_running` requests, and whether it runs split-KV attention."""
        num_tokens = 1 + draft_steps(num_running, self.k)
        factor = self.attention.step_factor(num_tokens, num_running)
        return self.step_seconds * factor, self.attention.engages(num_tokens, num_running)

    # -- the loop -------------------------------------------------------------------------------

    def abort_all(self) -> int:
        """vLLM's POST /abort_requests with no ids: every request the API server tracks ends as aborted, queued
        ones included; the scheduler is not paused. Returns how many."""
        with self._cond:
            count = len(self._running) + len(self._waiting)
            self._abort_all()
            self._cond.notify_all()
            return count

    def _abort_all(self) -> None:
        for req in itertools.chain(self._running, self._waiting):
            req.aborted = True
            req.events.put(("abort", req.generated))
            self.metrics.finished("abort")
        self._running.clear()
        self._waiting.clear()

    def _fail_all(self, message: str) -> None:
        for req in itertools.chain(self._running, self._waiting):
            req.events.put(("error", message))
        self._running.clear()
        self._waiting.clear()

    def _schedule(self) -> list[Request]:
        """Wait for work, then admit waiting requests. Called with the condition held."""
        while True:
            if self.faults.dead:
                self._fail_all(DEAD_MESSAGE)
            elif self.killed or self.faults.stuck or self.paused in ("abort", "keep"):
                pass  # no step runs; queued requests wait for a resume
            elif self._running or (self._waiting and self.paused is None):
                break
            self._cond.wait()
        still = [r for r in self._running if not r.aborted]
        dropped = len(self._running) - len(still)
        self._running = still
        admitted = 0
        while self._waiting and self.paused is None and len(self._running) < self.max_num_seqs:
            req = self._waiting.popleft()
            if req.aborted:
                dropped += 1
                continue
            self._running.append(req)
            admitted += req.prompt_tokens
        for _ in range(dropped):
            self.metrics.finished("abort")
        if admitted:
            self.metrics.add(prompt_tokens=admitted)
        return list(self._running)

    def _loop(self) -> None:
        deadline: float | None = None
        last_stats = time.monotonic()
        stats_tokens = [0, 0]  # prompt, generation since the last stats line
        while True:
            with self._cond:
                was_idle = not self._running
                prompt_before = self.metrics.prompt_tokens
                batch = self._schedule()
                stats_tokens[0] += self.metrics.prompt_tokens - prompt_before
            if not batch:
                continue
            step, split = self.step_time(len(batch))
            now = time.monotonic()
            # A step that starts a little late (a GIL hand-off, a busy core) is made up by the next
            # ones, so the average rate holds; after idling, or after a real stall, the clock restarts
            # instead of emitting a burst of catch-up steps.
            if deadline is None or was_idle or now - deadline > max(CATCH_UP_S, step):
                deadline = now
            deadline += step
            accepted = self._speculate(batch)
            delay = deadline - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            with self._cond:
                if self.killed or self.faults.stuck or self.faults.dead or self.paused in ("abort", "keep"):
                    continue  # the step never completes; the loop parks in _schedule
                emitted = self._emit(batch, accepted)
            self.metrics.add(generation_tokens=emitted, engine_steps=1, splitkv_steps=int(split))
            stats_tokens[1] += emitted
            if self.stats_interval_s > 0 and deadline - last_stats >= self.stats_interval_s:
                self._log_stats(deadline - last_stats, stats_tokens)
                last_stats = deadline
                stats_tokens = [0, 0]

    def _emit(self, batch: Sequence[Request], accepted: dict[int, int]) -> int:
        """Hand each request its tokens of this step, in one event: 1 + the drafts it accepted, cut at max_tokens."""
        now = time.monotonic()
        emitted = 0
        for req in batch:
            if req.aborted:
                continue
            index = req.generated
            count = min(1 + accepted.get(id(req), 0), req.max_tokens - index)
            emitted += count
            req.generated += count
            if index == 0:
                self.metrics.observe_ttft(now - req.arrival)
            done = req.generated >= req.max_tokens
            req.events.put(("tokens", index, count, "length" if done else None))
            if done:
                self._running.remove(req)
                self.metrics.finished("length")
        return emitted

    def _speculate(self, batch: Sequence[Request]) -> dict[int, int]:
        """Run the rejection sampler over this step's drafts, as the GPU step would. Returns the draft tokens
        each request accepted (by id(request)); a request in its prefill step has no drafts yet."""
        drafted = [req for req in batch if req.generated > 0]
        if self.k <= 0 or not drafted:
            return {}
        # The schedule is set by every running request, the drafts exist only for those past their prefill.
        steps = draft_steps(len(batch), self.k)
        target: list[int] = []
        drafts: list[int] = []
        cu_num_logits = [0]
        for req in drafted:
            pos = req.generated
            row = [req.stream.token(pos + j) for j in range(steps + 1)]
            target.extend(row)
            drafts.append(req.stream.token(pos - 1) if pos > 0 else 0)
            drafts.extend(_drafts(row[:steps], req.decode_steps))
            req.decode_steps += 1
            cu_num_logits.append(len(target))
        out = rejection_sample(target, drafts, cu_num_logits, self.k)
        # The unpatched sampler (#60945) can take the bonus position for a draft when fewer steps run than
        # configured; a step still has only steps + 1 tokens to give.
        accepted = [min(n, steps) for n in out.num_accepted]
        self.metrics.add(
            spec_drafts=len(drafted),
            spec_draft_tokens=steps * len(drafted),
            spec_accepted_tokens=sum(accepted),
        )
        if out.oob_reads:
            before = self.metrics.oob_draft_reads
            self.metrics.add(oob_draft_reads=len(out.oob_reads))
            total = before + len(out.oob_reads)
            # Log the first stray read and then one in every oob_log_every, so a storm stays readable.
            if before // self.oob_log_every != total // self.oob_log_every or before == 0:
                log.warning(
                    "rejection sampler read past draft buffer (logit_idx=%d, num_logits=%d, "
                    "%d of %d configured draft steps, %d running requests; %d stray reads so far)",
                    out.oob_reads[-1],
                    len(target),
                    steps,
                    self.k,
                    len(batch),
                    total,
                )
        return {id(req): n for req, n in zip(drafted, accepted, strict=True)}

    def _log_stats(self, interval: float, tokens: list[int]) -> None:
        g = self.gauges()
        log.info(
            "Engine 000: Avg prompt throughput: %.1f tokens/s, Avg generation throughput: %.1f tokens/s, "
            "Running: %d reqs, Waiting: %d reqs, GPU KV cache usage: %.1f%%, Prefix cache hit rate: 0.0%%",
            tokens[0] / interval,
            tokens[1] / interval,
            g.running,
            g.waiting,
            g.kv_usage * 100,
        )
