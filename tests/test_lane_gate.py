"""A lane's gate runs its companions' beside its primary's (lanectl.health.lane_gate), on the box and the fleet alike.

The gates here are small stand-ins on the real clock, in tenths of a second: what is under test is how the
lane's gate runs them (together, stopping each other, the last check of a budget), not the gates themselves,
which tests/test_health_gate.py holds to their rules.
"""

from __future__ import annotations

import time
from dataclasses import replace

from lanectl.health.gate import CONTAINER_EXITED, INTERRUPTED, STARTUP_BUDGET, Clock, GateResult
from lanectl.health.lane_gate import gate_lane


def passed(detail: str) -> GateResult:
    return GateResult(True, None, detail, 0.0, (), ())


def failed(check: str, detail: str) -> GateResult:
    return GateResult(False, check, detail, 0.0, (), ("something",))


def primary_ready_after(seconds: float, log: list[str], outcome: GateResult | None = None):
    """A primary that needs `seconds` to load, polling its stop every 10 ms."""

    def gate(interrupted) -> GateResult:
        began = time.monotonic()
        while time.monotonic() - began < seconds:
            why = interrupted()
            if why is not None:
                log.append(f"primary stopped: {why}")
                return failed(INTERRUPTED, f"interrupted ({why})")
            time.sleep(0.01)
        log.append("primary done")
        return replace(outcome or passed("primary ok"), seconds=time.monotonic() - began)

    return gate


def companion_ready_after(seconds: float, log: list[str], outcome: GateResult | None = None, poll: float = 0.05):
    """A companion whose engine is ready `seconds` after it was made (as the lane's gate began), polled every
    `poll` on the clock it is given."""
    ready_at = time.monotonic() + seconds

    def gate(budget: float, clock: Clock, interrupted) -> GateResult:
        began = clock.monotonic()
        while True:
            why = interrupted()
            if why is not None:
                log.append(f"companion stopped: {why}")
                return failed(INTERRUPTED, why)
            elapsed = clock.monotonic() - began
            if clock.monotonic() >= ready_at:
                log.append(f"companion done with budget {budget:g}")
                return outcome or passed(f"rtx: ready after {elapsed:.1f} s")
            if elapsed >= budget:
                log.append(f"companion out of budget {budget:g}")
                return failed(STARTUP_BUDGET, "rtx: still loading")
            clock.sleep(poll)

    return gate


def no_signal() -> str | None:
    return None


def test_a_companion_is_polled_beside_the_primary_so_the_lane_passes_with_its_slower_engine() -> None:
    log: list[str] = []
    result = gate_lane(primary_ready_after(1.0, log), [companion_ready_after(0.2, log)], 60, no_signal)
    assert result.passed and len(result.companions) == 1
    # Checked while the primary still loaded: one after the other, the companion's gate would begin after it.
    assert log == ["companion done with budget 60", "primary done"]
    assert result.seconds >= 1.0


def test_a_companion_that_dies_starting_fails_the_lane_at_once_and_stops_the_primarys_wait() -> None:
    log: list[str] = []
    crash = failed(CONTAINER_EXITED, "rtx: container exited (1) after 0.1 s more, before it was ready")
    began = time.monotonic()
    result = gate_lane(primary_ready_after(30, log), [companion_ready_after(0.1, log, crash)], 60, no_signal)
    assert time.monotonic() - began < 5, "not after the primary's load"
    assert (result.passed, result.failed_check, result.detail) == (False, CONTAINER_EXITED, crash.detail)
    assert log == ["companion done with budget 60", "primary stopped: a companion failed its gate"]


def test_a_primary_that_fails_ends_the_companions_waits_and_its_failure_is_the_lanes() -> None:
    log: list[str] = []
    fatal = failed("fatal-engine-line", "the engine logged a fatal line: CUDA out of memory")
    began = time.monotonic()
    result = gate_lane(primary_ready_after(0.1, log, fatal), [companion_ready_after(30, log, poll=5)], 60, no_signal)
    assert time.monotonic() - began < 2, "a companion's wait between polls ends with the gate"
    assert (result.failed_check, result.detail) == (fatal.failed_check, fatal.detail)
    assert log == ["primary done", "companion stopped: the primary's gate ended"]


def test_a_signal_stops_both_and_the_lane_reports_the_interruption_not_a_companion() -> None:
    log: list[str] = []
    signals: list[str] = []
    began = time.monotonic()

    def interrupted() -> str | None:
        if not signals and time.monotonic() - began > 0.2:
            signals.append("SIGINT")
        return signals[0] if signals else None

    result = gate_lane(primary_ready_after(30, log), [companion_ready_after(30, log, poll=5)], 60, interrupted)
    assert time.monotonic() - began < 2
    assert (result.passed, result.failed_check) == (False, INTERRUPTED)
    assert sorted(log) == ["companion stopped: SIGINT", "primary stopped: SIGINT"]


def test_a_companion_out_of_budget_while_a_cold_primarys_grew_gets_one_more_check_after_it() -> None:
    log: list[str] = []
    # The primary takes 1.2 s of a 0.2 s budget (a cold start's allowance); the companion is ready at 0.6 s.
    result = gate_lane(primary_ready_after(1.2, log), [companion_ready_after(0.6, log)], 0.2, no_signal)
    assert log == ["companion out of budget 0.2", "primary done", "companion done with budget 0"]
    assert result.passed


def test_a_companion_out_of_budget_beside_a_primary_within_it_fails_the_lane() -> None:
    log: list[str] = []
    result = gate_lane(primary_ready_after(0.1, log), [companion_ready_after(30, log)], 1.0, no_signal)
    assert (result.passed, result.failed_check) == (False, STARTUP_BUDGET)
    assert log == ["primary done", "companion out of budget 1"]


def test_a_gate_polls_as_soon_as_the_engine_says_it_serves_or_a_signal_comes():
    import threading
    import time as real_time

    from lanectl.lanes.engine_calls import _Clock, _PollSooner

    class Log:
        news = threading.Event()

    signal: list[str] = []
    clock = _PollSooner(_Clock(real_time.sleep), Log(), lambda: signal[0] if signal else None)
    began = real_time.monotonic()
    clock.sleep(0.3)  # nothing new: the whole interval
    assert real_time.monotonic() - began >= 0.3
    threading.Timer(0.2, Log.news.set).start()
    began = real_time.monotonic()
    clock.sleep(30)
    assert real_time.monotonic() - began < 10 and not Log.news.is_set()  # woken by the line, and ready for the next
    threading.Timer(0.2, lambda: signal.append("SIGTERM")).start()
    began = real_time.monotonic()
    clock.sleep(30)
    assert real_time.monotonic() - began < 10
