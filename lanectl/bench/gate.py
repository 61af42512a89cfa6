"""bench and gate: measure a lane, and judge a candidate only through a bracket with controls.

The release note's protocol (BRIEF §5): the control lane runs at the start and the end of the
bracket, the candidate in between (A/B/A, or A/B/B/A); a cell's verdict is the 95 % interval of the
candidate/control ratio of per-request rates, the arm its unit (`lanectl.bench.verdict`), against a
bar; any new Xid line or fatal engine line in any arm fails the gate whatever the speed; fidelity at
temperature 0 is teacher-forced: the first control arm's greedy continuations are scored, every
position, by every other arm, and the candidate may drift from them no more than the other control
arm did. Teacher forcing is by token ids (lanectl.bench.forcing): the reference's prompt ids and
continuation ids are sent back as ids, so a continuation whose text a tokenizer would merge
differently is still scored position by position.
"""

from __future__ import annotations

import json
import math
import platform
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from lanectl.bench.forcing import GreedyContinuation, greedy_continuation, score_continuation
from lanectl.bench.loadgen import ArmResult, make_client, run_arm
from lanectl.bench.probes import Probe, run_probe
from lanectl.bench.stats import (
    CONFIDENT_P,
    ArmNoise,
    ForcedFidelity,
    ForcedPosition,
    TokenChoice,
    Verdict,
    teacher_forced,
)
from lanectl.bench.verdict import (
    bracket_verdict,
    fidelity_verdict_of,
    judge_arm_noise,
    judge_candidate,
    judge_cell,
    overall_ratio,
    rank,
)
from lanectl.bench.workload import Workload, padded, prefixed
from lanectl.dockerapi.containers import ContainerEngine
from lanectl.dockerapi.labels import SPEC_LABEL
from lanectl.health.engine_log import fatal_engine_lines, log_lines
from lanectl.health.probe import probe_base_url
from lanectl.host.xid import believed_xid
from lanectl.lanes.switcher import LaneSwitcher
from lanectl.recipe.catalog import Lane

