"""A candidate's verdict from the bracket's record: the same functions for the gate and for anyone after it.

The gate judges from what it writes into results.json (each arm's per-request `rates` per cell, its failed
requests, Xid and fatal engine lines and probe results, and the fidelity figures), and `lanectl report`
judges again from the file with these same functions. So a verdict is recomputed exactly from the evidence
as written, and a results.json edited by hand says where its figures and its evidence part.

Pure: dicts in the results.json form in, dicts and verdicts out.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import field
from typing import Any

from lanectl.bench.stats import (
    ARM_NOISE_ESTIMATOR,
    CONFIDENCE,
    INTERVAL_MODEL,
    MAX_CALIBRATION_ARMS,
    POINT_PRIOR_MODEL,
    UNCALIBRATED_ARM_SD,
    ArmNoise,
    Verdict,
    arm_mean,
    calibrate,
    calibrate_cell,
    cell_verdict,
    fidelity_within,
    noise_df,
    ratio_interval,
)
from lanectl.records import frozen

# How a verdict ranks candidates: a PASS above anything else, whatever the other's speed.
VERDICT_RANK = {Verdict.PASS: 2, Verdict.INCONCLUSIVE: 1, Verdict.FAIL: 0}
# bench_lane notes why a prompt's scoring request failed as "class#index: why".
SCORING_NOTE = re.compile(r"[^\s#]+#\d+: ")


def is_control(arm: Mapping[str, Any]) -> bool:
    return str(arm["arm"]).startswith("control")


def is_candidate(arm: Mapping[str, Any]) -> bool:
    return str(arm["arm"]).startswith("candidate")


def judge_cell(key: str, arms: Sequence[Mapping[str, Any]], bar: float, prior: ArmNoise | None, *,
               confidence: float = CONFIDENCE, model: str = INTERVAL_MODEL) -> dict[str, Any]:
    """One cell's ratio, interval and verdict from the arms' per-request `rates` in it.

    A cell with failed requests cannot pass: in a candidate arm it FAILs (the candidate dropped requests),
    in a control arm only it is INCONCLUSIVE (the controls cannot vouch for the comparison). An arm
    that finished no request has no rate: its side of the ratio is 0 and the cell is not judged on it.
    """
    controls = [arm["cells"][key] for arm in arms if is_control(arm)]
    candidates = [arm["cells"][key] for arm in arms if is_candidate(arm)]
    failed_candidate = sum(cell["failed"] for cell in candidates)
    failed = failed_candidate + sum(cell["failed"] for cell in controls)
    control_rates = [cell["rates"] for cell in controls if _measured(cell["rates"])]
    candidate_rates = [cell["rates"] for cell in candidates if _measured(cell["rates"])]
    noise: dict[str, Any] = {"model": model, "confidence": confidence, "df": None, "arm_sd": None,
                             "prior": None if prior is None else {"variance": prior.variance, "df": prior.df}}
    if not control_rates or not candidate_rates or (len(control_rates) < 2 and prior is None):
        verdict = Verdict.FAIL if not candidate_rates else Verdict.INCONCLUSIVE
        return {"ratio": 0.0, "low": 0.0, "high": 0.0, "verdict": verdict.value, "failed": failed,
                "interval": noise}
    interval = ratio_interval(control_rates, candidate_rates, prior=prior, confidence=confidence, model=model)
    verdict = cell_verdict(interval.ratio, interval.low, interval.high, bar).verdict
    if failed_candidate:
        verdict = Verdict.FAIL
    elif failed and verdict is Verdict.PASS:
        verdict = Verdict.INCONCLUSIVE
    noise.update(df=interval.df, arm_sd=interval.arm_sd)
    if interval.conflict is not None:
        conflict = interval.conflict
        noise["prior_stale"] = {"spread": conflict.spread, "allowed": conflict.allowed, "df": conflict.df,
                                "level": conflict.level, "controls_only": len(candidate_rates) == 1}
    return {"ratio": interval.ratio, "low": interval.low, "high": interval.high, "verdict": verdict.value,
            "failed": failed, "interval": noise}


def _measured(rates: Sequence[float]) -> bool:
    return bool(rates) and arm_mean(rates) > 0


def fidelity_verdict_of(fidelity: Mapping[str, Any]) -> Verdict | None:
    """The teacher-forced verdict from its recorded figures; None when the bracket did not get that far."""
    if not fidelity:
        return None
    verdict = fidelity_within(
        fidelity["confident_flips"], fidelity["weighted_divergence"], fidelity["confident_flips_bar"] or 0,
        fidelity["weighted_divergence_bar"] or 0.0, fidelity["agent"]["confident_flips"])
    if verdict is Verdict.PASS and fidelity.get("unscored"):
        return Verdict.INCONCLUSIVE
    return verdict


@frozen
class Judged:
    verdict: Verdict
    reasons: list[str]
    more_arms_may_decide: bool = False  # INCONCLUSIVE only because no cell's interval is decisive yet


def judge_candidate(cells: Mapping[str, Mapping[str, Any]], arms: Sequence[Mapping[str, Any]],
                    fidelity: Mapping[str, Any], bar: float, *, noise_prior: Mapping[str, Any] | None = None) -> Judged:
    """FAIL when any arm logged a new Xid or fatal engine line, had failed requests or failed a probe, any
    cell FAILs, or fidelity FAILs. PASS when nothing failed, every arm ran the workload's probes, fidelity
    held on every prompt and at least one cell PASSes (a split-KV kernel wins where it applies and must
    merely not lose elsewhere). INCONCLUSIVE otherwise: rerun (or add arms), never promote. The calibration
    (`noise_prior`, where the priors came from) is named where it was not used, is old, or where a cell's own
    arms contradicted it (`prior stale: …`)."""
    if not any(is_candidate(arm) for arm in arms):
        return Judged(Verdict.FAIL, ["no arm of this candidate was measured"])
    judged = _judge_candidate(cells, arms, fidelity, bar)
    judged.reasons.extend(calibration_reasons(noise_prior))
    judged.reasons.extend(prior_stale_reasons(cells, (noise_prior or {}).get("recorded")))
    missing = prior_missing(cells)
    if missing and not (noise_prior or {}).get("refused"):
        judged.reasons.append(
            f"prior missing: this host has no calibration of {', '.join(missing)}, so those intervals rest on the "
            f"bracket's own arms, believed at no less than {UNCALIBRATED_ARM_SD:.0%} between arms: wider than "
            "calibrated ones (`lanectl gate CONTROL --workload W --calibrate` measures it)")
    return judged


def prior_missing(cells: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The cells whose interval was built, under a model with the uncalibrated floor, without a calibration of
    this host."""
    return [key for key, cell in cells.items() if (interval := cell.get("interval")) and interval["df"] is not None
            and interval["prior"] is None and interval["model"] != POINT_PRIOR_MODEL]


