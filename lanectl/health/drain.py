"""What became of the requests in flight when an engine was stopped, from the engine's own shutdown records.

vLLM (since v0.18; 0.26.0 on the H200, `gpu/record/drain/`; 0.31.0's `v1/engine/core.py` and
`v1/engine/utils.py`) logs, on SIGTERM:

    [shutdown] EngineCore: draining in-flight requests count=8 timeout=30s      (--shutdown-timeout 30)
    [shutdown] EngineCore: request processing complete; starting resource teardown   (they all finished)
    [shutdown] EngineCore: aborting in-flight requests count=8                   (--shutdown-timeout 0: cut)
    [shutdown] Process manager: force killing remaining processes count=1        (the drain's time ran out:
                                                                                  no "complete" before it)

A drained request finished with `length` or `stop`; an aborted one ended `finish_reason: "abort"`, a truncated
answer with no error; one still running when the drain's time ran out stalled (no final chunk). Only records
the engine itself wrote are read (`engine_log`): a client cannot write one through a request.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from lanectl.health.engine_log import record_message
from lanectl.records import frozen

_DRAINING = re.compile(r"^\[shutdown\] EngineCore: draining in-flight requests count=(\d+) timeout=([\d.]+)s")
_ABORTING = re.compile(r"^\[shutdown\] EngineCore: aborting in-flight requests count=(\d+)")
_COMPLETE = re.compile(r"^\[shutdown\] EngineCore: request processing complete")


@frozen
class DrainReport:
    in_flight: int | None  # requests the engine held at the stop (its own count, else /metrics before it)
    cut: int | None  # of those, how many did not finish; None when the engine did not say
    how: str  # "drained", "aborted", "drain timed out", "not said"
    timeout: float | None = None  # the drain's deadline, when it drained

    def describe(self) -> str:
        if self.in_flight == 0:
            return "no request in flight"
        count = "?" if self.in_flight is None else str(self.in_flight)
        if self.how == "drained":
            return f"{count} request(s) in flight, all finished (drained within {self.timeout:g} s)"
        if self.how == "aborted":
            return (f"{count} request(s) in flight CUT: the engine aborted them (finish_reason \"abort\"; "
                    "--shutdown-timeout 0)")
        if self.how == "drain timed out":
            # Why they did not finish (long, or stalled) the engine does not say.
            return f"{count} request(s) in flight CUT: the drain's {self.timeout:g} s ran out before they finished"
        return f"{count} request(s) in flight; the engine did not say whether they finished"


def drain_report(lines: Iterable[str], in_flight_before: int | None) -> DrainReport:
    """Read the shutdown records among a stopped engine's last lines."""
    count: int | None = None
    timeout: float | None = None
    how = "not said"
    for line in lines:
        message = record_message(line)
        if message is None:
            continue
        if (found := _DRAINING.match(message)) is not None:
            count, timeout, how = int(found[1]), float(found[2]), "drain timed out"
        elif (found := _ABORTING.match(message)) is not None:
            count, how = int(found[1]), "aborted"
        elif _COMPLETE.match(message) and how == "drain timed out":
            how = "drained"
    if count is None:
        return DrainReport(in_flight_before, None, how)
    cut = 0 if how == "drained" or count == 0 else count
    return DrainReport(count, cut, how, timeout)
