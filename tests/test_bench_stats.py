"""The gate's arithmetic on fixed numbers, the release note's among them."""

from __future__ import annotations

import math

import pytest

from lanectl.bench.stats import (
    CellVerdict,
    Flip,
    ForcedFidelity,
    ForcedPosition,
    RatioInterval,
    TokenChoice,
    Verdict,
    bootstrap_ratio,
    calibrate,
    cell_verdict,
    fidelity_verdict,
    percentile,
    teacher_forced,
)

# -- percentiles ----------------------------------------------------------------------------------


def test_percentile_interpolates_between_closest_ranks() -> None:
    assert percentile([4.0, 1.0, 3.0, 2.0], 50) == 2.5
    assert percentile([1.0, 2.0, 3.0, 4.0], 0) == 1.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 100) == 4.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 25) == 1.75
    assert percentile([10.0, 20.0], 99) == pytest.approx(19.9, abs=1e-12)
    assert percentile([float(i) for i in range(1, 101)], 99) == pytest.approx(99.01, abs=1e-12)
    assert percentile([float(i) for i in range(1, 101)], 50) == 50.5


def test_percentile_of_one_value_is_that_value() -> None:
    assert percentile([7.25], 0) == percentile([7.25], 50) == percentile([7.25], 99) == 7.25


def test_percentile_rejects_nothing_and_out_of_range() -> None:
    with pytest.raises(ValueError, match="no values"):
        percentile([], 50)
    with pytest.raises(ValueError, match=r"\[0, 100\]"):
        percentile([1.0], 101)


# -- the verdict from an interval ---------------------------------------------------------------


def test_release_note_4_splits_pass() -> None:
    v = cell_verdict(484.5 / 467.5, 1.030, 1.042, 1.025)
    assert v.verdict is Verdict.PASS
    assert round(v.ratio, 3) == 1.036
    assert str(v) == "pass: 1.036x against a bar of 1.025x (95% interval 1.030-1.042)"


def test_release_note_8_splits_do_not_pass() -> None:
    # 1.022x: a gain, but short of the bar even with no noise at all: not promoted, not a loss.
    assert cell_verdict(1.022, 1.022, 1.022, 1.025).verdict is Verdict.INCONCLUSIVE


def test_the_low_end_exactly_at_the_bar_passes() -> None:
    assert cell_verdict(1.03, 1.025, 1.035, 1.025).verdict is Verdict.PASS
    assert cell_verdict(1.03, 1.0249, 1.035, 1.025).verdict is Verdict.INCONCLUSIVE


def test_a_gain_whose_interval_reaches_below_the_bar_is_inconclusive() -> None:
    assert cell_verdict(1.036, 1.004, 1.068, 1.025).verdict is Verdict.INCONCLUSIVE


def test_fail_needs_the_whole_interval_below_the_floor() -> None:
    # floor = 1 / 1.025 = 0.9756
    assert cell_verdict(0.95, 0.948, 0.952, 1.025).verdict is Verdict.FAIL
    assert cell_verdict(0.97, 0.96, 0.98, 1.025).verdict is Verdict.INCONCLUSIVE  # the loss is inside the noise
    assert cell_verdict(1.0, 1.0, 1.0, 1.025).verdict is Verdict.INCONCLUSIVE  # neither gain nor loss


def test_a_no_regression_bar_below_one() -> None:
    # tool_json at 1 user in the release note: 0.992x; a "no worse than 2%" bar passes it.
    assert cell_verdict(0.992, 0.99, 0.994, 0.98).verdict is Verdict.PASS
    assert cell_verdict(0.97, 0.968, 0.972, 0.98).verdict is Verdict.FAIL


def test_a_candidate_that_measured_nothing_fails() -> None:
    assert cell_verdict(0.0, 0.0, 0.0, 1.025) == CellVerdict(ratio=0.0, low=0.0, high=0.0, bar=1.025,
                                                            verdict=Verdict.FAIL)


def test_nonsense_figures_are_refused() -> None:
    with pytest.raises(ValueError, match="ratio must be a finite figure"):
        cell_verdict(math.nan, 1.0, 1.0, 1.025)
    with pytest.raises(ValueError, match="must hold the ratio"):
        cell_verdict(1.1, 1.0, 1.05, 1.025)


# -- the bootstrap --------------------------------------------------------------------------------


def test_arms_without_spread_give_the_ratio_exactly() -> None:
    interval = bootstrap_ratio([[100.0] * 6, [100.0] * 6], [[125.0] * 6], resamples=50)
    assert (interval.ratio, interval.low, interval.high) == (1.25, 1.25, 1.25)
    assert len(interval.replicates) == 50


