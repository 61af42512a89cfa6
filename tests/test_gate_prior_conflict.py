"""The prior-data conflict check: a bracket whose own arms spread further than its calibration allows sets the
calibration aside, says so, and lets `--until-decided` add arms rather than deciding on a stale prior.

The rule (`lanectl.bench.stats.prior_conflict`): the variance of the bracket's own log arm means about their
lane's mean (controls, and candidates where there are two or more) over the prior's variance is an F statistic
on (own df, prior df); above its 95 % quantile the prior is stale. Its false-alarm rate is 5 % of a cell's
brackets by construction when the prior's variance is a chi-square estimate on its df, and at most that with the
calibration's own estimator (von Neumann's, whose df are rounded down): simulated below.

The two recorded H200 sessions (gpu/record/aa-8b, aa64-8b) have the same noise at 1 stream (0.29 % and 0.24 %
between arms at prose@1), so the threefold difference issue 53 met elsewhere (0.09 % against 0.30 %) cannot be
replayed from them as recorded. It is built from them instead: a quiet day's calibration is one session's own arms
pulled 3.3 times closer to their mean, and the other session's real arms are judged with it. (The recorded H100
session, gpu/record/aa64-8b-h100, is 3.7 times quieter at prose@1, 0.08 %, but on another GPU, whose calibration
the gate does not use on the H200: tests/test_gate_coverage.py.)
"""

from __future__ import annotations

import math
import random
from typing import Any

import pytest

from lanectl.bench.stats import (
    PESSIMISTIC_PRIOR_MODEL,
    PRIOR_CONFLICT_LEVEL,
    ArmNoise,
    Verdict,
    arm_noise,
    calibrate_cell,
    f_cdf,
    f_quantile,
    ratio_interval,
)
from lanectl.bench.verdict import judge_candidate, judge_cell
from tests.test_gate_coverage import BAR, H200_SETS, RELEASE_NOTE_EFFECT, UNTIL_DECIDED, recorded_cells, written

SD = 0.003  # between arms, of log arm means: a 1-stream cell's size on the H200
QUIETER = 3.3  # issue 53: 0.30 % against 0.09 %


def test_f_quantiles_are_the_tables():
    table = {(0.95, 1, 7): 5.591, (0.95, 1, 4): 7.709, (0.95, 2, 7): 4.737, (0.95, 3, 7): 4.347, (0.99, 1, 7): 12.246}
    for (p, d1, d2), value in table.items():
        assert f_quantile(p, d1, d2) == pytest.approx(value, rel=1e-3)
        assert f_cdf(f_quantile(p, d1, d2), d1, d2) == pytest.approx(p, abs=1e-9)


def log_normal_arms(rng: random.Random, n: int, sd: float = SD) -> list[list[float]]:
    return [[100 * math.exp(rng.gauss(0, sd))] for _ in range(n)]


def false_alarms(prior_of: str, calibration_arms: int, controls: int, candidates: int, brackets: int = 4000) -> float:
    """The share of brackets of an unchanged lane, with the noise the calibration measured, whose check fires."""
    rng = random.Random(53)
    fired = 0
    df = calibration_arms - 1
    for _ in range(brackets):
        if prior_of == "chi-square":  # the textbook case: a variance estimate distributed as sd^2 chi2(df) / df
            prior = ArmNoise(variance=SD**2 * sum(rng.gauss(0, 1) ** 2 for _ in range(df)) / df, df=df)
        else:  # what `gate --calibrate` keeps: von Neumann's estimate on its rounded-down df
            prior = arm_noise([arm[0] for arm in log_normal_arms(rng, calibration_arms)])
        interval = ratio_interval(log_normal_arms(rng, controls), log_normal_arms(rng, candidates), prior=prior)
        fired += interval.conflict is not None
    return fired / brackets


def test_the_check_fires_in_5_percent_of_brackets_when_the_prior_is_right():
    """False alarms, simulated (4000 A/B/A brackets each; binomial sd 0.35 %): 5.0 % with a chi-square prior on
    7 df, as the F test's level says; with the calibration's own estimator 3.6 % from 8 arms and 4.7 % from 12
    (its df rounded down make the test a little conservative); with more of the bracket's own arms, as ABBA and
    `--until-decided` give, no more."""
    assert PRIOR_CONFLICT_LEVEL == 0.05
    assert false_alarms("chi-square", 8, 2, 1) == pytest.approx(0.05, abs=0.011)
    measured = {arms: false_alarms("calibration", arms, 2, 1) for arms in (8, 12)}
    assert 0.025 <= measured[8] <= measured[12] <= 0.05 + 0.011, measured
    assert false_alarms("calibration", 12, 3, 2) <= 0.05 + 0.011  # one --until-decided round: 3 df of its own


