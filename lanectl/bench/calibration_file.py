"""The arm noise `gate LANE --calibrate` measured on this host, per workload and cell: `state_dir/calibration.json`.

A gate's own A/B/A bracket has one pair of control arms, one degree of freedom to tell how far apart two
arms of one lane land: an interval on that alone is honest and very wide. A calibration runs N arms of one
lane and keeps each cell's variance of log arm means (N - 1 df); later gates of the same workload on this
host pool it with their own arms (`lanectl.bench.stats.ratio_interval`). The record holds for the workload
only while its cells send the same thing (`Workload.cells_digest`), and only on the host that measured it.
"""

from __future__ import annotations

import math
import platform
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
    """The record of one calibration's cells (`judge_arm_noise`'s figures, and the lane's `lane_digest`), to keep
    for later gates."""
    cells = {key: CellNoise(variance=cell["variance"], df=cell["df"]) for key, cell in calibration["cells"].items()}
    arms = max((cell["arms"] for cell in calibration["cells"].values()), default=0)
    return WorkloadNoise(lane=lane, node=platform.node(), recorded=utc_timestamp(utc_now()), arms=arms,
                         lane_digest=calibration.get("lane_digest"), cells_digest=workload.cells_digest(),
                         cells=cells)


def priors_for(state: CalibrationState, workload: Workload, control: str | None = None,
               now: datetime | None = None) -> tuple[dict[str, ArmNoise], dict[str, Any] | None, str]:
    """The cells' priors for a gate of `workload` against `control` on this host, where the record came from (None:
    no prior), and a line saying which it is, for the person running the gate. The record's age at `now` and
    the workload's `calibration_max_age_days` go into the source, for the verdict to flag; its lane config
    (`lane_digest`) is held to the control's by the gate once the control runs (`lanectl.bench.gate`)."""
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
              "lane_digest": found.lane_digest, "age_days": round(age, 2),
              "max_age_days": workload.calibration_max_age_days}
    spread = max((math.sqrt(cell.variance) for cell in found.cells.values()), default=0.0)
    old = (f"; it is {age:.0f} days old, more than the {workload.calibration_max_age_days:g} days the workload "
           "allows (`calibration_max_age_days`): the verdict flags it" if age > workload.calibration_max_age_days
           else "")
    return priors, source, (f"intervals pool each cell's own arms with the arm noise `gate {found.lane} --calibrate` "
                            f"measured here at {found.recorded} ({found.arms} arms; at most {spread:.2%} between "
                            f"arms){old}")


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
