"""The health gate against the real stub engine: a subprocess on 127.0.0.1, real HTTP, its real log lines,
the real monotonic clock, and short budgets.

The process stands in for the lane's container: its stdout is the log, its exit is the container's.

These tests run beside other work on a shared CI machine, so they assert outcomes, not wall-clock figures.
Where time is the point ("fails fast, not at the end of the budget"), the bound is a fraction of the
budget, far from what a loaded machine adds; the gate's exact cadence is tested with a fake clock in
test_health_gate.py.
"""

from __future__ import annotations

import re
import socket
from collections.abc import Callable, Iterator, Mapping

import pytest

from lanectl.health.gate import ContainerStatus, GateProgress, GateResult, HealthGate, MonotonicClock
from lanectl.health.probe import EndpointProbe
from lanectl.recipe.model import GenerationProbe, Health, StartupLog, StartupStall, validated
from tests.stub_engine.stubproc import MODEL_NAME, STUB_DIR, StubProcess, free_port

EXPECT = [r"^GPU KV cache size: [0-9,]+ tokens", r"^\[Autotuner\]: Loaded [0-9]+ configs from "]
# As the recipes: the autotune must end within its minutes (a fraction of one here), however often it starts.
STALL_S = 3
STALL = [StartupStall(after=r"^\[Autotuner\]: Autotuning process starts",
                      until=r"^\[Autotuner\]: Autotuning process ends",
                      minutes=STALL_S / 60, name="autotune", why="a retune takes 74 min")]
# The budget of the gates that must end early; ending in under half of it is "fast", whatever the load.
BUDGET_S = 30
# The budget of the gates that must run it out: long enough for a loaded machine to start the stub (1 s
# of loading plus Python's start) well inside it, so the last answers are the engine's, not refusals.
SHORT_BUDGET_S = 6


class ProcessLog:
    """The stub's stdout as a LogSource; once the process has exited, every line it wrote is returned."""

    def __init__(self, stub: StubProcess) -> None:
        self.stub = stub
        self.returned = 0

    def new_lines(self) -> list[str]:
        if self.stub.proc.poll() is not None:
            self.stub.wait_exit(timeout=5)  # joins the reader, so the last lines are in
        lines = self.stub.output.splitlines()
        new, self.returned = lines[self.returned :], len(lines)
        return new


class ProcessWatch:
    def __init__(self, stub: StubProcess) -> None:
        self.stub = stub

    def status(self) -> ContainerStatus:
        code = self.stub.proc.poll()
        return ContainerStatus(True) if code is None else ContainerStatus(False, code, f"exited with code {code}")


RunGate = Callable[..., tuple[GateResult, list[GateProgress]]]


@pytest.fixture
def run_gate() -> Iterator[RunGate]:
    """run_gate(env, budget_minutes=BUDGET_S / 60, **health) starts a stub on a free port and gates it at once."""
    stubs: list[StubProcess] = []

    def run(
        env: Mapping[str, str], budget_minutes: float = BUDGET_S / 60, **health: object
    ) -> tuple[GateResult, list[GateProgress]]:
        settings = validated(Health,
            {
                "startup_budget_minutes": budget_minutes,
                "poll_interval_seconds": 0.2,
                "request_timeout_seconds": 2,
                "served_model_name": MODEL_NAME,
                "startup_log": StartupLog(expect=EXPECT, stall=STALL),
                "generation_probe": GenerationProbe(timeout_seconds=0.5),
                **health,
            }
        )
        port = free_port()
        stub = StubProcess({"STUB_LOAD_SECONDS": "1", **env}, (), STUB_DIR, port)
        stubs.append(stub)
        progress: list[GateProgress] = []
        endpoints = EndpointProbe(f"http://127.0.0.1:{port}", settings)
        logs, container = ProcessLog(stub), ProcessWatch(stub)
        return HealthGate(settings, endpoints, logs, container, MonotonicClock(), progress.append).wait(), progress

    yield run
    for stub in stubs:
        stub.kill()


def test_a_healthy_engine_passes_after_refusing_while_it_loads(run_gate: RunGate) -> None:
    result, progress = run_gate({})

    assert result.passed, result
    assert result.failed_check is None and result.missing == ()
    # The stub spends 1 s loading, counted from after the gate started, so passing sooner would mean the
    # gate passed a lane that was not serving yet.
    assert result.seconds >= 1
    assert "/v1/completions generated 3 tokens" in result.detail
    # The tail holds the engine's own records. Only the expected lines are sure to be in it: the gate waits
    # for them, whereas uvicorn's last lines can still be in the pipe when /health first answers.
    assert any("GPU KV cache size:" in line for line in result.log_tail)
    assert any("[Autotuner]: Loaded" in line for line in result.log_tail)
    # It did not pass on the first poll: the engine was still loading and refused connections.
    assert progress and "/health 200" in progress[0].missing


