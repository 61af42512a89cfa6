"""The health gate: a newly started lane must prove it serves within the recipe's startup budget.

Pure decision logic over four small interfaces (the engine's endpoints, its log, its container and a
clock), so the rules are unit-tested with in-memory fakes and integration-tested against the stub engine.

Each poll, in this order:
1. A log record matching a `startup_log.forbid` regex, or one of vLLM's fatal lines, fails the gate at once.
   Rules read only what the engine itself wrote (`engine_log`): never an access-log or request-log line.
   A `startup_log.stall` phase that began (its `after` record) and has not ended (`until`) within its
   minutes fails the gate, naming the phase; the clock runs from the poll that first saw the record. A stall
   with `cold_minutes` allows that long while no `warm` record has been seen (the engine found no cache to
   start from), and the budget grows by as much meanwhile.
2. A container that is no longer running fails the gate at once.
3. The lane is *ready* when `/health` answers 200, `/v1/models` lists the served model and every
   `startup_log.expect` regex has matched some line so far. Connection refused is normal until then:
   vLLM does not listen on its port before the model is loaded.
4. Once ready, a 1-3 token generation passes the gate. `/health` can answer 200 while the engine is
   stuck (vllm#39863), so a generation that fails `GENERATION_ATTEMPTS` times fails the gate rather than
   waiting out a budget that may be 20 minutes long.
5. When the budget runs out first, the gate fails and lists what it was still waiting for: the
   readiness conditions not met, or, once the lane looked ready, the generated token.
6. Each companion (`CompanionGate`), polled beside the primary from the start, must answer `/health` 200
   within the budget; its fatal lines and its exit fail it at once. The lane passes when the primary and
   every companion have: until then it does not serve, since a switch away from it would find a companion
   that cannot sleep.

Checks run every `poll_interval_seconds`, the last one exactly at the end of the budget.
"""

from __future__ import annotations

import math
import re
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from lanectl.health.engine_log import FATAL_ENGINE_LINES, fatal_engine_line, startup_match
from lanectl.health.probe import COMPLETIONS_PATH, ProbeResult
from lanectl.recipe.model import Health, StartupStall
from lanectl.records import frozen

GENERATION_ATTEMPTS = 3
LOG_TAIL_LINES = 30
PROBE_ACCESS_LINE = re.compile(r'"(GET|POST) /(health|v1/models|v1/completions) HTTP/[0-9.]+" [0-9]{3}')

STARTUP_LOG_FORBIDDEN = "startup-log-forbidden"
FATAL_ENGINE_LINE = "fatal-engine-line"
STARTUP_STALL = "startup-stall"
CONTAINER_EXITED = "container-exited"
GENERATION = "generation"
STARTUP_BUDGET = "startup-budget"
INTERRUPTED = "interrupted"


class Endpoints(Protocol):
    def health_ok(self) -> ProbeResult: ...

    def models_lists_served_model(self) -> ProbeResult: ...

    def generate(self) -> ProbeResult: ...


class LogSource(Protocol):
    def new_lines(self) -> list[str]:
        """The lines the engine logged since the last call (all of them on the first call)."""
        ...


@frozen
class ContainerStatus:
    running: bool
    exit_code: int | None = None
    detail: str = "running"  # e.g. "exited with code 1", "gone"


class ContainerWatch(Protocol):
    def status(self) -> ContainerStatus: ...


class Clock(Protocol):
    def monotonic(self) -> float: ...

    def sleep(self, seconds: float) -> None: ...


