"""A calibration says when and on which lane config it was taken; a gate uses it only on that config, and flags
one older than the workload allows.

Pure: the calibration record, the gate's choice of priors (`priors_for`, then `same_config` once the control
has run), and the verdict's lines. The spec digest is the one lanectl stamps on the control's primary container
(`io.lanectl.spec`: its image by ID, command, env, ports, ...), read by `serving_digest` in a real bracket.
"""

from __future__ import annotations

import platform
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from lanectl.bench.calibration_file import CalibrationState, CellNoise, WorkloadNoise, measured_noise, priors_for
from lanectl.bench.gate import same_config
from lanectl.bench.stats import ArmNoise
from lanectl.bench.verdict import judge_candidate, judge_cell, recompute_candidate
from lanectl.bench.workload import WorkloadInvalid, load_workload
from tests.conftest import REPO
from tests.test_gate_coverage import BAR, written

DEMO = load_workload(REPO / "recipes" / "workloads" / "demo.yaml")
DIGEST = "a" * 64
RECORDED = "2026-12-01T10:00:00.000Z"


def kept(lane: str = "demo-h1", digest: str | None = DIGEST) -> CalibrationState:
    record = WorkloadNoise(lane=lane, node=platform.node(), recorded=RECORDED, arms=12, lane_digest=digest,
                           cells_digest=DEMO.cells_digest(), cells={"prose@1": CellNoise(variance=1e-5, df=7)})
    return CalibrationState(workloads={"demo": record})


def at(days: float) -> datetime:
    """`days` after the calibration was recorded."""
    return datetime(2026, 12, 1, 10, tzinfo=UTC) + timedelta(days=days)


def test_a_calibration_records_the_lane_config_it_ran():
    calibration = {"cells": {"prose@1": {"variance": 1e-5, "df": 7, "arms": 12}}, "lane_digest": DIGEST}
    record = measured_noise("demo-h1", DEMO, calibration)
    assert (record.lane, record.lane_digest, record.node) == ("demo-h1", DIGEST, platform.node())
    assert datetime.fromisoformat(record.recorded).tzinfo is not None


def test_a_calibration_of_another_lane_is_not_used():
    priors, source, line = priors_for(kept(lane="demo-h2"), DEMO, "demo-h1", at(1))
    assert (priors, source) == ({}, None)
    assert line.startswith("the calibration of workload demo was measured on demo-h2, not the control demo-h1: "
                           "not used; `lanectl gate demo-h1 --workload demo --calibrate` measures it")


def test_a_calibration_of_the_controls_config_is_used_and_one_of_another_config_is_not():
    priors, source, _ = priors_for(kept(), DEMO, "demo-h1", at(1))
    assert priors == {"prose@1": ArmNoise(variance=1e-5, df=7)} and source is not None
    assert (source["lane_digest"], source["age_days"], source["max_age_days"]) == (DIGEST, 1.0, 30)
    assert same_config(priors, source, [DIGEST, DIGEST]) == (priors, source)
    used, refused = same_config(priors, source, [DIGEST, "b" * 64])
    assert used == {} and refused is not None
    assert refused["refused"] == (f"the calibration of {RECORDED} ran another config of demo-h1 (spec digest "
                                  "aaaaaaaaaaaa, where the control ran aaaaaaaaaaaa, bbbbbbbbbbbb)")
    # Kept before the config was recorded: nothing says it measured this one.
    _, unknown = same_config(*priors_for(kept(digest=None), DEMO, "demo-h1", at(1))[:2], [DIGEST])
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
    priors, source, _ = priors_for(kept(), DEMO, "demo-h1", at(1))
    _, refused = same_config(priors, source, ["b" * 64])
    assert refused is not None
    lines = verdict_lines(refused, None)
    assert lines[-1] == (f"prior not used: the calibration of {RECORDED} ran another config of demo-h1 (spec digest "
                         "aaaaaaaaaaaa, where the control ran bbbbbbbbbbbb); each cell's interval rests on the "
                         "bracket's own arms (`lanectl gate demo-h1 --workload W --calibrate` measures this config)")
    assert not any(line.startswith("prior missing") for line in lines)  # the host has one: it was refused


@pytest.mark.parametrize(("days", "flagged"), [(29.9, False), (30.5, True)])
def test_a_calibration_older_than_the_workload_allows_is_flagged_in_the_verdict(days, flagged):
    priors, source, line = priors_for(kept(), DEMO, "demo-h1", at(days))
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
