"""bench and gate: measure a lane, and judge a candidate only through a bracket with controls.

The release note's protocol (BRIEF §5): the control lane runs at the start and the end of the
bracket, the candidate in between (A/B/A, or A/B/B/A); a cell's verdict is the bootstrap interval of
the candidate/control ratio of per-request rates against a bar; any new Xid line or fatal engine line
in any arm fails the gate whatever the speed; fidelity at temperature 0 is teacher-forced: the first
control arm's greedy continuations are scored, every position, by every other arm, and the candidate
may drift from them no more than the other control arm did. Teacher forcing is by token ids
(lanectl.bench.forcing): the reference's prompt ids and continuation ids are sent back as ids, so a
continuation whose text a tokenizer would merge differently is still scored position by position.
"""

from __future__ import annotations

import json
import math
import platform
import re
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from lanectl.bench.forcing import GreedyContinuation, greedy_continuation, score_continuation
from lanectl.bench.loadgen import ArmResult, make_client, run_arm
from lanectl.bench.probes import Probe, run_probe
from lanectl.bench.stats import (
    BOOTSTRAP_RESAMPLES,
    BOOTSTRAP_SEED,
    CONFIDENT_P,
    ForcedFidelity,
    ForcedPosition,
    RatioInterval,
    TokenChoice,
    Verdict,
    bootstrap_ratio,
    calibrate,
    cell_verdict,
    fidelity_verdict,
    teacher_forced,
)
from lanectl.bench.workload import Workload, padded, prefixed
from lanectl.dockerapi.containers import ContainerEngine
from lanectl.health.engine_log import fatal_engine_lines
from lanectl.health.probe import probe_base_url
from lanectl.host.xid import believed_xid
from lanectl.lanes.switcher import LaneSwitcher
from lanectl.recipe.catalog import Lane

# Logprobs asked for in the fidelity pass: enough to find the scored arm's top token among the reference's.
FIDELITY_TOP_LOGPROBS = 5
REQUESTS_PER_STREAM = 3
SCORING_NOTE = re.compile(r"[^\s#]+#\d+: ")
# Arm orders: A is the control, B the candidate.
ORDERS = {"ABA": ("control-1", "candidate", "control-2"),
          "ABBA": ("control-1", "candidate-1", "candidate-2", "control-2")}


def bracket_arms(order: str, candidates: Sequence[str]) -> list[tuple[str, str | None]]:
    """(arm name, candidate lane; None for the control) in the order the bracket runs them.

    One candidate: the names of ORDERS. Several: ABA is A, C1, C2, ..., A and ABBA mirrors it
    (A, C1, C2, C2, C1, A), so every candidate sits as far from each control on average; each
    candidate arm's name carries its lane (`candidate:demo-h2`, `candidate-2:demo-h2`)."""
    if len(candidates) == 1:
        return [(arm, None if arm.startswith("control") else candidates[0]) for arm in ORDERS[order]]
    arms: list[tuple[str, str | None]] = [("control-1", None)]
    if order == "ABA":
        arms += [(f"candidate:{lane}", lane) for lane in candidates]
    else:
        arms += [(f"candidate-1:{lane}", lane) for lane in candidates]
        arms += [(f"candidate-2:{lane}", lane) for lane in reversed(candidates)]
    return [*arms, ("control-2", None)]


def cell_key(klass: str, streams: int, context: int) -> str:
    """`prose@8`, or `prose@8/64K` for a prompt padded to 65536 tokens."""
    if not context:
        return f"{klass}@{streams}"
    return f"{klass}@{streams}/{context // 1024}K" if context % 1024 == 0 else f"{klass}@{streams}/{context}"


