"""What a switch asks a lane's engines, as opposed to Docker: its health gate, sleep, wake and greedy output.

`LaneEngines` is the one real implementation; the executor takes any object with these four methods, so its
tests can stand in for the engines without HTTP.

The gate reads the engine's log through one followed log stream, which also ends when the container stops:
a gate costs Docker one request (and an inspect if the container exits), however many polls it takes.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from typing import Protocol

from lanectl.dockerapi.containers import ContainerEngine, ListedContainer
from lanectl.dockerapi.engine_api import NotFound, Stream
from lanectl.health.engine_exit import exit_detail
from lanectl.health.engine_http import engine_url
from lanectl.health.gate import Clock, CompanionGate, ContainerStatus, GateProgress, GateResult, HealthGate
from lanectl.health.lane_gate import gate_lane
from lanectl.health.probe import EndpointProbe, probe_base_url
from lanectl.lanes.standby import (
    DEFAULT_DRAIN_SECONDS,
    METRICS_TIMEOUT_SECONDS,
    SleepEndpoints,
    StandbyError,
    role_base_url,
)
from lanectl.recipe.catalog import Lane
from lanectl.recipe.model import Health
from lanectl.recipe.shutdown import drain_seconds


class EngineCalls(Protocol):
    def gate(self, lane: Lane, budget_seconds: float, since: float | None) -> GateResult:
        """Hold the lane's primary to its health gate and each companion, beside it, to its readiness, within
        `budget_seconds`, judging their logs from `since` (a UNIX time; None: from the start of the primary's
        current run)."""
        ...

    def sleep(self, lane: Lane, role: str) -> str:
        """Put one engine of the lane to sleep; says what became of the requests it was answering."""
        ...

    def wake(self, lane: Lane) -> None:
        """Wake every container of the lane; raises StandbyError naming each that failed."""
        ...

    def greedy(self, lane: Lane, prompt: str, max_tokens: int) -> str: ...

    def in_flight(self, lane: Lane, role: str) -> int | None:
        """Requests the role's engine is running or has waiting (vLLM's /metrics); None when it does not answer."""
        ...

    def is_sleeping(self, lane: Lane, role: str) -> bool | None:
        """Whether the role's engine sleeps (GET /is_sleeping, a dev-mode route); None when it does not say."""
        ...

    def is_sleeping_in(self, container: ListedContainer) -> bool | None:
        """Whether the engine in a running container sleeps, asked on the host port it publishes (whatever its
        name or its lane's recipe says now: an orphan or a renamed container answers there too); None when it
        publishes no port or does not say."""
        ...




# uvicorn's line once the API server accepts requests (vLLM's server is uvicorn's): /health can answer 200 from
# then on. Bytes, as the followed stream delivers them.
SERVING_LINE = b"Application startup complete."

class LaneEngines:
    def __init__(self, engine: ContainerEngine, *, on_gate: Callable[[GateProgress], None],
                 interrupted: Callable[[], str | None], sleep: Callable[[float], None] = time.sleep):
        self.engine = engine
        self.on_gate = on_gate
        self.interrupted = interrupted
        self.pause = sleep

    def gate(self, lane: Lane, budget_seconds: float, since: float | None) -> GateResult:
        name = lane.container_name()
        if since is None:
            # A container an earlier, killed run started: its startup lines predate this command and count.
            state = self.engine.container(name)
            started_epoch = state.started_epoch if state else None
            since = started_epoch - 1.0 if started_epoch else time.time()
        health = replace(lane.spec.health, startup_budget_minutes=budget_seconds / 60)
        log_since = since  # a float from here: the closures below see it so
        return gate_lane(lambda interrupted: self._primary_gate(lane, health, log_since, interrupted),
                         [partial(self._companion_gate, lane, role, health, log_since) for role in lane.roles[1:]],
                         budget_seconds, self.interrupted)

    def _primary_gate(self, lane: Lane, health: Health, since: float,
                      interrupted: Callable[[], str | None]) -> GateResult:
        log = FollowedLog(self.engine, lane.container_name(), since)
        try:
            clock = _PollSooner(_Clock(self.pause), log, interrupted)
            return HealthGate(health, EndpointProbe(probe_base_url(lane), health), log, log, clock,
                              self.on_gate, interrupted=interrupted).wait()
        finally:
            log.close()

    def _companion_gate(self, lane: Lane, role: str, health: Health, since: float, budget_seconds: float,
                        clock: Clock, interrupted: Callable[[], str | None]) -> GateResult:
        try:
            url = role_base_url(lane, role)
        except StandbyError:
            return GateResult(True, None, f"{role}: not checked (it publishes no port)", 0.0, (), ())
        log = FollowedLog(self.engine, lane.container_name(role), since)
        try:
            # Its progress is the primary's to report: one line per poll interval, not one per engine.
            return CompanionGate(role, health, EndpointProbe(url, health), log, log,
                                 _PollSooner(clock, log, interrupted), budget_seconds, interrupted=interrupted).wait()
        finally:
            log.close()

    def sleep(self, lane: Lane, role: str) -> str:
        """Put the role's engine to sleep after the requests it answers finished, within its drain (the same time
        a stop would give them); says what became of them."""
        standby = lane.spec.standby
        if standby is None:
            raise StandbyError(f"{lane.name}'s recipe asks for no standby")
        drain = drain_seconds(lane.spec, role)
        return SleepEndpoints(role_base_url(lane, role), standby.wake_timeout_seconds).sleep(
            standby.level, DEFAULT_DRAIN_SECONDS if drain is None else drain)

    def wake(self, lane: Lane) -> None:
        """Every container at once: they are separate engines on separate GPUs, and waking them one after
        another would add each one's wake time to the rollback."""
        standby = lane.spec.standby
        if standby is None:
            raise StandbyError(f"{lane.name}'s recipe asks for no standby")

        def wake(role: str) -> str | None:
            try:
                SleepEndpoints(role_base_url(lane, role), standby.wake_timeout_seconds).wake_up()
            except StandbyError as exc:
                return f"{lane.container_name(role)}: {exc}"
            return None

        from concurrent.futures import ThreadPoolExecutor  # a wake is rare; its import (logging's) is not paid by all

        with ThreadPoolExecutor(max_workers=len(lane.roles)) as pool:
            failed = [error for error in pool.map(wake, lane.roles) if error]
        if failed:
            raise StandbyError("; ".join(failed))

    def in_flight(self, lane: Lane, role: str) -> int | None:
        try:
            return SleepEndpoints(role_base_url(lane, role), METRICS_TIMEOUT_SECONDS).in_flight()
        except StandbyError:  # the role publishes no port
            return None

    def is_sleeping(self, lane: Lane, role: str) -> bool | None:
        return self.engine_sleeps(lane, role)

    def is_sleeping_in(self, container: ListedContainer) -> bool | None:
        # Only that container can hold the host port while it runs, so the port's answer is its engine's.
        for protocol, port in container.host_ports:
            if protocol != "tcp":
                continue
            try:
                return SleepEndpoints(engine_url("", port), METRICS_TIMEOUT_SECONDS).is_sleeping()
            except StandbyError:
                continue
        return None

    @staticmethod
    def engine_sleeps(lane: Lane, role: str) -> bool | None:
        try:
            return SleepEndpoints(role_base_url(lane, role), METRICS_TIMEOUT_SECONDS).is_sleeping()
        except StandbyError:  # no port, no dev-mode route, no answer: it does not say
            return None

    def greedy(self, lane: Lane, prompt: str, max_tokens: int) -> str:
        timeout = lane.spec.health.generation_probe.timeout_seconds
        return SleepEndpoints(probe_base_url(lane), timeout).greedy_text(lane.spec.health.served_model_name,
                                                                         prompt, max_tokens)


