"""Several candidates in one bracket: the arm order, one verdict per candidate against the same controls,
and which one `--promote` would pick. Pure: arms are built in memory, as `bench_lane` leaves them."""

from __future__ import annotations

import json
import math

from lanectl.bench.gate import BracketReport, LaneBench, bracket_arms, judge, judge_bracket
from lanectl.bench.stats import ForcedPosition, TokenChoice, Verdict
from lanectl.cli.views import render_text
from lanectl.output import Result
from tests.test_probes import timed_cell

REFERENCE = (TokenChoice(" the", math.log(0.95), {" the": math.log(0.95)}, token_id=0),)
AGREED = (ForcedPosition(" the", math.log(0.95), " the", math.log(0.95), token_id=0, top_token_id=0),)


def measured(arm: str, lane: str, rate: float, *, xid: bool = False) -> LaneBench:
    made = LaneBench(lane=lane, arm=arm, image=f"img-{lane}", started="t")
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
    return judge_bracket(arms, 1.025)


def test_each_candidate_is_judged_against_the_same_controls_and_the_best_that_passed_is_chosen():
    report = bracket()
    verdicts = {r.candidate: (r.verdict, round(r.cells["prose@1"]["ratio"], 3)) for r in report.candidates}
    assert verdicts == {"fast": (Verdict.PASS, 1.1), "faster": (Verdict.PASS, 1.2), "slow": (Verdict.FAIL, 0.9)}
    assert report.best is not None and report.best.candidate == "faster"
    assert report.verdict == Verdict.PASS and report.order == "ABCDA"
    # Each candidate's own arms and the two controls, nothing of the others.
    assert [a["arm"] for a in report.candidates[2].arms] == ["control-1", "candidate:slow", "control-2"]
    assert report.candidates[2].reasons == ["prose@1: fail: 0.900x against a bar of 1.025x (95% interval "
                                            "0.900-0.900)"]


def test_no_candidate_is_chosen_when_none_passed():
    arms = [measured("control-1", "a", 100), measured("candidate:slow", "slow", 90),
            measured("candidate:crashy", "crashy", 130, xid=True), measured("control-2", "a", 100)]
    report = judge_bracket(arms, 1.025)
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
    assert one.as_dict() == single.as_dict()
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
                         "  - fast: PASS (overall 1.100x)", "  - faster: PASS (overall 1.200x)",
                         "  - slow: FAIL (overall 0.900x)"]


# -- calibration (`gate LANE --calibrate`: every arm ran the control) ---------------------------------------


def calibration_arms(candidate_rate: float) -> list[LaneBench]:
    return [measured("control-1", "a", 100), measured("candidate", "a", candidate_rate),
            measured("control-2", "a", 100)]


def test_a_quiet_calibration_passes_with_its_figures_first():
    report = judge(calibration_arms(100), 1.025, max_false_promotion=0.05)
    assert report.verdict == Verdict.PASS
    assert report.calibration is not None
    assert (report.calibration["false_promotion_rate"], report.calibration["cells_passed"]) == (0.0, 0)
    assert report.reasons[0].startswith("false-promotion rate 0.0000 (allowed 0.05) over 1 cells")


def test_a_calibration_whose_noise_cleared_the_bar_fails():
    # One arm of the same lane measured 5% faster: noise alone would have promoted it.
    report = judge(calibration_arms(105), 1.025, max_false_promotion=0.05)
    assert report.verdict == Verdict.FAIL
    assert report.calibration is not None
    assert (report.calibration["false_promotion_rate"], report.calibration["cells_passed"]) == (1.0, 1)
    assert report.reasons[-1].startswith("false-promotion rate 1.0000 (allowed 0.05) over 1 cells x")


def test_a_calibration_with_a_cell_below_the_bar_fails_naming_it():
    # Noise the other way: a cell that a real candidate would FAIL on is as disqualifying as one that passes.
    report = judge(calibration_arms(90), 1.025, max_false_promotion=0.05)
    assert report.verdict == Verdict.FAIL
    assert report.calibration is not None and report.calibration["false_promotion_rate"] == 0.0
    assert report.reasons[0].startswith("prose@1: fail: 0.900x against a bar of 1.025x")