@dataclass
class LaneBench:
    """One arm: every (class, concurrency, context) cell of a lane, its fidelity pass, and what went wrong."""

    lane: str
    arm: str
    image: str
    started: str
    cells: dict[str, ArmResult] = field(default_factory=dict)  # key: cell_key()
    cell_axes: dict[str, tuple[str, int, int]] = field(default_factory=dict)  # key -> (class, concurrency, context)
    greedy: dict[str, tuple[TokenChoice, ...]] = field(default_factory=dict)  # "class#index": this arm's T=0 output
    # The fidelity pass's outcome per "class#index": the continuation with its ids, or why there is none.
    continuations: dict[str, GreedyContinuation | str] = field(default_factory=dict)
    forced: dict[str, tuple[ForcedPosition, ...]] = field(default_factory=dict)  # the reference's, as scored here
    xid_lines: list[str] = field(default_factory=list)
    fatal_lines: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    probes: dict[str, dict[str, Any]] = field(default_factory=dict)  # name -> ProbeReport.summary()

    def summary(self) -> dict[str, Any]:
        return {
            "lane": self.lane, "arm": self.arm, "image": self.image, "started": self.started,
            "cells": {key: _arm_figures(arm) for key, arm in self.cells.items()},
            "greedy": {key: [c.token for c in choices] for key, choices in self.greedy.items()},
            "greedy_token_ids": {key: list(made.token_ids) for key, made in self.continuations.items()
                                 if isinstance(made, GreedyContinuation)},
            "xid_lines": self.xid_lines, "fatal_lines": self.fatal_lines, "notes": self.notes,
            "probes": self.probes,
        }


def _arm_figures(arm: ArmResult) -> dict[str, Any]:
    return {name: getattr(arm, name) for name in (
        "concurrency", "requests", "wall_time_s", "output_tokens", "output_tok_per_s", "decode_tok_per_s",
        "ms_per_step", "ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p99_ms", "failed")}


def bench_lane(engine: ContainerEngine, lane: Lane, workload: Workload, concurrency: list[int], *, arm: str,
               kernel_log: Any | None, reference: dict[str, GreedyContinuation | str] | None = None,
               progress: Callable[[str], None] = lambda text: None, probes: Sequence[Probe] = ()) -> LaneBench:
    """Measure the serving lane. Prompts carry a prefix unique to this arm, so a prefix cache warmed by
    an earlier arm cannot inflate this one (vllm#52884), and are padded to each of the workload's
    context lengths. The fidelity pass sends the bare prompts, the same in every arm, one at a time at
    temperature 0 with logprobs and token ids; with `reference` (another arm's `continuations`) it then
    scores that arm's prompt ids + continuation ids as a token-id prompt with prompt logprobs: teacher
    forcing. A prompt that cannot be scored is noted as "class#index: why". Then each correctness
    probe, inside the arm's log and Xid window."""
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
        for context in workload.context_lengths:
            prompts = [prefixed(padded(p, context), arm_id) for p in workload.prompts(klass)]
            for streams in concurrency:
                key = cell_key(klass, streams, context)
                progress(f"{lane.name} [{arm}] {key}")
                requests = max(len(prompts), REQUESTS_PER_STREAM * streams)
                result.cells[key] = run_arm(
                    base_url, model, prompts, concurrency=streams, requests=requests,
                    max_tokens=workload.max_tokens, warmup=min(streams, 2), temperature=workload.temperature,
                    prompt_class=klass)
                result.cell_axes[key] = (klass, streams, context)
        progress(f"{lane.name} [{arm}] {klass}: fidelity pass")
        fidelity_pass(base_url, model, klass, workload.prompts(klass), max_tokens=workload.max_tokens,
                      reference=reference, result=result)
    for probe in probes:
        progress(f"{lane.name} [{arm}] probe {probe.name}")
        result.probes[probe.name] = run_probe(base_url, model, probe).summary()
    for name in (lane.container_name(role) for role in lane.roles):
        result.fatal_lines += fatal_engine_lines(engine.logs(name, since=log_since).splitlines(),
                                                 lane.spec.watchdog.fatal_log_lines)
    if kernel_log is not None:
        lines, _ = kernel_log.read_new(kernel_cursor)
        result.xid_lines = [line.text for line in lines if believed_xid(line) is not None]
    return result


