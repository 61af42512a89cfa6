"""The standby check's protocol: does vLLM's sleep and wake hold for one lane on this box, and at what cost.

A standby is only as good as its wake. Wakes have answered 200 and served different text (vllm#17103,
vllm#29341), sleep has crashed beside CPU and KV offload (vllm#45268, vllm#36753), and a sleeping lane keeps
GPU memory the next lane may need. So before a recipe says `standby:`, the box proves it: the lane is started
cold (the seconds a rollback without a standby costs), then put to sleep N times with streams in flight
(`mode=wait`: they finish first, as a switch's sleep lets them) and woken, its greedy output after each wake
compared with the first; optionally a second lane is started beside it asleep, at its own
`--gpu-memory-utilization`. The first failure ends the check and is named:

- `crash`: a container (or process) of the lane ended, or its engine stopped answering;
- `engine-error`: a sleep or wake answered an error (or a stream failed) while the engine still ran;
- `fingerprint-drift`: the greedy text after a wake differs from the text before the first sleep;
- `slow-wake`: a wake took longer than the lane's own cold start, so a standby would not shorten a rollback;
- `oom-beside`: the second lane could not start beside the sleeping one for lack of GPU memory
  (`beside-failed` when it failed otherwise); after a good beside start the lane is woken and checked once more.

The protocol is engine-agnostic: `CheckedLane` is what it needs from whoever runs the engine (Docker
containers for `lanectl standby check`, a local process on the GPU machine's record, `gpu/vllm_serve/`).
Success yields the measured `standby:` block: weights_gib (host memory the sleep takes), resident_gib (GPU
memory held asleep), gpu_memory_gib (the GPU's size, from vLLM's own startup line or nvidia-smi) and the
highest `--gpu-memory-utilization` a lane beside it can ask for.
"""

from __future__ import annotations

import math
import re
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import field
from typing import Any, Protocol

from lanectl.lanes.standby import SleepEndpoints, StandbyError, resident_gib
from lanectl.records import frozen

FAILURE_KINDS = ("crash", "engine-error", "fingerprint-drift", "slow-wake", "oom-beside", "beside-failed")

# vLLM 0.26.0 (gpu_worker.py), at every start: "Free memory on device (139.29/139.8 GiB) on startup. Desired GPU
# memory utilization is (0.92, 128.62 GiB)." The same words open the error of a start that cannot have its share:
# "Free memory on device cuda:0 (10.2/79.19 GiB) on startup is less than desired GPU memory utilization (0.92, ...".
STARTUP_MEMORY_LINE = re.compile(r"Free memory on device[^(]*\(([0-9.]+)/([0-9.]+) GiB\) on startup")
# What a start that found too little GPU memory says, in vLLM's words and torch's.
OUT_OF_MEMORY = re.compile(r"less than desired GPU memory utilization|CUDA out of memory|OutOfMemoryError|"
                           r"CUDA error: out of memory")
# vLLM's CuMemAllocator, at each level-1 sleep: "CuMemAllocator: sleep freed 54.84 GiB memory in total, of which
# 13.15 GiB is backed up in CPU and the rest 41.69 GiB is discarded directly."
BACKED_UP_LINE = re.compile(r"of which ([0-9.]+) GiB is backed up in CPU")
RESIDENT_LOG_WAIT_SECONDS = 2.0
ENDED_WAIT_SECONDS = 5.0
# An engine that no longer answers, or whose engine core died while its API server still answers (vLLM 0.26.0 to
# 0.33.0: completions 500 with this text for about a second, then the API server exits 0; BRIEF §8).
DEAD_ENGINE = re.compile(r"EngineCore encountered an issue|EngineDeadError|EngineCore encountered a fatal error|"
                         r"no answer|refused|Connection|connection")
STREAM_PROMPT = "Stream {i}: write a long story about the sea."


class CheckedLane(Protocol):
    """The lane under check, as the protocol drives it: its engines' URLs, whether they still run, its log."""

    def urls(self) -> list[tuple[str, str]]:
        """(role, base URL) of each engine that publishes a port, the primary first."""
        ...

    def ended(self) -> str | None:
        """A container or process of the lane that no longer runs, and how it ended; None while all run."""
        ...

    def log_since(self, since: float) -> str:
        """The primary's log from a UNIX time on."""
        ...


@frozen(kw_only=True)
class Meters:
    """The box's memory, as the check reads it: nvidia-smi's used MiB over the lane's GPUs and their total
    (None without nvidia-smi or GPUs), and the kernel's MemAvailable."""

    gpu_used_mib: Callable[[], int | None] = lambda: None
    gpu_total_mib: Callable[[], int | None] = lambda: None
    host_available_gib: Callable[[], float | None] = lambda: None


