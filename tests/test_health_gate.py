"""The health gate's rules, with in-memory fakes for the engine, its log, its container and the clock.

The fake clock only moves when the gate sleeps (or a fake probe takes time), so a 20-minute budget
runs in microseconds and every elapsed time below is exact.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import pytest

from lanectl.health.gate import (
    CONTAINER_EXITED,
    FATAL_ENGINE_LINE,
    FATAL_ENGINE_LINES,
    STARTUP_BUDGET,
    CompanionGate,
    ContainerStatus,
    GateProgress,
    HealthGate,
    fatal_engine_line,
)
from lanectl.health.probe import ProbeResult
from lanectl.recipe.model import GenerationProbe, Health, StartupLog, StartupStall

MODEL = "demo-model"
KV_LINE = "INFO 10-17 09:00:10 [kv_cache_utils.py:868] GPU KV cache size: 4,400,013 tokens"
FLASHINFER = "2026-10-17 09:00:11,123 - INFO - autotuner.py:262 - flashinfer.jit: "
CONFIGS_LINE = FLASHINFER + "[Autotuner]: Loaded 210 configs from /root/.cache/vllm/flashinfer_autotune_cache"
AUTOTUNE_STALL_LINE = FLASHINFER + "[Autotuner]: Autotuning process starts ..."
AUTOTUNE_START = "(EngineCore pid=412) " + FLASHINFER + "[Autotuner]: Autotuning process starts ..."
AUTOTUNE_END = "(EngineCore pid=412) " + FLASHINFER + "[Autotuner]: Autotuning process ends"
AUTOTUNE_STALL = StartupStall(after="Autotuning process starts", until="Autotuning process ends", minutes=10,
                              name="autotune", why="a retune takes 74 min")
EXPECT_KV = r"GPU KV cache size: [0-9,]+ tokens"
EXPECT_CONFIGS = r"Loaded [0-9]+ configs"


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0  # not zero, so a gate that confuses elapsed with monotonic time shows it
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        # time.sleep refuses a negative length; so does this clock, or a gate that would crash
        # on a real clock passes here.
        if seconds < 0:
            raise ValueError("sleep length must be non-negative")
        self.sleeps.append(seconds)
        self.now += seconds


class FakeEngine:
    """Refuses connections until `listening_at` seconds into the run, then answers as configured.

    `generation` scripts the generation probe's outcomes in order (True after the script runs out);
    a failed generation takes `generation_timeout` seconds of clock time, like a real timeout.
    """

    def __init__(
        self,
        clock: FakeClock,
        *,
        listening_at: float = 0.0,
        health_status: int = 200,
        models: tuple[str, ...] = (MODEL,),
        generation: tuple[bool, ...] = (),
        generation_timeout: float = 10.0,
        answer_seconds: float = 0.0,
    ) -> None:
        self.clock = clock
        self.t0 = clock.now
        self.listening_at = listening_at
        self.health_status = health_status
        self.models = models
        self.generation = list(generation)
        self.generation_timeout = generation_timeout
        self.answer_seconds = answer_seconds
        self.health_calls: list[float] = []
        self.generate_calls: list[float] = []

    def _listening(self) -> bool:
        return self.clock.now - self.t0 >= self.listening_at

    def _answer(self) -> None:
        self.clock.now += self.answer_seconds

    def health_ok(self) -> ProbeResult:
        self.health_calls.append(self.clock.now - self.t0)
        self._answer()
        if not self._listening():
            return ProbeResult(False, "/health: connection refused", 0.0)
        return ProbeResult(self.health_status == 200, f"/health answered {self.health_status}", 0.0)

    def models_lists_served_model(self) -> ProbeResult:
        if not self._listening():
            return ProbeResult(False, "/v1/models: connection refused", 0.0)
        if MODEL in self.models:
            return ProbeResult(True, f"/v1/models lists '{MODEL}'", 0.0)
        return ProbeResult(False, f"/v1/models does not list '{MODEL}' (it lists: {', '.join(self.models)})", 0.0)

    def generate(self) -> ProbeResult:
        self.generate_calls.append(self.clock.now - self.t0)
        if self.generation and not self.generation.pop(0):
            self.clock.now += self.generation_timeout
            detail = f"generation probe timed out after {self.generation_timeout:.1f} s (health 200: engine stuck?)"
            return ProbeResult(False, detail, self.generation_timeout)
        return ProbeResult(True, "/v1/completions generated 3 tokens in 0.05 s", 0.05)


class FakeLog:
    """Lines that appear at given seconds into the run; each call returns those not returned yet."""

    def __init__(self, clock: FakeClock, timeline: Sequence[tuple[float, str]]) -> None:
        self.clock = clock
        self.t0 = clock.now
        self.timeline = sorted(timeline, key=lambda entry: entry[0])
        self.returned = 0

    def new_lines(self) -> list[str]:
        due = [line for at, line in self.timeline if at <= self.clock.now - self.t0]
        lines, self.returned = due[self.returned :], len(due)
        return lines


class FakeContainer:
    def __init__(self, clock: FakeClock, *, exits_at: float | None = None, exit_code: int | None = 1,
                 detail: str = "exited with code 1") -> None:
        self.clock = clock
        self.t0 = clock.now
        self.exits_at = exits_at
        self.exit_code = exit_code
        self.detail = detail

    def status(self) -> ContainerStatus:
        if self.exits_at is not None and self.clock.now - self.t0 >= self.exits_at:
            return ContainerStatus(False, self.exit_code, self.detail)
        return ContainerStatus(True)


def health(budget_minutes: float = 20, poll: float = 5, expect: tuple[str, ...] = (EXPECT_KV, EXPECT_CONFIGS),
           forbid: tuple[str, ...] = (r"^\[Autotuner\]: Autotuning process starts",),
           stall: tuple[StartupStall, ...] = ()) -> Health:
    return Health(
        startup_budget_minutes=budget_minutes,
        poll_interval_seconds=poll,
        served_model_name=MODEL,
        startup_log=StartupLog(expect=list(expect), forbid=list(forbid), stall=list(stall)),
        generation_probe=GenerationProbe(timeout_seconds=10),
    )


def gate(settings: Health, clock: FakeClock, engine: FakeEngine, log: Sequence[tuple[float, str]] | None = None,
         container: FakeContainer | None = None, progress: list[GateProgress] | None = None) -> HealthGate:
    return HealthGate(
        settings,
        engine,
        FakeLog(clock, log if log is not None else [(0, KV_LINE), (0, CONFIGS_LINE)]),
        container or FakeContainer(clock),
        clock,
        on_progress=(progress.append if progress is not None else lambda p: None),
    )


def test_passes_once_endpoints_answer_and_the_expected_lines_appeared() -> None:
    clock = FakeClock()
    engine = FakeEngine(clock, listening_at=12)
    result = gate(health(), clock, engine, log=[(3, "INFO loading"), (8, KV_LINE), (14, CONFIGS_LINE)]).wait()

    assert result.passed and result.failed_check is None
    assert result.seconds == 15  # polls at 0, 5, 10, 15: the configs line appears at 14
    assert clock.sleeps == [5, 5, 5]
    assert engine.generate_calls == [15]
    assert result.missing == ()
    assert result.exit_code is None
    assert result.log_tail == ("INFO loading", KV_LINE, CONFIGS_LINE)
    assert result.detail == (
        "lane ready after 15 s: /health answered 200, /v1/models lists 'demo-model', "
        "2 expected startup log lines seen, /v1/completions generated 3 tokens in 0.05 s"
    )


def test_a_forbidden_line_fails_at_once_and_quotes_the_line() -> None:
    clock = FakeClock()
    engine = FakeEngine(clock, listening_at=600)
    log = [(0, "INFO Starting to load model /model..."), (9, KV_LINE), (30, AUTOTUNE_STALL_LINE)]
    result = gate(health(), clock, engine, log=log).wait()

    assert not result.passed
    assert result.failed_check == "startup-log-forbidden"
    assert result.seconds == 30
    assert result.detail == (r"startup log line matches forbidden '^\[Autotuner\]: Autotuning process starts': "
                             f"{AUTOTUNE_STALL_LINE}")
    assert result.log_tail[-1] == AUTOTUNE_STALL_LINE
    assert result.missing == (
        "/health 200",
        "/v1/models lists 'demo-model'",
        f"startup log line matching '{EXPECT_CONFIGS}'",
    )
    assert result.exit_code is None


def test_a_fatal_engine_line_fails_at_once_even_without_a_forbid_rule() -> None:
    clock = FakeClock()
    engine = FakeEngine(clock, listening_at=600)
    fatal = "ERROR 10-17 09:00:03 [core.py:708] EngineCore failed to start."
    log = [(0, "INFO Starting to load model /model..."), (3, fatal), (3, "Traceback (most recent call last):")]
    result = gate(health(forbid=()), clock, engine, log=log).wait()

    assert result.failed_check == "fatal-engine-line"
    assert result.seconds == 5
    assert result.detail == f"the engine logged a fatal line: {fatal}"
    assert result.log_tail == tuple(line for _, line in log)


def test_a_crash_that_logged_its_reason_is_reported_by_the_fatal_line_with_the_exit_code() -> None:
    clock = FakeClock()
    engine = FakeEngine(clock, listening_at=600)
    fatal = "ERROR 10-17 09:00:03 [core.py:708] EngineCore failed to start."
    container = FakeContainer(clock, exits_at=7, exit_code=1, detail="exited with code 1")
    result = gate(health(), clock, engine, log=[(7, fatal)], container=container).wait()

    assert result.failed_check == "fatal-engine-line"
    assert result.exit_code == 1
    assert result.seconds == 10
    assert result.detail == f"the engine logged a fatal line: {fatal}; container exited with code 1"


def test_a_container_that_exits_fails_at_once_with_its_exit_code() -> None:
    clock = FakeClock()
    engine = FakeEngine(clock, listening_at=600)
    container = FakeContainer(clock, exits_at=42, exit_code=137, detail="exited with code 137")
    result = gate(health(), clock, engine, container=container).wait()

    assert result.failed_check == "container-exited"
    assert result.exit_code == 137
    assert result.seconds == 45
    assert result.detail == "container exited with code 137 after 45 s, before the lane was ready"
    assert result.missing == ("/health 200", "/v1/models lists 'demo-model'")


def test_a_container_that_is_gone_fails_without_an_exit_code() -> None:
    clock = FakeClock()
    container = FakeContainer(clock, exits_at=0, exit_code=None, detail="gone")
    engine = FakeEngine(clock)
    result = gate(health(), clock, engine, container=container).wait()

    assert result.failed_check == "container-exited"
    assert result.exit_code is None
    assert result.detail == "container gone after 0 s, before the lane was ready"
    assert engine.health_calls == []  # a dead container is not probed


def test_budget_exhaustion_lists_exactly_what_is_still_missing() -> None:
    clock = FakeClock()
    engine = FakeEngine(clock, listening_at=10_000)
    result = gate(health(budget_minutes=2), clock, engine, log=[(20, KV_LINE)]).wait()

    assert result.failed_check == "startup-budget"
    assert result.seconds == 120
    assert result.missing == (
        "/health 200",
        "/v1/models lists 'demo-model'",
        f"startup log line matching '{EXPECT_CONFIGS}'",
    )
    assert result.detail == (
        "after 120 s still waiting for: /health 200; /v1/models lists 'demo-model'; "
        f"startup log line matching '{EXPECT_CONFIGS}'. "
        "Last answers: /health: connection refused; /v1/models: connection refused"
    )
    assert len(engine.health_calls) == 25  # 0, 5, ..., 120: the last poll lands on the deadline


def test_budget_exhaustion_with_the_wrong_served_model_names_only_the_model_list() -> None:
    clock = FakeClock()
    engine = FakeEngine(clock, models=("other",))
    result = gate(health(budget_minutes=1, expect=()), clock, engine).wait()

    assert result.failed_check == "startup-budget"
    assert result.missing == ("/v1/models lists 'demo-model'",)
    assert result.detail == (
        "after 60 s still waiting for: /v1/models lists 'demo-model'. "
        "Last answers: /v1/models does not list 'demo-model' (it lists: other)"
    )
    assert engine.generate_calls == []  # never ready, so never asked to generate


def test_a_hung_engine_fails_the_generation_check_long_before_the_budget() -> None:
    clock = FakeClock()
    engine = FakeEngine(clock, generation=(False,) * 100, generation_timeout=10)
    result = gate(health(budget_minutes=20), clock, engine).wait()

    assert result.failed_check == "generation"
    # Tries at 0, 15 and 30: each times out after 10 s, and the next poll is the next 5-s tick after that.
    assert engine.generate_calls == [0, 15, 30]
    assert result.seconds == 40
    assert result.missing == ("/v1/completions generates a token",)
    assert result.detail == (
        "the lane looked ready but the generation probe failed 3 times in a row; "
        "last: generation probe timed out after 10.0 s (health 200: engine stuck?)"
    )


def test_a_generation_that_succeeds_on_the_third_try_passes() -> None:
    clock = FakeClock()
    engine = FakeEngine(clock, generation=(False, False, True), generation_timeout=1)
    result = gate(health(), clock, engine).wait()

    assert result.passed
    assert engine.generate_calls == [0, 5, 10]


def test_a_budget_that_ends_while_generation_fails_lists_the_token_as_missing() -> None:
    clock = FakeClock()
    engine = FakeEngine(clock, listening_at=55, generation=(False,) * 10, generation_timeout=1)
    result = gate(health(budget_minutes=1), clock, engine).wait()

    assert result.failed_check == "startup-budget"
    assert result.missing == ("/v1/completions generates a token",)
    assert engine.generate_calls == [55, 60]
    assert result.detail == (
        "after 60 s still waiting for: /v1/completions generates a token. "
        "Last answers: generation probe timed out after 1.0 s (health 200: engine stuck?)"
    )


def test_a_slow_start_passes_and_is_never_failed_inside_its_budget() -> None:
    clock = FakeClock()
    engine = FakeEngine(clock, listening_at=19 * 60 + 30)  # the 92-minute network-share boot, scaled down
    log = [(60 * minute, f"INFO still loading shard {minute}") for minute in range(19)]
    log += [(19 * 60, KV_LINE), (19 * 60 + 20, CONFIGS_LINE)]
    progress: list[GateProgress] = []
    result = gate(health(budget_minutes=20), clock, engine, log=log, progress=progress).wait()

    assert result.passed
    assert result.seconds == 19 * 60 + 30
    assert len(progress) == len(engine.health_calls) - 1 == 234
    assert all(p.missing for p in progress)
    assert progress[0].missing == (
        "/health 200",
        "/v1/models lists 'demo-model'",
        f"startup log line matching '{EXPECT_KV}'",
        f"startup log line matching '{EXPECT_CONFIGS}'",
    )
    assert progress[-1].missing == ("/health 200", "/v1/models lists 'demo-model'")
    assert progress[-1].satisfied == (
        f"startup log line matching '{EXPECT_KV}'",
        f"startup log line matching '{EXPECT_CONFIGS}'",
    )
    assert progress[-1].budget == 1200 and progress[-1].elapsed == 19 * 60 + 25
    assert progress[-1].last_log_line == CONFIGS_LINE


def test_a_lane_ready_at_the_very_end_of_its_budget_passes() -> None:
    clock = FakeClock()
    engine = FakeEngine(clock, listening_at=600)
    result = gate(health(budget_minutes=10, poll=7), clock, engine).wait()

    assert result.passed
    assert result.seconds == 600


def test_polls_on_the_interval_and_once_more_at_the_deadline() -> None:
    clock = FakeClock()
    engine = FakeEngine(clock, listening_at=10_000)
    result = gate(health(budget_minutes=1, poll=7), clock, engine).wait()

    assert result.failed_check == "startup-budget"
    assert clock.sleeps == [7] * 8 + [4]
    assert engine.health_calls == [0, 7, 14, 21, 28, 35, 42, 49, 56, 60]


def test_slow_answers_do_not_stretch_the_poll_interval() -> None:
    clock = FakeClock()
    engine = FakeEngine(clock, listening_at=10_000, answer_seconds=2)
    gate(health(budget_minutes=0.5, poll=5), clock, engine).wait()

    assert engine.health_calls == [0, 5, 10, 15, 20, 25, 30]
    assert clock.sleeps == [3] * 6


def test_the_log_tail_keeps_the_last_30_lines() -> None:
    clock = FakeClock()
    engine = FakeEngine(clock, listening_at=10_000)
    log = [(i / 2, f"line {i}") for i in range(100)]
    result = gate(health(budget_minutes=1, expect=()), clock, engine, log=log).wait()

    assert result.log_tail == tuple(f"line {i}" for i in range(70, 100))


def test_recipe_fatal_lines_can_be_added() -> None:
    clock = FakeClock()
    settings = health()
    extra = (*FATAL_ENGINE_LINES, re.compile(r"NCCL error"))
    result = HealthGate(
        settings,
        FakeEngine(clock, listening_at=600),
        FakeLog(clock, [(5, "ERROR 10-17 09:00:03 [pynccl.py:41] NCCL error: unhandled system error")]),
        FakeContainer(clock),
        clock,
        fatal_lines=extra,
    ).wait()

    assert result.failed_check == "fatal-engine-line"
    assert result.seconds == 5


@pytest.mark.parametrize(
    "line",
    [
        "ERROR 10-17 09:00:03 [core.py:710] EngineCore encountered a fatal error.",
        "ERROR 10-17 09:00:03 [core.py:708] EngineCore failed to start.",
        "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace (above).",
        "(EngineCore_DP0 pid=137) ERROR 10-29 08:32:36 [multiproc_executor.py:154] "
        "Worker proc VllmWorker-0 died unexpectedly, shutting down executor.",
        "WARNING 10-29 08:32:59 [core_client.py:520] [shutdown] MPClient: engine core exited unexpectedly; "
        "starting cleanup",
        "ERROR 10-17 09:00:03 [gpu_model_runner.py:88] CUDA error: an illegal memory access was encountered",
    ],
)
def test_fatal_engine_lines_from_the_brief_are_recognised(line: str) -> None:
    assert fatal_engine_line(line)


@pytest.mark.parametrize(
    "line",
    [
        KV_LINE,
        CONFIGS_LINE,
        "INFO:     Application startup complete.",
        "INFO 10-17 09:00:03 [core.py:80] EngineCore started",
        "WARNING 10-17 09:00:03 [rejection_sampler.py:41] rejection sampler read past draft buffer (1 so far)",
        "INFO 10-17 09:00:03 [multiproc_executor.py:100] Worker proc VllmWorker-0 started",
    ],
)
def test_ordinary_lines_are_not_fatal(line: str) -> None:
    assert not fatal_engine_line(line)


# -- stall rules: a phase that began must end within its minutes ---------------------------------------


def test_an_autotune_that_starts_and_goes_silent_fails_when_its_minutes_are_up_naming_the_stall() -> None:
    clock = FakeClock()
    engine = FakeEngine(clock, listening_at=10_000)
    log = [(9, KV_LINE), (12, CONFIGS_LINE), (12, AUTOTUNE_START)]
    result = gate(health(forbid=(), stall=(AUTOTUNE_STALL,)), clock, engine, log=log).wait()

    assert result.failed_check == "startup-stall"
    # Seen at the poll of 15 s, so due at 615 s: the gate wakes for it between its 5 s polls.
    assert result.seconds == 615
    assert result.detail == (
        "autotune started 10 min ago and has not ended (no line matching 'Autotuning process ends' within "
        f"10 min): a retune takes 74 min; began with: {AUTOTUNE_START}"
    )
    assert result.missing == ("/health 200", "/v1/models lists 'demo-model'")


def test_an_autotune_that_ends_lets_the_start_pass_however_long_it_took_before() -> None:
    clock = FakeClock()
    engine = FakeEngine(clock, listening_at=700)
    log = [(9, KV_LINE), (12, CONFIGS_LINE), (12, AUTOTUNE_START), (590, AUTOTUNE_END)]
    result = gate(health(forbid=(), stall=(AUTOTUNE_STALL,)), clock, engine, log=log).wait()

    assert result.passed, result.detail
    assert result.seconds == 700


def test_a_stall_rule_without_a_name_is_called_by_its_regex() -> None:
    clock = FakeClock()
    stall = StartupStall(after="Autotuning process starts", until="Autotuning process ends", minutes=0.1)
    result = gate(health(forbid=(), stall=(stall,)), clock, FakeEngine(clock, listening_at=10_000),
                  log=[(0, AUTOTUNE_START)]).wait()

    assert result.failed_check == "startup-stall"
    assert result.seconds == 6
    assert result.detail.startswith("'Autotuning process starts' started 6 s ago and has not ended")


def test_a_stall_that_falls_due_while_the_endpoints_answer_slowly_fails_at_once() -> None:
    # Seen at the poll of 5 s, so due at 11 s; the health probe takes 4 s, so the poll of 10 s ends at
    # 14 s, past the stall's deadline, when the gate plans its next poll. It must not ask the clock to
    # sleep backwards: it looks again at once and reports the stall.
    clock = FakeClock()
    stall = StartupStall(after="Autotuning process starts", until="Autotuning process ends", minutes=0.1)
    engine = FakeEngine(clock, listening_at=10_000, answer_seconds=4)
    result = gate(health(forbid=(), stall=(stall,)), clock, engine, log=[(5, AUTOTUNE_START)]).wait()

    assert result.failed_check == "startup-stall"
    assert result.seconds == 14
    assert all(s >= 0 for s in clock.sleeps)


# A stall that tells a warm phase (flashinfer found its tuned results) from a cold one: the first start of a new vLLM
# or flashinfer release retunes from scratch, once, and is allowed to.
COLD_AWARE_STALL = StartupStall(after="Autotuning process starts", until="Autotuning process ends", minutes=10,
                                name="autotune", why="a retune takes 74 min",
                                warm=r"Loaded 210 configs|Preloaded 210/[0-9]+ managed cache entries", cold_minutes=90)
PRELOADED_LINE = FLASHINFER + "[Autotuner]: Preloaded 210/210 managed cache entries into memory"


def test_a_cold_autotune_may_take_its_cold_minutes_and_the_budget_grows_by_them() -> None:
    """No 'Loaded N configs' before the phase: a 74-minute retune ends, the lane answers after it, and the start
    passes although the 20-minute budget alone ran out long before."""
    clock = FakeClock()
    engine = FakeEngine(clock, listening_at=80 * 60)
    log = [(9, KV_LINE), (12, AUTOTUNE_START), (12 + 74 * 60, AUTOTUNE_END)]
    result = gate(health(forbid=(), expect=(EXPECT_KV,), stall=(COLD_AWARE_STALL,)), clock, engine, log=log).wait()

    assert result.passed, result.detail
    assert result.seconds == 80 * 60


def test_a_cold_autotune_that_outlasts_its_cold_minutes_fails_and_says_it_ran_cold() -> None:
    clock = FakeClock()
    engine = FakeEngine(clock, listening_at=10_000)
    log = [(9, KV_LINE), (12, AUTOTUNE_START)]
    result = gate(health(forbid=(), expect=(EXPECT_KV,), stall=(COLD_AWARE_STALL,)), clock, engine, log=log).wait()

    assert result.failed_check == "startup-stall"
    assert result.seconds == 15 + 90 * 60
    assert result.detail.startswith(
        "autotune started from no cache (no line matching 'Loaded 210 configs|Preloaded 210/[0-9]+ managed cache "
        "entries') 90 min ago and has not ended (no line matching 'Autotuning process ends' within 90 min)")


@pytest.mark.parametrize("warm_line", [CONFIGS_LINE, "(EngineCore pid=412) " + PRELOADED_LINE])
def test_a_warm_autotune_is_held_to_its_minutes_whether_the_cache_line_comes_before_or_inside_it(
        warm_line: str) -> None:
    """vLLM's legacy cache logs 'Loaded N configs' before the phase; 0.33.0's managed store logs 'Preloaded N/M'
    just after it began. Either way the cache was there, and a phase that then runs long is the fault."""
    clock = FakeClock()
    engine = FakeEngine(clock, listening_at=10_000)
    warm_at = 11 if "Loaded" in warm_line else 13
    log = [(9, KV_LINE), (warm_at, warm_line), (12, AUTOTUNE_START)]
    log.sort(key=lambda item: item[0])
    result = gate(health(forbid=(), expect=(EXPECT_KV,), stall=(COLD_AWARE_STALL,)), clock, engine, log=log).wait()

    assert result.failed_check == "startup-stall"
    assert result.seconds == 615
    assert result.detail.startswith("autotune started 10 min ago and has not ended")


def test_cold_minutes_need_the_warm_record_and_are_never_below_the_warm_limit() -> None:
    with pytest.raises(ValueError, match="cold_minutes needs `warm`"):
        StartupStall(after="a", until="b", minutes=10, cold_minutes=90)
    with pytest.raises(ValueError, match=r"cold_minutes \(5\) is below minutes \(10\)"):
        StartupStall(after="a", until="b", minutes=10, warm="w", cold_minutes=5)


# -- rules read what the engine wrote, never what a client put in the log ------------------------------


def test_an_access_line_naming_a_forbidden_or_fatal_text_changes_nothing() -> None:
    clock = FakeClock()
    engine = FakeEngine(clock, listening_at=10)
    hostile = [
        (3, 'INFO:     172.17.0.1:51402 - "GET /Autotuning%20process%20starts HTTP/1.1" 404 Not Found'),
        (3, '(APIServer pid=1) INFO:     172.17.0.1:51402 - "GET /EngineDeadError HTTP/1.1" 404 Not Found'),
        (4, "(APIServer pid=1) INFO 10-17 09:00:04 [logger.py:49] Received request cmpl-1: prompt: "
            "'EngineCore encountered a fatal error. Autotuning process starts', params: SamplingParams(n=1)"),
    ]
    result = gate(health(), clock, engine, log=[*hostile, (8, KV_LINE), (9, CONFIGS_LINE)]).wait()

    assert result.passed, result.detail


def test_an_expected_text_in_an_access_line_does_not_satisfy_the_rule() -> None:
    clock = FakeClock()
    engine = FakeEngine(clock, listening_at=0)
    fake = '(APIServer pid=1) INFO:     10.0.0.9:4040 - "GET /Loaded%20210%20configs HTTP/1.1" 404 Not Found'
    result = gate(health(budget_minutes=1), clock, engine, log=[(0, KV_LINE), (1, fake),
                                                                (1, fake.replace("%20", " "))]).wait()

    assert result.failed_check == "startup-budget"
    assert result.missing == (f"startup log line matching '{EXPECT_CONFIGS}'",)


def test_an_exit_with_code_0_is_reported_as_the_engine_death_it_is() -> None:
    from lanectl.health.engine_exit import exit_detail

    assert exit_detail("exited", 0) == "exited with code 0 (vLLM exits 0 when its engine core dies)"
    assert exit_detail("exited", 137) == "exited with code 137"
    clock = FakeClock()
    container = FakeContainer(clock, exits_at=3, exit_code=0, detail=exit_detail("exited", 0))
    result = gate(health(), clock, FakeEngine(clock, listening_at=600), container=container).wait()
    assert (result.failed_check, result.exit_code) == ("container-exited", 0)
    assert result.detail == ("container exited with code 0 (vLLM exits 0 when its engine core dies) after 5 s, "
                             "before the lane was ready")


# -- a companion's readiness, beside the primary's gate --------------------------------------------------------------

def companion_gate(clock: FakeClock, engine: FakeEngine, budget: float, log: Sequence[tuple[float, str]] = (),
                   container: FakeContainer | None = None) -> CompanionGate:
    return CompanionGate("rtx", health(poll=5), engine, FakeLog(clock, log), container or FakeContainer(clock),
                         clock, budget)


def test_a_companion_passes_at_the_first_poll_that_finds_its_health_200() -> None:
    clock = FakeClock()
    engine = FakeEngine(clock, listening_at=7)
    result = companion_gate(clock, engine, budget=60).wait()
    assert (result.passed, result.seconds, result.missing) == (True, 10, ())
    assert result.detail == "rtx: ready after 10 s (/health answered 200)"
    assert engine.health_calls == [0, 5, 10]


def test_a_companion_still_loading_when_the_budget_ends_fails_saying_what_it_waited_for() -> None:
    clock = FakeClock()
    result = companion_gate(clock, FakeEngine(clock, listening_at=100), budget=12).wait()
    assert (result.passed, result.failed_check, result.seconds) == (False, STARTUP_BUDGET, 12)
    assert result.detail == ("rtx: after 12 s more, still waiting for its rtx companion's /health 200. "
                             "Last answer: /health: connection refused")
    assert result.missing == ("its rtx companion's /health 200",)


def test_a_companion_with_no_budget_left_is_still_checked_once() -> None:
    clock = FakeClock()
    assert companion_gate(clock, FakeEngine(clock), budget=-3).wait().passed
    clock = FakeClock()
    failed = companion_gate(clock, FakeEngine(clock, listening_at=1), budget=0).wait()
    assert (failed.failed_check, failed.seconds) == (STARTUP_BUDGET, 0)


def test_a_companion_that_exits_or_logs_a_fatal_line_fails_at_once() -> None:
    clock = FakeClock()
    exited = companion_gate(clock, FakeEngine(clock, listening_at=100), budget=600,
                            container=FakeContainer(clock, exits_at=6)).wait()
    assert (exited.failed_check, exited.exit_code, exited.seconds) == (CONTAINER_EXITED, 1, 10)
    assert exited.detail == "rtx: container exited with code 1 after 10 s more, before it was ready"
    clock = FakeClock()
    fatal = companion_gate(clock, FakeEngine(clock, listening_at=100), budget=600,
                           log=[(3, "ERROR 10-17 09:00:03 [core.py:708] EngineCore failed to start.")]).wait()
    assert (fatal.failed_check, fatal.seconds) == (FATAL_ENGINE_LINE, 5)
    assert fatal.detail == ("rtx: the engine logged a fatal line: ERROR 10-17 09:00:03 [core.py:708] EngineCore "
                            "failed to start.")
