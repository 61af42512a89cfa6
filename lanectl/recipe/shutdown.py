"""How long a lane's engine drains its requests on a stop: vLLM's `--shutdown-timeout`, fitted into Docker's stop
timeout.

vLLM 0.31.0 (`engine/arg_utils.py`: "Shutdown timeout in seconds. 0 = abort, >0 = wait") defaults to 0: on SIGTERM
it aborts every request in flight, whatever `stop_timeout_seconds` Docker grants it. With N > 0 it refuses new
requests and lets the running ones finish for up to N seconds, then needs time to tear down (4.8 s on an H200,
BRIEF §9) before Docker's SIGKILL at the stop timeout; a drain whose deadline passes leaves its streams hanging
(the GPU record). So every role lanectl runs as `vllm serve` gets the flag: `stop_timeout_seconds` minus a
teardown margin, unless its args give one, which must then fit with that margin. Pure: a lane spec in, a lane spec
or problems out.
"""

from __future__ import annotations

import typing
from dataclasses import replace

from lanectl.recipe.model import Engine, LaneSpec, flag_value

if typing.TYPE_CHECKING:
    from lanectl.errors import Problem
    from lanectl.recipe.yaml_source import PathKey, YamlDocument

SHUTDOWN_TIMEOUT_FLAG = "--shutdown-timeout"
# What a stop keeps for the engine's teardown after its drain: KServe keeps 15 s of the grace period (kserve #5496),
# three times the 4.8 s vLLM 0.26.0 took on the H200.
TEARDOWN_SECONDS = 15
# Templates whose engine is `vllm serve` (vllm: the official image's; stub-engine: the stub, which reads the flag
# as vLLM does).
VLLM_SERVE_TEMPLATES = ("vllm", "stub-engine")
PRIMARY = "primary"


def serves_vllm(spec: LaneSpec, role: str) -> bool:
    """Whether the role's engine is the lane image's `vllm serve`: not its own entrypoint, not another image."""
    if spec.image.template not in VLLM_SERVE_TEMPLATES:
        return False
    if role == PRIMARY:
        return spec.engine.entrypoint is None
    companion = spec.companions[role]
    return companion.image is None and companion.engine.entrypoint is None


def drain_seconds(spec: LaneSpec, role: str) -> int | None:
    """Seconds the role's engine gives its requests in flight to finish when it is stopped (its `--shutdown-timeout`
    as it runs; 0: it aborts them at once). None when lanectl does not run the role as `vllm serve` and cannot know."""
    if not serves_vllm(spec, role):
        return None
    engine = _engine(spec, role)
    if _flag_index(engine.args) is None:
        return max(engine.stop_timeout_seconds - TEARDOWN_SECONDS, 0)
    return _explicit(engine)


def with_shutdown_timeouts(spec: LaneSpec) -> LaneSpec:
    """The spec with `--shutdown-timeout N` added to the args of every role that runs `vllm serve` without one, so
    the image's CMD, each companion's command and `lanectl render` carry what the engine will do."""
    engines: dict[str, Engine] = {}
    for role, engine in spec.engines():
        seconds = drain_seconds(spec, role)
        if seconds is not None and _flag_index(engine.args) is None:
            engines[role] = replace(engine, args=[*engine.args, SHUTDOWN_TIMEOUT_FLAG, str(seconds)])
    if not engines:
        return spec
    companions = {role: replace(c, engine=engines[role]) if role in engines else c
                  for role, c in spec.companions.items()}
    return replace(spec, engine=engines.get(PRIMARY, spec.engine), companions=companions)


def check_shutdown(doc: YamlDocument, spec: LaneSpec,
                   locate: typing.Callable[[PathKey], PathKey]) -> list[Problem]:
    """A drain that cannot fit into the stop timeout, located: the explicit flag's, or the stop timeout that
    leaves no room for one."""
    problems = []
    for role, engine in spec.engines():
        if not serves_vllm(spec, role):
            continue
        base: PathKey = ("engine",) if role == PRIMARY else ("companions", role, "engine")
        stop = engine.stop_timeout_seconds
        index = _flag_index(engine.args)
        if index is None:
            if stop - TEARDOWN_SECONDS < 1:
                problems.append(doc.problem(locate((*base, "stop_timeout_seconds")), (
                    f"{stop} s leaves the {role} engine no time to drain its requests on a stop: lanectl gives vLLM "
                    f"stop_timeout_seconds - {TEARDOWN_SECONDS} s ({SHUTDOWN_TIMEOUT_FLAG}) and keeps "
                    f"{TEARDOWN_SECONDS} s for its teardown before Docker kills it. Raise stop_timeout_seconds to "
                    "at least "
                    f"{TEARDOWN_SECONDS + 1}")))
            continue
        where = locate((*base, "args", index))
        given = _explicit(engine)
        if given is None:
            raw = flag_value(engine.args, SHUTDOWN_TIMEOUT_FLAG)
            problems.append(doc.problem(where, f"{SHUTDOWN_TIMEOUT_FLAG} {raw!r}: vLLM takes a whole number of "
                                               "seconds, 0 (abort requests in flight) or more (let them finish)"))
        elif given + TEARDOWN_SECONDS > stop:
            problems.append(doc.problem(where, (
                f"{SHUTDOWN_TIMEOUT_FLAG} {given} does not fit the {role}'s stop_timeout_seconds ({stop}): a drain "
                f"of {given} s and vLLM's teardown ({TEARDOWN_SECONDS} s kept for it) outlast Docker's stop, which "
                f"kills the engine mid-drain and leaves its streams hanging. Lower {SHUTDOWN_TIMEOUT_FLAG} to at most "
                f"{max(stop - TEARDOWN_SECONDS, 0)}, raise stop_timeout_seconds to at least "
                f"{given + TEARDOWN_SECONDS}, or drop the flag (lanectl then sets stop_timeout_seconds - "
                f"{TEARDOWN_SECONDS})")))
    return problems


def _engine(spec: LaneSpec, role: str) -> Engine:
    return spec.engine if role == PRIMARY else spec.companions[role].engine


def _explicit(engine: Engine) -> int | None:
    """The flag's seconds as vLLM reads them (argparse's int, then `ge=0`); None when it would refuse them."""
    raw = flag_value(engine.args, SHUTDOWN_TIMEOUT_FLAG)
    try:
        seconds = int(raw) if raw is not None else -1
    except ValueError:
        return None
    return seconds if seconds >= 0 else None


def _flag_index(args: list[str]) -> int | None:
    return next((i for i, arg in enumerate(args) if arg == SHUTDOWN_TIMEOUT_FLAG
                 or arg.startswith(SHUTDOWN_TIMEOUT_FLAG + "=")), None)