@frozen(kw_only=True)
class CheckSettings:
    cycles: int
    model: str  # the served model name completions ask for
    prompt: str  # the wake check's prompt and length (the recipe's standby.wake_check, or its default)
    max_tokens: int
    streams: int = 4  # streams in flight at each sleep
    stream_tokens: int = 64
    drain_seconds: float = 30.0  # how long a sleep lets them finish before the rest are cut
    timeout: float = 120.0  # one sleep, wake or completion


@frozen(kw_only=True)
class Cycle:
    index: int  # 1-based
    sleep_seconds: float
    wake_seconds: float | None = None
    in_flight: int | None = None  # requests the engine ran or queued when the sleep was asked
    streams_ok: int = 0
    streams_failed: int = 0
    drained: str = ""  # what the sleep said became of them
    resident_gib: float | None = None  # what vLLM logged it still holds asleep
    backed_up_gib: float | None = None  # what vLLM's allocator logged it copied to host memory
    gpu_used_mib_asleep: int | None = None
    host_available_gib_asleep: float | None = None
    text: str | None = None  # greedy output after the wake
    same: bool | None = None

    def as_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self._record_shown}  # type: ignore[attr-defined]


@frozen(kw_only=True)
class Beside:
    lane: str
    utilization: float | None  # the --gpu-memory-utilization it asked for
    started: bool
    seconds: float
    detail: str
    out_of_memory: bool = False
    gpu_used_mib: int | None = None  # both up, the one asleep
    text_after: str | None = None  # the checked lane's greedy output after the beside lane stopped and it woke
    same_after: bool | None = None


@frozen(kw_only=True)
class Failure:
    kind: str
    cycle: int | None  # None: not inside a cycle (the fingerprint, the beside start)
    detail: str


@frozen(kw_only=True)
class CheckReport:
    lane: str
    cold_start_seconds: float
    fingerprint: str
    cycles: tuple[Cycle, ...]
    memory: dict[str, Any] = field(default_factory=dict)
    beside: Beside | None = None
    failure: Failure | None = None

    @property
    def passed(self) -> bool:
        return self.failure is None

    def standby_block(self) -> dict[str, Any] | None:
        """The recipe's `standby:` fields this run measured; None when it failed or measured too little."""
        if not self.passed:
            return None
        memory = self.memory
        if memory.get("weights_gib") is None or memory.get("resident_gib") is None or memory.get(
                "gpu_memory_gib") is None:
            return None
        slowest = max((c.wake_seconds or 0.0 for c in self.cycles), default=0.0)
        return {"mode": "sleep", "level": 1, "weights_gib": memory["weights_gib"],
                "resident_gib": memory["resident_gib"], "gpu_memory_gib": memory["gpu_memory_gib"],
                # Ten times the slowest wake seen, at least 30 s: the woken lane's gate must fit inside it too.
                "wake_timeout_seconds": max(30, math.ceil(10 * slowest))}

    def as_dict(self) -> dict[str, Any]:
        beside = None
        if self.beside is not None:
            beside = {name: getattr(self.beside, name) for name in self.beside._record_shown}  # type: ignore[attr-defined]
        failure = None if self.failure is None else {"kind": self.failure.kind, "cycle": self.failure.cycle,
                                                     "detail": self.failure.detail}
        return {"lane": self.lane, "passed": self.passed, "failure": failure,
                "cold_start_seconds": round(self.cold_start_seconds, 2), "fingerprint": self.fingerprint,
                "cycles": [c.as_dict() for c in self.cycles], "memory": self.memory, "beside": beside,
                "standby": self.standby_block()}


def run_cycles(lane: CheckedLane, settings: CheckSettings, meters: Meters, *, cold_start_seconds: float,
               start_streams: Callable[[str, str, int, int], StreamsInFlight] | None = None
               ) -> tuple[str, list[Cycle], Failure | None]:
    """The fingerprint before any sleep, then `settings.cycles` sleeps (streams in flight) and wakes, each
    wake's output compared with it. Stops at the first failure and says what it was."""
    start = start_streams or StreamsInFlight.start
    endpoints = [(role, SleepEndpoints(url, settings.timeout)) for role, url in lane.urls()]
    primary_url = lane.urls()[0][1]
    primary = endpoints[0][1]
    try:
        fingerprint = primary.greedy_text(settings.model, settings.prompt, settings.max_tokens)
    except StandbyError as exc:
        return "", [], engine_failure(lane, None, f"the fingerprint before the first sleep: {exc}")
    cycles: list[Cycle] = []
    for index in range(1, settings.cycles + 1):
        cycle, failure = _one_cycle(lane, settings, meters, endpoints, fingerprint, index,
                                    lambda: start(primary_url, settings.model, settings.streams,
                                                  settings.stream_tokens), cold_start_seconds)
        cycles.append(cycle)
        if failure is not None:
            return fingerprint, cycles, failure
    return fingerprint, cycles, None


