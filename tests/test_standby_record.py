"""The standby check against a real vLLM (gpu/record/standby-1b/: vLLM 0.26.0 on one H100, issue 55), read as
evidence, and lanectl's own code held to what it showed.

`uva/` is `lanectl standby check`'s protocol (gpu/vllm_serve/standby_check.py) against `vllm serve` with 1 GiB of
MLP weights offloaded through UVA on the V1 model runner, 12 sleeps with 8 streams in flight and wakes, then two
starts beside it asleep (0.92 fitted, 0.99 was refused); `control/` is the same engine without offload. Pure: the
files are read, nothing runs. The stub told to behave as that engine did runs the same check through `lanectl
standby check` (tests/test_standby_check_docker.py) and through the GPU machine's driver
(tests/test_standby_check_driver.py).
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from lanectl.errors import RecipeInvalid
from lanectl.health.engine_log import fatal_engine_lines, startup_match
from lanectl.lanes.standby_check import CheckReport, Cycle, beside_failure, beside_start, memory_figures
from lanectl.project import Project
from lanectl.recipe.catalog import load_catalog
from tests.gpu_record import engine_lines, standby_report

RUNS = ("uva", "control")
OFFLOAD_LINE = "Total CPU offloaded parameters: 1.0"
# The production recipe's gate rule (`^Total CPU offloaded parameters: 60(\.0+)?$`) at this record's 1 GiB.
OFFLOAD_RULE = re.compile(r"^Total CPU offloaded parameters: 1(\.0+)?$")


@pytest.mark.parametrize("run", RUNS)
def test_every_wake_gave_the_first_output_with_every_stream_finished(run: str) -> None:
    report = standby_report(run)
    check = report["check"]
    assert check["passed"] and check["failure"] is None
    assert report["env"]["VLLM_USE_V2_MODEL_RUNNER"] == "0" and "--enable-sleep-mode" in report["argv"]
    assert len(check["cycles"]) == 12
    for cycle in check["cycles"]:
        assert cycle["same"] and cycle["text"] == check["fingerprint"], cycle
        assert (cycle["in_flight"], cycle["streams_ok"], cycle["streams_failed"]) == (8, 8, 0), cycle
    # Top-2 logprobs of the wake check's 32 tokens, before the first sleep and after the last wake: equal to the bit.
    assert report["logprobs_equal"] is True and len(report["logprobs_before"]["tokens"]) == 32


def test_the_offload_ran_in_the_uva_run_and_not_in_the_control() -> None:
    uva, control = (standby_report(run) for run in RUNS)
    assert "--offload-backend" in uva["argv"] and "--offload-backend" not in control["argv"]
    offloaded = [line for line in engine_lines("uva") if OFFLOAD_LINE in line]
    assert offloaded and any(OFFLOAD_LINE in line for line in uva["proof_lines"])
    assert not any("Total CPU offloaded parameters" in line for line in engine_lines("control"))
    # lanectl's startup rules believe the real line (a vLLM record), as the production gate needs them to.
    assert startup_match(OFFLOAD_RULE, offloaded[0])
    # A sleep backs up only the weights still on the GPU: the offloaded GiB already lives in host memory.
    assert (uva["check"]["memory"]["backed_up_gib_logged"], control["check"]["memory"]["backed_up_gib_logged"]) == (
        0.97, 1.97)


@pytest.mark.parametrize(("run", "block"), [
    ("uva", {"mode": "sleep", "level": 1, "weights_gib": 1.1, "resident_gib": 1.02, "gpu_memory_gib": 79.18,
             "wake_timeout_seconds": 30}),
    ("control", {"mode": "sleep", "level": 1, "weights_gib": 2.2, "resident_gib": 1.02, "gpu_memory_gib": 79.18,
                 "wake_timeout_seconds": 30}),
])
def test_lanectl_makes_the_recorded_standby_block_from_what_the_engine_showed(run: str, block: dict[str, Any]
                                                                             ) -> None:
    """Today's figure rules over the record's readings (each cycle's log figures, nvidia-smi and MemAvailable, the
    engine's startup lines) give the block and figures the record holds: a change to how they are read shows here
    as a different block for the same real engine."""
    report = standby_report(run)
    check = report["check"]
    memory = check["memory"]
    cycles = tuple(Cycle(**cycle) for cycle in check["cycles"])
    before = {key: memory[key] for key in ("gpu_used_mib_before_start", "host_available_gib_before_start",
                                           "host_available_gib_awake")}
    beside = check["beside"]
    figures = memory_figures(cycles, before, "\n".join(engine_lines(run)), beside and beside["utilization"])
    assert figures == memory
    again = CheckReport(lane=check["lane"], cold_start_seconds=check["cold_start_seconds"],
                        fingerprint=check["fingerprint"], cycles=cycles, memory=figures)
    assert again.standby_block() == check["standby"] == block


def test_the_start_beside_at_0_99_is_an_oom_beside_in_vllms_own_words() -> None:
    """Fed the real engine's log of each start beside the sleeping lane, lanectl's gate rules and its classifier
    say what happened: 0.92 started, 0.99 found too little free memory and is an `oom-beside`."""
    fits, refused = standby_report("uva")["besides"]
    assert (fits["utilization"], fits["started"], refused["utilization"], refused["started"]) == (0.92, True, 0.99,
                                                                                                  False)
    refused_log = engine_lines("uva", "engine-beside-0.99.log")
    assert fatal_engine_lines(refused_log), "lanectl's gate would not see the start at 0.99 fail"
    assert not fatal_engine_lines(engine_lines("uva", "engine-beside-0.92.log"))
    classified = beside_start("h2-REF", 0.99, started=False, seconds=refused["seconds"], gate_detail="(the gate's)",
                              log_lines=refused_log)
    assert classified.out_of_memory and classified.detail == refused["detail"]
    failure = beside_failure(classified)
    assert failure is not None and failure.kind == "oom-beside"
    assert ("Free memory on device cuda:0 (77.65/79.18 GiB) on startup is less than desired GPU memory utilization "
            "(0.99, 78.39 GiB)") in failure.detail
    started = beside_start("h2-REF", 0.92, started=True, seconds=fits["seconds"], gate_detail=fits["detail"],
                           log_lines=engine_lines("uva", "engine-beside-0.92.log"), text_after=fits["text_after"],
                           fingerprint=standby_report("uva")["check"]["fingerprint"])
    assert beside_failure(started) is None and started.same_after is True


RECIPE = """
schema: lanectl/v1
id: t
defaults:
  image:
    template: stub-engine
    base: lanectl/base-python:bookworm
    local_base: true
    python_site: /opt/stub
  engine:
    env: {{VLLM_SERVER_DEV_MODE: "1"}}
    gpus: {{device_ids: ["0"]}}
  health:
    startup_budget_minutes: 1
    served_model_name: m
lanes:
  h1:
    engine:
      args: [/model, --served-model-name, m, --port, "8000", --enable-sleep-mode]
      ports:
        - {{container: 8000, host: 18000, host_ip: 127.0.0.1}}
    standby: {standby}
  h2:
    engine:
      args: [/model, --served-model-name, m, --port, "8000", --gpu-memory-utilization, "{share}"]
      ports:
        - {{container: 8000, host: 18001, host_ip: 127.0.0.1}}
"""


@pytest.mark.parametrize("share", ["0.92", "0.99"])
def test_validate_with_the_recorded_block_agrees_with_the_gpu(write_recipe, share: str) -> None:
    """The recorded block in a recipe: `validate` lets a lane at 0.92 share the GPU with it asleep and refuses one
    at 0.99, as vLLM did on the H100."""
    block = standby_report("uva")["check"]["standby"]
    write_recipe(RECIPE.format(standby="{" + ", ".join(f"{k}: {v}" for k, v in block.items()) + "}", share=share))
    if share == "0.92":
        assert load_catalog(Project.locate()).lane("h1").spec.standby is not None
        return
    with pytest.raises(RecipeInvalid) as refused:
        load_catalog(Project.locate())
    assert [str(p) for p in refused.value.problems] == [
        "recipes/r.yaml:21:70: lanes.h1.standby.resident_gib: asleep, this lane holds 1.02 GiB of each 79.18 GiB GPU, "
        "but lane h2's primary asks vLLM for --gpu-memory-utilization 0.99 of it, which leaves 0.8 GiB: vLLM would "
        "refuse to start h2 beside it. Lower that to 0.98 or less, or prove a resident_gib of 0.79 or less "
        "(`lanectl standby check h1 --beside h2` measures both), or leave standby off"]