def fidelity_pass(base_url: str, model: str, klass: str, prompts: Sequence[str], *, max_tokens: int,
                  reference: dict[str, GreedyContinuation | str] | None, result: LaneBench) -> None:
    """One class of bench_lane's fidelity pass, into `result`: this arm's greedy continuation of each
    bare prompt (keys "klass#index"), then, with `reference`, that arm's continuations of this class
    scored here by token ids. Every prompt that cannot be continued or scored gets a note saying why."""
    with make_client(1) as client:
        for index, prompt in enumerate(prompts):
            key = f"{klass}#{index}"
            made = greedy_continuation(client, base_url, model, prompt, max_tokens=max_tokens,
                                       top_logprobs=FIDELITY_TOP_LOGPROBS)
            result.continuations[key] = made
            # A prompt the reference could not continue stays in `greedy` with no tokens, so the
            # fidelity verdict counts it unscored instead of never having seen it.
            result.greedy[key] = made.choices if isinstance(made, GreedyContinuation) else ()
            if isinstance(made, str):
                result.notes.append(f"{key}: {made}")
        for key, wanted in (reference or {}).items():
            if key.split("#")[0] != klass:
                continue
            if isinstance(wanted, str):
                result.notes.append(f"{key}: no reference continuation to score: {wanted}")
                continue
            scored = score_continuation(client, base_url, model, wanted.prompt_token_ids, wanted.token_ids, top=1)
            if isinstance(scored, str):
                result.notes.append(f"{key}: {scored}")
            else:
                result.forced[key] = scored


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
    order: str = "ABA"
    promoted: str | None = None
    calibration: dict[str, Any] | None = None
    probes: dict[str, dict[str, Any]] = field(default_factory=dict)  # probe -> arm -> its summary
    host: dict[str, str] = field(default_factory=lambda: {"node": platform.node(), "python": platform.python_version(),
                                                          "machine": platform.machine()})

    def as_dict(self) -> dict[str, Any]:
        return {"candidate": self.candidate, "control": self.control, "bar": self.bar, "verdict": self.verdict.value,
                "order": self.order, "reasons": self.reasons, "cells": self.cells, "fidelity": self.fidelity,
                "arms": self.arms, "promoted": self.promoted, "calibration": self.calibration, "probes": self.probes,
                "host": self.host}


def overall_ratio(report: GateReport) -> float | None:
    """The geometric mean of a candidate's cell ratios: how `--promote` ranks candidates that passed."""
    ratios = [cell["ratio"] for cell in report.cells.values() if cell["ratio"] > 0]
    return math.exp(math.fsum(math.log(r) for r in ratios) / len(ratios)) if ratios else None


@dataclass
class BracketReport:
    """Several candidates judged in one bracket against the same two control arms, each by `judge`."""

    control: str
    bar: float
    order: str
    candidates: list[GateReport]
    arms: list[dict[str, Any]]
    promoted: str | None = None
    reasons: list[str] = field(default_factory=list)

    @property
    def best(self) -> GateReport | None:
        """The candidate that passed with the highest overall ratio; None when none passed."""
        passed = [r for r in self.candidates if r.verdict == Verdict.PASS]
        return max(passed, key=lambda r: overall_ratio(r) or 0.0) if passed else None

    @property
    def verdict(self) -> Verdict:
        """PASS when any candidate passed; FAIL when every one failed; INCONCLUSIVE otherwise."""
        verdicts = {r.verdict for r in self.candidates}
        if Verdict.PASS in verdicts:
            return Verdict.PASS
        return Verdict.FAIL if verdicts == {Verdict.FAIL} else Verdict.INCONCLUSIVE

    def as_dict(self) -> dict[str, Any]:
        """One candidate: exactly the one-candidate form. Several: each candidate's own form under
        `candidates`, with the bracket's arms, order, verdict and promotion beside them."""
        if len(self.candidates) == 1:
            return {**self.candidates[0].as_dict(), "promoted": self.promoted}
        best = self.best
        return {"control": self.control, "bar": self.bar, "order": self.order, "verdict": self.verdict.value,
                "best": best.candidate if best else None, "promoted": self.promoted, "reasons": self.reasons,
                "candidates": [r.as_dict() for r in self.candidates], "arms": self.arms,
                "host": self.candidates[0].host}