def test_drift_between_the_control_arms_widens_the_interval_to_its_ends() -> None:
    # No request-to-request noise: a replicate draws the control arms {A1, A1}, {A1, A2} or {A2, A2}, so its
    # ratio is 110/100, 110/105 or 110/110, the ends drawn a quarter of the time each.
    interval = bootstrap_ratio([[100.0] * 5, [110.0] * 5], [[110.0] * 5], resamples=2000, seed=1)
    assert interval.ratio == pytest.approx(110 / 105)
    assert (interval.low, interval.high) == (1.0, 1.1)
    assert set(interval.replicates) == {1.1, 110 / 105, 1.0}
    assert interval.replicates.count(1.0) == pytest.approx(500, abs=70)


def test_the_bootstrap_is_seeded() -> None:
    controls = [[100.0 + (i * 7) % 13 for i in range(20)], [101.0 + (i * 5) % 11 for i in range(20)]]
    candidate = [[104.0 + (i * 3) % 17 for i in range(20)]]
    first = bootstrap_ratio(controls, candidate)
    assert first == bootstrap_ratio(controls, candidate)
    assert first.replicates != bootstrap_ratio(controls, candidate, seed=2).replicates
    assert len(first.replicates) == 2000
    assert first.low < first.ratio < first.high
    # 2.5th and 97.5th percentiles of the replicates, as the docstring states.
    assert (first.low, first.high) == (percentile(first.replicates, 2.5), percentile(first.replicates, 97.5))


def test_more_requests_narrow_the_interval() -> None:
    def width(n: int) -> float:
        noisy = [[100.0 + (i * 37) % 21 - 10 for i in range(n)] for _ in range(2)]
        interval = bootstrap_ratio(noisy, [[x * 1.05 for x in noisy[0]]])
        return interval.high - interval.low

    assert width(400) < width(25) / 2


def test_the_bootstrap_refuses_empty_arms_and_a_zero_control() -> None:
    with pytest.raises(ValueError, match="at least one request"):
        bootstrap_ratio([[1.0], []], [[1.0]])
    with pytest.raises(ValueError, match="measured nothing"):
        bootstrap_ratio([[0.0]], [[1.0]])


# -- calibration ----------------------------------------------------------------------------------


def test_calibration_counts_replicates_at_or_above_the_bar_and_the_worst_cell_decides() -> None:
    cells = [
        RatioInterval(ratio=1.0, low=0.99, high=1.01, replicates=(0.99, 1.0, 1.01, 1.025)),
        RatioInterval(ratio=1.0, low=0.96, high=1.03, replicates=(0.96, 1.0, 1.03, 1.0)),
    ]
    found = calibrate(cells, 1.025)
    assert found.false_promotion_rate == 2 / 8  # 1.025 (at the bar) and 1.03
    assert found.cells_passed == 0
    assert found.detectable_ratio == pytest.approx(1.025 / 0.96)
    assert found.detectable_gain == pytest.approx(1 / 0.96 - 1)
    assert found.within(0.25) and not found.within(0.2)


def test_a_cell_whose_interval_cleared_the_bar_is_a_false_promotion_whatever_the_rate() -> None:
    cells = [RatioInterval(ratio=1.03, low=1.026, high=1.034, replicates=(1.0,) * 99 + (1.03,))]
    found = calibrate(cells, 1.025)
    assert (found.cells_passed, found.false_promotion_rate) == (1, 0.01)
    assert not found.within(0.05)


# -- teacher-forced fidelity ----------------------------------------------------------------------


def token_id(token: str) -> int:
    return int.from_bytes(token.encode(), "little")


def choice(token: str, p: float, **others: float) -> TokenChoice:
    top = {token: math.log(p), **{t: math.log(q) for t, q in others.items()}}
    return TokenChoice(token=token, logprob=math.log(p), top=top, token_id=token_id(token))


def forced(token: str, top: str | None = None) -> ForcedPosition:
    return ForcedPosition(token=token, logprob=math.log(0.9), top_token=top or token, top_logprob=math.log(0.9),
                          token_id=token_id(token), top_token_id=token_id(top or token))


def test_an_arm_that_agrees_everywhere_has_no_flips() -> None:
    reference = {0: [choice("a", 0.95), choice("b", 0.5, c=0.3)], 1: [choice("x", 0.99)]}
    report = teacher_forced(reference, {0: [forced("a"), forced("b")], 1: [forced("x")]})
    assert report == ForcedFidelity(prompts=2, positions=3, unscored=0, flips=())
    assert (report.confident_flips, report.weighted_divergence) == (0, 0.0)


