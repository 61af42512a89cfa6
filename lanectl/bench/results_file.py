"""A gate run's results.json read back (`lanectl report`): checked whole before anything uses it.

The file is the gate's own output, but it sits in a folder anyone may have edited, copied or truncated;
`report` reads it long after the run. Every shape the report view and the plot rely on is checked here
(figures finite, verdicts known, tables of the right kinds), and any other shape becomes one `BadInput`
that names the file and each wrong field, so the view never meets a value it cannot print.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from lanectl.bench.stats import INTERVAL_MODELS
from lanectl.errors import BadInput

# A gate over every class, concurrency and context of a large workload writes well under 1 MiB.
MAX_RESULTS_BYTES = 16 * 1024 * 1024
# What `json` would otherwise nest into until RecursionError.
MAX_DEPTH = 64


# 1: the summaries only (lanectl before the per-request rates were kept); no "version" key.
# 2: each arm's cells keep their per-request `rates`, and each cell how its interval was built.
RESULTS_VERSION = 2


class _Shape(BaseModel):
    # Strict: "1.025" is not a number and 1 is not true. Fields the report does not read are kept as they are
    # (a newer lanectl may add some).
    model_config = ConfigDict(extra="allow", allow_inf_nan=False, strict=True)


Verdict = Literal["pass", "fail", "inconclusive"]
Rate = Annotated[float, Field(ge=0)]
Count = Annotated[int, Field(ge=0)]


class _Prior(_Shape):
    variance: Rate
    df: Annotated[int, Field(ge=1)]


class _Interval(_Shape):
    model: str
    confidence: Annotated[float, Field(gt=0, lt=1)]
    df: Annotated[int, Field(ge=1)] | None
    arm_sd: Rate | None
    prior: _Prior | None

    @field_validator("model")
    @classmethod
    def _known(cls, model: str) -> str:
        if model not in INTERVAL_MODELS:
            raise ValueError(f"unknown interval model {model!r}; this lanectl recomputes {', '.join(INTERVAL_MODELS)}")
        return model


class _Cell(_Shape):
    klass: str = Field(alias="class")
    concurrency: Annotated[int, Field(ge=1)]
    context: Count
    arms: dict[str, Rate]
    ratio: Rate
    low: Rate
    high: Rate
    verdict: Verdict
    decode_ratio: Rate | None
    prompt_ratio: Rate | None
    ttft_ratio: Rate | None
    failed: Count | None = None  # format 2
    interval: _Interval | None = None  # format 2


class _Figures(_Shape):
    confident_flips: Count
    confident_flips_bar: Count | None
    weighted_divergence: Rate
    weighted_divergence_bar: Rate | None


class _Agent(_Shape):
    classes: list[str]
    confident_flips: Count


class _Fidelity(_Shape):
    reference: str
    verdict: Verdict
    confident_flips: Count
    confident_flips_bar: Count | None
    weighted_divergence: Rate
    weighted_divergence_bar: Rate
    positions: Count
    prompts: Count
    unscored: Count = 0
    classes: dict[str, _Figures]
    agent: _Agent


class _ArmCell(_Shape):
    concurrency: Annotated[int, Field(ge=1)]
    failed: Count
    output_tok_per_s: Rate
    ms_per_step: Rate | None
    rates: list[Rate] | None = None  # format 2: each successful request's tok/s, in completion order


class _Probe(_Shape):
    kind: str
    passed: Count
    total: Count
    ok: bool
    seconds: dict[str, Rate]
    failures: list[str] = []


class _Arm(_Shape):
    arm: str
    lane: str
    image: str
    started: str
    cells: dict[str, _ArmCell]
    xid_lines: list[str]
    fatal_lines: list[str]
    notes: list[str]
    probes: dict[str, _Probe] = {}


class _CalibrationCell(_Shape):
    arms: Annotated[int, Field(ge=3)]
    variance: Rate
    df: Annotated[int, Field(ge=1)]
    arm_sd: Rate
    brackets: Count
    covered: Count
    passed: Count
    failed: Count
    false_promotion: Annotated[float, Field(ge=0, le=1)]
    detectable_ratio: Rate


class _Calibration(_Shape):
    max_false_promotion: Annotated[float, Field(ge=0, le=1)]
    false_promotion_rate: Annotated[float, Field(ge=0, le=1)] | None = None
    # Format 1: the number of cells; format 2: each cell's figures.
    cells: Count | dict[str, _CalibrationCell]
    cells_passed: Count | None = None  # format 1
    brackets: Count | None = None  # format 2
    covered: Count | None = None
    brackets_passed: Count | None = None
    brackets_failed: Count | None = None
    detectable_ratio: Rate | None = None
    detectable_gain: Rate | None = None

    @model_validator(mode="after")
    def _format_1_has_its_figures(self) -> _Calibration:
        # Format 1 wrote one bracket's figures beside the count of cells; the report shows each of them.
        if isinstance(self.cells, int):
            missing = [name for name in FORMAT_1_CALIBRATION if getattr(self, name) is None]
            if missing:
                raise ValueError(f"a format-1 calibration (cells: {self.cells}) holds its figures, and this one has "
                                 f"no {', '.join(missing)}")
        return self


FORMAT_1_CALIBRATION = ("false_promotion_rate", "cells_passed", "detectable_ratio", "detectable_gain")


class _NoisePrior(_Shape):
    lane: str
    node: str
    recorded: str
    arms: Annotated[int, Field(ge=3)]


class _Round(_Shape):
    candidate_arms: Count
    control_arms: Count
    verdict: Verdict


class _Gate(_Shape):
    candidate: str
    control: str
    bar: float = Field(gt=0)
    verdict: Verdict
    order: str = "ABA"
    promoted: str | None = None
    reasons: list[str]
    cells: dict[str, _Cell]
    fidelity: _Fidelity | None = None
    arms: list[_Arm] = []
    probes: dict[str, dict[str, _Probe]] = {}
    calibration: _Calibration | None = None
    requested_order: Literal["ABA", "ABBA"] | None = None  # format 2
    until_decided: Count = 0
    rounds: list[_Round] = []
    noise_prior: _NoisePrior | None = None

    @field_validator("fidelity", mode="before")
    @classmethod
    def _no_fidelity(cls, value: Any) -> Any:
        return None if value == {} else value  # a run with nothing to score writes {}

    @model_validator(mode="after")
    def _promoted_is_the_candidate(self) -> _Gate:
        if self.promoted not in (None, self.candidate):
            raise ValueError(f"promoted names {self.promoted!r}, not the candidate {self.candidate!r}")
        return self


class _Bracket(_Shape):
    """Several candidates in one bracket: each one's own gate form under `candidates`."""

    control: str
    bar: float = Field(gt=0)
    verdict: Verdict
    order: str
    best: str | None = None
    promoted: str | None = None
    reasons: list[str]
    candidates: list[_Gate] = Field(min_length=2)
    arms: list[_Arm] = []
    requested_order: Literal["ABA", "ABBA"] | None = None
    until_decided: Count = 0

    @model_validator(mode="after")
    def _names_are_candidates(self) -> _Bracket:
        names = [c.candidate for c in self.candidates]
        if len(set(names)) != len(names):
            raise ValueError(f"a candidate is listed twice: {', '.join(names)}")
        for field_name in ("best", "promoted"):
            named = getattr(self, field_name)
            if named is not None and named not in names:
                raise ValueError(f"{field_name} names {named!r}, which is not one of the candidates "
                                 f"({', '.join(names)})")
        return self


