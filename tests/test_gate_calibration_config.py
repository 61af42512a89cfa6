"""A calibration says when, on which lane config and on which GPUs it was taken; a gate uses it only on that
config and those GPUs, and flags one older than the workload allows.

Pure: the calibration record, the gate's choice of priors (`priors_for`, then `same_config` once the control
has run), and the verdict's lines. The spec digest is the one lanectl stamps on the control's primary container
(`io.lanectl.spec`: its image by ID, command, env, ports, ...), read by `serving_digest` in a real bracket; the
GPUs are nvidia-smi's names of them (`gpu_names`, held here to a stand-in nvidia-smi on PATH).
"""

from __future__ import annotations

import json
import platform
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from lanectl.bench.calibration_file import (
    CalibrationState,
    CellNoise,
    WorkloadNoise,
    gpu_kinds,
    gpu_mismatch,
    measured_noise,
    priors_for,
)
from lanectl.bench.gate import same_config
from lanectl.bench.stats import ArmNoise
from lanectl.bench.verdict import judge_candidate, judge_cell, recompute_candidate, recompute_gate
from lanectl.bench.workload import WorkloadInvalid, load_workload
from lanectl.host.gpu_inventory import gpu_names, parse_gpu_names
from tests.conftest import REPO
from tests.test_gate_coverage import BAR, written

DEMO = load_workload(REPO / "recipes" / "workloads" / "demo.yaml")
DIGEST = "a" * 64
RECORDED = "2026-12-01T10:00:00.000Z"
H200 = ["NVIDIA H200"]  # nvidia-smi's names of the recorded sessions' GPUs (gpu/record/*/env.log)
H100 = ["NVIDIA H100 80GB HBM3"]


def kept(lane: str = "demo-h1", digest: str | None = DIGEST, gpus: list[str] | None = H200) -> CalibrationState:
    record = WorkloadNoise(lane=lane, node=platform.node(), recorded=RECORDED, arms=12, lane_digest=digest,
                           gpus=gpus, cells_digest=DEMO.cells_digest(),
                           cells={"prose@1": CellNoise(variance=1e-5, df=7)})
    return CalibrationState(workloads={"demo": record})


def at(days: float) -> datetime:
    """`days` after the calibration was recorded."""
    return datetime(2026, 12, 1, 10, tzinfo=UTC) + timedelta(days=days)


def test_a_calibration_records_the_lane_config_and_the_gpus_it_ran_on():
    calibration = {"cells": {"prose@1": {"variance": 1e-5, "df": 7, "arms": 12}}, "lane_digest": DIGEST,
                   "gpus": H200}
    record = measured_noise("demo-h1", DEMO, calibration)
    assert (record.lane, record.lane_digest, record.gpus, record.node) == ("demo-h1", DIGEST, H200, platform.node())
    assert datetime.fromisoformat(record.recorded).tzinfo is not None


def test_report_keeps_the_gpus_a_calibration_ran_on():
    """`lanectl report` of a calibration run judges its figures again and keeps its facts as recorded."""
    run = REPO / "tests" / "data" / "release-note" / "20261203T102747Z-calibrate-demo-h1" / "results.json"
    gate = json.loads(run.read_text())["gate"]
    gate["calibration"].update(gpus=H200, lane_digest=DIGEST)
    recomputed = recompute_gate(gate)["calibration"]
    assert (recomputed["gpus"], recomputed["lane_digest"]) == (H200, DIGEST)


def test_a_calibration_of_another_lane_is_not_used():
    priors, source, line = priors_for(kept(lane="demo-h2"), DEMO, "demo-h1", at(1), gpus=H200)
    assert (priors, source) == ({}, None)
    assert line.startswith("the calibration of workload demo was measured on demo-h2, not the control demo-h1: "
                           "not used; `lanectl gate demo-h1 --workload demo --calibrate` measures it")