def _one_cycle(lane: CheckedLane, settings: CheckSettings, meters: Meters,
               endpoints: list[tuple[str, SleepEndpoints]], fingerprint: str, index: int,
               start: Callable[[], StreamsInFlight], cold_start_seconds: float
               ) -> tuple[Cycle, Failure | None]:
    primary = endpoints[0][1]
    streams = None
    seen = 0
    if settings.streams:
        streams = start()
        seen = streams.wait_until_running(primary, settings.timeout)
    # What the engine ran just before the sleep; a short stream may be done by the time it is asked again.
    in_flight = max(seen, primary.in_flight() or 0) if settings.streams else primary.in_flight()
    asked = time.time()
    began = time.monotonic()
    drained = []
    try:
        for role, engine in endpoints:
            drained.append(f"{role}: {engine.sleep(1, settings.drain_seconds)}")
    except StandbyError as exc:
        if streams is not None:
            streams.join(settings.timeout)
        return Cycle(index=index, sleep_seconds=round(time.monotonic() - began, 3), in_flight=in_flight), \
            engine_failure(lane, index, f"sleep: {exc}")
    slept = round(time.monotonic() - began, 3)
    log = _log_with(lane, asked - 1, RESIDENT_LINE_WORDS)
    cycle = Cycle(index=index, sleep_seconds=slept, in_flight=in_flight, drained="; ".join(drained),
                  resident_gib=resident_gib(log), backed_up_gib=_backed_up_gib(log),
                  gpu_used_mib_asleep=meters.gpu_used_mib(), host_available_gib_asleep=meters.host_available_gib())
    began = time.monotonic()
    try:
        for _, engine in endpoints:
            engine.wake_up()
    except StandbyError as exc:
        return cycle, engine_failure(lane, index, f"wake: {exc}")
    woke = round(time.monotonic() - began, 3)
    # Joined after the wake: a stream the engine had not yet scheduled when the sleep came is queued through it.
    ok, failed = streams.join(settings.timeout) if streams is not None else (0, 0)
    cycle = _with(cycle, wake_seconds=woke, streams_ok=ok, streams_failed=failed)
    if failed:
        assert streams is not None
        return cycle, engine_failure(lane, index, f"{failed} of {ok + failed} stream(s) in flight at the sleep did "
                                                  f"not finish: {', '.join(sorted(set(streams.ended)))}")
    try:
        text = primary.greedy_text(settings.model, settings.prompt, settings.max_tokens)
    except StandbyError as exc:
        return cycle, engine_failure(lane, index, f"the greedy output after the wake: {exc}")
    cycle = _with(cycle, text=text, same=text == fingerprint)
    if text != fingerprint:
        return cycle, Failure(kind="fingerprint-drift", cycle=index,
                              detail=f"after wake {index} the greedy output is {text!r}, before the first sleep it "
                                     f"was {fingerprint!r}")
    if woke > cold_start_seconds:
        return cycle, Failure(kind="slow-wake", cycle=index,
                              detail=f"wake {index} took {woke:.2f} s, longer than the cold start's "
                                     f"{cold_start_seconds:.2f} s: a standby would not shorten a rollback")
    return cycle, None


RESIDENT_LINE_WORDS = "memory is still in use"


def _log_with(lane: CheckedLane, since: float, words: str) -> str:
    """The engine writes its sleep lines before it answers, but Docker's log copier may store them a moment
    later (seen under load): looked for up to 2 s."""
    deadline = time.monotonic() + RESIDENT_LOG_WAIT_SECONDS
    while True:
        log = lane.log_since(since)
        if words in log or time.monotonic() >= deadline:
            return log
        time.sleep(0.1)


def _backed_up_gib(log: str) -> float | None:
    found = BACKED_UP_LINE.findall(log)
    return float(found[-1]) if found else None


def _with(cycle: Cycle, **changes: Any) -> Cycle:
    from dataclasses import replace

    return replace(cycle, **changes)


