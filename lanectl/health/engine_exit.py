"""What the exit of an engine container nobody stopped means.

vLLM's API server exits with code 0 once its engine core has died (BRIEF §8: the engine core SIGKILLed,
completions answered 500, the port closed, exit code 0). So an exit lanectl did not ask for is a dead
engine whatever its code, and 0 must never read as a clean stop: not in the gate, the watchdog, `status`,
nor Swarm's restart condition.
"""

from __future__ import annotations

ENGINE_EXIT_0 = "vLLM exits 0 when its engine core dies"


def exit_detail(status: str, exit_code: int | None) -> str:
    """`exited with code 1`; for code 0, why that is no clean stop of a lane nobody stopped."""
    if exit_code is None:
        return status
    detail = f"{status} with code {exit_code}"
    return f"{detail} ({ENGINE_EXIT_0})" if exit_code == 0 else detail
