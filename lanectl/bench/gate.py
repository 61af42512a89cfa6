"""bench and gate: measure a lane, and judge a candidate only through an A/B/A bracket with controls.

The release note's protocol (BRIEF §5): the control lane runs at the start and the end of the
bracket, the candidate in between; a cell's verdict is the candidate's ratio to the mean of the
controls against a bar, with the controls' own drift as the noise band; any new Xid line or fatal
engine line in any arm fails the gate whatever the speed; fidelity at temperature 0 compares the
tokens chosen, position by position, against the controls' own run-to-run spread.
"""

from __future__ import annotations

import json
import platform
import re
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from lanectl.bench.loadgen import ArmResult, run_arm
from lanectl.bench.probes import Probe, run_probe
from lanectl.bench.stats import FidelityReport, TokenChoice, Verdict, cell_verdict, fidelity, fidelity_verdict
from lanectl.bench.workload import Workload, prefixed
from lanectl.dockerapi.containers import ContainerEngine
from lanectl.health.gate import FATAL_ENGINE_LINES
from lanectl.health.probe import probe_base_url
from lanectl.host.xid import believed_xid
from lanectl.lanes.switcher import LaneSwitcher
from lanectl.recipe.catalog import Lane

# Logprobs asked for in the fidelity pass: enough to find the candidate's token among the control's top.
FIDELITY_TOP_LOGPROBS = 5
REQUESTS_PER_STREAM = 3


@dataclass
class LaneBench:
    """One arm: every (class, concurrency) cell of a lane, its fidelity pass, and what went wrong."""

    lane: str
    arm: str
    image: str
    started: str
    cells: dict[str, ArmResult] = field(default_factory=dict)  # key "class@concurrency"
    fidelity_choices: dict[str, tuple[TokenChoice, ...]] = field(default_factory=dict)  # "class#index"
    xid_lines: list[str] = field(default_factory=list)
    fatal_lines: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    probes: dict[str, dict[str, Any]] = field(default_factory=dict)  # name -> ProbeReport.summary()

    def summary(self) -> dict[str, Any]:
        return {
            "lane": self.lane, "arm": self.arm, "image": self.image, "started": self.started,
            "cells": {key: _arm_figures(arm) for key, arm in self.cells.items()},
            "xid_lines": self.xid_lines, "fatal_lines": self.fatal_lines, "notes": self.notes,
            "probes": self.probes,
        }


def _arm_figures(arm: ArmResult) -> dict[str, Any]:
    return {name: getattr(arm, name) for name in (
        "concurrency", "requests", "wall_time_s", "output_tokens", "output_tok_per_s", "decode_tok_per_s",
        "ms_per_step", "ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p99_ms", "failed")}


def bench_lane(engine: ContainerEngine, lane: Lane, workload: Workload, concurrency: list[int], *, arm: str,
               kernel_log: Any | None, progress: Callable[[str], None] = lambda text: None,
               probes: Sequence[Probe] = ()) -> LaneBench:
    """Measure the serving lane. Prompts carry a prefix unique to this arm, so a prefix cache warmed by
    an earlier arm cannot inflate this one (vllm#52884); the fidelity pass sends the bare prompts,
    the same in every arm, one at a time, with logprobs. Then each correctness probe, inside the arm's
    log and Xid window."""
    base_url, model = probe_base_url(lane), lane.spec.health.served_model_name
    primary = engine.container(lane.container_name())
    result = LaneBench(lane=lane.name, arm=arm, image=primary.image if primary else "?",
                       started=datetime.now(UTC).isoformat(timespec="seconds"))
    kernel_cursor = kernel_log.read_new(None)[1] if kernel_log is not None else None
    if kernel_log is None:
        result.notes.append("kernel log not readable: Xid lines were not checked in this arm")
    log_since = time.time()
    arm_id = f"{arm}-{uuid.uuid4().hex[:8]}"
    for klass in workload.classes:
        prompts = [prefixed(p, arm_id) for p in workload.prompts(klass)]
        for streams in concurrency:
            progress(f"{lane.name} [{arm}] {klass} at {streams} stream(s)")
            requests = max(len(prompts), REQUESTS_PER_STREAM * streams)
            result.cells[f"{klass}@{streams}"] = run_arm(
                base_url, model, prompts, concurrency=streams, requests=requests,
                max_tokens=workload.max_tokens, warmup=min(streams, 2), temperature=workload.temperature,
                prompt_class=klass)
        progress(f"{lane.name} [{arm}] {klass}: fidelity pass")
        fidelity_arm = run_arm(base_url, model, workload.prompts(klass), concurrency=1,
                               requests=len(workload.prompts(klass)), max_tokens=workload.max_tokens, warmup=0,
                               logprobs=FIDELITY_TOP_LOGPROBS, temperature=0.0, prompt_class=klass)
        for index, choices in fidelity_arm.choices_by_prompt().items():
            result.fidelity_choices[f"{klass}#{index}"] = choices
    for probe in probes:
        progress(f"{lane.name} [{arm}] probe {probe.name}")
        result.probes[probe.name] = run_probe(base_url, model, probe).summary()
    patterns = [*FATAL_ENGINE_LINES, *(re.compile(p) for p in lane.spec.watchdog.fatal_log_lines)]
    for name in (lane.container_name(role) for role in lane.roles):
        result.fatal_lines += [line for line in engine.logs(name, since=log_since).splitlines()
                               if any(p.search(line) for p in patterns)]
    if kernel_log is not None:
        lines, _ = kernel_log.read_new(kernel_cursor)
        result.xid_lines = [line.text for line in lines if believed_xid(line) is not None]
    return result