def engine_failure(lane: CheckedLane, index: int | None, detail: str) -> Failure:
    """A crash when a container or process of the lane ended (or the engine no longer answers at all), an
    engine error when it still runs and answered with one."""
    ended = lane.ended()
    if ended is not None:
        return Failure(kind="crash", cycle=index, detail=f"{detail}; {ended}")
    if DEAD_ENGINE.search(detail):
        # vLLM's API server outlives its dead engine core by about a second: how it ended is worth the wait.
        deadline = time.monotonic() + ENDED_WAIT_SECONDS
        while ended is None and time.monotonic() < deadline:
            time.sleep(0.2)
            ended = lane.ended()
        return Failure(kind="crash", cycle=index, detail=detail + (f"; {ended}" if ended else ""))
    return Failure(kind="engine-error", cycle=index, detail=detail)


def beside_start(lane: str, utilization: float | None, *, started: bool, seconds: float, gate_detail: str,
                 log_lines: Iterable[str], gpu_used_mib: int | None = None, text_after: str | None = None,
                 fingerprint: str = "") -> Beside:
    """What a start beside the sleeping lane came to, from its gate's verdict and its engine's log: a start that
    failed is out of memory when a line of its log says so (`OUT_OF_MEMORY`), and that line is then its detail."""
    short = None if started else next((line.strip() for line in log_lines if OUT_OF_MEMORY.search(line)), None)
    return Beside(lane=lane, utilization=utilization, started=started, seconds=seconds,
                  detail=(short or gate_detail)[:400], out_of_memory=short is not None, gpu_used_mib=gpu_used_mib,
                  text_after=text_after, same_after=None if text_after is None else text_after == fingerprint)


def beside_failure(beside: Beside) -> Failure | None:
    if beside.started and (beside.same_after is None or beside.same_after):
        return None
    if beside.started:
        return Failure(kind="fingerprint-drift", cycle=None,
                       detail=f"woken after {beside.lane} ran beside it, the greedy output is {beside.text_after!r}")
    kind = "oom-beside" if beside.out_of_memory else "beside-failed"
    return Failure(kind=kind, cycle=None, detail=f"{beside.lane} could not start beside it asleep: {beside.detail}")


def memory_figures(cycles: list[Cycle] | tuple[Cycle, ...], meters_before: dict[str, Any], startup_log: str,
                   beside_utilization: float | None) -> dict[str, Any]:
    """What the standby block is made of, each figure with what it was read from.

    weights_gib: the host memory one sleep takes, the larger of vLLM's own "backed up in CPU" and the fall of
    MemAvailable from awake to asleep. resident_gib: the GPU memory held asleep, the larger of vLLM's "still in
    use" and nvidia-smi's used memory of the lane's GPUs asleep (a neighbour's start sees the latter). gpu_memory_gib:
    the GPU's size, from vLLM's startup line or nvidia-smi. max_utilization_beside: the highest
    --gpu-memory-utilization a lane sharing the GPU can ask for and still start (vLLM wants free >= share x total)."""
    logged_backup = max((c.backed_up_gib for c in cycles if c.backed_up_gib is not None), default=None)
    host_awake = meters_before.get("host_available_gib_awake")
    asleep = [c.host_available_gib_asleep for c in cycles if c.host_available_gib_asleep is not None]
    host_drop = round(host_awake - min(asleep), 2) if host_awake is not None and asleep else None
    weights = _ceil(max(v for v in (logged_backup, host_drop, 0.0) if v is not None), 1) if (
        logged_backup is not None or host_drop is not None) else None
    logged_resident = max((c.resident_gib for c in cycles if c.resident_gib is not None), default=None)
    smi_asleep = max((c.gpu_used_mib_asleep for c in cycles if c.gpu_used_mib_asleep is not None), default=None)
    measured = [v for v in (logged_resident, None if smi_asleep is None else smi_asleep / 1024) if v is not None]
    resident = _ceil(max(measured), 2) if measured else None
    total = _gpu_total_gib(startup_log, meters_before.get("gpu_total_mib"))
    figures: dict[str, Any] = {
        "weights_gib": weights, "backed_up_gib_logged": logged_backup, "host_available_gib_awake": host_awake,
        "host_available_gib_asleep_min": min(asleep) if asleep else None, "host_taken_gib": host_drop,
        "host_available_gib_before_start": meters_before.get("host_available_gib_before_start"),
        "resident_gib": resident, "resident_gib_logged": logged_resident, "gpu_used_mib_asleep_max": smi_asleep,
        "gpu_used_mib_before_start": meters_before.get("gpu_used_mib_before_start"), "gpu_memory_gib": total,
    }
    if total is not None and resident is not None:
        most = max(0.0, math.floor(100 * (total - resident) / total) / 100)
        figures["max_utilization_beside"] = most
        if beside_utilization is not None:
            figures["beside_utilization"] = beside_utilization
            figures["beside_fits_by_numbers"] = beside_utilization <= most
    return figures