def test_an_engine_that_fails_to_start_fails_fast_on_its_fatal_line(run_gate: RunGate) -> None:
    result, _ = run_gate({"STUB_FAULT": "crash_on_start"})

    assert result.failed_check == "fatal-engine-line"
    assert result.seconds < BUDGET_S / 2  # on the line, not at the end of the budget
    assert "EngineCore failed to start." in result.detail
    assert any("Engine core initialization failed" in line for line in result.log_tail)


def test_a_process_that_exits_without_a_fatal_line_is_a_container_exit(run_gate: RunGate) -> None:
    # A port bound by another socket that does not listen: probes are refused, and once loaded the stub
    # logs "Cannot bind" (not one of vLLM's fatal lines) and exits 1.
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        port = taken.getsockname()[1]
        settings = Health(
            startup_budget_minutes=BUDGET_S / 60, poll_interval_seconds=0.2, served_model_name=MODEL_NAME
        )
        stub = StubProcess({"STUB_LOAD_SECONDS": "0.3"}, (), STUB_DIR, port)
        try:
            endpoints = EndpointProbe(f"http://127.0.0.1:{port}", settings)
            result = HealthGate(settings, endpoints, ProcessLog(stub), ProcessWatch(stub), MonotonicClock()).wait()
        finally:
            stub.kill()

    assert result.failed_check == "container-exited", result
    assert result.exit_code == 1
    assert result.seconds < BUDGET_S / 2  # on the exit, not at the end of the budget
    assert any("Cannot bind the API server" in line for line in result.log_tail)


def test_an_autotune_stall_fails_when_its_minutes_are_up_naming_the_stall(run_gate: RunGate) -> None:
    result, _ = run_gate({"STUB_AUTOTUNE_STALL": "1"})

    assert result.failed_check == "startup-stall"
    # After its minutes, and well before the budget: the stall rule ended it, not the budget.
    assert STALL_S <= result.seconds < BUDGET_S / 2
    # How far past its minutes the last poll landed depends on the machine's load.
    assert re.match(r"autotune started [3-9](\.\d)? s ago and has not ended \(no line matching ", result.detail), \
        result.detail
    assert ": a retune takes 74 min; began with: " in result.detail
    assert result.detail.endswith("[Autotuner]: Autotuning process starts ...")
    assert "/health 200" in result.missing


def test_a_hung_engine_fails_the_generation_check_not_the_budget(run_gate: RunGate) -> None:
    result, _ = run_gate({"STUB_FAULT": "hang"})

    assert result.failed_check == "generation"
    assert result.seconds < BUDGET_S / 2  # after its failed probes, not at the end of the budget
    assert result.detail.endswith("last: generation probe timed out after 0.5 s (health 200: engine stuck?)")
    assert result.missing == ("/v1/completions generates a token",)


def test_an_unhealthy_engine_runs_out_the_budget_waiting_for_health(run_gate: RunGate) -> None:
    result, progress = run_gate({"STUB_FAULT": "unhealthy"}, budget_minutes=SHORT_BUDGET_S / 60)

    assert result.failed_check == "startup-budget"
    assert result.missing == ("/health 200",)
    assert result.detail == "after 6 s still waiting for: /health 200. Last answers: /health answered 503"
    # It waited out the whole budget, polling all along, and gave up at its end: its last poll is at the
    # deadline, so it ends after the budget but not a second budget later.
    assert SHORT_BUDGET_S <= result.seconds < 2 * SHORT_BUDGET_S
    assert len(progress) > 1 and all(p.elapsed < SHORT_BUDGET_S for p in progress)


def test_a_served_model_name_that_differs_is_missing_from_the_model_list(run_gate: RunGate) -> None:
    result, _ = run_gate({}, budget_minutes=SHORT_BUDGET_S / 60, served_model_name="dsv41-flash-uva")

    assert result.failed_check == "startup-budget"
    assert result.missing == ("/v1/models lists 'dsv41-flash-uva'",)
    assert result.detail == (
        "after 6 s still waiting for: /v1/models lists 'dsv41-flash-uva'. "
        f"Last answers: /v1/models does not list 'dsv41-flash-uva' (it lists: {MODEL_NAME})"
    )


def test_a_closed_port_is_connection_refused_not_an_error() -> None:
    settings = Health(startup_budget_minutes=1, served_model_name=MODEL_NAME)
    endpoints = EndpointProbe(f"http://127.0.0.1:{free_port()}", settings)
    results = [endpoints.health_ok(), endpoints.models_lists_served_model(), endpoints.generate()]

    assert [r.detail for r in results] == [
        "/health: connection refused",
        "/v1/models: connection refused",
        "/v1/completions: connection refused",
    ]
    assert not any(r.ok for r in results)