class _Results(_Shape):
    version: Literal[1, 2] = 1
    workload: str = "?"
    concurrency: list[Annotated[int, Field(ge=1)]] = []
    gate: _Gate


class _BracketResults(_Results):
    gate: _Bracket  # type: ignore[assignment]


def read_run_file(path: Path, limit: int, *, most: str, fix: str, follow_links: bool = True) -> bytes:
    """The first `limit` + 1 bytes of a file in a run folder, refused (BadInput) unless it is a regular file
    of at most `limit` bytes (`most` says whose size that is; `fix` what to do instead). O_NONBLOCK: a FIFO
    planted there must not hang the command; it is refused here. Without `follow_links`, a symbolic link is
    not opened at all (ELOOP, an OSError for the caller)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | (0 if follow_links else os.O_NOFOLLOW))
    try:
        status = os.fstat(fd)
        if not stat.S_ISREG(status.st_mode):
            raise BadInput(f"{path} is not a regular file; {fix}")
        if status.st_size > limit:
            raise BadInput(f"{path} is {status.st_size} bytes, more than {most} ({limit // (1024 * 1024)} MiB at "
                           f"most); {fix}")
        with os.fdopen(os.dup(fd), "rb") as handle:
            return handle.read(limit + 1)
    finally:
        os.close(fd)


def load_results(run_dir: Path) -> dict[str, Any]:
    """results.json as written, after checking every field the report and the release note read."""
    path = run_dir / "results.json"
    if not path.exists():
        raise BadInput(f"{run_dir}: no results.json; give a folder written by `lanectl gate --out`")
    try:
        raw = read_run_file(path, MAX_RESULTS_BYTES, most="a gate writes",
                            fix="give a folder written by `lanectl gate --out`")
    except OSError as exc:
        raise BadInput(f"{path}: cannot read it: {exc.strerror or exc}") from None
    if raw.count(b"[") + raw.count(b"{") > MAX_DEPTH and not _shallow_enough(raw):
        raise BadInput(f"{path} nests deeper than {MAX_DEPTH} levels; it is not a gate's results")
    try:
        data = json.loads(raw.decode("utf-8"), parse_constant=_refuse_constant)
    except UnicodeDecodeError as exc:
        raise BadInput(f"{path} is not UTF-8 text (byte {exc.start})") from None
    except ValueError as exc:
        raise BadInput(f"{path} is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise BadInput(f"{path} holds a JSON {type(data).__name__}, not the object `lanectl gate --out` writes")
    if "gate" not in data:
        raise BadInput(f"{path} holds a bench run, not a gate; its figures are in the file")
    version = data.get("version", 1)
    if type(version) is int and version > RESULTS_VERSION:
        raise BadInput(f"{path} is results format {version}, written by a newer lanectl; this one reads formats "
                       f"1 to {RESULTS_VERSION}")
    try:
        # The bracket form is tried only for a document that says it is one: a one-candidate run's errors
        # are then its own, not a union's.
        bracket = isinstance(data["gate"], dict) and "candidates" in data["gate"]
        (_BracketResults if bracket else _Results).model_validate(data)
    except ValidationError as exc:
        wrong = "; ".join(f"{'.'.join(str(p) for p in error['loc'])}: "
                          + ("expected a JSON object" if error["type"] == "model_type"
                             else error["msg"].removeprefix("Value error, "))
                          for error in exc.errors(include_url=False)[:10])
        raise BadInput(f"{path} is not a gate's results ({wrong}); rerun `lanectl gate --out`, "
                       f"or restore the file from the run") from None
    if version >= 2:
        missing = _missing_evidence(data["gate"])
        if missing:
            raise BadInput(f"{path} is not a gate's results ({'; '.join(missing[:10])}: format 2 keeps every "
                           "arm's per-request rates in every cell, and how each cell's interval was built); rerun "
                           "`lanectl gate --out`, or restore the file from the run")
    return data


def _missing_evidence(gate: dict[str, Any]) -> list[str]:
    """Where a format-2 file lacks what its verdicts are recomputed from, as `gate.…` locations."""
    missing = []
    reports = [("gate", gate)]
    if "candidates" in gate:
        reports = [(f"gate.candidates.{i}", c) for i, c in enumerate(gate["candidates"])]
    for where, report in reports:
        if "arms" not in report:
            missing.append(f"{where}.arms: missing")
            continue
        keys = list(report["cells"]) or list((report.get("calibration") or {}).get("cells") or {})
        for key in report["cells"]:
            for name in ("failed", "interval"):
                if report["cells"][key].get(name) is None:
                    missing.append(f"{where}.cells.{key}.{name}: missing")
        for i, arm in enumerate(report["arms"]):
            for key in keys:
                cell = arm["cells"].get(key)
                if cell is None or cell.get("rates") is None:
                    missing.append(f"{where}.arms.{i}.cells.{key}{'' if cell is None else '.rates'}: missing")
    return missing


def load_gate_results(run_dir: Path) -> dict[str, Any]:
    """results.json's `gate` section, checked as `load_results` checks it."""
    gate: dict[str, Any] = load_results(run_dir)["gate"]
    return gate


def _shallow_enough(raw: bytes) -> bool:
    """Bracket depth, counted on the bytes outside strings, before `json` recurses into them."""
    depth = deepest = 0
    in_string = escaped = False
    for byte in raw:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):
            depth += 1
            deepest = max(deepest, depth)
            if deepest > MAX_DEPTH:
                return False
        elif byte in (0x5D, 0x7D):
            depth -= 1
    return True


def _refuse_constant(name: str) -> float:
    raise ValueError(f"{name} is not a figure a gate writes")
