"""Several candidates in one bracket: the arm order, one verdict per candidate against the same controls,
and which one `--promote` would pick. Pure: arms are built in memory, as `bench_lane` leaves them."""

from __future__ import annotations

import json
import math

import pytest

from lanectl.bench.gate import BracketReport, LaneBench, bracket_arms, judge, judge_bracket, judge_calibration
from lanectl.bench.loadgen import ArmResult, RequestResult, summarize
from lanectl.bench.stats import INTERVAL_MODEL, ArmNoise, ForcedPosition, TokenChoice, Verdict, pessimistic
from lanectl.cli.views import render_text
from lanectl.output import Result
from tests.test_probes import timed_cell

REFERENCE = (TokenChoice(" the", math.log(0.95), {" the": math.log(0.95)}, token_id=0),)
AGREED = (ForcedPosition(" the", math.log(0.95), " the", math.log(0.95), token_id=0, top_token_id=0),)


# This host's calibration of the cells these tests judge: 0.2 % between arms on 7 df. Without one, a cell's interval
# rests on the bracket's own arms with at least 1 % between them (t = 12.7 on A/B/A's one df: +-15 %).
PRIORS = {"prose@1": ArmNoise(variance=0.002**2, df=7), "prose@8": ArmNoise(variance=0.002**2, df=7)}
PROBED = {"gauntlet": {"kind": "gauntlet", "passed": 12, "total": 12, "ok": True, "failures": [], "seconds": {}}}


def measured(arm: str, lane: str, rate: float, *, xid: bool = False, probes: bool = True) -> LaneBench:
    made = LaneBench(lane=lane, arm=arm, image=f"img-{lane}", started="t", probes=dict(PROBED) if probes else {})
    made.cells["prose@1"] = timed_cell(rate)
    made.cell_axes["prose@1"] = ("prose", 1, 0)
    made.greedy["prose#0"] = REFERENCE
    if arm != "control-1":
        made.forced["prose#0"] = AGREED
    if xid:
        made.xid_lines.append("NVRM: Xid (PCI:0000:01:00): 31, pid=1, name=python3")
    return made


def test_one_candidate_keeps_the_orders_it_always_had():
    assert bracket_arms("ABA", ["c"]) == [("control-1", None), ("candidate", "c"), ("control-2", None)]
    assert [a for a, _ in bracket_arms("ABBA", ["c"])] == ["control-1", "candidate-1", "candidate-2", "control-2"]


def test_several_candidates_sit_between_the_controls_and_abba_mirrors_them():
    assert bracket_arms("ABA", ["c1", "c2"]) == [
        ("control-1", None), ("candidate:c1", "c1"), ("candidate:c2", "c2"), ("control-2", None)]
    assert bracket_arms("ABBA", ["c1", "c2"]) == [
        ("control-1", None), ("candidate-1:c1", "c1"), ("candidate-1:c2", "c2"), ("candidate-2:c2", "c2"),
        ("candidate-2:c1", "c1"), ("control-2", None)]


def bracket() -> BracketReport:
    arms = [measured("control-1", "a", 100), measured("candidate:fast", "fast", 110),
            measured("candidate:faster", "faster", 120), measured("candidate:slow", "slow", 90),
            measured("control-2", "a", 100)]
    return judge_bracket(arms, 1.025, priors=PRIORS)


def test_each_candidate_is_judged_against_the_same_controls_and_the_best_that_passed_is_chosen():
    report = bracket()
    verdicts = {r.candidate: (r.verdict, round(r.cells["prose@1"]["ratio"], 3)) for r in report.candidates}
    assert verdicts == {"fast": (Verdict.PASS, 1.1), "faster": (Verdict.PASS, 1.2), "slow": (Verdict.FAIL, 0.9)}
    assert report.best is not None and report.best.candidate == "faster"
    assert report.verdict == Verdict.PASS and report.order == "ABCDA"
    # Each candidate's own arms and the two controls, nothing of the others.
    assert [a["arm"] for a in report.candidates[2].arms] == ["control-1", "candidate:slow", "control-2"]
    assert report.candidates[2].reasons == ["prose@1: fail: 0.900x against a bar of 1.025x (95% interval "
                                            "0.893-0.908)"]


def test_no_candidate_is_chosen_when_none_passed():
    arms = [measured("control-1", "a", 100), measured("candidate:slow", "slow", 90),
            measured("candidate:crashy", "crashy", 130, xid=True), measured("control-2", "a", 100)]
    report = judge_bracket(arms, 1.025, priors=PRIORS)
    assert [r.verdict for r in report.candidates] == [Verdict.FAIL, Verdict.FAIL]
    assert report.best is None and report.verdict == Verdict.FAIL


def test_a_fault_in_a_control_arm_fails_every_candidate():
    arms = [measured("control-1", "a", 100), measured("candidate:fast", "fast", 110),
            measured("candidate:faster", "faster", 120), measured("control-2", "a", 100, xid=True)]
    assert [r.verdict for r in judge_bracket(arms, 1.025).candidates] == [Verdict.FAIL, Verdict.FAIL]