def calibration_reasons(noise_prior: Mapping[str, Any] | None) -> list[str]:
    """`prior not used: …` when the gate refused the host's calibration (another config of the control lane),
    `calibration old: …` when it was older at the gate than the workload allows."""
    if not noise_prior:
        return []
    if noise_prior.get("refused"):
        return [f"prior not used: {noise_prior['refused']}; each cell's interval rests on the bracket's own arms "
                f"(`lanectl gate {noise_prior['lane']} --workload W --calibrate` measures this config)"]
    age, allowed = noise_prior.get("age_days"), noise_prior.get("max_age_days")
    if age is None or allowed is None or age <= allowed:
        return []
    return [f"calibration old: the calibration of {noise_prior['recorded']} was {age:.0f} days old at the gate, more "
            f"than the {allowed:g} days the workload allows (`calibration_max_age_days`); `lanectl gate "
            f"{noise_prior['lane']} --workload W --calibrate` measures it again"]


def prior_stale_reasons(cells: Mapping[str, Mapping[str, Any]], calibrated: str | None) -> list[str]:
    """`prior stale: prose@1 controls spread 0.42 % where the calibration of … allows 0.15 % …`, one per cell
    whose own arms contradicted its prior (`lanectl.bench.stats.prior_conflict`)."""
    lines = []
    for key, cell in cells.items():
        stale = (cell.get("interval") or {}).get("prior_stale")
        if not stale:
            continue
        whose = "controls" if stale["controls_only"] else "arms"
        lines.append(f"prior stale: {key} {whose} spread {stale['spread']:.2%} where the calibration"
                     f"{f' of {calibrated}' if calibrated else ''} allows {stale['allowed']:.2%} (F test on "
                     f"{stale['df']} df at {stale['level']:.0%}): that cell's interval rests on the bracket's own "
                     f"arms, believed at no less than {UNCALIBRATED_ARM_SD:.0%} between arms; more arms "
                     "(`--until-decided`) or a new calibration (`--calibrate`) decide it")
    return lines


