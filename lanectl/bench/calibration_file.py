"""The arm noise `gate LANE --calibrate` measured on this host, per workload and cell: `state_dir/calibration.json`.

A gate's own A/B/A bracket has one pair of control arms, one degree of freedom to tell how far apart two
arms of one lane land: an interval on that alone is honest and very wide. A calibration runs N arms of one
lane and keeps each cell's variance of log arm means (N - 1 df); later gates of the same workload on this
host pool it with their own arms (`lanectl.bench.stats.ratio_interval`). The record holds for the workload
only while its cells send the same thing (`Workload.cells_digest`), only on the host that measured it, and only
on the GPUs it had then (`gpu_mismatch`).
"""

from __future__ import annotations

import itertools
import math
import platform
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from lanectl.bench.stats import ArmNoise
from lanectl.bench.verdict import KeptCalibration
from lanectl.bench.workload import Workload
from lanectl.errors import EXIT_BAD_INPUT, OperationFailed
from lanectl.state.file_model import Timestamp, load_state_file, write_state_file
from lanectl.state.journal import utc_now, utc_timestamp

MAX_CALIBRATION_BYTES = 4 * 1024 * 1024


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


class CellNoise(_Record):
    variance: Annotated[float, Field(ge=0)]  # of log(arm mean rate), between arms of one lane
    df: Annotated[int, Field(ge=1)]


class WorkloadNoise(_Record):
    lane: str  # the lane whose arms were measured
    node: str  # platform.node() of the host that measured it
    recorded: Timestamp
    # The spec digest of the lane's primary container when it was measured (its image by ID, command, env, ...):
    # a gate uses the prior only while its control runs that same config. None: kept before it was recorded.
    lane_digest: str | None = None
    # Each GPU of the host as nvidia-smi names it when it was measured, in index order ([]: none listed): a gate
    # uses the prior only on the same GPUs. None: kept before they were recorded, or nvidia-smi did not answer.
    gpus: list[str] | None = None
    arms: Annotated[int, Field(ge=3)]
    cells_digest: str
    cells: dict[str, CellNoise]


class CalibrationState(_Record):
    version: Literal[1] = 1
    workloads: dict[str, WorkloadNoise] = {}


class CalibrationFileCorrupt(OperationFailed):
    exit_code = EXIT_BAD_INPUT

    def __init__(self, path: Path, detail: str):
        super().__init__(f"{path} is not a readable calibration ({detail}); nothing switched. Move it aside "
                         f"(mv {path} {path}.broken) and run `lanectl gate LANE --calibrate` again")


class CalibrationStore:
    def __init__(self, path: Path):
        self.path = path

    def load(self) -> CalibrationState:
        state = load_state_file(self.path, CalibrationState, MAX_CALIBRATION_BYTES, "calibration", version=1,
                                refuse=lambda detail, newer: CalibrationFileCorrupt(self.path, detail))
        return state or CalibrationState()

    def save(self, workload: str, record: WorkloadNoise) -> None:
        state = self.load()
        state = state.model_copy(update={"workloads": {**state.workloads, workload: record}})
        write_state_file(self.path, (state.model_dump_json(indent=2) + "\n").encode())


def measured_noise(lane: str, workload: Workload, calibration: dict[str, Any]) -> WorkloadNoise:
    """The record of one calibration's cells (`judge_arm_noise`'s figures, the lane's `lane_digest` and the host's
    `gpus`), to keep for later gates."""
    cells = {key: CellNoise(variance=cell["variance"], df=cell["df"]) for key, cell in calibration["cells"].items()}
    arms = max((cell["arms"] for cell in calibration["cells"].values()), default=0)
    return WorkloadNoise(lane=lane, node=platform.node(), recorded=utc_timestamp(utc_now()), arms=arms,
                         lane_digest=calibration.get("lane_digest"), gpus=calibration.get("gpus"),
                         cells_digest=workload.cells_digest(), cells=cells)