def test_a_calibration_of_the_controls_config_is_used_and_one_of_another_config_is_not():
    priors, source, _ = priors_for(kept(), DEMO, "demo-h1", at(1), gpus=H200)
    assert priors == {"prose@1": ArmNoise(variance=1e-5, df=7)} and source is not None
    assert (source["lane_digest"], source["age_days"], source["max_age_days"]) == (DIGEST, 1.0, 30)
    assert same_config(priors, source, [DIGEST, DIGEST]) == (priors, source)
    used, refused = same_config(priors, source, [DIGEST, "b" * 64])
    assert used == {} and refused is not None
    assert refused["refused"] == (f"the calibration of {RECORDED} ran another config of demo-h1 (spec digest "
                                  "aaaaaaaaaaaa, where the control ran aaaaaaaaaaaa, bbbbbbbbbbbb)")
    # Kept before the config was recorded: nothing says it measured this one.
    _, unknown = same_config(*priors_for(kept(digest=None), DEMO, "demo-h1", at(1), gpus=H200)[:2], [DIGEST])
    assert unknown is not None
    assert unknown["refused"].endswith("was kept before lanectl recorded the lane config it ran")


def verdict_lines(noise_prior: dict, prior: ArmNoise | None) -> list[str]:
    arms = [written("control-1", {"prose@1": [100.0]}), written("candidate", {"prose@1": [103.6]}),
            written("control-2", {"prose@1": [100.1]})]
    cells = {"prose@1": judge_cell("prose@1", arms, BAR, prior)}
    report = {"candidate": "candidate", "arms": arms, "cells": cells, "fidelity": {}, "reasons": [],
              "noise_prior": noise_prior}
    judged = judge_candidate(cells, arms, {}, BAR, noise_prior=noise_prior)
    # `lanectl report` says the same from the file.
    assert recompute_candidate(report, BAR)["reasons"] == judged.reasons
    return judged.reasons


def test_the_verdict_says_the_prior_was_not_used_and_why():
    priors, source, _ = priors_for(kept(), DEMO, "demo-h1", at(1), gpus=H200)
    _, refused = same_config(priors, source, ["b" * 64])
    assert refused is not None
    lines = verdict_lines(refused, None)
    assert lines[-1] == (f"prior not used: the calibration of {RECORDED} ran another config of demo-h1 (spec digest "
                         "aaaaaaaaaaaa, where the control ran bbbbbbbbbbbb); each cell's interval rests on the "
                         "bracket's own arms (`lanectl gate demo-h1 --workload W --calibrate` measures this config)")
    assert not any(line.startswith("prior missing") for line in lines)  # the host has one: it was refused


@pytest.mark.parametrize(("days", "flagged"), [(29.9, False), (30.5, True)])
def test_a_calibration_older_than_the_workload_allows_is_flagged_in_the_verdict(days, flagged):
    priors, source, line = priors_for(kept(), DEMO, "demo-h1", at(days), gpus=H200)
    assert source is not None and ("the verdict flags it" in line) is flagged
    lines = verdict_lines(source, priors["prose@1"])
    old = [line for line in lines if line.startswith("calibration old:")]
    assert old == ([f"calibration old: the calibration of {RECORDED} was 30 days old at the gate, more than the 30 "
                    "days the workload allows (`calibration_max_age_days`); `lanectl gate demo-h1 --workload W "
                    "--calibrate` measures it again"] if flagged else [])


def test_a_workload_sets_its_own_calibration_age(tmp_path: Path):
    text = (REPO / "recipes" / "workloads" / "demo.yaml").read_text()
    (tmp_path / "probes").symlink_to(REPO / "recipes" / "workloads" / "probes")
    (tmp_path / "w.yaml").write_text(text + "calibration_max_age_days: 7\n")
    assert load_workload(tmp_path / "w.yaml").calibration_max_age_days == 7
    (tmp_path / "w.yaml").write_text(text + "calibration_max_age_days: 0\n")
    with pytest.raises(WorkloadInvalid, match="calibration_max_age_days"):
        load_workload(tmp_path / "w.yaml")