def _judge_candidate(cells: Mapping[str, Mapping[str, Any]], arms: Sequence[Mapping[str, Any]],
                     fidelity: Mapping[str, Any], bar: float) -> Judged:
    reasons = fault_reasons(arms)
    for key, cell in cells.items():
        if cell["verdict"] == Verdict.FAIL.value:
            reasons.append(f"{key}: fail: " + _fail_detail(cell, bar))
    fid = fidelity_verdict_of(fidelity)
    if fid is Verdict.FAIL:
        reasons.append(f"fidelity: {fidelity['confident_flips']} confident flips (bar "
                       f"{fidelity['confident_flips_bar']}), weighted divergence "
                       f"{fidelity['weighted_divergence']:.3f} (bar {fidelity['weighted_divergence_bar']:.3f}), "
                       f"{fidelity['agent']['confident_flips']} confident flips on agent/tool prompts (allowed 0)")
    if reasons:
        return Judged(Verdict.FAIL, reasons)
    to_rerun = []
    if fid is Verdict.INCONCLUSIVE:
        notes = (note for arm in arms if is_candidate(arm) for note in arm["notes"])
        why_unscored = next((note for note in notes if SCORING_NOTE.match(note)), None)
        to_rerun.append(f"fidelity: {fidelity['unscored']} prompt(s) could not be scored in a candidate arm, so "
                        "teacher forcing cannot vouch for them" + (f" ({why_unscored})" if why_unscored else ""))
    without = [str(arm["arm"]) for arm in arms if not arm.get("probes")]
    if without:
        to_rerun.append(f"no correctness probe ran in {', '.join(without)}: PASS needs the workload's probes "
                        "(`probes:` in the workload file)")
    if to_rerun:
        return Judged(Verdict.INCONCLUSIVE, to_rerun)
    passed = [key for key, cell in cells.items() if cell["verdict"] == Verdict.PASS.value]
    if passed:
        return Judged(Verdict.PASS, [f"no cell failed, and {', '.join(passed)} beat the {bar:.3f}x bar at the low "
                                     "end of the 95% interval"])
    return Judged(Verdict.INCONCLUSIVE, [f"no cell's 95% interval cleared the {bar:.3f}x bar, and none fell below it"],
                  more_arms_may_decide=True)


def _fail_detail(cell: Mapping[str, Any], bar: float) -> str:
    figures = (f"{cell['ratio']:.3f}x against a bar of {bar:.3f}x "
               f"(95% interval {cell['low']:.3f}-{cell['high']:.3f})")
    return f"{cell['failed']} failed request(s) in it; {figures}" if cell["failed"] else figures


def fault_reasons(arms: Sequence[Mapping[str, Any]]) -> list[str]:
    """What went wrong in any arm, whatever the speed: Xid and fatal engine lines, failed requests, probes."""
    reasons = []
    for arm in arms:
        name = f"{arm['arm']} ({arm['lane']})"
        if arm["xid_lines"]:
            reasons.append(f"{name} logged {len(arm['xid_lines'])} Xid line(s): {arm['xid_lines'][0]}")
        if arm["fatal_lines"]:
            reasons.append(f"{name} logged a fatal engine line: {arm['fatal_lines'][0]}")
        failed = sum(cell["failed"] for cell in arm["cells"].values())
        if failed:
            reasons.append(f"{name} had {failed} failed request(s)")
    for arm in arms:
        for probe_name, probe in (arm.get("probes") or {}).items():
            if not probe["ok"]:
                first = probe["failures"][0] if probe["failures"] else "no detail recorded"
                reasons.append(f"{arm['arm']} ({arm['lane']}) failed probe {probe_name}: {probe['passed']}/"
                               f"{probe['total']} passed; {first}")
    return reasons


def overall_ratio(cells: Mapping[str, Mapping[str, Any]]) -> float | None:
    """The geometric mean of a candidate's cell ratios; 0 when any cell measured nothing."""
    ratios = [cell["ratio"] for cell in cells.values()]
    if not ratios:
        return None
    if min(ratios) <= 0:
        return 0.0
    return math.exp(math.fsum(math.log(r) for r in ratios) / len(ratios))


def rank(verdict: Verdict, cells: Mapping[str, Mapping[str, Any]]) -> tuple[int, float]:
    """Verdict first, then the overall ratio: a FAIL never ranks above a PASS, however fast its cells."""
    return VERDICT_RANK[verdict], overall_ratio(cells) or 0.0