class _Clock:
    def __init__(self, pause: Callable[[float], None]):
        self.pause = pause

    def monotonic(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        self.pause(seconds)


class _PollSooner:
    """A gate's clock whose wait for its next poll ends when the followed log has news (the engine serves, or
    its log ended with its container): the gate polls then, not up to a poll interval later. An engine is
    ready the moment it serves, and a lane switch waits for the last of its engines."""

    SLICE_SECONDS = 0.05

    def __init__(self, clock: Clock, log: FollowedLog, interrupted: Callable[[], str | None]):
        self.clock, self.log, self.interrupted = clock, log, interrupted

    def monotonic(self) -> float:
        return self.clock.monotonic()

    def sleep(self, seconds: float) -> None:
        end = self.clock.monotonic() + seconds
        while not self.log.news.is_set() and self.interrupted() is None and (left := end - self.monotonic()) > 0:
            self.clock.sleep(min(left, self.SLICE_SECONDS))
        self.log.news.clear()


class FollowedLog:
    """A container's log from `since`, read as it comes by one followed stream in a thread: the gate's log
    source and its container watch in one. The stream ends when the container stops; only then is the
    container inspected, once, for its exit code."""

    def __init__(self, engine: ContainerEngine, name: str, since: float):
        self.engine, self.name = engine, name
        self.lines: list[str] = []
        self.read = 0
        self.partial = b""
        self.ended = threading.Event()
        self.news = threading.Event()  # the engine said it serves, or the log ended: worth a poll now
        self.lock = threading.Lock()
        self.exit: ContainerStatus | None = None
        self.stream: Stream | None = None
        try:
            self.stream = engine.log_stream(name, since=since)
        except NotFound:
            self.ended.set()
            return
        threading.Thread(target=self._follow, args=(self.stream,), daemon=True).start()

    def _follow(self, stream: Stream) -> None:
        try:
            for chunk in stream.log_chunks():
                with self.lock:
                    *complete, self.partial = (self.partial + chunk).split(b"\n")
                    self.lines += [line.decode(errors="replace") for line in complete]
                if any(SERVING_LINE in line for line in complete):
                    self.news.set()
        except Exception:  # the engine went away, or the stream was closed: the container is inspected instead
            pass
        finally:
            with self.lock:
                if self.partial:
                    self.lines.append(self.partial.decode(errors="replace"))
                    self.partial = b""
            self.ended.set()
            self.news.set()

    def new_lines(self) -> list[str]:
        with self.lock:
            fresh, self.read = self.lines[self.read:], len(self.lines)
        return fresh

    def status(self) -> ContainerStatus:
        if not self.ended.is_set():
            return ContainerStatus(running=True, exit_code=None, detail="running")
        if self.exit is None:
            state = self.engine.container(self.name)
            if state is None:
                self.exit = ContainerStatus(running=False, exit_code=None, detail="gone (removed)")
            elif state.running:
                # The stream broke but the container runs (the engine restarted): it is judged running.
                return ContainerStatus(running=True, exit_code=None, detail="running")
            else:
                self.exit = ContainerStatus(running=False, exit_code=state.exit_code,
                                            detail=exit_detail(state.status, state.exit_code))
        return self.exit

    def close(self) -> None:
        if self.stream is not None:
            self.stream.close()