@dataclass
class GateReport:
    candidate: str
    control: str
    bar: float
    verdict: Verdict
    reasons: list[str]
    cells: dict[str, dict[str, Any]]
    fidelity: dict[str, Any]
    arms: list[dict[str, Any]]
    promoted: str | None = None
    probes: dict[str, dict[str, Any]] = field(default_factory=dict)  # probe -> arm -> its summary
    host: dict[str, str] = field(default_factory=lambda: {"node": platform.node(), "python": platform.python_version(),
                                                          "machine": platform.machine()})

    def as_dict(self) -> dict[str, Any]:
        return {"candidate": self.candidate, "control": self.control, "bar": self.bar, "verdict": self.verdict.value,
                "reasons": self.reasons, "cells": self.cells, "fidelity": self.fidelity, "arms": self.arms,
                "promoted": self.promoted, "probes": self.probes, "host": self.host}


def judge(control_first: LaneBench, candidate: LaneBench, control_last: LaneBench, bar: float) -> GateReport:
    """Pure: the verdict from three arms.

    Per cell (class@concurrency) on output tok/s: `cell_verdict`. Overall: FAIL when any arm logged a
    new Xid or fatal engine line, any arm had failed requests or failed a correctness probe, any cell
    FAILs, or fidelity FAILs; PASS when nothing failed and at least one cell PASSes (a split-KV kernel
    wins where it applies and must merely not lose elsewhere); INCONCLUSIVE otherwise: rerun, do not promote.
    """
    reasons: list[str] = []
    for arm in (control_first, candidate, control_last):
        if arm.xid_lines:
            reasons.append(f"{arm.arm} ({arm.lane}) logged {len(arm.xid_lines)} Xid line(s): {arm.xid_lines[0]}")
        if arm.fatal_lines:
            reasons.append(f"{arm.arm} ({arm.lane}) logged a fatal engine line: {arm.fatal_lines[0]}")
        failed = sum(cell.failed for cell in arm.cells.values())
        if failed:
            reasons.append(f"{arm.arm} ({arm.lane}) had {failed} failed request(s)")
    reasons += probe_reasons((control_first, candidate, control_last))
    cells: dict[str, dict[str, Any]] = {}
    for key in candidate.cells:
        a1, b, a2 = (arm.cells[key].output_tok_per_s for arm in (control_first, candidate, control_last))
        judged = cell_verdict(a1, a2, b, bar)
        cells[key] = {"control_first": a1, "candidate": b, "control_last": a2, "ratio": judged.ratio,
                      "band": judged.band, "verdict": judged.verdict.value}
        if judged.verdict == Verdict.FAIL:
            reasons.append(f"{key}: {judged}")
    candidate_drift: FidelityReport[str] = fidelity(control_first.fidelity_choices, candidate.fidelity_choices)
    control_drift: FidelityReport[str] = fidelity(control_first.fidelity_choices, control_last.fidelity_choices)
    fidelity_result = fidelity_verdict(candidate_drift, control_drift)
    if fidelity_result == Verdict.FAIL:
        reasons.append(f"fidelity: {candidate_drift.confident_flips} confident flips (bar "
                       f"{control_drift.confident_flips}), weighted divergence "
                       f"{candidate_drift.weighted_divergence:.3f} (bar {control_drift.weighted_divergence:.3f})")
    if reasons:
        verdict = Verdict.FAIL
    elif any(cell["verdict"] == Verdict.PASS.value for cell in cells.values()):
        verdict = Verdict.PASS
        reasons.append("no cell failed, and " + ", ".join(k for k, c in cells.items() if c["verdict"] == "pass")
                       + f" beat the {bar:.3f}x bar beyond the controls' noise")
    else:
        verdict = Verdict.INCONCLUSIVE
        reasons.append(f"no cell beat the {bar:.3f}x bar beyond the controls' noise, and none fell below it")
    return GateReport(
        candidate=candidate.lane, control=control_first.lane, bar=bar, verdict=verdict, reasons=reasons,
        cells=cells,
        fidelity={"verdict": fidelity_result.value, "confident_flips": candidate_drift.confident_flips,
                  "confident_flips_bar": control_drift.confident_flips,
                  "weighted_divergence": candidate_drift.weighted_divergence,
                  "weighted_divergence_bar": control_drift.weighted_divergence,
                  "prompts": candidate_drift.prompts, "positions": candidate_drift.positions},
        arms=[arm.summary() for arm in (control_first, candidate, control_last)],
        probes=probe_table((control_first, candidate, control_last)),
    )