def bracket_verdict(verdicts: Sequence[Verdict]) -> Verdict:
    """PASS when any candidate passed; FAIL when every one failed; INCONCLUSIVE otherwise."""
    if Verdict.PASS in verdicts:
        return Verdict.PASS
    return Verdict.FAIL if set(verdicts) == {Verdict.FAIL} else Verdict.INCONCLUSIVE


@frozen
class CalibrationJudged:
    verdict: Verdict
    reasons: list[str]
    calibration: dict[str, Any]


def judge_arm_noise(arms: Sequence[Mapping[str, Any]], bar: float, max_false_promotion: float, *,
                    confidence: float = CONFIDENCE, model: str = INTERVAL_MODEL) -> CalibrationJudged:
    """`gate --calibrate`: N arms of one lane, each cell's noise, coverage and false promotions (`calibrate_cell`).

    PASS when the modelled false-promotion rate of an A/B/A bracket is at most `max_false_promotion`, no
    A/A bracket of the calibration passed or failed, and nothing went wrong in any arm (a failed request,
    an Xid or fatal engine line: noise the setup must not have). Each cell's noise is what later gates on
    this host take as their prior (`ArmNoise` from `noise_of`).
    """
    reasons = fault_reasons(arms)
    cells: dict[str, dict[str, Any]] = {}
    found = []
    for key in arms[0]["cells"]:
        rates = [arm["cells"][key]["rates"] for arm in arms if _measured(arm["cells"][key]["rates"])]
        if len(rates) < 3:
            reasons.append(f"{key}: only {len(rates)} arm(s) finished a request; a calibration needs 3")
            continue
        cell = calibrate_cell(rates, bar, confidence=confidence, model=model)
        found.append(cell)
        cells[key] = {"arms": len(rates), "variance": cell.noise.variance, "df": cell.noise.df,
                      "arm_sd": math.sqrt(cell.noise.variance), "brackets": cell.brackets,
                      "covered": cell.covered, "coverage": cell.coverage, "passed": cell.passed, "failed": cell.failed,
                      "false_promotion": cell.false_promotion, "detectable_ratio": cell.detectable_ratio}
    calibration: dict[str, Any] = {"max_false_promotion": max_false_promotion, "confidence": confidence,
                                   "noise": ARM_NOISE_ESTIMATOR, "model": model, "cells": cells}
    if not found:
        return CalibrationJudged(Verdict.FAIL, reasons, calibration)
    total = calibrate(found, bar)
    calibration.update(false_promotion_rate=total.false_promotion_rate, brackets=total.brackets,
                       covered=total.covered, brackets_passed=total.brackets_passed,
                       brackets_failed=total.brackets_failed, detectable_ratio=total.detectable_ratio,
                       detectable_gain=total.detectable_gain)
    line = (f"false-promotion rate {total.false_promotion_rate:.4f} (allowed {max_false_promotion:g}) for an A/B/A "
            f"bracket over {total.cells} cells; {total.covered} of {total.brackets} A/A intervals held 1.0, "
            f"{total.brackets_passed} passed the bar, {total.brackets_failed} fell below it; smallest detectable: "
            f"{total.detectable_ratio:.3f}x to pass the bar, +{total.detectable_gain:.1%} to tell from no change")
    short = [f"{key} {figures['covered']}/{figures['brackets']}" for key, figures in cells.items()
             if figures["coverage"] is not None and figures["coverage"] < confidence]
    if short:
        line += (f"; the {confidence:.0%} intervals held 1.0 less often than that in {', '.join(short)}: on this "
                 "host the gate's intervals there are narrower than they claim, and a verdict on them needs more arms")
    for key, figures in cells.items():
        if figures["passed"] or figures["failed"]:
            reasons.append(f"{key}: {figures['passed']} A/A bracket(s) passed the bar and {figures['failed']} fell "
                           "below it: noise alone moved an unchanged lane that far")
    passed = total.within(max_false_promotion) and total.brackets_failed == 0 and not reasons
    if passed:
        return CalibrationJudged(Verdict.PASS, [line], calibration)
    return CalibrationJudged(Verdict.FAIL, [*reasons, line], calibration)