def judge_bracket(arms: Sequence[LaneBench], bar: float, *, agent_classes: Sequence[str] = (),
                  resamples: int = BOOTSTRAP_RESAMPLES, seed: int = BOOTSTRAP_SEED) -> BracketReport:
    """Pure: each candidate lane judged by `judge` on the control arms and its own arms only, so all
    share the controls, the bar, the fidelity reference (control-1's outputs) and the probes."""
    controls = [a for a in arms if a.arm.startswith("control")]
    lanes = list(dict.fromkeys(a.lane for a in arms if a.arm.startswith("candidate")))
    # In the bracket's order, so each candidate's own order reads as it ran: ABA, or ABBA.
    reports = [judge([a for a in arms if a.arm.startswith("control") or a.lane == lane], bar,
                     agent_classes=agent_classes, resamples=resamples, seed=seed) for lane in lanes]
    order = "".join("A" if a.arm.startswith("control") else chr(ord("B") + lanes.index(a.lane)) for a in arms)
    bracket = BracketReport(control=controls[0].lane, bar=bar, order=order, candidates=reports,
                            arms=[a.summary() for a in arms])
    bracket.reasons = [f"{r.candidate}: {r.verdict.value.upper()}"
                       + (f" (overall {ratio:.3f}x)" if (ratio := overall_ratio(r)) is not None else "")
                       for r in reports]
    return bracket