def _gpu_total_gib(startup_log: str, smi_total_mib: int | None) -> float | None:
    found = STARTUP_MEMORY_LINE.findall(startup_log)
    if found:
        return float(found[-1][1])
    return round(smi_total_mib / 1024, 2) if smi_total_mib else None


def _ceil(value: float, digits: int) -> float:
    scale = 10 ** digits
    return math.ceil(round(value * scale, 6)) / scale


class StreamsInFlight:
    """N streaming completions sent at once, one request each, in threads of their own, so that a sleep is asked
    while they run. (The load generator's closed loop would send a new request at every finish: one sent while
    the engine sleeps waits, queued, until the wake.)"""

    def __init__(self, base_url: str, model: str, count: int, max_tokens: int) -> None:
        self.count = count
        self.ended: list[str] = []  # one per stream: its finish_reason, or what went wrong
        self._lock = threading.Lock()
        body = {"model": model, "prompt": "", "max_tokens": max_tokens, "temperature": 0, "stream": True,
                "ignore_eos": True}
        self._threads = [threading.Thread(target=self._one, args=(base_url, {**body, "prompt": STREAM_PROMPT.format(
            i=i)}), daemon=True) for i in range(count)]

    @classmethod
    def start(cls, base_url: str, model: str, count: int, max_tokens: int) -> StreamsInFlight:
        streams = cls(base_url, model, count, max_tokens)
        for thread in streams._threads:
            thread.start()
        return streams

    def _one(self, base_url: str, body: dict[str, Any]) -> None:
        import httpx

        reason = "ended without [DONE]"
        try:
            with httpx.stream("POST", base_url.rstrip("/") + "/v1/completions", json=body,
                              timeout=httpx.Timeout(10.0, read=600.0)) as response:
                if response.status_code != 200:
                    reason = f"HTTP {response.status_code}"
                for line in response.iter_lines() if response.status_code == 200 else ():
                    reason = _stream_line(line, reason)
        except httpx.HTTPError as exc:
            reason = f"{type(exc).__name__}: {exc}"
        with self._lock:
            self.ended.append(reason)

    def wait_until_running(self, engine: SleepEndpoints, timeout: float) -> int:
        """Until the engine says the streams run (vllm:num_requests_running), or `timeout` passed; the most it
        said ran."""
        deadline = time.monotonic() + min(timeout, 30)
        most = 0
        while time.monotonic() < deadline and len(self.ended) < self.count:
            most = max(most, requests_running(engine) or 0)
            if most >= self.count:
                break
            time.sleep(0.05)
        return most

    def join(self, timeout: float) -> tuple[int, int]:
        """(finished well, failed) once every stream ended; a stream cut by the drain or still open counts as
        failed."""
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        ok = sum(1 for reason in self.ended if reason in ("length", "stop"))
        return ok, self.count - ok


RUNNING = re.compile(r"^vllm:num_requests_running(?:\{[^}]*\})? ([0-9.eE+-]+)$", re.MULTILINE)


def requests_running(engine: SleepEndpoints) -> int | None:
    """Requests the engine is stepping (not those it has waiting: a sleep with mode=wait finishes the running
    ones, and a request still waiting is queued through the sleep)."""
    from lanectl.health.engine_http import EngineUnanswered

    try:
        answer = engine.engine.request("GET", "/metrics", timeout=2.0)
    except EngineUnanswered:
        return None
    values = RUNNING.findall(answer.text) if answer.status == 200 else []
    return round(sum(float(v) for v in values)) if values else None


def _stream_line(line: str, reason: str) -> str:
    """A stream's state after one SSE line: its finish_reason once sent, `length` kept once [DONE] follows."""
    import json

    if not line.startswith("data: "):
        return reason
    payload = line[len("data: "):]
    if payload == "[DONE]":
        return reason.removesuffix(" (no [DONE])")
    try:
        choices = json.loads(payload).get("choices") or []
    except (ValueError, AttributeError):
        return f"unreadable chunk {payload[:60]!r}"
    for choice in choices:
        if isinstance(choice, dict) and choice.get("finish_reason"):
            return f"{choice['finish_reason']} (no [DONE])"
    return reason