def test_one_candidate_writes_the_one_candidate_form_and_several_nest_each_candidates():
    arms = [measured("control-1", "a", 100), measured("candidate", "fast", 110), measured("control-2", "a", 100)]
    single = judge(arms, 1.025)
    one = BracketReport(control="a", bar=1.025, order="ABA", candidates=[single], arms=single.arms)
    assert one.as_dict() == {**single.as_dict(), "requested_order": "ABA", "until_decided": 0}
    several = json.loads(json.dumps(bracket().as_dict()))
    assert (several["best"], several["verdict"], several["order"]) == ("faster", "pass", "ABCDA")
    assert [c["candidate"] for c in several["candidates"]] == ["fast", "faster", "slow"]
    assert [a["arm"] for a in several["arms"]] == ["control-1", "candidate:fast", "candidate:faster",
                                                   "candidate:slow", "control-2"]


def test_the_text_view_shows_each_candidate_then_the_bracket():
    data = json.loads(json.dumps(bracket().as_dict()))
    text = [x.text for x in render_text(Result("gate", data))]
    assert text[0] == "fast against a:"
    assert [t for t in text if t.startswith("verdict:")] == [
        "verdict: PASS (bar 1.025x, order ABA)", "verdict: PASS (bar 1.025x, order ABA)",
        "verdict: FAIL (bar 1.025x, order ABA)"]
    assert text[-4:] == ["bracket: PASS (order ABCDA, 3 candidates; best that passed: faster)",
                         "  - faster: PASS (overall 1.200x)", "  - fast: PASS (overall 1.100x)",
                         "  - slow: FAIL (overall 0.900x)"]


def test_a_failed_candidate_never_ranks_above_one_that_passed_however_fast():
    # "fast-but-broken" is 30 % faster everywhere it finished, and finished nothing in one cell: its overall figure
    # counts that cell (0), and a FAIL is listed after every PASS whatever its figure.
    broken = measured("candidate:broken", "broken", 130)
    broken.cells["prose@8"] = failed_cell()
    broken.cell_axes["prose@8"] = ("prose", 8, 0)
    arms = [measured("control-1", "a", 100), broken, measured("candidate:ok", "ok", 104),
            measured("control-2", "a", 100)]
    for arm in arms:
        if arm is not broken:
            arm.cells["prose@8"], arm.cell_axes["prose@8"] = timed_cell(100), ("prose", 8, 0)
    report = judge_bracket(arms, 1.025, priors=PRIORS)
    assert report.reasons == ["ok: PASS (overall 1.020x)", "broken: FAIL (overall 0.000x)"]
    assert report.best is not None and report.best.candidate == "ok"


def failed_cell() -> ArmResult:
    """A cell where every request failed."""
    lost = RequestResult(prompt_class="prose", prompt_index=0, ok=False, error="HTTP 500: boom", started_s=0.0,
                         finished_s=0.1, chunk_times_s=(), output_tokens=0, texts=())
    return summarize([lost] * 3, wall_time_s=0.1, concurrency=8)


def with_one_failed_request(cell: ArmResult) -> ArmResult:
    lost = RequestResult(prompt_class="prose", prompt_index=0, ok=False, error="HTTP 500: boom", started_s=0.0,
                         finished_s=0.1, chunk_times_s=(), output_tokens=0, texts=())
    return summarize([*cell.results[:2], lost], wall_time_s=cell.wall_time_s, concurrency=1)


def test_a_cell_with_a_failed_request_cannot_pass():
    # 1 of 3 requests failed, in the candidate arm: the cell fails, however fast the other two were.
    fast = measured("candidate", "fast", 120)
    fast.cells["prose@1"] = with_one_failed_request(fast.cells["prose@1"])
    report = judge([measured("control-1", "a", 100), fast, measured("control-2", "a", 100)], 1.025, priors=PRIORS)
    cell = report.cells["prose@1"]
    assert (cell["verdict"], cell["failed"], round(cell["ratio"], 3)) == ("fail", 1, 1.2)
    assert report.verdict == Verdict.FAIL
    assert "prose@1: fail: 1 failed request(s) in it; 1.200x against a bar of 1.025x (95% interval 1.190-1.210)" \
        in report.reasons
    # In a control arm: the controls cannot vouch for the comparison, so the cell is at best inconclusive.
    control = measured("control-2", "a", 100)
    control.cells["prose@1"] = with_one_failed_request(control.cells["prose@1"])
    report = judge([measured("control-1", "a", 100), measured("candidate", "fast", 120), control], 1.025,
                   priors=PRIORS)
    assert report.cells["prose@1"]["verdict"] == "inconclusive" and report.verdict == Verdict.FAIL