# Logprobs asked for in the fidelity pass: enough to find the scored arm's top token among the reference's.
FIDELITY_TOP_LOGPROBS = 5
REQUESTS_PER_STREAM = 3
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
    figures = {name: getattr(arm, name) for name in (
        "concurrency", "requests", "wall_time_s", "output_tokens", "output_tok_per_s", "decode_tok_per_s",
        "ms_per_step", "ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p99_ms", "failed")}
    # The evidence the verdict is computed from, kept so that anyone can compute it again:
    # each successful request's tok/s, in the order the requests finished.
    figures["rates"] = [r.tok_per_s for r in arm.results if r.ok]
    return figures


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
        result.fatal_lines += fatal_engine_lines(log_lines(engine.logs(name, since=log_since)),
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
    # Where the cells' prior arm noise came from (`gate --calibrate` on this host); None: the bracket's own arms.
    noise_prior: dict[str, Any] | None = None
    # Set by `judge`, not written: only more arms can decide it (every cell inconclusive, nothing else wrong).
    more_arms_may_decide: bool = False
    # The verdict after each judgement of a bracket run with --until-decided: its arms then, and the verdict.
    rounds: list[dict[str, Any]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"candidate": self.candidate, "control": self.control, "bar": self.bar, "verdict": self.verdict.value,
                "order": self.order, "reasons": self.reasons, "cells": self.cells, "fidelity": self.fidelity,
                "arms": self.arms, "promoted": self.promoted, "calibration": self.calibration, "probes": self.probes,
                "host": self.host, "noise_prior": self.noise_prior, "rounds": self.rounds}


def report_rank(report: GateReport) -> tuple[int, float]:
    return rank(report.verdict, report.cells)


@dataclass
class BracketReport:
    """Several candidates judged in one bracket against the same control arms, each by `judge`."""

    control: str
    bar: float
    order: str
    candidates: list[GateReport]
    arms: list[dict[str, Any]]
    promoted: str | None = None
    reasons: list[str] = field(default_factory=list)
    # The options that shaped the bracket, for the note's "Reproduce": --order and --until-decided.
    requested_order: str = "ABA"
    until_decided: int = 0

    @property
    def best(self) -> GateReport | None:
        """The candidate that passed with the highest overall ratio; None when none passed."""
        passed = [r for r in self.candidates if r.verdict == Verdict.PASS]
        return max(passed, key=report_rank) if passed else None

    @property
    def verdict(self) -> Verdict:
        return bracket_verdict([r.verdict for r in self.candidates])

    def as_dict(self) -> dict[str, Any]:
        """One candidate: exactly the one-candidate form. Several: each candidate's own form under
        `candidates`, with the bracket's arms, order, verdict and promotion beside them."""
        options = {"requested_order": self.requested_order, "until_decided": self.until_decided}
        if len(self.candidates) == 1:
            return {**self.candidates[0].as_dict(), "promoted": self.promoted, **options}
        best = self.best
        return {"control": self.control, "bar": self.bar, "order": self.order, "verdict": self.verdict.value,
                "best": best.candidate if best else None, "promoted": self.promoted, "reasons": self.reasons,
                "candidates": [r.as_dict() for r in self.candidates], "arms": self.arms,
                "host": self.candidates[0].host, **options}


def bracket_reasons(reports: Sequence[GateReport]) -> list[str]:
    """One line per candidate, best first: a FAIL is never listed above a PASS, whatever its speed."""
    lines = []
    for report in sorted(reports, key=report_rank, reverse=True):
        ratio = overall_ratio(report.cells)
        lines.append(f"{report.candidate}: {report.verdict.value.upper()}"
                     + (f" (overall {ratio:.3f}x)" if ratio is not None else ""))
    return lines


def judge_bracket(arms: Sequence[LaneBench], bar: float, *, agent_classes: Sequence[str] = (),
                  priors: Mapping[str, ArmNoise] | None = None,
                  noise_prior: Mapping[str, Any] | None = None) -> BracketReport:
    """Pure: each candidate lane judged by `judge` on the control arms and its own arms only, so all
    share the controls, the bar, the fidelity reference (control-1's outputs) and the probes."""
    controls = [a for a in arms if a.arm.startswith("control")]
    lanes = list(dict.fromkeys(a.lane for a in arms if a.arm.startswith("candidate")))
    # In the bracket's order, so each candidate's own order reads as it ran: ABA, or ABBA.
    reports = [judge([a for a in arms if a.arm.startswith("control") or a.lane == lane], bar,
                     agent_classes=agent_classes, priors=priors, noise_prior=noise_prior) for lane in lanes]
    order = "".join("A" if a.arm.startswith("control") else chr(ord("B") + lanes.index(a.lane)) for a in arms)
    bracket = BracketReport(control=controls[0].lane, bar=bar, order=order, candidates=reports,
                            arms=[a.summary() for a in arms])
    bracket.reasons = bracket_reasons(reports)
    return bracket


def _mean_of(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return math.fsum(known) / len(known) if len(known) == len(values) and known else None


def _ratio(candidate: float | None, control: float | None) -> float | None:
    return candidate / control if candidate is not None and control else None


def _cell_context(key: str, controls: list[LaneBench], candidates: list[LaneBench]) -> dict[str, Any]:
    """What a cell shows beside its verdict: its axes, each arm's tok/s, and the other ratios."""
    def mean(arms: list[LaneBench], figure: Callable[[ArmResult], float | None]) -> float | None:
        return _mean_of([figure(arm.cells[key]) for arm in arms])

    def prompt_rate(cell: ArmResult) -> float | None:
        return _mean_of([r.prompt_tok_per_s for r in cell.results if r.ok] or [None])

    klass, streams, context = candidates[0].cell_axes.get(key, (key, 0, 0))
    ttft_control, ttft_candidate = (mean(arms, lambda c: c.ttft_p50_ms) for arms in (controls, candidates))
    return {
        "class": klass, "concurrency": streams, "context": context,
        "arms": {arm.arm: arm.cells[key].output_tok_per_s for arm in (*controls, *candidates)},
        # Beside the verdict's figure: > 1 always means the candidate did better.
        "decode_ratio": _ratio(mean(candidates, lambda c: c.decode_tok_per_s),
                               mean(controls, lambda c: c.decode_tok_per_s)),
        "prompt_ratio": _ratio(mean(candidates, prompt_rate), mean(controls, prompt_rate)),
        "ttft_ratio": _ratio(ttft_control, ttft_candidate),
    }


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
    classes = dict.fromkeys(k.split("#")[0] for k in reference.greedy)
    found = {
        "method": "teacher-forced", "scored_by": "token_ids", "reference": reference.arm,
        "confident_p": CONFIDENT_P, **figures(candidate_drift, control_drift),
        # A prompt a candidate arm could not be scored on says nothing either way: the gate may not pass on it.
        "unscored": max(scored(arm).unscored for arm in candidates),
        "classes": {k: figures(worst(candidates, [k]), worst(others, [k]) if others else None) for k in classes},
        "agent": {"classes": list(agent_classes), **figures(agent, None)},
    }
    verdict = fidelity_verdict_of(found)
    return {"verdict": verdict.value if verdict else None, **found}


def judge(arms: Sequence[LaneBench], bar: float, *, agent_classes: Sequence[str] = (),
          priors: Mapping[str, ArmNoise] | None = None, noise_prior: Mapping[str, Any] | None = None) -> GateReport:
    """Pure: the verdict from the arms of a bracket (named as in ORDERS: control-1 first, then the
    candidate arms, control-2 last; `--until-decided` adds candidate-N and control-N arms).

    Per cell (class@concurrency[/context]): `judge_cell`, the t-interval on arm means with the cell's
    calibrated prior from `priors` (when this host has one; `noise_prior` says which calibration that is).
    Overall: `judge_candidate`, on the arms as results.json records them, so `lanectl report` recomputes the
    same verdict from the file.
    """
    controls = [a for a in arms if a.arm.startswith("control")]
    candidates = [a for a in arms if a.arm.startswith("candidate")]
    written = [arm.summary() for arm in arms]
    cells: dict[str, dict[str, Any]] = {}
    for key in candidates[0].cells:
        cells[key] = {**_cell_context(key, controls, candidates),
                      **judge_cell(key, written, bar, (priors or {}).get(key))}
    fid = _fidelity(controls, candidates, agent_classes)
    judged = judge_candidate(cells, written, fid, bar, noise_prior=noise_prior)
    order = "".join("A" if a.arm.startswith("control") else "B" for a in arms)
    return GateReport(
        candidate=candidates[0].lane, control=controls[0].lane, bar=bar, verdict=judged.verdict,
        reasons=judged.reasons, cells=cells, fidelity=fid, arms=written, order=order, probes=probe_table(arms),
        more_arms_may_decide=judged.more_arms_may_decide, noise_prior=dict(noise_prior) if noise_prior else None)


def judge_calibration(arms: Sequence[LaneBench], bar: float, max_false_promotion: float) -> GateReport:
    """Pure: `gate LANE --calibrate`'s verdict on N arms of one lane (`judge_arm_noise` on what is written)."""
    written = [arm.summary() for arm in arms]
    judged = judge_arm_noise(written, bar, max_false_promotion)
    return GateReport(candidate=arms[0].lane, control=arms[0].lane, bar=bar, verdict=judged.verdict,
                      reasons=judged.reasons, cells={}, fidelity={}, arms=written, order="A" * len(arms),
                      calibration=judged.calibration)


def probe_table(arms: Sequence[LaneBench]) -> dict[str, dict[str, Any]]:
    return {name: {arm.arm: arm.probes[name] for arm in arms if name in arm.probes}
            for name in dict.fromkeys(name for arm in arms for name in arm.probes)}


@dataclass
class _Bracket:
    """The arms of one bracket as they run: each switch through the lanes code path and its gate."""

    switcher: LaneSwitcher
    control: Lane
    lanes: dict[str, Lane]  # candidate name -> lane
    workload: Workload
    concurrency: list[int]
    kernel_log: Any | None
    progress: Callable[[str], None]
    probes: Sequence[Probe]
    arms: list[LaneBench] = field(default_factory=list)
    control_digests: list[str | None] = field(default_factory=list)  # the control's spec digest in each control arm
    unreachable: dict[str, str] = field(default_factory=dict)  # candidate -> why it could not be brought up
    serving: str | None = None  # the lane the last switch left serving (the way back's, when it failed)

    def run(self, arm: str, candidate: str | None) -> str | None:
        """Switch to the arm's lane and measure it; None, or why the bracket cannot go on (the control, or the
        only candidate, could not be brought up). A candidate of several that cannot come up fails alone."""
        lane = self.control if candidate is None else self.lanes[candidate]
        self.progress(f"{arm}: switching to {lane.name}")
        outcome = self.switcher.up(lane)
        self.serving = outcome.lane
        if outcome.result not in ("ok", "noop"):
            why = f"{arm}: could not bring {lane.name} up: {outcome.message}"
            if candidate is None or len(self.lanes) == 1:
                return why
            self.unreachable[candidate] = why
            self.progress(why)
            return None
        if candidate is None:
            self.control_digests.append(serving_digest(self.switcher.engine, lane))
        self.arms.append(bench_lane(self.switcher.engine, lane, self.workload, self.concurrency, arm=arm,
                                    kernel_log=self.kernel_log, progress=self.progress, probes=self.probes,
                                    reference=self.arms[0].continuations if self.arms else None))
        return None

    def next_arm(self, candidate: str | None) -> str:
        """The name of a lane's next arm: `control-3`, `candidate-2` (`candidate-2:LANE` among several)."""
        if candidate is None:
            return f"control-{sum(a.arm.startswith('control') for a in self.arms) + 1}"
        taken = sum(a.arm.startswith("candidate") and a.lane == candidate for a in self.arms)
        return f"candidate-{taken + 1}" + (f":{candidate}" if len(self.lanes) > 1 else "")

    def judge(self, bar: float, agent_classes: Sequence[str], priors: Mapping[str, ArmNoise] | None,
              noise_prior: Mapping[str, Any] | None = None) -> BracketReport:
        names = list(self.lanes)
        if len(names) == 1:
            single = judge(self.arms, bar, agent_classes=agent_classes, priors=priors, noise_prior=noise_prior)
            return BracketReport(control=self.control.name, bar=bar, order=single.order, candidates=[single],
                                 arms=single.arms)
        measured = [a for a in self.arms if a.lane not in self.unreachable or a.arm.startswith("control")]
        report = judge_bracket(measured, bar, agent_classes=agent_classes, priors=priors, noise_prior=noise_prior)
        by_name = {r.candidate: r for r in report.candidates}
        report.candidates = [by_name.get(name) or GateReport(
            candidate=name, control=self.control.name, bar=bar, verdict=Verdict.FAIL,
            reasons=[self.unreachable[name]], cells={}, fidelity={}, order="", arms=[]) for name in names]
        report.reasons = bracket_reasons(report.candidates)
        for name, why in self.unreachable.items():
            report.reasons = [f"{name}: FAIL ({why})" if line.startswith(f"{name}: ") else line
                              for line in report.reasons]
        report.arms = [a.summary() for a in self.arms]
        return report

    def stopped(self, why: str, bar: float, order: str) -> BracketReport:
        """The bracket could not go on: every candidate FAILs, and the control serves again."""
        names = list(self.lanes)
        journal_names = {"candidate": names[0]} if len(names) == 1 else {"candidates": names}
        self.switcher.journal.append("gate", **journal_names, control=self.control.name, verdict="fail",
                                     reasons=[why])
        if self.serving != self.control.name:
            self.switcher.up(self.control)
        written = [a.summary() for a in self.arms]
        failed = [GateReport(candidate=name, control=self.control.name, bar=bar, verdict=Verdict.FAIL, reasons=[why],
                             cells={}, fidelity={}, order=order, arms=written) for name in self.lanes]
        return BracketReport(control=self.control.name, bar=bar, order=order, candidates=failed, arms=written,
                             reasons=[why])


def serving_digest(engine: ContainerEngine, lane: Lane) -> str | None:
    """The spec digest lanectl stamped on the lane's primary container (its image by ID, command, env, ...);
    None when the container is not there."""
    name = lane.container_name()
    listed = next((c for c in engine.list_containers() if c.name == name), None)
    return listed.labels.get(SPEC_LABEL) if listed is not None else None


def same_config(priors: Mapping[str, ArmNoise] | None, noise_prior: dict[str, Any] | None,
                digests: Sequence[str | None]) -> tuple[Mapping[str, ArmNoise] | None, dict[str, Any] | None]:
    """The priors, when the calibration ran the lane config each control arm ran (`lane_digest`); else none,
    with `noise_prior` saying why it was refused. A calibration kept before the config was recorded is refused
    too: nothing says it measured this config."""
    if not priors or noise_prior is None:
        return priors, noise_prior
    kept = noise_prior.get("lane_digest")
    ran = sorted({d or "unknown" for d in digests})
    if kept is not None and ran == [kept]:
        return priors, noise_prior
    when = f"the calibration of {noise_prior['recorded']}"
    why = (f"{when} was kept before lanectl recorded the lane config it ran" if kept is None else
           f"{when} ran another config of {noise_prior['lane']} (spec digest {kept[:12]}, where the control ran "
           f"{', '.join(d[:12] for d in ran)})")
    return {}, {**noise_prior, "refused": why}


def run_gate(switcher: LaneSwitcher, candidates: Lane | Sequence[Lane], control: Lane, workload: Workload,
             concurrency: list[int], *, bar: float, promote: bool, kernel_log: Any | None, order: str = "ABA",
             until_decided: int = 0, priors: Mapping[str, ArmNoise] | None = None,
             noise_prior: dict[str, Any] | None = None,
             progress: Callable[[str], None] = lambda text: None, probes: Sequence[Probe] = ()) -> BracketReport:
    """The bracket in `order` (`bracket_arms`: ABA is control, each candidate, control; ABBA mirrors the
    candidates); each switch through the lanes code path and its gate. The first control arm's greedy
    outputs are the continuations every later arm scores.

    `until_decided` N: while a candidate is INCONCLUSIVE only because its cells are (every other check
    held), up to N more rounds run, each one more arm of every such candidate and then one more control
    arm (A B A, B A, B A ...: the arms stay balanced in time), and the bracket is judged again.

    The caller holds the host lock for the whole bracket. The control is serving at the end, unless
    `promote` and a candidate PASSed: then the best that passed (highest overall ratio) is.
    """
    chosen = [candidates] if isinstance(candidates, Lane) else list(candidates)
    bracket = _Bracket(switcher, control, {lane.name: lane for lane in chosen}, workload, concurrency, kernel_log,
                       progress, probes)
    for arm, candidate_name in bracket_arms(order, list(bracket.lanes)):
        if candidate_name in bracket.unreachable:
            continue
        why = bracket.run(arm, candidate_name)
        if why is not None:
            return bracket.stopped(why, bar, order)
    priors, noise_prior = same_config(priors, noise_prior, bracket.control_digests)
    report = bracket.judge(bar, workload.agent_classes, priors, noise_prior)
    rounds = {r.candidate: [_judgement(r)] for r in report.candidates}
    for round_number in range(1, until_decided + 1):
        undecided = [r.candidate for r in report.candidates if r.more_arms_may_decide]
        if not undecided:
            break
        progress(f"until decided: round {round_number} of {until_decided} for {', '.join(undecided)}")
        for candidate_name in [*undecided, None]:
            why = bracket.run(bracket.next_arm(candidate_name), candidate_name)
            if why is not None:
                return bracket.stopped(why, bar, order)
        report = bracket.judge(bar, workload.agent_classes, priors, noise_prior)
        for judged in report.candidates:
            if judged.candidate in undecided:
                rounds[judged.candidate].append(_judgement(judged))
    report.requested_order, report.until_decided = order, until_decided
    for judged in report.candidates:
        judged.rounds, judged.noise_prior = rounds[judged.candidate], noise_prior
    best = report.best
    if promote and best is not None:
        progress(f"PASS: promoting {best.candidate}")
        outcome = switcher.up(bracket.lanes[best.candidate], why=f"gate PASS against {control.name}")
        report.promoted = best.candidate if outcome.result in ("ok", "noop") else None
        best.promoted = report.promoted
        if report.promoted is None:
            best.reasons.append(f"promotion failed: {outcome.message}")
    for judged in report.candidates:
        _journal_gate(switcher, judged, control.name, report.order)
    return report


def _judgement(report: GateReport) -> dict[str, Any]:
    arms = [str(arm["arm"]) for arm in report.arms]
    return {"candidate_arms": sum(a.startswith("candidate") for a in arms),
            "control_arms": sum(a.startswith("control") for a in arms), "verdict": report.verdict.value}


def _journal_gate(switcher: LaneSwitcher, judged: GateReport, control: str, order: str) -> None:
    switcher.journal.append("gate", candidate=judged.candidate, control=control, verdict=judged.verdict.value,
                            bar=judged.bar, order=order, reasons=judged.reasons, promoted=judged.promoted,
                            cells={k: {"ratio": round(c["ratio"], 4), "low": round(c["low"], 4),
                                       "high": round(c["high"], 4), "verdict": c["verdict"]}
                                   for k, c in judged.cells.items()},
                            fidelity={k: v for k, v in judged.fidelity.items() if k != "classes"},
                            calibration=_without_cells(judged.calibration))


def _without_cells(calibration: dict[str, Any] | None) -> dict[str, Any] | None:
    # The journal keeps the calibration's verdict figures; its per-cell figures are in results.json.
    return None if calibration is None else {k: v for k, v in calibration.items() if k != "cells"}


def run_calibration(switcher: LaneSwitcher, lane: Lane, workload: Workload, concurrency: list[int], *, arms: int,
                    bar: float, max_false_promotion: float, kernel_log: Any | None, gpus: Sequence[str] | None,
                    progress: Callable[[str], None] = lambda text: None) -> GateReport:
    """`gate LANE --calibrate`: `arms` arms of one lane, back to back on one start of it (no switch between
    them, so a restart's own effect on the rate is not in what they measure; a bracket's own arms are).
    No probes and no teacher forcing: a calibration measures noise, and promotes nothing. The calibration
    records the lane's config and the host's `gpus` (None: not known): a gate uses it only on both."""
    progress(f"calibration: switching to {lane.name}")
    outcome = switcher.up(lane)
    if outcome.result not in ("ok", "noop"):
        why = f"could not bring {lane.name} up: {outcome.message}"
        switcher.journal.append("gate", candidate=lane.name, control=lane.name, verdict="fail", reasons=[why])
        return GateReport(candidate=lane.name, control=lane.name, bar=bar, verdict=Verdict.FAIL, reasons=[why],
                          cells={}, fidelity={}, arms=[], order="")
    measured = [bench_lane(switcher.engine, lane, workload, concurrency, arm=f"arm-{n}", kernel_log=kernel_log,
                           progress=progress) for n in range(1, arms + 1)]
    report = judge_calibration(measured, bar, max_false_promotion)
    if report.calibration is not None:  # the config the noise was measured on: a gate holds its control to it
        report.calibration["lane_digest"] = serving_digest(switcher.engine, lane)
        report.calibration["gpus"] = None if gpus is None else list(gpus)
    _journal_gate(switcher, report, lane.name, report.order)
    return report


def write_results(directory: Path, name: str, data: dict[str, Any]) -> Path:
    run_dir = directory / f"{datetime.now(UTC).strftime('%Y%m%dT%H%M%SZ')}-{name}"
    run_dir.mkdir(parents=True, exist_ok=False)
    (run_dir / "results.json").write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    return run_dir