def priors_for(state: CalibrationState, workload: Workload, control: str | None = None,
               now: datetime | None = None, *, gpus: Sequence[str] | None
               ) -> tuple[dict[str, ArmNoise], dict[str, Any] | None, str]:
    """The cells' priors for a gate of `workload` against `control` on this host, whose GPUs are `gpus` (as
    `lanectl.host.gpu_inventory.gpu_names` lists them), where the record came from (None: no prior), and a line
    saying which it is, for the person running the gate. A record of other GPUs is refused (`gpu_mismatch`):
    no prior, and the source says why, for the verdict. The record's age at `now` and the workload's
    `calibration_max_age_days` go into the source, for the verdict to flag; its lane config (`lane_digest`) is
    held to the control's by the gate once the control runs (`lanectl.bench.gate`)."""
    found = state.workloads.get(workload.name)
    hint = f"`lanectl gate {control or 'CONTROL'} --workload {workload.name} --calibrate` measures it"
    if found is None:
        return {}, None, (f"no calibration of workload {workload.name} on this host: each cell's interval rests on "
                          f"the bracket's own arms (1 degree of freedom in A/B/A, so it is wide); {hint}")
    if found.node != platform.node():
        return {}, None, (f"the calibration of workload {workload.name} was measured on {found.node}, not here: "
                          f"not used; {hint}")
    if found.cells_digest != workload.cells_digest():
        return {}, None, (f"the calibration of workload {workload.name} was measured on other prompts or settings: "
                          f"not used; {hint}")
    if control is not None and found.lane != control:
        return {}, None, (f"the calibration of workload {workload.name} was measured on {found.lane}, not the control "
                          f"{control}: not used; {hint}")
    priors = {key: ArmNoise(variance=cell.variance, df=cell.df) for key, cell in found.cells.items()}
    age = ((now or utc_now()) - datetime.fromisoformat(found.recorded)).total_seconds() / 86400
    source = {"lane": found.lane, "node": found.node, "recorded": found.recorded, "arms": found.arms,
              "lane_digest": found.lane_digest, "gpus": found.gpus, "age_days": round(age, 2),
              "max_age_days": workload.calibration_max_age_days}
    other = gpu_mismatch(found.recorded, found.gpus, gpus)
    if other is not None:
        return {}, {**source, "refused": other}, f"{other}: not used; {hint}"
    spread = max((math.sqrt(cell.variance) for cell in found.cells.values()), default=0.0)
    old = (f"; it is {age:.0f} days old, more than the {workload.calibration_max_age_days:g} days the workload "
           "allows (`calibration_max_age_days`): the verdict flags it" if age > workload.calibration_max_age_days
           else "")
    return priors, source, (f"intervals pool each cell's own arms with the arm noise `gate {found.lane} --calibrate` "
                            f"measured here at {found.recorded} ({found.arms} arms; at most {spread:.2%} between "
                            f"arms){old}")


def gpu_mismatch(recorded: str, kept: Sequence[str] | None, now: Sequence[str] | None) -> str | None:
    """Why a calibration of `recorded`, measured on the GPUs `kept`, is no prior on this host's GPUs `now`; None
    when they are the same kinds in the same order.

    The arm noise is the GPU's as much as the lane's. The same 8B-shaped vLLM 0.26.0 engine's A/A arms of the
    coding workload spread 0.08 % between arms at prose@1 on an H100, and 0.24 % and 0.29 % in two sessions on an
    H200 (gpu/record/aa64-8b-h100, aa64-8b, aa-8b); with the H100's calibration as the prior, the first H200
    session's A/B/A intervals held 1.0 in 5 of 10 brackets at prose@1, and the conflict check on each bracket's
    control pair set the prior aside in 2 others (tests/test_gate_coverage.py). A host keeps its name when its
    GPU is swapped or a cloud host comes back on another kind, so the record's node alone does not say this."""
    if kept is None:
        return (f"the calibration of {recorded} does not say which GPUs it ran on (kept before lanectl recorded "
                "them, or nvidia-smi did not answer then)")
    if now is None:
        return (f"this host's GPUs could not be listed (nvidia-smi did not answer), so nothing says they are the "
                f"{gpu_kinds(kept)} the calibration of {recorded} ran on")
    if list(kept) != list(now):
        return f"the calibration of {recorded} ran on {gpu_kinds(kept)}, where this host has {gpu_kinds(now)}"
    return None


def gpu_kinds(names: Sequence[str]) -> str:
    """`NVIDIA H200`, `8 x NVIDIA H100 80GB HBM3`, `NVIDIA GB300, NVIDIA RTX PRO 6000`: GPUs in index order, a run
    of one kind counted; `no GPU` for none."""
    runs = [(name, len(list(same))) for name, same in itertools.groupby(names)]
    return ", ".join(name if count == 1 else f"{count} x {name}" for name, count in runs) or "no GPU"


def kept_calibration(workload: object) -> KeptCalibration | None:
    """This host's kept calibration of `workload` (a workload's name from a results.json), to hold a run's
    recorded priors to (`lanectl.bench.verdict.recheck`); None when it keeps none here, or none it can read."""
    from lanectl.state.paths import StateFiles, state_dir

    try:
        found = CalibrationStore(StateFiles(state_dir()).calibration).load().workloads.get(str(workload))
    except OperationFailed:
        return None
    if found is None or found.node != platform.node():
        return None
    cells = {key: ArmNoise(variance=cell.variance, df=cell.df) for key, cell in found.cells.items()}
    return KeptCalibration(node=found.node, recorded=found.recorded, cells=cells)