def _mean_of(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return math.fsum(known) / len(known) if len(known) == len(values) and known else None


def _ratio(candidate: float | None, control: float | None) -> float | None:
    return candidate / control if candidate is not None and control else None


def _judge_cell(key: str, controls: list[LaneBench], candidates: list[LaneBench], bar: float, *,
                resamples: int, seed: int) -> tuple[dict[str, Any], RatioInterval]:
    def rates(arm: LaneBench) -> list[float]:
        return [r.tok_per_s for r in arm.cells[key].results if r.ok]

    def mean(arms: list[LaneBench], figure: Callable[[ArmResult], float | None]) -> float | None:
        return _mean_of([figure(arm.cells[key]) for arm in arms])

    def prompt_rate(cell: ArmResult) -> float | None:
        return _mean_of([r.prompt_tok_per_s for r in cell.results if r.ok] or [None])

    interval = bootstrap_ratio([rates(a) or [0.0] for a in controls], [rates(a) or [0.0] for a in candidates],
                               resamples=resamples, seed=seed)
    judged = cell_verdict(interval.ratio, interval.low, interval.high, bar)
    klass, streams, context = candidates[0].cell_axes.get(key, (key, 0, 0))
    ttft_control, ttft_candidate = (mean(arms, lambda c: c.ttft_p50_ms) for arms in (controls, candidates))
    cell = {
        "class": klass, "concurrency": streams, "context": context,
        "arms": {arm.arm: arm.cells[key].output_tok_per_s for arm in (*controls, *candidates)},
        "ratio": judged.ratio, "low": judged.low, "high": judged.high, "verdict": judged.verdict.value,
        # Beside the verdict's figure: > 1 always means the candidate did better.
        "decode_ratio": _ratio(mean(candidates, lambda c: c.decode_tok_per_s),
                               mean(controls, lambda c: c.decode_tok_per_s)),
        "prompt_ratio": _ratio(mean(candidates, prompt_rate), mean(controls, prompt_rate)),
        "ttft_ratio": _ratio(ttft_control, ttft_candidate),
    }
    return cell, interval


def _fidelity(controls: list[LaneBench], candidates: list[LaneBench], agent_classes: Sequence[str]) -> dict[str, Any]:
    reference = controls[0]

    def scored(arm: LaneBench, classes: Sequence[str] | None = None) -> ForcedFidelity[str]:
        keep = {k: v for k, v in reference.greedy.items() if classes is None or k.split("#")[0] in classes}
        return teacher_forced(keep, arm.forced)

    def worst(arms: list[LaneBench], classes: Sequence[str] | None = None) -> ForcedFidelity[str]:
        return max((scored(arm, classes) for arm in arms),
                   key=lambda f: (f.confident_flips, f.weighted_divergence))

    def figures(candidate: ForcedFidelity[str], bar: ForcedFidelity[str] | None) -> dict[str, Any]:
        return {"confident_flips": candidate.confident_flips, "weighted_divergence": candidate.weighted_divergence,
                "confident_flips_bar": bar.confident_flips if bar else None,
                "weighted_divergence_bar": bar.weighted_divergence if bar else None,
                "prompts": candidate.prompts, "positions": candidate.positions}

    others = controls[1:]
    candidate_drift, control_drift = worst(candidates), worst(others) if others else None
    agent = worst(candidates, agent_classes)
    if control_drift is None:  # one control arm: nothing to measure its own spread by
        control_drift = ForcedFidelity(prompts=0, positions=0, unscored=0, flips=())
    verdict = fidelity_verdict(candidate_drift, control_drift, agent.confident_flips)
    # A prompt a candidate arm could not be scored on says nothing either way: the gate may not pass on it.
    unscored = max(scored(arm).unscored for arm in candidates)
    if verdict == Verdict.PASS and unscored:
        verdict = Verdict.INCONCLUSIVE
    classes = dict.fromkeys(k.split("#")[0] for k in reference.greedy)
    return {
        "verdict": verdict.value, "method": "teacher-forced", "scored_by": "token_ids", "reference": reference.arm,
        "confident_p": CONFIDENT_P, **figures(candidate_drift, control_drift),
        "unscored": unscored,
        "classes": {k: figures(worst(candidates, [k]), worst(others, [k]) if others else None) for k in classes},
        "agent": {"classes": list(agent_classes), **figures(agent, None)},
    }


def judge(arms: Sequence[LaneBench], bar: float, *, agent_classes: Sequence[str] = (),
          resamples: int = BOOTSTRAP_RESAMPLES, seed: int = BOOTSTRAP_SEED,
          max_false_promotion: float | None = None) -> GateReport:
    """Pure: the verdict from the arms of a bracket (named as in ORDERS: control-1 first, then the
    candidate arms, control-2 last).

    Per cell (class@concurrency[/context]): `cell_verdict` on the bootstrap interval of the
    candidate/control ratio of per-request rates. Overall: FAIL when any arm logged a new Xid or fatal
    engine line, any arm had failed requests or failed a correctness probe, any cell FAILs, or
    teacher-forced fidelity FAILs; PASS
    when nothing failed and at least one cell PASSes (a split-KV kernel wins where it applies and must
    merely not lose elsewhere); INCONCLUSIVE otherwise: rerun, do not promote.

    With `max_false_promotion` the bracket is a calibration (every arm ran the control): the verdict is
    PASS when its false-promotion rate is at most that and no cell PASSed, FAIL otherwise.
    """
    controls = [a for a in arms if a.arm.startswith("control")]
    candidates = [a for a in arms if a.arm.startswith("candidate")]
    reasons: list[str] = []
    for arm in arms:
        if arm.xid_lines:
            reasons.append(f"{arm.arm} ({arm.lane}) logged {len(arm.xid_lines)} Xid line(s): {arm.xid_lines[0]}")
        if arm.fatal_lines:
            reasons.append(f"{arm.arm} ({arm.lane}) logged a fatal engine line: {arm.fatal_lines[0]}")
        failed = sum(cell.failed for cell in arm.cells.values())
        if failed:
            reasons.append(f"{arm.arm} ({arm.lane}) had {failed} failed request(s)")
    reasons += probe_reasons(arms)
    cells: dict[str, dict[str, Any]] = {}
    intervals: list[RatioInterval] = []
    for key in candidates[0].cells:
        cells[key], interval = _judge_cell(key, controls, candidates, bar, resamples=resamples, seed=seed)
        intervals.append(interval)
        if cells[key]["verdict"] == Verdict.FAIL.value:
            reasons.append(f"{key}: fail: {cells[key]['ratio']:.3f}x against a bar of {bar:.3f}x "
                           f"(95% interval {cells[key]['low']:.3f}-{cells[key]['high']:.3f})")
    fid = _fidelity(controls, candidates, agent_classes)
    if fid["verdict"] == Verdict.FAIL.value:
        reasons.append(f"fidelity: {fid['confident_flips']} confident flips (bar {fid['confident_flips_bar']}), "
                       f"weighted divergence {fid['weighted_divergence']:.3f} (bar "
                       f"{fid['weighted_divergence_bar']:.3f}), {fid['agent']['confident_flips']} confident "
                       f"flips on agent/tool prompts (allowed 0)")
    reasons_to_rerun = []
    if fid["verdict"] == Verdict.INCONCLUSIVE.value:
        # bench_lane notes why a prompt's scoring request failed as "class#index: why".
        why = next((note for arm in candidates for note in arm.notes if SCORING_NOTE.match(note)), None)
        reasons_to_rerun.append(f"fidelity: {fid['unscored']} prompt(s) could not be scored in a candidate arm, so "
                                "teacher forcing cannot vouch for them" + (f" ({why})" if why else ""))
    calibration = None
    if max_false_promotion is not None:
        found = calibrate(intervals, bar)
        calibration = {"max_false_promotion": max_false_promotion, "false_promotion_rate": found.false_promotion_rate,
                       "cells": found.cells, "cells_passed": found.cells_passed,
                       "replicates_per_cell": resamples, "detectable_ratio": found.detectable_ratio,
                       "detectable_gain": found.detectable_gain}
        line = (f"false-promotion rate {found.false_promotion_rate:.4f} (allowed {max_false_promotion:g}) over "
                f"{found.cells} cells x {resamples} replicates, {found.cells_passed} cell(s) passed the bar; "
                f"smallest detectable: {found.detectable_ratio:.3f}x to pass the bar, "
                f"+{found.detectable_gain:.1%} to tell from no change")
        # Anything else that went wrong (a failed request or probe, a FAIL cell) is noise the setup must not have.
        reasons += reasons_to_rerun
        verdict = Verdict.PASS if found.within(max_false_promotion) and not reasons else Verdict.FAIL
        reasons = [line, *reasons] if verdict == Verdict.PASS else [*reasons, line]
    elif reasons:
        verdict = Verdict.FAIL
    elif reasons_to_rerun:
        verdict = Verdict.INCONCLUSIVE
        reasons += reasons_to_rerun
    elif any(cell["verdict"] == Verdict.PASS.value for cell in cells.values()):
        verdict = Verdict.PASS
        reasons.append("no cell failed, and " + ", ".join(k for k, c in cells.items() if c["verdict"] == "pass")
                       + f" beat the {bar:.3f}x bar at the low end of the 95% interval")
    else:
        verdict = Verdict.INCONCLUSIVE
        reasons.append(f"no cell's 95% interval cleared the {bar:.3f}x bar, and none fell below it")
    order = "".join("A" if a.arm.startswith("control") else "B" for a in arms)
    return GateReport(
        candidate=candidates[0].lane, control=controls[0].lane, bar=bar, verdict=verdict, reasons=reasons,
        cells=cells, fidelity=fid, arms=[arm.summary() for arm in arms], order=order, calibration=calibration,
        probes=probe_table(arms))


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


def run_gate(switcher: LaneSwitcher, candidates: Lane | Sequence[Lane], control: Lane, workload: Workload,
             concurrency: list[int], *, bar: float, promote: bool, kernel_log: Any | None, order: str = "ABA",
             max_false_promotion: float | None = None,
             progress: Callable[[str], None] = lambda text: None, probes: Sequence[Probe] = ()) -> BracketReport:
    """The bracket in `order` (`bracket_arms`: ABA is control, each candidate, control; ABBA mirrors the
    candidates); each switch through the lanes code path and its gate. The first control arm's greedy
    outputs are the continuations every later arm scores.

    The caller holds the host lock for the whole bracket. The control is serving at the end, unless
    `promote` and a candidate PASSed: then the best that passed (highest overall ratio) is. A calibration
    (`max_false_promotion` set, one candidate = control) never promotes.
    """
    chosen = [candidates] if isinstance(candidates, Lane) else list(candidates)
    names = [lane.name for lane in chosen]
    journal_names = {"candidate": names[0]} if len(names) == 1 else {"candidates": names}
    arms: list[LaneBench] = []
    unreachable: dict[str, str] = {}  # candidate -> why it could not be brought up
    for arm, candidate_name in bracket_arms(order, names):
        if candidate_name in unreachable:
            continue
        lane = control if candidate_name is None else chosen[names.index(candidate_name)]
        progress(f"{arm}: switching to {lane.name}")
        outcome = switcher.up(lane)
        if outcome.result not in ("ok", "noop") and candidate_name is not None and len(names) > 1:
            # One candidate that cannot come up fails alone; the controls still bracket the others.
            unreachable[candidate_name] = f"{arm}: could not bring {lane.name} up: {outcome.message}"
            progress(unreachable[candidate_name])
            continue
        if outcome.result not in ("ok", "noop"):
            raise_message = f"{arm}: could not bring {lane.name} up: {outcome.message}"
            switcher.journal.append("gate", **journal_names, control=control.name, verdict="fail",
                                    reasons=[raise_message])
            if outcome.lane != control.name:
                switcher.up(control)
            failed = [GateReport(candidate=name, control=control.name, bar=bar, verdict=Verdict.FAIL,
                                 reasons=[raise_message], cells={}, fidelity={}, order=order,
                                 arms=[a.summary() for a in arms]) for name in names]
            return BracketReport(control=control.name, bar=bar, order=order, candidates=failed,
                                 arms=[a.summary() for a in arms], reasons=[raise_message])
        arms.append(bench_lane(switcher.engine, lane, workload, concurrency, arm=arm, kernel_log=kernel_log,
                               reference=arms[0].continuations if arms else None, progress=progress,
                               probes=probes))
    if len(names) == 1:
        single = judge(arms, bar, agent_classes=workload.agent_classes, max_false_promotion=max_false_promotion)
        report = BracketReport(control=control.name, bar=bar, order=single.order, candidates=[single],
                               arms=single.arms)
    else:
        measured = [a for a in arms if a.lane not in unreachable or a.arm.startswith("control")]
        report = judge_bracket(measured, bar, agent_classes=workload.agent_classes)
        by_name = {r.candidate: r for r in report.candidates}
        report.candidates = [by_name.get(name) or GateReport(
            candidate=name, control=control.name, bar=bar, verdict=Verdict.FAIL, reasons=[unreachable[name]],
            cells={}, fidelity={}, order=order, arms=[]) for name in names]
        report.reasons = [*(f"{name}: FAIL ({why})" for name, why in unreachable.items()),
                          *(r for r in report.reasons if r.split(":")[0] not in unreachable)]
        report.arms = [a.summary() for a in arms]
    best = report.best
    if promote and best is not None and max_false_promotion is None:
        progress(f"PASS: promoting {best.candidate}")
        outcome = switcher.up(chosen[names.index(best.candidate)], why=f"gate PASS against {control.name}")
        report.promoted = best.candidate if outcome.result in ("ok", "noop") else None
        best.promoted = report.promoted
        if report.promoted is None:
            best.reasons.append(f"promotion failed: {outcome.message}")
    for judged in report.candidates:
        switcher.journal.append("gate", candidate=judged.candidate, control=control.name,
                                verdict=judged.verdict.value, bar=bar, order=report.order, reasons=judged.reasons,
                                promoted=judged.promoted,
                                cells={k: {"ratio": round(c["ratio"], 4), "low": round(c["low"], 4),
                                           "high": round(c["high"], 4), "verdict": c["verdict"]}
                                       for k, c in judged.cells.items()},
                                fidelity={k: v for k, v in judged.fidelity.items() if k != "classes"},
                                calibration=judged.calibration)
    return report


def write_results(directory: Path, name: str, data: dict[str, Any]) -> Path:
    run_dir = directory / f"{datetime.now(UTC).strftime('%Y%m%dT%H%M%SZ')}-{name}"
    run_dir.mkdir(parents=True, exist_ok=False)
    (run_dir / "results.json").write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    return run_dir
