"""The gate's arithmetic on fixed numbers, the release note's among them."""

from __future__ import annotations

import math

import pytest

from lanectl.bench.stats import (
    CellVerdict,
    Divergence,
    FidelityReport,
    TokenChoice,
    Verdict,
    cell_verdict,
    fidelity,
    fidelity_verdict,
    percentile,
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


# -- the A/B/A verdict ----------------------------------------------------------------------------


def test_release_note_4_splits_pass() -> None:
    v = cell_verdict(467.5, 467.5, 484.5, 1.025)
    assert v.verdict is Verdict.PASS
    assert v.band == 0.0
    assert round(v.ratio, 3) == 1.036
    assert str(v) == "pass: 1.036x against a bar of 1.025x (noise band ±0.000)"


def test_release_note_8_splits_do_not_pass() -> None:
    v = cell_verdict(467.5, 467.5, 477.8, 1.025)
    assert round(v.ratio, 3) == 1.022
    assert v.verdict is Verdict.INCONCLUSIVE  # a gain, but short of the bar: not promoted, not a loss


def test_ratio_exactly_at_the_bar_passes() -> None:
    assert cell_verdict(400.0, 400.0, 410.0, 1.025).verdict is Verdict.PASS


def test_band_is_the_controls_drift() -> None:
    v = cell_verdict(460.0, 475.0, 484.5, 1.025)
    assert v.band == pytest.approx(15.0 / 467.5)
    assert v.ratio == pytest.approx(484.5 / 467.5)


def test_a_gain_inside_the_noise_is_inconclusive() -> None:
    # 1.036x, but the controls moved 3.2%: the true ratio may be anywhere in 1.004..1.068.
    v = cell_verdict(460.0, 475.0, 484.5, 1.025)
    assert v.verdict is Verdict.INCONCLUSIVE


def test_pass_needs_the_bar_at_the_pessimistic_end() -> None:
    # band 1% (465.15 / 469.85 around 467.5): 1.036 - 0.010 = 1.026 >= 1.025
    assert cell_verdict(465.1625, 469.8375, 484.5, 1.025).verdict is Verdict.PASS
    # band 2%: 1.036 - 0.020 = 1.016 < 1.025 <= 1.056
    assert cell_verdict(462.825, 472.175, 484.5, 1.025).verdict is Verdict.INCONCLUSIVE


def test_fail_needs_a_loss_as_large_as_the_bar_at_the_optimistic_end() -> None:
    # floor = 1 / 1.025 = 0.9756. 0.95 with a 0.2% band: 0.952 < 0.9756
    assert cell_verdict(467.0325, 467.9675, 444.125, 1.025).verdict is Verdict.FAIL
    # 0.97 with a 1% band: 0.98 >= 0.9756, so the loss is inside the noise
    assert cell_verdict(465.1625, 469.8375, 453.475, 1.025).verdict is Verdict.INCONCLUSIVE
    # as fast as the controls: neither a gain nor a loss
    assert cell_verdict(467.5, 467.5, 467.5, 1.025).verdict is Verdict.INCONCLUSIVE


def test_lower_is_better_inverts_the_ratio() -> None:
    # ms/step: controls 11.10, candidate 10.67 -> 1.040x better
    v = cell_verdict(11.10, 11.10, 10.67, 1.025, higher_is_better=False)
    assert v.ratio == pytest.approx(11.10 / 10.67)
    assert v.verdict is Verdict.PASS
    assert cell_verdict(11.10, 11.10, 11.20, 1.0, higher_is_better=False).verdict is Verdict.FAIL


def test_a_no_regression_bar_below_one() -> None:
    # tool_json at 1 user in the release note: 0.992x; a "no worse than 2%" bar passes it.
    assert cell_verdict(100.0, 100.0, 99.2, 0.98).verdict is Verdict.PASS
    assert cell_verdict(100.0, 100.0, 97.0, 0.98).verdict is Verdict.FAIL


def test_a_candidate_that_measured_nothing_fails() -> None:
    assert cell_verdict(467.5, 467.5, 0.0, 1.025) == CellVerdict(ratio=0.0, band=0.0, bar=1.025, verdict=Verdict.FAIL)


def test_nonsense_figures_are_refused() -> None:
    with pytest.raises(ValueError, match="controls measured nothing"):
        cell_verdict(0.0, 0.0, 10.0, 1.025)
    with pytest.raises(ValueError, match="candidate must be a finite figure"):
        cell_verdict(1.0, 1.0, math.nan, 1.025)
    with pytest.raises(ValueError, match="control_first must be a finite figure"):
        cell_verdict(-1.0, 1.0, 1.0, 1.025)
    with pytest.raises(ValueError, match="lower-is-better"):
        cell_verdict(11.1, 11.1, 0.0, 1.025, higher_is_better=False)


# -- fidelity -------------------------------------------------------------------------------------


def choice(token: str, p: float, **others: float) -> TokenChoice:
    top = {token: math.log(p), **{t: math.log(q) for t, q in others.items()}}
    return TokenChoice(token=token, logprob=math.log(p), top=top)


def test_identical_runs_do_not_diverge() -> None:
    run = {0: [choice("a", 0.95), choice("b", 0.5, c=0.3)], 1: [choice("x", 0.99)]}
    report = fidelity(run, run)
    assert report == FidelityReport(prompts=2, positions=3, length_mismatches=0, divergences=())
    assert report.confident_flips == 0
    assert report.weighted_divergence == 0.0


def test_only_the_first_divergence_of_a_prompt_counts() -> None:
    control = {"p": [choice("a", 0.95), choice("b", 0.95, c=0.03), choice("d", 0.99), choice("e", 0.99)]}
    candidate = {"p": [choice("a", 0.95), choice("c", 0.6), choice("q", 0.9), choice("r", 0.9)]}
    report = fidelity(control, candidate)
    assert report.positions == 2  # up to and including the first flip; later positions are another text
    (d,) = report.divergences
    assert (d.prompt, d.position, d.control_token, d.candidate_token) == ("p", 1, "b", "c")
    assert d.confident
    assert d.control_p == pytest.approx(0.95)
    assert d.weight == pytest.approx(0.95 - 0.03)
    assert report.confident_flips == 1


def test_weight_and_confidence_follow_the_controls_probabilities() -> None:
    control = {
        0: [choice("a", 0.5, b=0.45)],  # a near tie: not confident, weight 0.05
        1: [choice("a", 0.95)],  # sure, and the candidate's token is not in its top: weight 0.95
        2: [choice("a", 0.89, b=0.1)],  # just under the confidence line
    }
    candidate = {0: [choice("b", 0.5)], 1: [choice("z", 0.7)], 2: [choice("b", 0.6)]}
    report = fidelity(control, candidate)
    assert [d.confident for d in report.divergences] == [False, True, False]
    assert [round(d.weight, 10) for d in report.divergences] == [0.05, 0.95, 0.79]
    assert report.confident_flips == 1
    assert report.weighted_divergence == pytest.approx(1.79)


def test_only_shared_prompts_are_compared_and_lengths_are_noted() -> None:
    control = {0: [choice("a", 0.9), choice("b", 0.9)], 1: [choice("a", 0.9)], 2: [choice("a", 0.9)]}
    candidate = {0: [choice("a", 0.9)], 1: [choice("a", 0.9)], 3: [choice("a", 0.9)]}
    report = fidelity(control, candidate)
    assert report.prompts == 2
    assert report.positions == 2
    assert report.length_mismatches == 1
    assert report.divergences == ()


def test_fidelity_verdict_uses_the_controls_as_the_bar() -> None:
    def report(flips: int, weights: list[float]) -> FidelityReport:
        divs = tuple(
            Divergence(prompt=i, position=0, control_token="a", control_p=0.95 if i < flips else 0.5,
                       candidate_token="b", weight=w, confident=i < flips)
            for i, w in enumerate(weights)
        )
        return FidelityReport(prompts=len(weights), positions=len(weights), length_mismatches=0, divergences=divs)

    controls = report(4, [0.8, 0.8, 0.8, 0.792])  # 4 flips, weighted 3.192
    shipped = report(4, [0.7, 0.7, 0.7, 0.684])  # 4 flips, weighted 2.784
    eight_splits = report(6, [0.4] * 6)  # 6 flips, weighted 2.4
    assert round(controls.weighted_divergence, 3) == 3.192
    assert round(shipped.weighted_divergence, 3) == 2.784
    assert fidelity_verdict(shipped, controls) is Verdict.PASS
    assert fidelity_verdict(eight_splits, controls) is Verdict.FAIL
    assert fidelity_verdict(report(3, [0.9, 0.9, 0.9, 0.9]), controls) is Verdict.FAIL  # 3.6 > 3.192
