"""The gate's arithmetic on fixed numbers, the release note's among them."""

from __future__ import annotations

import math
import random
from statistics import NormalDist

import pytest

from lanectl.bench.stats import (
    POINT_PRIOR_MODEL,
    UNCALIBRATED_ARM_SD,
    ArmNoise,
    CellCalibration,
    CellVerdict,
    Flip,
    ForcedFidelity,
    ForcedPosition,
    TokenChoice,
    Verdict,
    arm_noise,
    calibrate,
    calibrate_cell,
    cell_verdict,
    chi2_quantile,
    fidelity_verdict,
    percentile,
    pessimistic,
    ratio_interval,
    t_cdf,
    t_quantile,
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


# -- the interval: a t-interval on log arm means ------------------------------------------------


def test_t_quantiles_are_the_tables() -> None:
    # Student's t at 97.5 %, as every statistics table prints them.
    table = {1: 12.706, 2: 4.303, 3: 3.182, 5: 2.571, 10: 2.228, 30: 2.042, 1000: 1.962}
    assert {df: round(t_quantile(0.975, df), 3) for df in table} == table
    assert t_quantile(0.025, 4) == -t_quantile(0.975, 4)
    assert t_cdf(0.0, 3) == 0.5
    assert t_cdf(1.0, 1) == pytest.approx(0.75, abs=1e-12)  # Cauchy: 1/2 + atan(1)/pi


def test_an_aba_bracket_rests_on_its_one_control_pair_without_a_prior() -> None:
    # Controls 100 and 102 tok/s, the candidate 110: one degree of freedom, the spread of the control pair.
    interval = ratio_interval([[100.0] * 3, [102.0] * 3], [[110.0] * 3])
    sd = math.log(1.02) / math.sqrt(2)  # two log means' sample sd
    half = 12.7062047 * sd * math.sqrt(1 / 2 + 1)
    assert (interval.df, interval.arm_sd) == (1, pytest.approx(sd, rel=1e-12))
    assert interval.ratio == pytest.approx(110 / math.sqrt(100 * 102), rel=1e-12)
    assert interval.low == pytest.approx(interval.ratio * math.exp(-half), rel=1e-7)
    assert interval.high == pytest.approx(interval.ratio * math.exp(half), rel=1e-7)
    assert (round(interval.low, 4), round(interval.high, 4)) == (0.8759, 1.3543)


def test_a_calibrated_prior_pools_with_the_brackets_own_arms() -> None:
    prior = ArmNoise(variance=0.002**2, df=9)
    controls = [[100.0] * 3, [100.3] * 3]  # 0.3 % apart: within what a 0.2 % prior allows one pair
    interval = ratio_interval(controls, [[110.0] * 3], prior=prior)
    own = math.log(1.003) ** 2 / 2  # the control pair's sum of squares, on 1 df
    assert interval.df == 10 and interval.conflict is None
    # The prior at the upper end of its 90 % bound: 9 / chi2(0.10, 9) = 2.16 times its variance.
    assert pessimistic(prior).variance == pytest.approx(0.002**2 * 9 / 4.168, rel=1e-3)
    assert interval.arm_sd == pytest.approx(math.sqrt((own + 9 * pessimistic(prior).variance) / 10), rel=1e-12)
    as_estimated = ratio_interval(controls, [[110.0] * 3], prior=prior, model=POINT_PRIOR_MODEL)
    assert as_estimated.arm_sd == pytest.approx(math.sqrt((own + 9 * 0.002**2) / 10), rel=1e-12)
    assert interval.high - interval.low < 0.1  # against 0.48 on the pair alone


def test_chi2_quantiles_are_the_tables_to_half_a_percent() -> None:
    table = {(0.10, 4): 1.064, (0.10, 7): 2.833, (0.10, 9): 4.168, (0.10, 20): 12.443, (0.90, 7): 12.017}
    for (p, df), value in table.items():
        assert chi2_quantile(p, df) == pytest.approx(value, rel=0.005)


def test_without_a_prior_two_controls_that_agree_by_chance_are_not_believed_below_the_floor() -> None:
    # The control pair 0.1 % apart, the candidate 3 % off: the pair's own spread would give +-2 %, and the A/A
    # brackets of the H200 record show such pairs beside an arm that swung further (issue 42).
    interval = ratio_interval([[100.0], [100.1]], [[103.0]])
    assert interval.arm_sd == UNCALIBRATED_ARM_SD and interval.df == 1
    half = 12.7062047 * UNCALIBRATED_ARM_SD * math.sqrt(1.5)
    assert interval.high / interval.ratio == pytest.approx(math.exp(half), rel=1e-7)
    believed = ratio_interval([[100.0], [100.1]], [[103.0]], model=POINT_PRIOR_MODEL)
    assert believed.low > 1.0 > interval.low  # believed, the pair would call an unchanged lane's swing a change
    with pytest.raises(ValueError, match="unknown interval model"):
        ratio_interval([[100.0], [100.1]], [[103.0]], model="a z-test")


def test_the_unit_is_the_arm_so_more_requests_per_arm_do_not_narrow_it() -> None:
    # Requests of one arm share its state (and at 8 streams its batches); only more arms say more about drift.
    few = ratio_interval([[99.0, 101.0], [101.0, 103.0]], [[105.0, 107.0]])
    many = ratio_interval([[99.0, 101.0] * 50, [101.0, 103.0] * 50], [[105.0, 107.0] * 50])
    assert (few.low, few.ratio, few.high) == pytest.approx((many.low, many.ratio, many.high), rel=1e-12)
    more_arms = ratio_interval([[100.0], [102.0], [100.0], [102.0]], [[106.0], [106.0], [106.0]])
    assert more_arms.high - more_arms.low < (few.high - few.low) / 5


def test_a_steady_drift_cancels_from_the_ratio() -> None:
    # Each arm 2 % faster than the one before: A/B/A's controls average out exactly where the candidate sits.
    drift = [100.0 * 1.02**k for k in range(4)]
    aba = ratio_interval([[drift[0]], [drift[2]]], [[drift[1] * 1.05]])
    abba = ratio_interval([[drift[0]], [drift[3]]], [[drift[1] * 1.05], [drift[2] * 1.05]])
    assert aba.ratio == pytest.approx(1.05, rel=1e-12) and abba.ratio == pytest.approx(1.05, rel=1e-12)


def test_the_interval_refuses_what_it_cannot_judge() -> None:
    with pytest.raises(ValueError, match="two control arms, or a calibrated prior"):
        ratio_interval([[100.0]], [[100.0]])
    with pytest.raises(ValueError, match="at least one request"):
        ratio_interval([[1.0], []], [[1.0]])
    with pytest.raises(ValueError, match="finite and >= 0"):
        ratio_interval([[1.0], [-1.0]], [[1.0]])
    with pytest.raises(ValueError, match="finite and > 0"):
        ratio_interval([[0.0], [1.0]], [[1.0]])


def aa_arms(rng: random.Random, *, arms: int, requests: int, streams: int, arm_sd: float, batch_sd: float,
            walk_sd: float) -> list[list[float]]:
    """Identical arms of one lane, as a loaded server gives them: a level that wanders from arm to arm, each
    arm off by its own amount, and requests in flight together sharing a batch's luck."""
    made, level = [], 0.0
    for _ in range(arms):
        level += rng.gauss(0, walk_sd)
        arm = level + rng.gauss(0, arm_sd)
        rates, batch = [], 0.0
        for i in range(requests):
            if i % streams == 0:
                batch = rng.gauss(0, batch_sd)
            rates.append(100 * math.exp(arm + batch + rng.gauss(0, 0.01)))
        made.append(rates)
    return made


def test_on_arms_that_drift_and_share_batches_the_intervals_hold_1_at_their_nominal_rate() -> None:
    """The statistics claim, on data: A/B/A brackets of consecutive identical arms, with the noise of a
    calibration on other arms of the lane (run before them) as their prior. Resampling requests (the bootstrap
    lanectl used before) held 1.0 in 40-70 % of such brackets; an interval whose unit is the arm holds it in
    about 95 %; with the calibration's noise at the upper end of its 90 % bound (a gate runs in another session
    than its calibration, and the H200's sessions differ by more than a 7-df estimate's own spread), in 99 %."""
    rng = random.Random(32)
    covered = total = 0
    for _ in range(60):
        calibration = aa_arms(rng, arms=8, requests=24, streams=8, arm_sd=0.005, batch_sd=0.004, walk_sd=0.002)
        arms = aa_arms(rng, arms=14, requests=24, streams=8, arm_sd=0.005, batch_sd=0.004, walk_sd=0.002)
        prior = arm_noise([sum(a) / len(a) for a in calibration])
        for k in range(len(arms) - 2):
            interval = ratio_interval([arms[k], arms[k + 2]], [arms[k + 1]], prior=prior)
            covered += interval.low <= 1.0 <= interval.high
            total += 1
    assert 0.95 <= covered / total <= 0.995, (covered, total)


# -- calibration ----------------------------------------------------------------------------------


def test_arm_noise_is_the_mean_square_step_between_neighbouring_arms() -> None:
    # Von Neumann's estimator on the logs: 4 steps, each 1 % (as logs), so variance = 4 * 0.01^2 / (2 * 4).
    means = [100 * math.exp(x) for x in (0.0, 0.01, 0.0, 0.01, 0.0)]
    assert arm_noise(means) == ArmNoise(variance=pytest.approx(0.01**2 / 2, rel=1e-9), df=2)  # 2*16 // 11
    # A steady drift moves each step by the same amount; a to-and-fro swing of the same size counts far more.
    drift = arm_noise([100 * math.exp(0.002 * k) for k in range(12)])
    swing = arm_noise([100 * math.exp(0.002 * (k % 2) * 11) for k in range(12)])
    assert drift.variance == pytest.approx(0.002**2 / 2, rel=1e-9) and swing.variance > 100 * drift.variance
    assert (drift.df, arm_noise([1.0, 2.0]).df) == (7, 1)  # 2 * 121 // 32 for 12 arms; at least 1


def test_a_calibration_cell_measures_noise_coverage_and_what_it_can_detect() -> None:
    arms = [[100.0], [100.4], [99.8], [100.2], [99.9]]
    cell = calibrate_cell(arms, 1.025)
    logs = [math.log(a[0]) for a in arms]
    steps = [b - a for a, b in zip(logs, logs[1:], strict=False)]
    assert cell.noise == ArmNoise(variance=pytest.approx(sum(d * d for d in steps) / 8, rel=1e-12), df=2)
    assert (cell.brackets, cell.covered, cell.passed, cell.failed) == (3, 3, 0, 0)
    spread = math.sqrt(pessimistic(cell.noise).variance * 1.5)  # the prior as a gate takes it
    t = t_quantile(0.975, 3)  # the calibration's 2 df and an A/B/A bracket's own 1
    assert cell.detectable_ratio == pytest.approx(1.025 * math.exp(t * spread), rel=1e-12)
    assert cell.false_promotion == pytest.approx(1 - NormalDist().cdf(math.log(1.025) / spread + t), rel=1e-9)
    assert cell.false_promotion < 1e-6


def test_an_arm_far_off_the_others_widens_what_the_setup_can_detect() -> None:
    quiet = calibrate_cell([[100.0], [100.1], [99.9], [100.0], [100.2], [100.1], [99.9]], 1.025)
    one_off = calibrate_cell([[100.0], [100.1], [99.9], [100.0], [108.0], [100.1], [99.9]], 1.025)
    assert (quiet.covered, one_off.covered) == (5, 5)  # its own noise, measured, covers it
    assert round(quiet.detectable_ratio, 3) == 1.032 and round(one_off.detectable_ratio, 3) == 1.241


def test_a_spike_among_many_quiet_arms_is_an_aa_bracket_that_passed() -> None:
    arms = [[100.0 + 0.1 * (k % 2)] for k in range(20)]
    arms[10] = [125.0]  # 10 % no longer passes: the spike widens the noise, and the prior enters at its upper bound
    cell = calibrate_cell(arms, 1.025)
    assert (cell.brackets, cell.covered, cell.passed, cell.failed) == (18, 17, 1, 0)


def test_the_bracket_promotes_by_noise_when_any_cell_does() -> None:
    def cell(chance: float, detectable: float) -> CellCalibration:
        return CellCalibration(noise=ArmNoise(0.0, 4), brackets=3, covered=3, passed=0, failed=0,
                               false_promotion=chance, detectable_ratio=detectable)

    found = calibrate([cell(0.01, 1.03), cell(0.02, 1.05)], 1.025)
    assert found.false_promotion_rate == pytest.approx(1 - 0.99 * 0.98, rel=1e-12)
    assert (found.detectable_ratio, found.detectable_gain) == (1.05, pytest.approx(1.05 / 1.025 - 1))
    assert (found.brackets, found.covered, found.coverage) == (6, 6, 1.0)
    assert found.within(0.03) and not found.within(0.02)


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