def probe_reasons(arms: Sequence[LaneBench]) -> list[str]:
    """A reason for each probe that failed in any arm: a control that fails one cannot vouch for the bracket."""
    reasons = []
    for arm in arms:
        for name, probe in arm.probes.items():
            if not probe["ok"]:
                reasons.append(f"{arm.arm} ({arm.lane}) failed probe {name}: {probe['passed']}/{probe['total']} "
                               f"passed; {probe['failures'][0]}")
    return reasons


def probe_table(arms: Sequence[LaneBench]) -> dict[str, dict[str, Any]]:
    return {name: {arm.arm: arm.probes[name] for arm in arms if name in arm.probes}
            for name in dict.fromkeys(name for arm in arms for name in arm.probes)}


def run_gate(switcher: LaneSwitcher, candidate: Lane, control: Lane, workload: Workload, concurrency: list[int], *,
             bar: float, promote: bool, kernel_log: Any | None,
             progress: Callable[[str], None] = lambda text: None, probes: Sequence[Probe] = ()) -> GateReport:
    """The bracket: control, candidate, control; each switch through the lanes code path and its gate.

    The caller holds the host lock for the whole bracket. The control is serving at the end, unless
    `promote` and the verdict is PASS: then the candidate is.
    """
    arms: list[LaneBench] = []
    for arm, lane in (("control-1", control), ("candidate", candidate), ("control-2", control)):
        progress(f"{arm}: switching to {lane.name}")
        outcome = switcher.up(lane)
        if outcome.result not in ("ok", "noop"):
            raise_message = f"{arm}: could not bring {lane.name} up: {outcome.message}"
            switcher.journal.append("gate", candidate=candidate.name, control=control.name, verdict="fail",
                                    reasons=[raise_message])
            if outcome.lane != control.name:
                switcher.up(control)
            return GateReport(candidate=candidate.name, control=control.name, bar=bar, verdict=Verdict.FAIL,
                              reasons=[raise_message], cells={}, fidelity={},
                              arms=[a.summary() for a in arms])
        arms.append(bench_lane(switcher.engine, lane, workload, concurrency, arm=arm, kernel_log=kernel_log,
                               progress=progress, probes=probes))
    report = judge(arms[0], arms[1], arms[2], bar)
    if promote and report.verdict == Verdict.PASS:
        progress(f"PASS: promoting {candidate.name}")
        outcome = switcher.up(candidate, why=f"gate PASS against {control.name}")
        report.promoted = candidate.name if outcome.result in ("ok", "noop") else None
        if report.promoted is None:
            report.reasons.append(f"promotion failed: {outcome.message}")
    switcher.journal.append("gate", candidate=candidate.name, control=control.name, verdict=report.verdict.value,
                            bar=bar, reasons=report.reasons, promoted=report.promoted,
                            cells={k: {"ratio": round(c["ratio"], 4), "verdict": c["verdict"]}
                                   for k, c in report.cells.items()},
                            fidelity=report.fidelity)
    return report


def write_results(directory: Path, name: str, data: dict[str, Any]) -> Path:
    run_dir = directory / f"{datetime.now(UTC).strftime('%Y%m%dT%H%M%SZ')}-{name}"
    run_dir.mkdir(parents=True, exist_ok=False)
    (run_dir / "results.json").write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    return run_dir
