"""lines: every startup_log rule of every shipped recipe, and lanectl's built-in fatal lines, against what vLLM
the release under check (0.31.0, the pin, unless `make contract VLLM=…`) and its flashinfer print.

A healthy start's lines (start_sequence.py) are vLLM's own: an `expect` that none of them matches is a gate that
never passes, a `forbid` that one of them matches is a gate that always fails (h1-REF/h2-REF's "Autotuning process
starts", issue 21), a stall whose `after` never appears guards nothing. Each failure names the recipe's file:line.
"""

from __future__ import annotations

import re

import pytest
import vllm_oracle as oracle
from lanes import lanes, uses_vllm_entrypoint, where
from start_sequence import StartLine, healthy_start

from lanectl.health.gate import FATAL_ENGINE_LINES
from lanectl.recipe.catalog import Lane
from lanectl.recipe.model import flag_value

VLLM_LANES = [lane for lane in lanes() if uses_vllm_entrypoint(lane)]


def rule_text(line: str) -> str | None:
    """What lanectl's startup_log rules read of a line: the engine record's message where lanectl takes lines
    apart (lanectl.health.engine_log), else, before it did, the whole line."""
    try:
        from lanectl.health import engine_log  # type: ignore[attr-defined]
    except ImportError:
        return line
    return engine_log.parse(line).record_message


def fatal_text(line: str) -> str | None:
    try:
        from lanectl.health import engine_log  # type: ignore[attr-defined]
    except ImportError:
        return line
    return engine_log.parse(line).believed


def _shown(lines: list[StartLine]) -> str:
    return "\n".join(f"    {line.text}    <- {line.source}" for line in lines)


@pytest.fixture(scope="module")
def starts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[StartLine]]:
    return {lane.name: healthy_start(lane, tmp_path_factory.mktemp(lane.name)) for lane in VLLM_LANES}


def _matching(pattern: str, lines: list[StartLine], read=rule_text) -> list[int]:
    regex = re.compile(pattern)
    return [i for i, line in enumerate(lines) if (text := read(line.text)) is not None and regex.search(text)]


@pytest.mark.parametrize("lane", VLLM_LANES, ids=lambda lane: lane.name)
def test_every_expected_line_is_one_a_healthy_start_prints(lane: Lane, starts: dict[str, list[StartLine]]) -> None:
    lines = starts[lane.name]
    rules = lane.spec.health.startup_log.expect
    wrong = [f"{where(lane, ('health', 'startup_log', 'expect', i))}: expect {pattern!r} matches no line "
             f"{oracle.RELEASE} prints on a healthy start: the gate would wait out its budget and fail"
             for i, pattern in enumerate(rules) if not _matching(pattern, lines)]
    assert not wrong, "\n".join(wrong) + f"\n  a healthy start of {lane.name} prints:\n" + _shown(lines)


@pytest.mark.parametrize("lane", VLLM_LANES, ids=lambda lane: lane.name)
def test_no_forbidden_line_is_one_every_start_prints(lane: Lane, starts: dict[str, list[StartLine]]) -> None:
    lines = starts[lane.name]
    wrong = []
    for i, pattern in enumerate(lane.spec.health.startup_log.forbid):
        for j in _matching(pattern, lines):
            wrong.append(f"{where(lane, ('health', 'startup_log', 'forbid', i))}: forbid {pattern!r} matches "
                         f"{lines[j].text!r} ({lines[j].source}), which every healthy start prints: the gate "
                         "would fail every start")
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("lane", VLLM_LANES, ids=lambda lane: lane.name)
def test_every_stall_begins_and_ends_on_lines_a_healthy_start_prints(
        lane: Lane, starts: dict[str, list[StartLine]]) -> None:
    lines = starts[lane.name]
    wrong = []
    for i, stall in enumerate(getattr(lane.spec.health.startup_log, "stall", [])):
        at = where(lane, ("health", "startup_log", "stall", i))
        begins = _matching(stall.after, lines)
        if not begins:
            wrong.append(f"{at}: stall after {stall.after!r} matches no line of a healthy start: it guards nothing")
            continue
        if not [j for j in _matching(stall.until, lines) if j > begins[0]]:
            wrong.append(f"{at}: stall until {stall.until!r} matches no line after {lines[begins[0]].text!r}: "
                         "every healthy start would count as stalled")
        warm = getattr(stall, "warm", None)
        if warm is not None and not _matching(warm, lines):
            wrong.append(f"{at}: stall warm {warm!r} matches no line of a start on a warm cache: every start would "
                         f"count as cold and get {stall.cold_minutes:g} min")
    assert not wrong, "\n".join(wrong) + "\n  a healthy start prints:\n" + _shown(lines)


@pytest.mark.parametrize("lane", [lane for lane in VLLM_LANES if flag_value(lane.spec.engine.args, "--cpu-offload-gb")],
                         ids=lambda lane: lane.name)