class MonotonicClock:
    def monotonic(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


@frozen
class GateProgress:
    """Where the gate stands after one poll, for a live display."""

    elapsed: float
    budget: float
    satisfied: tuple[str, ...]
    missing: tuple[str, ...]
    generation_failures: int
    last_log_line: str | None


@frozen
class GateResult:
    passed: bool
    failed_check: str | None  # one of the check names above; None when passed
    detail: str
    seconds: float
    log_tail: tuple[str, ...]
    missing: tuple[str, ...]
    exit_code: int | None = None
    companions: tuple[str, ...] = ()  # how each companion came ready, gated beside the primary


class HealthGate:
    def __init__(
        self,
        health: Health,
        endpoints: Endpoints,
        logs: LogSource,
        container: ContainerWatch,
        clock: Clock,
        on_progress: Callable[[GateProgress], None] = lambda progress: None,
        *,
        fatal_lines: Sequence[re.Pattern[str]] = FATAL_ENGINE_LINES,
        interrupted: Callable[[], str | None] = lambda: None,
    ) -> None:
        self.health = health
        self.endpoints = endpoints
        self.logs = logs
        self.container = container
        self.clock = clock
        self.on_progress = on_progress
        self.fatal_lines = tuple(fatal_lines)
        # A switch interrupted by Ctrl-C or SIGTERM stops waiting at the next poll: its way back must not wait
        # out a startup budget of 20 minutes first. Returns why, or None.
        self.interrupted = interrupted
        self.budget = health.startup_budget_minutes * 60
        self.forbid = [re.compile(pattern) for pattern in health.startup_log.forbid]
        self.expect = {pattern: re.compile(pattern) for pattern in health.startup_log.expect}
        self.stalls = [_StallWatch(stall) for stall in health.startup_log.stall]

        self.health_requirement = f"{health.health_path} 200"
        self.models_requirement = f"{health.models_path} lists '{health.served_model_name}'"
        self.generation_requirement = f"{COMPLETIONS_PATH} generates a token"

    def wait(self) -> GateResult:
        start = self.clock.monotonic()
        seen = _Seen(tail=deque(maxlen=LOG_TAIL_LINES))

        def result(check: str | None, detail: str, missing: Sequence[str], exit_code: int | None = None) -> GateResult:
            return GateResult(
                passed=check is None,
                failed_check=check,
                detail=detail,
                seconds=self.clock.monotonic() - start,
                log_tail=tuple(seen.tail),
                missing=tuple(missing),
                exit_code=exit_code,
            )

        while True:
            why = self.interrupted()
            if why is not None:
                detail = f"interrupted ({why}) after {_seconds(self.clock.monotonic() - start)} s"
                return result(INTERRUPTED, detail, self._missing(seen))
            # The container first, then its log: a log read after the exit was seen holds the engine's
            # last words, so a crash that explains itself is reported by its fatal line, not as a bare exit.
            status = self.container.status()
            lines = self.logs.new_lines()
            # The gate's own polls fill the engine's access log; keep them out of the tail, where
            # they would push out the lines that say what went wrong.
            seen.tail.extend(line for line in lines if not PROBE_ACCESS_LINE.search(line))
            exit_code = None if status.running else status.exit_code
            exited = "" if status.running else f"; container {status.detail}"
            seen_at = self.clock.monotonic()
            for line in lines:
                forbidden = next((p for p in self.forbid if startup_match(p, line)), None)
                if forbidden is not None:
                    detail = f"startup log line matches forbidden '{forbidden.pattern}': {line.strip()}{exited}"
                    return result(STARTUP_LOG_FORBIDDEN, detail, self._missing(seen), exit_code)
                if fatal_engine_line(line, self.fatal_lines):
                    detail = f"the engine logged a fatal line: {line.strip()}{exited}"
                    return result(FATAL_ENGINE_LINE, detail, self._missing(seen), exit_code)
                seen.expected.update(pattern for pattern, regex in self.expect.items() if startup_match(regex, line))
                for watch in self.stalls:
                    watch.see(line, seen_at)
            stalled = next((w for w in self.stalls if w.overdue(seen_at)), None)
            if stalled is not None:
                detail = stalled.failure(seen_at) + exited
                return result(STARTUP_STALL, detail, self._missing(seen), exit_code)
            if not status.running:
                elapsed = _seconds(self.clock.monotonic() - start)
                detail = f"container {status.detail} after {elapsed} s, before the lane was ready"
                return result(CONTAINER_EXITED, detail, self._missing(seen), exit_code)

            seen.health = self.endpoints.health_ok()
            seen.models = self.endpoints.models_lists_served_model()
            missing = self._missing(seen)
            answers = [probe.detail for probe in (seen.health, seen.models) if not probe.ok]
            if not missing:
                generation = self.endpoints.generate()
                if generation.ok:
                    elapsed = _seconds(self.clock.monotonic() - start)
                    return result(None, f"lane ready after {elapsed} s: {self._ready(seen, generation)}", ())
                # Any success passes the gate, so "in a row" is every attempt since the lane looked ready;
                # a lane whose readiness flickers does not get a fresh count.
                seen.generation_failures += 1
                if seen.generation_failures >= GENERATION_ATTEMPTS:
                    detail = (
                        f"the lane looked ready but the generation probe failed {seen.generation_failures} "
                        f"times in a row; last: {generation.detail}"
                    )
                    return result(GENERATION, detail, (self.generation_requirement,))
                missing = [self.generation_requirement]
                answers.append(generation.detail)

            now = self.clock.monotonic()
            # A phase running cold (its engine found no cache) has its own minutes on top of the budget.
            deadline = start + self.budget + sum(w.extension for w in self.stalls)
            if now >= deadline:
                detail = f"after {_seconds(deadline - start)} s still waiting for: {'; '.join(missing)}"
                if answers:
                    detail += f". Last answers: {'; '.join(answers)}"
                return result(STARTUP_BUDGET, detail, missing)
            self.on_progress(
                GateProgress(
                    elapsed=now - start,
                    budget=deadline - start,
                    satisfied=tuple(r for r in self._readiness_requirements() if r not in missing),
                    missing=tuple(missing),
                    generation_failures=seen.generation_failures,
                    last_log_line=seen.tail[-1] if seen.tail else None,
                )
            )
            # A stall can fall due while the probes answer; then the next poll is now, and it reports the stall.
            next_poll = _next_poll(start, now, self.health.poll_interval_seconds, deadline,
                                   *(w.deadline for w in self.stalls if w.deadline is not None))
            self.clock.sleep(max(0.0, next_poll - now))

    def _readiness_requirements(self) -> list[str]:
        return [
            self.health_requirement,
            self.models_requirement,
            *(_expect_requirement(pattern) for pattern in self.expect),
        ]

    def _missing(self, seen: _Seen) -> list[str]:
        """Readiness conditions not met, in a fixed order; an endpoint not asked yet counts as unmet."""
        missing = []
        if seen.health is None or not seen.health.ok:
            missing.append(self.health_requirement)
        if seen.models is None or not seen.models.ok:
            missing.append(self.models_requirement)
        missing.extend(_expect_requirement(pattern) for pattern in self.expect if pattern not in seen.expected)
        return missing

    def _ready(self, seen: _Seen, generation: ProbeResult) -> str:
        parts = [probe.detail for probe in (seen.health, seen.models) if probe is not None]
        if self.expect:
            parts.append(f"{len(self.expect)} expected startup log lines seen")
        return ", ".join([*parts, generation.detail])


@dataclass
class _Seen:
    """What one gate run has observed so far."""

    tail: deque[str]
    expected: set[str] = field(default_factory=set)
    health: ProbeResult | None = None
    models: ProbeResult | None = None
    generation_failures: int = 0


class _StallWatch:
    """One `startup_log.stall` rule over one gate run: open from its `after` record until its `until` record."""

    def __init__(self, stall: StartupStall) -> None:
        self.stall = stall
        self.after = re.compile(stall.after)
        self.until = re.compile(stall.until)
        self.warm = re.compile(stall.warm) if stall.warm is not None else None
        self.warm_seen = False
        self.ran_cold = False  # a cold phase ended: the start keeps the budget it was given for it
        self.began: float | None = None
        self.line = ""

    @property
    def cold(self) -> bool:
        """Open, with a cold allowance, and no record yet that the engine found its cache (flashinfer logs the
        tuned results it loaded before the phase, or, from its managed store, inside it)."""
        return self.began is not None and self.stall.cold_minutes is not None and not self.warm_seen

    @property
    def limit_minutes(self) -> float:
        return self.stall.cold_minutes if self.cold and self.stall.cold_minutes is not None else self.stall.minutes

    @property
    def extension(self) -> float:
        """Seconds the start's budget grows by: a cold phase's allowance, from when it began cold on."""
        if self.stall.cold_minutes is None or not (self.cold or self.ran_cold):
            return 0.0
        return self.stall.cold_minutes * 60

    @property
    def deadline(self) -> float | None:
        return None if self.began is None else self.began + self.limit_minutes * 60

    def see(self, line: str, at: float) -> None:
        if self.warm is not None and startup_match(self.warm, line):
            self.warm_seen = True
        if self.began is not None and startup_match(self.until, line):
            self.ran_cold = self.ran_cold or self.cold
            self.began = None
        elif self.began is None and startup_match(self.after, line):
            self.began, self.line = at, line.strip()

    def overdue(self, now: float) -> bool:
        deadline = self.deadline
        return deadline is not None and now >= deadline

    def failure(self, now: float) -> str:
        assert self.began is not None
        cold = f" from no cache (no line matching '{self.stall.warm}')" if self.cold else ""
        detail = (f"{self.stall.label} started{cold} {_minutes(now - self.began)} ago and has not ended "
                  f"(no line matching '{self.stall.until}' within {self.limit_minutes:g} min)")
        if self.stall.why:
            detail += f": {self.stall.why}"
        return f"{detail}; began with: {self.line}"


class HealthEndpoint(Protocol):
    def health_ok(self) -> ProbeResult: ...


class CompanionGate:
    """A companion's part of its lane's gate: the companion is its own `vllm serve` (on the station's second
    GPU), and the lane serves only when it does too. Ready is vLLM's own word for it, `/health` 200, which it
    answers only once its engine is up; the generation and model checks stay the primary's, whose served model
    the recipe's health block names. A fatal engine line or a container that exits fails it at once, as they
    fail the primary's gate; otherwise it waits at most `budget_seconds`, polling on the recipe's interval,
    and checks at least once.
    """

    def __init__(self, role: str, health: Health, endpoint: HealthEndpoint, logs: LogSource,
                 container: ContainerWatch, clock: Clock, budget_seconds: float,
                 on_progress: Callable[[GateProgress], None] = lambda progress: None, *,
                 fatal_lines: Sequence[re.Pattern[str]] = FATAL_ENGINE_LINES,
                 interrupted: Callable[[], str | None] = lambda: None) -> None:
        self.role = role
        self.interval = health.poll_interval_seconds
        self.endpoint = endpoint
        self.logs = logs
        self.container = container
        self.clock = clock
        self.budget = max(0.0, budget_seconds)
        self.on_progress = on_progress
        self.fatal_lines = tuple(fatal_lines)
        self.interrupted = interrupted
        self.requirement = f"its {role} companion's {health.health_path} 200"

    def wait(self) -> GateResult:
        start = self.clock.monotonic()
        deadline = start + self.budget
        tail: deque[str] = deque(maxlen=LOG_TAIL_LINES)
        missing = (self.requirement,)

        def result(check: str | None, detail: str, exit_code: int | None = None) -> GateResult:
            return GateResult(passed=check is None, failed_check=check, detail=f"{self.role}: {detail}",
                              seconds=self.clock.monotonic() - start, log_tail=tuple(tail),
                              missing=() if check is None else missing, exit_code=exit_code)

        while True:
            why = self.interrupted()
            if why is not None:
                return result(INTERRUPTED, f"interrupted ({why}) after {_seconds(self.clock.monotonic() - start)} s")
            status = self.container.status()
            lines = self.logs.new_lines()
            tail.extend(line for line in lines if not PROBE_ACCESS_LINE.search(line))
            exit_code = None if status.running else status.exit_code
            exited = "" if status.running else f"; container {status.detail}"
            fatal = next((line for line in lines if fatal_engine_line(line, self.fatal_lines)), None)
            if fatal is not None:
                return result(FATAL_ENGINE_LINE, f"the engine logged a fatal line: {fatal.strip()}{exited}",
                              exit_code)
            if not status.running:
                elapsed = _seconds(self.clock.monotonic() - start)
                return result(CONTAINER_EXITED, f"container {status.detail} after {elapsed} s more, before it was "
                              "ready", exit_code)
            probe = self.endpoint.health_ok()
            now = self.clock.monotonic()
            if probe.ok:
                return result(None, f"ready after {_seconds(now - start)} s ({probe.detail})")
            if now >= deadline:
                return result(STARTUP_BUDGET, f"after {_seconds(self.budget)} s more, still waiting for "
                              f"{self.requirement}. Last answer: {probe.detail}")
            self.on_progress(GateProgress(elapsed=now - start, budget=self.budget, satisfied=(), missing=missing,
                                          generation_failures=0, last_log_line=tail[-1] if tail else None))
            self.clock.sleep(max(0.0, _next_poll(start, now, self.interval, deadline) - now))


def _next_poll(start: float, now: float, interval: float, *limits: float) -> float:
    """When the next poll is due. Polls keep a fixed cadence from the start, so slow answers do not stretch the
    interval, and a poll that overran skips the ticks it missed rather than firing them back to back; a limit
    (the deadline, a stall's) that comes first is the next poll, so the last one lands on the deadline itself
    and a lane gets all of its budget."""
    return min(start + (math.floor((now - start) / interval) + 1) * interval, *limits)


def _minutes(seconds: float) -> str:
    """600 -> "10 min", 6.2 -> "6.2 s": minutes when the rule is in minutes, seconds for the short test rules."""
    return f"{round(seconds / 60, 1):g} min" if seconds >= 60 else f"{round(seconds, 1):g} s"


def _expect_requirement(pattern: str) -> str:
    return f"startup log line matching '{pattern}'"


def _seconds(value: float) -> str:
    """120.0 -> "120", 2.54 -> "2.5": whole seconds read best, tenths matter only for short budgets."""
    return f"{round(value, 1):g}"
