"""A lane's whole gate: its primary's (`HealthGate`) and each companion's (`CompanionGate`), run beside each other.

The companions start right after the primary and load beside it, so they are polled beside it from the start:
one after the other, each would begin with a poll that finds it still loading and wait an interval. The lane
passes when the primary and every companion have. A companion that dies starting (a fatal line, an exit) fails
the lane at once, not after the primary's load, which on a real lane takes minutes. The box (`LaneEngines.gate`)
and the fleet (`gate_on_node`) gate a lane through this one function, so both promise the same.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import partial

from lanectl.health.gate import INTERRUPTED, STARTUP_BUDGET, Clock, GateResult

Interrupted = Callable[[], "str | None"]
# The primary's gate, told when to stop: a signal, or a companion that failed.
PrimaryGate = Callable[[Interrupted], GateResult]
# A companion's gate with `budget_seconds`, on `clock`, told when to stop.
CompanionGateRun = Callable[[float, Clock, Interrupted], GateResult]

# How often a companion's wait looks for the end of the gate or a signal.
WAIT_SLICE_SECONDS = 0.1


def gate_lane(primary: PrimaryGate, companions: Sequence[CompanionGateRun], budget_seconds: float,
              interrupted: Interrupted) -> GateResult:
    """The lane's gate within `budget_seconds`; `interrupted` names a signal that arrived (the switch's)."""
    began = time.monotonic()
    stop = threading.Event()  # ends the companions' waits: the primary failed, or the gate was left
    died: list[GateResult] = []

    def companion_interrupted() -> str | None:
        return interrupted() or ("the primary's gate ended" if stop.is_set() else None)

    class _Clock:
        def monotonic(self) -> float:
            return time.monotonic()

        def sleep(self, seconds: float) -> None:
            # In slices: a signal (which ends the primary's wait at once) or the end of the gate ends it too.
            end = time.monotonic() + seconds
            while not stop.is_set() and interrupted() is None and (left := end - time.monotonic()) > 0:
                stop.wait(min(left, WAIT_SLICE_SECONDS))

    def run_companion(gate: CompanionGateRun) -> GateResult:
        result = gate(budget_seconds, _Clock(), companion_interrupted)
        if not result.passed and result.failed_check not in (STARTUP_BUDGET, INTERRUPTED):
            died.append(result)
        return result

    def primary_interrupted() -> str | None:
        return interrupted() or ("a companion failed its gate" if died else None)

    pending = [_Beside(partial(run_companion, gate)) for gate in companions]
    try:
        first = primary(primary_interrupted)
        if not first.passed:
            stop.set()
        ready = [beside.result() for beside in pending]
    finally:
        stop.set()
        for beside in pending:
            beside.join()
    if died and interrupted() is None:
        return replace(died[0], seconds=time.monotonic() - began)
    if not first.passed:
        return first
    for i, companion in enumerate(ready):
        if companion.failed_check == STARTUP_BUDGET and first.seconds > budget_seconds:
            # The lane's budget ran out while a cold primary's grew (a stall's cold minutes): the companion gets
            # one more check now, as a lane's last check always comes at the end of its budget.
            ready[i] = companions[i](0.0, _Clock(), interrupted)
        if not ready[i].passed:
            return replace(ready[i], seconds=time.monotonic() - began)
    return replace(first, companions=tuple(c.detail for c in ready), seconds=time.monotonic() - began)


class _Beside:
    """A call run in a thread of its own, beside the caller's: a companion's gate beside the primary's. (Threads,
    not concurrent.futures, whose import brings logging's to every switch.)"""

    def __init__(self, call: Callable[[], GateResult]):
        self._outcome: list[tuple[GateResult | None, BaseException | None]] = []
        self._thread = threading.Thread(target=self._run, args=(call,), daemon=True)
        self._thread.start()

    def _run(self, call: Callable[[], GateResult]) -> None:
        try:
            self._outcome.append((call(), None))
        except BaseException as exc:  # re-raised in the caller's thread by result()
            self._outcome.append((None, exc))

    def result(self) -> GateResult:
        self._thread.join()
        value, error = self._outcome[0]
        if error is not None:
            raise error
        assert value is not None
        return value

    def join(self) -> None:
        self._thread.join()
