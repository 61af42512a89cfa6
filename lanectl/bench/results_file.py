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
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from lanectl.errors import BadInput

# A gate over every class, concurrency and context of a large workload writes well under 1 MiB.
MAX_RESULTS_BYTES = 16 * 1024 * 1024
# What `json` would otherwise nest into until RecursionError.
MAX_DEPTH = 64


class _Shape(BaseModel):
    # Fields the report does not read are kept as they are (a newer lanectl may add some).
    model_config = ConfigDict(extra="allow", allow_inf_nan=False)


Verdict = Literal["pass", "fail", "inconclusive"]


class _Cell(_Shape):
    klass: str = Field(alias="class")
    concurrency: int
    context: int
    arms: dict[str, float]
    ratio: float = Field(ge=0)
    low: float = Field(ge=0)
    high: float = Field(ge=0)
    verdict: Verdict
    decode_ratio: float | None
    prompt_ratio: float | None
    ttft_ratio: float | None


class _Figures(_Shape):
    confident_flips: int
    confident_flips_bar: int | None
    weighted_divergence: float
    weighted_divergence_bar: float | None


class _Agent(_Shape):
    classes: list[str]
    confident_flips: int


class _Fidelity(_Shape):
    reference: str
    verdict: Verdict
    confident_flips: int
    confident_flips_bar: int | None
    weighted_divergence: float
    weighted_divergence_bar: float
    positions: int
    prompts: int
    classes: dict[str, _Figures]
    agent: _Agent


class _Arm(_Shape):
    arm: str


class _Probe(_Shape):
    kind: str
    passed: int
    total: int
    ok: bool
    seconds: dict[str, float]


class _Calibration(_Shape):
    false_promotion_rate: float
    max_false_promotion: float
    cells: int
    cells_passed: int
    detectable_ratio: float
    detectable_gain: float


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

    @field_validator("fidelity", mode="before")
    @classmethod
    def _no_fidelity(cls, value: Any) -> Any:
        return None if value == {} else value  # a run with nothing to score writes {}


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


class _Results(_Shape):
    gate: _Gate


class _BracketResults(_Shape):
    gate: _Bracket


def _read_bounded(path: Path) -> bytes:
    # O_NONBLOCK: a FIFO planted as results.json must not hang the command; it is refused below.
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise BadInput(f"{path} is not a regular file; give a folder written by `lanectl gate --out`")
        if info.st_size > MAX_RESULTS_BYTES:
            raise BadInput(f"{path} is {info.st_size} bytes, more than a gate writes "
                           f"({MAX_RESULTS_BYTES // (1024 * 1024)} MiB at most)")
        with os.fdopen(os.dup(fd), "rb") as handle:
            return handle.read(MAX_RESULTS_BYTES + 1)
    finally:
        os.close(fd)


def load_results(run_dir: Path) -> dict[str, Any]:
    """results.json as written, after checking every field the report and the release note read."""
    path = run_dir / "results.json"
    if not path.exists():
        raise BadInput(f"{run_dir}: no results.json; give a folder written by `lanectl gate --out`")
    try:
        raw = _read_bounded(path)
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
    try:
        # The bracket form is tried only for a document that says it is one: a one-candidate run's errors
        # are then its own, not a union's.
        bracket = isinstance(data["gate"], dict) and "candidates" in data["gate"]
        (_BracketResults if bracket else _Results).model_validate(data)
    except ValidationError as exc:
        wrong = "; ".join(f"{'.'.join(str(p) for p in error['loc'])}: "
                          + ("expected a JSON object" if error["type"] == "model_type" else error["msg"])
                          for error in exc.errors(include_url=False)[:10])
        raise BadInput(f"{path} is not a gate's results ({wrong}); rerun `lanectl gate --out`, "
                       f"or restore the file from the run") from None
    return data


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