def test_the_check_fires_when_the_bracket_is_three_times_noisier_than_its_calibration():
    """Its power on one A/B/A control pair, simulated: with the arms 3.3 times noisier than a 12-arm calibration,
    the pair alone catches it in about half the brackets; after one --until-decided round (3 own df) in most."""
    rng = random.Random(7)
    quiet = [arm_noise([a[0] for a in log_normal_arms(rng, 12, SD / QUIETER)]) for _ in range(2000)]
    aba = sum(ratio_interval(log_normal_arms(rng, 2), log_normal_arms(rng, 1), prior=p).conflict is not None
              for p in quiet) / len(quiet)
    rounds = sum(ratio_interval(log_normal_arms(rng, 3), log_normal_arms(rng, 2), prior=p).conflict is not None
                 for p in quiet) / len(quiet)
    assert 0.4 <= aba < rounds and rounds >= 0.75, (aba, rounds)


def test_a_stale_prior_is_set_aside_and_the_verdict_names_it():
    prior = ArmNoise(variance=0.0015**2, df=7)
    arms = [written("control-1", {"prose@1": [100.0]}), written("candidate", {"prose@1": [103.6]}),
            written("control-2", {"prose@1": [100.6]})]  # the controls 0.6 % apart; the prior allows 0.35 %
    cell = judge_cell("prose@1", arms, BAR, prior)
    stale = cell["interval"]["prior_stale"]
    assert (round(stale["spread"], 5), round(stale["allowed"], 5), stale["df"]) == (0.00423, 0.00355, 1)
    without = judge_cell("prose@1", arms, BAR, None)
    assert (cell["low"], cell["high"], cell["verdict"]) == (without["low"], without["high"], "inconclusive")
    assert cell["interval"]["prior"] == {"variance": prior.variance, "df": 7}  # kept, to be checked and recomputed
    source = {"lane": "demo-h1", "recorded": "2026-12-01T10:00:00.000Z", "arms": 12}
    judged = judge_candidate({"prose@1": cell}, arms, {}, BAR, noise_prior=source)
    assert judged.verdict is Verdict.INCONCLUSIVE and judged.more_arms_may_decide  # --until-decided adds a round
    assert judged.reasons[-1].startswith("prior stale: prose@1 controls spread 0.42% where the calibration of "
                                         "2026-12-01T10:00:00.000Z allows 0.35% (F test on 1 df at 5%)")
    # Issue 42's model had no check: the same bracket then rested on the stale prior, and passed.
    assert judge_cell("prose@1", arms, BAR, prior, model=PESSIMISTIC_PRIOR_MODEL)["verdict"] == "pass"


def quieter(arms: list[list[float]], factor: float) -> list[list[float]]:
    """The arms of a quieter day: each arm's log mean pulled `factor` times closer to the arms' mean."""
    logs = [math.log(sum(arm) / len(arm)) for arm in arms]
    centre = sum(logs) / len(logs)
    return [[rate * math.exp((centre - log) * (1 - 1 / factor)) for rate in arm] for arm, log in zip(arms, logs,
                                                                                                     strict=True)]


def quiet_day_brackets(model: str | None = None) -> tuple[int, int, int]:
    """Every 1-stream A/B/A bracket of each session, judged with the other session's arms made 3.3 times quieter
    as its calibration: how many held 1.0, how many set the prior aside, of how many."""
    sets = {name: recorded_cells(path) for name, path in H200_SETS.items()}
    held = stale = total = 0
    for name, cells in sets.items():
        other = next(n for n in sets if n != name)
        for key in ("prose@1", "code@1"):
            prior = calibrate_cell(quieter(sets[other][key], QUIETER), BAR).noise
            arms = cells[key]
            for k in range(len(arms) - 2):
                bracket = [written("control-1", {key: arms[k]}), written("candidate", {key: arms[k + 1]}),
                           written("control-2", {key: arms[k + 2]})]
                cell = judge_cell(key, bracket, BAR, prior, **({"model": model} if model else {}))
                held += cell["low"] <= 1.0 <= cell["high"]
                stale += bool(cell["interval"].get("prior_stale"))
                total += 1
    return held, stale, total