def test_pass_needs_the_probes_to_have_run():
    arms = [measured("control-1", "a", 100, probes=False), measured("candidate", "fast", 120, probes=False),
            measured("control-2", "a", 100, probes=False)]
    report = judge(arms, 1.025, priors=PRIORS)
    assert report.cells["prose@1"]["verdict"] == "pass"
    assert report.verdict == Verdict.INCONCLUSIVE and not report.more_arms_may_decide
    assert report.reasons == ["no correctness probe ran in control-1, candidate, control-2: PASS needs the "
                              "workload's probes (`probes:` in the workload file)"]


def test_only_a_bracket_undecided_by_its_cells_asks_for_more_arms():
    noisy = [measured("control-1", "a", 100), measured("candidate", "b", 103), measured("control-2", "a", 102)]
    report = judge(noisy, 1.025)
    assert report.verdict == Verdict.INCONCLUSIVE and report.more_arms_may_decide
    assert not judge(bracket_of(100, 130, 100), 1.025).more_arms_may_decide  # PASS: decided


def bracket_of(*rates: float) -> list[LaneBench]:
    names = ["control-1", *(f"candidate-{i}" for i in range(1, len(rates) - 1)), "control-2"]
    return [measured(name, "a" if name.startswith("control") else "b", rate) for name, rate in zip(names, rates,
                                                                                                   strict=True)]


def test_a_calibrated_prior_decides_a_bracket_its_own_control_pair_cannot():
    # 3.6 % faster, controls 0.2 % apart: on its one control pair (1 df, t = 12.7) the interval reaches below the
    # bar; with a calibration's 7 df of arm noise at that level it clears it.
    arms = [measured("control-1", "a", 100), measured("candidate", "b", 103.7), measured("control-2", "a", 100.2)]
    alone = judge(arms, 1.025)
    calibrated = judge(arms, 1.025, priors={"prose@1": ArmNoise(variance=0.002**2, df=7)})
    assert (alone.cells["prose@1"]["verdict"], calibrated.cells["prose@1"]["verdict"]) == ("inconclusive", "pass")
    assert calibrated.cells["prose@1"]["interval"] == {
        "model": INTERVAL_MODEL, "confidence": 0.95, "df": 8,
        "arm_sd": pytest.approx(math.sqrt((math.log(1.002) ** 2 / 2 + 7 * pessimistic(PRIORS["prose@1"]).variance) / 8),
                                rel=1e-12),
        "prior": {"variance": 0.002**2, "df": 7}}
    # Without the calibration the verdict says so, and the interval is the wider one.
    assert alone.reasons[-1].startswith("prior missing: this host has no calibration of prose@1")
    assert calibrated.reasons[-1].startswith("no cell failed")
    wide, narrow = alone.cells["prose@1"], calibrated.cells["prose@1"]
    assert wide["low"] < narrow["low"] and wide["high"] > narrow["high"]


# -- calibration (`gate LANE --calibrate`: N arms of one lane, back to back) ---------------------------------


def calibration_arms(*rates: float) -> list[LaneBench]:
    return [measured(f"arm-{n}", "a", rate, probes=False) for n, rate in enumerate(rates, start=1)]


def test_a_quiet_calibration_passes_with_its_figures():
    report = judge_calibration(calibration_arms(100, 100.2, 99.9, 100.1, 100), 1.025, 0.05)
    assert report.verdict == Verdict.PASS
    assert report.calibration is not None
    cell = report.calibration["cells"]["prose@1"]
    assert (cell["arms"], cell["df"], cell["brackets"], cell["covered"], cell["passed"]) == (5, 2, 3, 3, 0)
    assert report.calibration["false_promotion_rate"] < 1e-6
    assert report.reasons[0].startswith("false-promotion rate 0.0000 (allowed 0.05) for an A/B/A bracket over 1 "
                                        "cells; 3 of 3 A/A intervals held 1.0, 0 passed the bar, 0 fell below it")


def test_a_calibration_in_which_noise_alone_promoted_the_lane_fails():
    # One arm 25 % off nineteen quiet ones: judged as an A/B/A bracket, the unchanged lane cleared the bar (a 10 %
    # spike no longer does: it widens the calibrated noise, and the prior enters at its pessimistic end).
    rates = [100 + 0.1 * (k % 2) for k in range(20)]
    rates[10] = 125
    report = judge_calibration(calibration_arms(*rates), 1.025, 0.05)
    assert report.verdict == Verdict.FAIL
    assert report.calibration is not None and report.calibration["cells"]["prose@1"]["passed"] == 1
    assert report.reasons[0] == ("prose@1: 1 A/A bracket(s) passed the bar and 0 fell below it: noise alone moved "
                                 "an unchanged lane that far")
    assert report.reasons[-1].startswith("false-promotion rate ")


def test_a_calibration_with_a_failed_request_fails_and_names_it():
    arms = calibration_arms(100, 100.2, 99.9)
    arms[1].cells["prose@1"] = with_one_failed_request(arms[1].cells["prose@1"])
    report = judge_calibration(arms, 1.025, 0.05)
    assert report.verdict == Verdict.FAIL
    assert report.reasons[0] == "arm-2 (a) had 1 failed request(s)"