def test_a_lane_that_offloads_experts_expects_the_line_that_proves_it(
        lane: Lane, starts: dict[str, list[StartLine]]) -> None:
    """issue 21 item 2: `--offload-backend uva --cpu-offload-gb N` is proven by UVA's own line; a rule that matches
    only another offload's line (the Engram table's) passes a lane whose expert offload did nothing."""
    lines = starts[lane.name]
    uva = oracle.find_call("vllm/model_executor/offloader/uva.py", "Total CPU offloaded")
    proving = [i for i, line in enumerate(lines) if line.source == uva.where]
    assert proving, f"{lane.name} asks for --cpu-offload-gb, but vLLM's parser reads no UVA offload from its flags"
    rules = lane.spec.health.startup_log.expect
    assert any(proving[0] in _matching(pattern, lines) for pattern in rules), (
        f"{where(lane, ('health', 'startup_log', 'expect'))}: no expect rule of {lane.name} matches UVA's "
        f"{lines[proving[0]].text!r} ({uva.where}, format {uva.template!r}); the rules match only:\n"
        + "\n".join(f"    {pattern!r} -> {[lines[j].text for j in _matching(pattern, lines)]}" for pattern in rules))


def test_the_production_lanes_hold_the_autotune_line_to_a_stall_not_a_forbid() -> None:
    """issue 21 item 1: the real sequence prints `starts` on every start; only silence after it is a failure."""
    production = [lane for lane in VLLM_LANES if lane.spec.image.template == "vllm"]
    assert production, "no lane of the vllm template among the shipped recipes"
    autotune = oracle.find_call("flashinfer/autotuner/autotuner.py", "Autotuning process starts")
    wrong = [f"{where(lane, ('health', 'startup_log'))}: {lane.name} has no stall rule whose `after` matches "
             f"flashinfer's {autotune.template!r} ({autotune.where})"
             for lane in production
             if not any(re.search(stall.after, autotune.template)
                        for stall in getattr(lane.spec.health.startup_log, "stall", []))]
    assert not wrong, "\n".join(wrong)


# -- the built-in fatal lines ---------------------------------------------------------------------------------

def _fatal_texts() -> list[StartLine]:
    """Lines the vLLM release prints when its engine dies, from its own format strings and exception."""
    dead = oracle.engine_dead_traceback()
    lines = [
        StartLine(oracle.vllm_line(oracle.find_call("vllm/v1/engine/core.py", "EngineCore encountered a fatal error."),
                                   ), "vllm/v1/engine/core.py"),
        StartLine(oracle.vllm_line(oracle.find_call("vllm/v1/engine/core.py", "EngineCore failed to start."),
                                   ), "vllm/v1/engine/core.py"),
        StartLine(oracle.vllm_line(oracle.find_call("vllm/v1/executor/multiproc_executor.py",
                                                    "Worker proc %s died unexpectedly"), "VllmWorker-0", -9,
                                   process="EngineCore"), "vllm/v1/executor/multiproc_executor.py"),
        StartLine(oracle.vllm_line(oracle.find_call("vllm/v1/engine/core_client.py",
                                                    "engine core exited unexpectedly"), process="APIServer"),
                  "vllm/v1/engine/core_client.py"),
        StartLine(dead[-1], "raised vllm.v1.engine.exceptions.EngineDeadError"),
    ]
    return lines


# Texts no CPU can print: they come from the CUDA runtime (cudaGetErrorString), not from vLLM's or torch's Python.
GPU_ONLY_FATAL = {"CUDA error: an illegal memory access was encountered":
                  "cudaErrorIllegalAddress, as torch's CUDA check prints it; only a GPU shows it"}


def _gpu_only(pattern: str) -> bool:
    return any(text in pattern for text in GPU_ONLY_FATAL)


@pytest.mark.parametrize("pattern", [p.pattern for p in FATAL_ENGINE_LINES if not _gpu_only(p.pattern)])
def test_every_fatal_line_is_one_vllm_prints_when_its_engine_dies(pattern: str) -> None:
    lines = _fatal_texts()
    assert _matching(pattern, lines, fatal_text), (
        f"lanectl/health/gate.py FATAL_ENGINE_LINES: {pattern!r} matches none of the lines {oracle.RELEASE} prints "
        f"when its engine dies:\n{_shown(lines)}")


def test_no_fatal_line_matches_a_healthy_start(starts: dict[str, list[StartLine]]) -> None:
    wrong = [f"lanectl/health/gate.py FATAL_ENGINE_LINES: {p.pattern!r} matches {line.text!r} ({line.source}) of "
             f"a healthy start of {name}"
             for name, lines in starts.items() for p in FATAL_ENGINE_LINES
             for line in lines if (text := fatal_text(line.text)) is not None and p.search(text)]
    assert not wrong, "\n".join(wrong)


def test_the_gpu_only_fatal_lines_are_still_lanectls() -> None:
    """The exemption above is not a place for a line lanectl dropped to hide."""
    assert all(any(text in p.pattern for p in FATAL_ENGINE_LINES) for text in GPU_ONLY_FATAL)