def test_a_calibration_taken_on_other_gpus_is_not_used_and_the_verdict_says_so():
    """The H200 sessions' calibration on an H100 (tests/test_gate_coverage.py: with it, 5 of 10 A/B/A intervals of
    an H200 session held 1.0 at prose@1, the H100's calibration on the H200 arms)."""
    priors, source, line = priors_for(kept(), DEMO, "demo-h1", at(1), gpus=H100)
    assert priors == {} and source is not None
    why = f"the calibration of {RECORDED} ran on NVIDIA H200, where this host has NVIDIA H100 80GB HBM3"
    assert source["refused"] == why and source["gpus"] == H200
    assert line == f"{why}: not used; `lanectl gate demo-h1 --workload demo --calibrate` measures it"
    # The control's config, checked once it ran, keeps the refusal; the verdict and `report` say it.
    assert same_config(priors, source, [DIGEST]) == ({}, source)
    lines = verdict_lines(source, None)
    assert lines[-1] == (f"prior not used: {why}; each cell's interval rests on the bracket's own arms (`lanectl "
                         "gate demo-h1 --workload W --calibrate` measures this config)")
    assert not any(line.startswith("prior missing") for line in lines)
    used, source, _ = priors_for(kept(), DEMO, "demo-h1", at(1), gpus=H200)
    assert used == {"prose@1": ArmNoise(variance=1e-5, df=7)} and source is not None and "refused" not in source


@pytest.mark.parametrize(("kept_gpus", "now", "why"), [
    (H200, H200, None),
    ([], [], None),  # a host without NVIDIA GPUs (the stub lanes' demo) keeps its calibration
    (["NVIDIA GB300", "NVIDIA RTX PRO 6000"], ["NVIDIA RTX PRO 6000", "NVIDIA GB300"],
     f"the calibration of {RECORDED} ran on NVIDIA GB300, NVIDIA RTX PRO 6000, where this host has NVIDIA RTX PRO "
     "6000, NVIDIA GB300"),
    (H200, [], f"the calibration of {RECORDED} ran on NVIDIA H200, where this host has no GPU"),
    (8 * H100, 4 * H100, f"the calibration of {RECORDED} ran on 8 x NVIDIA H100 80GB HBM3, where this host has "
                         "4 x NVIDIA H100 80GB HBM3"),
    (None, H200, f"the calibration of {RECORDED} does not say which GPUs it ran on (kept before lanectl recorded "
                 "them, or nvidia-smi did not answer then)"),
    (H200, None, "this host's GPUs could not be listed (nvidia-smi did not answer), so nothing says they are the "
                 f"NVIDIA H200 the calibration of {RECORDED} ran on"),
])
def test_a_calibration_is_used_only_on_the_gpus_it_recorded(kept_gpus, now, why):
    assert gpu_mismatch(RECORDED, kept_gpus, now) == why
    priors, source, _ = priors_for(kept(gpus=kept_gpus), DEMO, "demo-h1", at(1), gpus=now)
    assert source is not None and source.get("refused") == why and bool(priors) is (why is None)


def test_gpu_kinds_counts_a_run_of_one_kind():
    assert gpu_kinds(["NVIDIA H200"] * 2 + H100) == "2 x NVIDIA H200, NVIDIA H100 80GB HBM3"


def test_the_gpus_are_read_as_nvidia_smi_names_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    # `nvidia-smi --query-gpu=name --format=csv,noheader` on the device machine's H100 (gpu/record/aa64-8b-h100/
    # env.log has the name from the same query, with two more fields).
    assert parse_gpu_names("NVIDIA H100 80GB HBM3\n") == H100
    assert parse_gpu_names("\n") is None
    monkeypatch.setenv("PATH", str(tmp_path))
    assert gpu_names() == []  # no nvidia-smi: a host without NVIDIA GPUs
    smi = tmp_path / "nvidia-smi"
    smi.write_text('#!/bin/sh\n[ "$*" = "--query-gpu=name --format=csv,noheader" ] || exit 2\n'
                   'printf "NVIDIA GB300\\nNVIDIA RTX PRO 6000 Blackwell\\n"\n')
    smi.chmod(0o755)
    assert gpu_names() == ["NVIDIA GB300", "NVIDIA RTX PRO 6000 Blackwell"]
    smi.write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed because it could not communicate with the driver'\n"
                   "exit 9\n")
    assert gpu_names() is None