def test_on_the_recorded_arms_a_quiet_days_calibration_is_caught_as_stale():
    """The real 1-stream arms of each session with a calibration 3.3 times quieter than the other session's: issue
    42's model holds 1.0 in 30 of 40 A/B/A brackets (75 %); the check sets the prior aside in 20 of them, and 34
    of 40 hold 1.0 (85 %). One A/B/A control pair cannot see every stale prior: the brackets it misses are those
    whose two controls happened to land close while the candidate arm sat off. More arms see it (below)."""
    before, _, total = quiet_day_brackets(PESSIMISTIC_PRIOR_MODEL)
    held, stale, _ = quiet_day_brackets()
    assert (before, held, stale, total) == (30, 34, 20, 40)


def until_decided(key: str, run: list[list[float]], effect: float, prior: ArmNoise,
                  model: str | None) -> tuple[Verdict, dict[str, Any]]:
    """The gate's rounds as `run_gate` runs them with --until-decided 3 on the recorded arms `run` (A B A B ...,
    the candidate arms' rates times `effect`): the verdict and the cell at the end."""
    taken = 1
    while True:
        arms = [written(f"control-{i + 1}", {key: run[2 * i]}) for i in range(taken + 1)]
        arms += [written(f"candidate-{i + 1}", {key: [r * effect for r in run[2 * i + 1]]}) for i in range(taken)]
        cells = {key: judge_cell(key, arms, BAR, prior, **({"model": model} if model else {}))}
        judged = judge_candidate(cells, arms, {}, BAR)
        if not judged.more_arms_may_decide or taken > UNTIL_DECIDED:
            return judged.verdict, cells[key]
        taken += 1


def quiet_day_rounds(effect: float, model: str | None = None) -> list[tuple[Verdict, bool]]:
    """Each run of 2 x UNTIL_DECIDED + 2 recorded 1-stream arms judged with --until-decided, the calibration 3.3
    times quieter than the other session: the verdict, and whether the last interval held the true ratio."""
    sets = {name: recorded_cells(path) for name, path in H200_SETS.items()}
    found = []
    for name, cells in sets.items():
        other = next(n for n in sets if n != name)
        for key in ("prose@1", "code@1"):
            prior = calibrate_cell(quieter(sets[other][key], QUIETER), BAR).noise
            for start in range(0, len(cells[key]) - 2 * UNTIL_DECIDED - 2, 2):
                verdict, cell = until_decided(key, cells[key][start:], effect, prior, model)
                found.append((verdict, cell["low"] <= effect <= cell["high"]))
    return found


def test_until_decided_on_a_quiet_days_calibration_adds_rounds_and_never_fails_the_3_6_percent_candidate():
    """With --until-decided the set-aside prior costs rounds, not verdicts: on the quiet day's calibration an
    unchanged lane's last interval holds 1.0 in all 8 runs (5 of 8 under issue 42's model), it is never passed or
    failed, and the release note's 3.6 % candidate is never failed (6 of 8 pass, 2 stay INCONCLUSIVE)."""
    unchanged = quiet_day_rounds(1.0)
    assert [held for _, held in unchanged] == [True] * 8
    assert sum(held for _, held in quiet_day_rounds(1.0, PESSIMISTIC_PRIOR_MODEL)) == 5
    assert {verdict for verdict, _ in unchanged} == {Verdict.INCONCLUSIVE}
    faster = [verdict for verdict, _ in quiet_day_rounds(RELEASE_NOTE_EFFECT)]
    assert Verdict.FAIL not in faster and faster.count(Verdict.PASS) == 6, faster


def test_the_release_note_says_where_the_calibration_was_set_aside():
    from lanectl.bench.release_note import NoteInputs, release_note
    from tests.test_release_note import promoted_bracket

    results = promoted_bracket()
    assert "set aside as stale" not in release_note(results, NoteInputs(run_name="r"))
    demo_h2 = results["gate"]["candidates"][0]
    demo_h2["cells"]["prose@8"]["interval"]["prior_stale"] = {"spread": 0.0042, "allowed": 0.0035, "df": 1,
                                                               "level": 0.05, "controls_only": True}
    assert ("The calibration was set aside as stale in demo-h2 prose@8 (arms 0.42% apart where it allows 0.35%)"
            in release_note(results, NoteInputs(run_name="r")))