def test_every_position_counts_not_only_the_first_difference() -> None:
    reference = {"p": [choice("a", 0.95), choice("b", 0.95, c=0.03), choice("d", 0.99), choice("e", 0.99)]}
    scored = {"p": [forced("a"), forced("b", "c"), forced("d", "q"), forced("e", "r")]}
    report = teacher_forced(reference, scored)
    assert report.positions == 4
    assert [(f.position, f.reference_token, f.scored_token) for f in report.flips] == [
        (1, "b", "c"), (2, "d", "q"), (3, "e", "r")]
    assert report.confident_flips == 3  # first-divergence counting would have seen one
    assert [round(f.weight, 10) for f in report.flips] == [0.92, 0.99, 0.99]


def test_weight_and_confidence_follow_the_references_probabilities() -> None:
    reference = {
        0: [choice("a", 0.5, b=0.45)],  # a near tie: not confident, weight 0.05
        1: [choice("a", 0.95)],  # sure, and the scored arm's top is not in its top: weight 0.95
        2: [choice("a", 0.89, b=0.1)],  # just under the confidence line
    }
    scored = {0: [forced("a", "b")], 1: [forced("a", "z")], 2: [forced("a", "b")]}
    report = teacher_forced(reference, scored)
    assert [f.confident for f in report.flips] == [False, True, False]
    assert [round(f.weight, 10) for f in report.flips] == [0.05, 0.95, 0.79]
    assert report.confident_flips == 1
    assert report.weighted_divergence == pytest.approx(1.79)


def test_scores_that_do_not_line_up_are_unscored_not_flips() -> None:
    reference = {0: [choice("a", 0.9), choice("b", 0.9)], 1: [choice("a", 0.9)], 2: [choice("a", 0.9)]}
    # 0: too short; 1: another token forced; 2: no scores at all (its scoring request failed); 3: not a reference prompt
    scored = {0: [forced("a")], 1: [forced("x", "x")], 3: [forced("a")]}
    report = teacher_forced(reference, scored)
    assert (report.prompts, report.positions, report.unscored, report.flips) == (0, 0, 3, ())


def test_positions_line_up_by_token_id_not_by_text() -> None:
    """Two ids that decode to the same text are two tokens; scores without ids line up with nothing."""
    reference = {0: [choice("a", 0.95)], 1: [choice("a", 0.95)], 2: [choice("a", 0.95)]}
    other_id = ForcedPosition(token="a", logprob=math.log(0.9), top_token="a", top_logprob=math.log(0.9),
                              token_id=token_id("a") + 1, top_token_id=token_id("a") + 1)
    no_ids = ForcedPosition(token="a", logprob=math.log(0.9), top_token="a", top_logprob=math.log(0.9))
    same_text_other_top = ForcedPosition(token="a", logprob=math.log(0.9), top_token="a", top_logprob=math.log(0.9),
                                         token_id=token_id("a"), top_token_id=token_id("a") + 1)
    report = teacher_forced(reference, {0: [other_id], 1: [no_ids], 2: [same_text_other_top]})
    assert (report.prompts, report.unscored) == (1, 2)
    assert [(f.prompt, f.reference_token, f.scored_token, f.confident) for f in report.flips] == [(2, "a", "a", True)]


def test_fidelity_verdict_uses_the_controls_as_the_bar_and_allows_no_agent_flip() -> None:
    def report(flips: int, weights: list[float]) -> ForcedFidelity:
        found = tuple(Flip(prompt=i, position=0, reference_token="a", reference_p=0.95 if i < flips else 0.5,
                           scored_token="b", weight=w, confident=i < flips) for i, w in enumerate(weights))
        return ForcedFidelity(prompts=len(weights), positions=len(weights), unscored=0, flips=found)

    controls = report(4, [0.8, 0.8, 0.8, 0.792])  # 4 flips, weighted 3.192
    shipped = report(4, [0.7, 0.7, 0.7, 0.684])  # 4 flips, weighted 2.784
    eight_splits = report(6, [0.4] * 6)  # 6 flips, weighted 2.4
    assert round(controls.weighted_divergence, 3) == 3.192
    assert round(shipped.weighted_divergence, 3) == 2.784
    assert fidelity_verdict(shipped, controls) is Verdict.PASS
    assert fidelity_verdict(shipped, controls, agent_confident_flips=1) is Verdict.FAIL
    assert fidelity_verdict(eight_splits, controls) is Verdict.FAIL
    assert fidelity_verdict(report(3, [0.9, 0.9, 0.9, 0.9]), controls) is Verdict.FAIL  # 3.6 > 3.192