def noise_of(calibration_cell: Mapping[str, Any]) -> ArmNoise:
    """The prior a gate takes from one cell of a calibration."""
    return ArmNoise(variance=calibration_cell["variance"], df=calibration_cell["df"])


# -- recomputing a run from its results.json --------------------------------------------------------

# Figures recomputed from the same rates by the same functions agree to the last bit; this much leeway
# only forgives a JSON writer that printed fewer digits than Python does.
SAME_FIGURE = 1e-12


def candidates_of(gate: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """Each candidate's own report: the several of a bracket, or the one of a one-candidate run."""
    return list(gate["candidates"]) if "candidates" in gate else [gate]


def _prior(cell: Mapping[str, Any]) -> ArmNoise | None:
    prior = cell["interval"]["prior"]
    return None if prior is None else ArmNoise(variance=prior["variance"], df=prior["df"])


def recompute_candidate(report: Mapping[str, Any], bar: float,
                        priors: Mapping[str, ArmNoise | None] | None = None) -> dict[str, Any]:
    """One candidate's cells and verdict, judged again from its arms' rates, the recorded priors and `bar`;
    a cell named in `priors` is judged with that prior instead of the recorded one (None: without one)."""
    arms = report["arms"]
    cells = {}
    for key, recorded in report["cells"].items():
        prior = priors[key] if priors is not None and key in priors else _prior(recorded)
        judged_cell = judge_cell(key, arms, bar, prior, confidence=recorded["interval"]["confidence"],
                                 model=recorded["interval"]["model"])
        cells[key] = {**recorded, **judged_cell}
    judged = judge_candidate(cells, arms, report["fidelity"] or {}, bar, noise_prior=report.get("noise_prior"))
    measured = any(is_candidate(arm) for arm in arms)
    # A candidate that never ran (it could not be brought up) keeps the recorded reason why.
    reasons = judged.reasons if measured else list(report["reasons"])
    return {**report, "cells": cells, "verdict": judged.verdict.value, "reasons": reasons}


def recompute_calibration(report: Mapping[str, Any]) -> dict[str, Any]:
    calibration = report["calibration"]
    # A calibration written before the model was recorded was judged under issue 32's.
    judged = judge_arm_noise(report["arms"], report["bar"], calibration["max_false_promotion"],
                             confidence=calibration.get("confidence", CONFIDENCE),
                             model=calibration.get("model", POINT_PRIOR_MODEL))
    # The lane's config and the GPUs the calibration ran on are facts of the run, not figures: kept as recorded.
    config = {key: calibration[key] for key in ("lane_digest", "gpus") if key in calibration}
    return {**report, "calibration": {**judged.calibration, **config}, "verdict": judged.verdict.value,
            "reasons": judged.reasons}


def recompute_gate(gate: Mapping[str, Any],
                   priors: Mapping[str, Mapping[str, ArmNoise | None]] | None = None) -> dict[str, Any]:
    """The gate section as the evidence in it says it should read: every candidate's cells and verdict,
    and the bracket's verdict and best, judged again. Other fields are kept as recorded. `priors`:
    candidate -> cell -> the prior to judge that cell with in place of the recorded one."""
    if gate.get("calibration") and not gate["cells"] and "candidates" not in gate:
        return recompute_calibration(gate)
    if "candidates" not in gate:
        return recompute_candidate(gate, gate["bar"], (priors or {}).get(gate["candidate"]))
    candidates = [recompute_candidate(c, gate["bar"], (priors or {}).get(c["candidate"])) for c in gate["candidates"]]
    verdicts = [Verdict(c["verdict"]) for c in candidates]
    passed = [c for c in candidates if c["verdict"] == Verdict.PASS.value]
    best = max(passed, key=lambda c: rank(Verdict.PASS, c["cells"]))["candidate"] if passed else None
    return {**gate, "candidates": candidates, "verdict": bracket_verdict(verdicts).value, "best": best}


def differences(recorded: Mapping[str, Any], recomputed: Mapping[str, Any]) -> list[str]:
    """Each figure and verdict where the record and the recomputation part, e.g.
    `demo-h2 prose@1 low: recorded 1.0412, recomputed 1.0391`."""
    found = _differ("bracket", recorded, recomputed, ("verdict", "best"))
    pairs = zip(candidates_of(recorded), candidates_of(recomputed), strict=True)
    for was, now in pairs:
        name = str(now["candidate"])
        found += _differ(name, was, now, ("verdict",))
        for key, cell in now["cells"].items():
            found += _differ(f"{name} {key}", was["cells"][key], cell, ("ratio", "low", "high", "verdict"))
        if now.get("calibration") and not now["cells"]:
            found += _calibration_differences(name, was["calibration"], now["calibration"])
    return found


def _calibration_differences(name: str, was: Mapping[str, Any], now: Mapping[str, Any]) -> list[str]:
    fields = ("false_promotion_rate", "brackets", "covered", "brackets_passed", "brackets_failed", "detectable_ratio")
    found = _differ(f"{name} calibration", was, now, fields)
    for key, cell in now["cells"].items():
        before = was["cells"].get(key, {}) if isinstance(was["cells"], Mapping) else {}
        found += _differ(f"{name} calibration {key}", before, cell, ("variance", "df", "covered", "passed", "failed"))
    return found


def _differ(where: str, was: Mapping[str, Any], now: Mapping[str, Any], fields: Sequence[str]) -> list[str]:
    found = []
    for name in fields:
        if name not in now or (name not in was and now[name] is None):
            continue
        before, after = was.get(name), now[name]
        if _same(before, after):
            continue
        found.append(f"{where} {name}: recorded {_shown(before)}, recomputed {_shown(after)}")
    return found


def _same(before: Any, after: Any) -> bool:
    numbers = (int, float)
    if isinstance(before, numbers) and isinstance(after, numbers) and not isinstance(before, bool):
        return math.isclose(before, after, rel_tol=SAME_FIGURE, abs_tol=SAME_FIGURE)
    return bool(before == after)


def _shown(value: Any) -> str:
    # Every digit: a difference in the tenth digit must not print as two equal figures.
    return repr(value) if isinstance(value, float) else str(value)


@frozen
class Rechecked:
    """A run's gate section as its evidence says it should read, and where the record says otherwise."""

    gate: dict[str, Any]  # recomputed (format 2); as recorded (format 1: no rates to recompute from)
    recomputed: bool
    differences: list[str]
    # Where the evidence itself does not hold together (an arm's two copies, a prior no calibration could
    # have given): the verdict is then not reproduced, and no candidate PASSes on it. Also in `differences`.
    not_reproduced: list[str] = field(default_factory=list)
    priors_checked: str | None = None  # how the recorded priors were checked against this host's calibration


@frozen
class KeptCalibration:
    """This host's kept calibration of the run's workload (`calibration_file`), to hold a run's priors to."""

    node: str  # the host that measured it: this one
    recorded: str
    cells: Mapping[str, ArmNoise]


def recheck(results: Mapping[str, Any], kept: KeptCalibration | None = None) -> Rechecked:
    """`lanectl report`'s reading of a results.json that `load_results` accepted: the evidence checked
    (`arm_copy_problems`, `prior_problems`), then every figure and verdict recomputed from it. A cell whose
    recorded prior no calibration could have given is judged with this host's kept prior of it, or without one."""
    recorded = dict(results["gate"])
    if results.get("version", 1) < 2:
        return Rechecked(gate=recorded, recomputed=False, differences=[])
    problems = arm_copy_problems(recorded)
    replaced: dict[str, dict[str, ArmNoise | None]] = {}
    for candidate in candidates_of(recorded):
        found, instead = prior_problems(candidate, kept)
        problems += found
        replaced[str(candidate["candidate"])] = instead
    recomputed = recompute_gate(recorded, replaced)
    if problems:
        recomputed = refused(recomputed, problems)
    return Rechecked(gate=recomputed, recomputed=True, differences=problems + differences(recorded, recomputed),
                     not_reproduced=problems, priors_checked=priors_checked(recorded, kept))


def refused(gate: Mapping[str, Any], problems: Sequence[str]) -> dict[str, Any]:
    """The recomputed gate with no candidate passing: its evidence does not hold together."""
    why = f"not reproduced: results.json does not hold together ({problems[0]}" + (
        f", and {len(problems) - 1} more)" if len(problems) > 1 else ")")

    def unpassed(report: Mapping[str, Any]) -> dict[str, Any]:
        if report["verdict"] != Verdict.PASS.value:
            return dict(report)
        return {**report, "verdict": Verdict.INCONCLUSIVE.value, "reasons": [why, *report["reasons"]]}

    if "candidates" not in gate:
        return unpassed(gate)
    candidates = [unpassed(c) for c in gate["candidates"]]
    verdict = bracket_verdict([Verdict(c["verdict"]) for c in candidates])
    return {**gate, "candidates": candidates, "verdict": verdict.value, "best": None}


# -- the evidence itself ----------------------------------------------------------------------------

def arm_copy_problems(gate: Mapping[str, Any]) -> list[str]:
    """A bracket of several candidates keeps each arm twice: in `gate.arms` (the safety table reads them) and
    in each candidate's `arms` (its verdict is judged on them). Where the two copies part, e.g. an Xid line
    in one copy only. A candidate that never ran keeps no arms, and a bracket that stopped keeps every arm
    in each candidate's copy: neither is a difference."""
    if "candidates" not in gate:
        return []
    bracket = {str(arm["arm"]): arm for arm in gate["arms"]}
    problems = []
    for candidate in gate["candidates"]:
        name, copies = str(candidate["candidate"]), candidate["arms"]
        if not copies:
            continue
        own = {str(arm["arm"]) for arm in copies}
        for arm in copies:
            kept = bracket.get(str(arm["arm"]))
            if kept is None:
                problems.append(f"{name}'s copy of the arms holds {arm['arm']}, which gate.arms does not")
                continue
            parted = sorted(key for key in {*arm, *kept} if arm.get(key) != kept.get(key))
            if parted:
                problems.append(f"{name}'s copy of arm {arm['arm']} differs from gate.arms in {', '.join(parted)}")
        for arm_name, arm in bracket.items():
            if arm_name not in own and (is_control(arm) or arm["lane"] == name):
                problems.append(f"{name}'s copy of the arms lacks {arm_name}, which gate.arms holds")
    return problems


def prior_problems(report: Mapping[str, Any], kept: KeptCalibration | None
                   ) -> tuple[list[str], dict[str, ArmNoise | None]]:
    """Each recorded prior no calibration could have given: more degrees of freedom than the calibration's arms
    allow (`noise_df`), no calibration named as its source, or (when the run's calibration was measured here)
    other figures than this host keeps for that cell. With each such cell, the prior to judge it with instead:
    this host's kept one, or none."""
    name, source = str(report["candidate"]), report.get("noise_prior")
    problems: list[str] = []
    instead: dict[str, ArmNoise | None] = {}
    for key, cell in report["cells"].items():
        prior = (cell.get("interval") or {}).get("prior")
        if prior is None:
            continue
        held = kept.cells.get(key) if kept is not None else None
        why = _prior_problem(prior, source, kept, held)
        if why is not None:
            problems.append(f"{name} {key} prior: {why}")
            instead[key] = held
    return problems, instead


def _prior_problem(prior: Mapping[str, Any], source: Mapping[str, Any] | None, kept: KeptCalibration | None,
                   held: ArmNoise | None) -> str | None:
    if source is None:
        return "recorded without the calibration it came from (noise_prior is missing)"
    if source["arms"] > MAX_CALIBRATION_ARMS:
        return (f"its calibration claims {source['arms']} arms, where `gate --calibrate` runs "
                f"{MAX_CALIBRATION_ARMS} at most")
    allowed = noise_df(source["arms"])
    if prior["df"] > allowed:
        return (f"{prior['df']} degrees of freedom, more than the {source['arms']} arms of its calibration "
                f"allow ({allowed})")
    if kept is None or source.get("node") != kept.node:
        return None
    if held is None:
        return f"this host's calibration of {kept.recorded} has no such cell"
    if not _same(prior["variance"], held.variance) or prior["df"] != held.df:
        return (f"variance {_shown(prior['variance'])} on {prior['df']} df where this host's calibration of "
                f"{kept.recorded} has {_shown(held.variance)} on {held.df}")
    return None


def priors_checked(gate: Mapping[str, Any], kept: KeptCalibration | None) -> str | None:
    """How the run's priors were held to this host's calibration, in a sentence; None when no cell had one."""
    sources = [c.get("noise_prior") for c in candidates_of(gate)
               if any((cell.get("interval") or {}).get("prior") for cell in c["cells"].values())]
    if not sources:
        return None
    node = next((s.get("node") for s in sources if s), None)
    if kept is None:
        return ("The calibration priors could not be checked against a calibration of this host: it keeps none "
                "of this workload.")
    if node != kept.node:
        return (f"The calibration priors could not be checked against a calibration of this host: they were "
                f"measured on {node}, not here ({kept.node}).")
    return f"Each cell's calibration prior was checked against this host's calibration of {kept.recorded}."
