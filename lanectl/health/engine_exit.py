"""What the exit of an engine container nobody stopped means.

vLLM's API server exits with code 0 once its engine core has died (BRIEF §8: the engine core SIGKILLed,
completions answered 500, the port closed, exit code 0). So an exit lanectl did not ask for is a dead
engine whatever its code, and 0 must never read as a clean stop: not in the gate, the watchdog, `status`,
nor Swarm's restart condition. Lane images run the engine under lanectl's exit guard
(lanectl/image/in_image/exit_guard.py), which turns that unasked exit 0 into EXIT_UNASKED, so a restart
policy that restarts failures only (Swarm's on-failure) restarts it; images built before the guard still exit 0.
"""

from __future__ import annotations

ENGINE_EXIT_0 = "vLLM exits 0 when its engine core dies"
EXIT_UNASKED = 70  # keep in step with exit_guard.py
_MEANINGS = {
    0: ENGINE_EXIT_0,
    EXIT_UNASKED: (f"the engine exited 0 unasked, as vLLM does when its engine core dies; lanectl's exit guard "
                   f"made it {EXIT_UNASKED}"),
}


def exit_meaning(exit_code: int | None) -> str | None:
    """Why an exit code that looks clean, or is lanectl's own, is an engine death; None for the others."""
    return _MEANINGS.get(exit_code) if exit_code is not None else None


def exit_code_text(exit_code: int | None) -> str:
    """`exit code 137`, or `exit code 0: vLLM exits 0 …` where the code needs its meaning beside it."""
    meaning = exit_meaning(exit_code)
    return f"exit code {exit_code}" + (f": {meaning}" if meaning else "")


def exit_detail(status: str, exit_code: int | None) -> str:
    """`exited with code 1`; for 0 and the exit guard's code, why that is an engine death."""
    if exit_code is None:
        return status
    meaning = exit_meaning(exit_code)
    detail = f"{status} with code {exit_code}"
    return f"{detail} ({meaning})" if meaning else detail
