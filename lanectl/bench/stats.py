"""The arithmetic of `bench` and `gate`: percentiles, the interval and its verdict, calibration and fidelity.

Pure functions on numbers and token lists, so every rule the gate applies can be checked on fixed
figures (the release note's among them) without a server.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Hashable, Mapping, Sequence
from enum import StrEnum
from statistics import NormalDist
from typing import Generic, TypeVar

from lanectl.records import frozen

# A token the control chose with at least this probability is one it was sure of; the candidate
# choosing anything else there is a "confident flip", the release note's fidelity count.
CONFIDENT_P = 0.9

PromptKey = TypeVar("PromptKey", bound=Hashable)  # how a caller names its prompts: an index, (class, index), ...


def percentile(values: Sequence[float], p: float) -> float:
    """The p-th percentile (0 <= p <= 100) by linear interpolation between closest ranks.

    The method is numpy's default ("linear", Hyndman & Fan type 7): sort the n values, take the
    rank h = (n - 1) * p / 100, and interpolate between the values at floor(h) and floor(h) + 1.
    So p50 of [1, 2, 3, 4] is 2.5, p99 of 1..100 is 99.01, and one value is every percentile.
    """
    if not values:
        raise ValueError("percentile of no values")
    if not 0 <= p <= 100:
        raise ValueError(f"percentile must be in [0, 100], got {p}")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * p / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (rank - low) * (ordered[high] - ordered[low])


class Verdict(StrEnum):
    PASS = "pass"
    FAIL = "fail"
    INCONCLUSIVE = "inconclusive"


@frozen
class CellVerdict:
    """The verdict on one (workload class, concurrency, context) cell of a bracket."""

    ratio: float  # candidate / control, inverted when lower is better: > 1 means the candidate is better
    low: float  # the confidence interval of the ratio
    high: float
    bar: float
    verdict: Verdict

    def __str__(self) -> str:
        return (f"{self.verdict.value}: {self.ratio:.3f}x against a bar of {self.bar:.3f}x "
                f"(95% interval {self.low:.3f}-{self.high:.3f})")


def cell_verdict(ratio: float, low: float, high: float, bar: float) -> CellVerdict:
    """Judge a candidate's ratio to its controls by the ratio's confidence interval [low, high].

    With floor = min(bar, 1 / bar):

        PASS          low >= bar      the gain holds even at the pessimistic end of the interval
                                      (meeting the bar exactly passes, as before)
        FAIL          high < floor    a loss at least as large as the gain the bar asks for, even at the
                                      optimistic end (for a "no worse than" bar below 1, the bar itself)
        INCONCLUSIVE  otherwise       no clear gain and no clear loss: rerun, do not promote

    This keeps the meaning the rule had with the controls' drift as the band (ratio ± band), with the
    band replaced by an interval (`ratio_interval`) whose unit is the arm, so drift between arms widens it.
    A candidate as fast as its controls is INCONCLUSIVE, not FAIL. Only PASS may promote.
    Release note: 484.5 against controls at 467.5 -> 1.036x, PASS at a 1.025x bar when the interval's low
    end stays above 1.025; 8 splits at 1.022x cannot PASS whatever the noise.
    """
    for name, value in {"ratio": ratio, "low": low, "high": high, "bar": bar}.items():
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"{name} must be a finite figure >= 0, got {value}")
    if not low <= ratio <= high:
        raise ValueError(f"the interval {low}-{high} must hold the ratio {ratio}")
    if low >= bar:
        verdict = Verdict.PASS
    elif high < min(bar, 1 / bar):
        verdict = Verdict.FAIL
    else:
        verdict = Verdict.INCONCLUSIVE
    return CellVerdict(ratio=ratio, low=low, high=high, bar=bar, verdict=verdict)


# -- the interval: a t-interval on the log of arm means ------------------------------------------

CONFIDENCE = 0.95
INTERVAL_MODEL = ("t on log arm means, calibrated prior at its 90% upper bound unless the bracket's own arms "
                  "contradict it (F test at 5%), 1% floor without one")
# Issue 42's model (the prior at its pessimistic end, never tested against the bracket's own arms) and issue 32's
# (the prior at its point estimate, no floor): results.json files written under them are recomputed under them,
# so `lanectl report` still reproduces them exactly.
PESSIMISTIC_PRIOR_MODEL = "t on log arm means, calibrated prior at its 90% upper bound, 1% floor without one"
POINT_PRIOR_MODEL = "t on log arm means"
INTERVAL_MODELS = (INTERVAL_MODEL, PESSIMISTIC_PRIOR_MODEL, POINT_PRIOR_MODEL)
ARM_NOISE_ESTIMATOR = "mean square successive difference of log arm means"
# A calibration is one session of the host; a gate runs on another. The prior enters an interval at the upper
# end of a one-sided 90 % confidence bound on its variance (`pessimistic`), not at its estimate: on the H200's
# two recorded A/A sessions (gpu/record/aa-8b, aa64-8b) one session's arms at 8 streams spread 1.10 % where the
# other's spread 0.59 %, and with the quieter one's noise as the prior, 3 of 10 brackets of the noisier one
# missed 1.0 (issue 42). The bound, df / chi2(0.10, df), is 2.47 times the variance at 7 df.
PRIOR_BOUND = 0.90
# Without a calibration a cell's interval rests on the bracket's own arms, and A/B/A's one control pair can
# land within a hair of each other by chance while the candidate arm sits further off (neighbouring arms swing
# in bursts): its spread is not believed below this arm-to-arm sd. Not an estimate of the noise: a floor, so
# that an uncalibrated interval is never narrower than t on the bracket's own df says at 1 % between arms
# (A/B/A: +-15 %), where the H200 record's calibrated cells reach at most 2.6 % at their pessimistic end x 1.57.
UNCALIBRATED_ARM_SD = 0.01
# A calibration taken on a quiet day makes a noisy day's bracket overconfident (issue 53: two sessions' arm-to-arm
# noise at 1 stream differed threefold, 0.09 % against 0.30 %, where a prior on 7 df at its 90 % bound allows
# about 1.6x).
# So every bracket tests its own arms' spread against the prior, an F test of the own variance over the prior's
# (own df, prior df) at this upper-tail level: by construction it fires in 5 % of a cell's brackets when the
# prior is right (tests/test_gate_prior_conflict.py measures 5.0 % by simulation with the calibration's own
# estimator). When it fires, the prior is set aside for that cell: the interval rests on the bracket's own arms
# with the uncalibrated floor, as if no calibration existed.
PRIOR_CONFLICT_LEVEL = 0.05


@frozen
class ArmNoise:
    """How far apart the arms of one lane land in one cell: the variance of log(arm mean rate) between arms,
    with the degrees of freedom it was estimated on (arms - 1 for one lane's arms)."""

    variance: float
    df: int


def arm_noise(arm_means: Sequence[float]) -> ArmNoise:
    """The variance of log arm means of one lane's arms, given in the order they ran, from the differences of
    neighbouring arms: von Neumann's mean square successive difference, sum (x[i+1] - x[i])^2 / (2 (n - 1)).

    Why neighbours: a gate's bracket is neighbouring arms (A/B/A), so what it feels is how far an arm lands
    from the arms beside it. A slow drift over a calibration inflates the plain sample variance with spread
    no bracket sees (and an A/B/A ratio cancels a linear drift), while swings from one arm to the next
    (recorded on an H200: arms alternating up and down by 0.5 % for a few minutes) are what a bracket feels
    in full. The degrees of freedom are the estimate's own, 2 m^2 / (3 m - 1) for m = n - 1 differences
    (its variance under independent normal arms), rounded down: 7 for 12 arms, 4 for 8.
    """
    if len(arm_means) < 2:
        raise ValueError("arm noise needs at least two arms")
    logs = [_log_mean(m) for m in arm_means]
    steps = [later - earlier for earlier, later in zip(logs, logs[1:], strict=False)]
    return ArmNoise(variance=math.fsum(d * d for d in steps) / (2 * len(steps)), df=noise_df(len(arm_means)))


# `gate --calibrate --arms` takes 3 to this many: no kept calibration, and no prior from one, has more.
MAX_CALIBRATION_ARMS = 100


def noise_df(arms: int) -> int:
    """The degrees of freedom `arm_noise` gives `arms` arms: 2 m^2 / (3 m - 1) for m = arms - 1, rounded down.
    No prior measured on that many arms carries more."""
    if arms < 2:
        raise ValueError("arm noise needs at least two arms")
    m = arms - 1
    return max(1, 2 * m * m // (3 * m - 1))


@frozen
class PriorConflict:
    """A bracket whose own arms spread further apart than its calibrated prior allows: the prior is stale."""

    spread: float  # the sd of log arm means about their lane's mean, from the bracket's own arms
    allowed: float  # the largest such sd the prior allows at `level`: sqrt(prior variance x F(1 - level))
    df: int  # the bracket's own degrees of freedom the spread was measured on
    level: float


@frozen
class RatioInterval:
    ratio: float  # exp(mean log candidate arm mean - mean log control arm mean)
    low: float
    high: float
    df: int  # degrees of freedom of the arm noise the interval was built on
    arm_sd: float  # that noise: the pooled standard deviation of log arm means
    conflict: PriorConflict | None = None  # the prior was stale, and set aside


def _mean(values: Sequence[float]) -> float:
    return math.fsum(values) / len(values)


def _log_mean(value: float) -> float:
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"an arm's mean rate must be finite and > 0, got {value}")
    return math.log(value)


def arm_mean(rates: Sequence[float]) -> float:
    """An arm's figure in a cell: the mean of its per-request rates."""
    if not rates:
        raise ValueError("every arm needs at least one request")
    if any(not math.isfinite(v) or v < 0 for v in rates):
        raise ValueError("per-request rates must be finite and >= 0")
    return _mean(rates)


def chi2_quantile(p: float, df: int) -> float:
    """The chi-square quantile at p, by Wilson and Hilferty's cube-root normal approximation (within 0.5 % of
    the tables from 3 df up, and conservative below: at 1 df and p = 0.10, 0.0166 against 0.0158)."""
    if not 0 < p < 1 or df < 1:
        raise ValueError("chi2_quantile needs 0 < p < 1 and df >= 1")
    spread = math.sqrt(2 / (9 * df))
    return df * max(1 - 2 / (9 * df) + NormalDist().inv_cdf(p) * spread, 1e-6) ** 3


def f_cdf(x: float, d1: float, d2: float) -> float:
    """P(F <= x) for Fisher's F with (d1, d2) degrees of freedom."""
    if x <= 0:
        return 0.0
    return regularized_beta(d1 * x / (d1 * x + d2), d1 / 2, d2 / 2)


@functools.lru_cache(maxsize=512)
def f_quantile(p: float, d1: float, d2: float) -> float:
    """The x with P(F <= x) = p, by bisection on `f_cdf` (to 1e-12 of its size)."""
    if not 0 < p < 1 or d1 <= 0 or d2 <= 0:
        raise ValueError("f_quantile needs 0 < p < 1 and d1, d2 > 0")
    return _positive_quantile(lambda x: f_cdf(x, d1, d2), p)


def _positive_quantile(cdf: Callable[[float], float], p: float) -> float:
    """The x >= 0 with cdf(x) = p, for an increasing cdf: bracketed by doubling, then bisected to 1e-12 of its
    size."""
    low, high = 0.0, 1.0
    while cdf(high) < p:
        low, high = high, high * 2
    for _ in range(200):
        middle = (low + high) / 2
        if cdf(middle) < p:
            low = middle
        else:
            high = middle
        if high - low <= 1e-12 * max(1.0, high):
            break
    return (low + high) / 2


def prior_conflict(squares: float, df: int, prior: ArmNoise, level: float = PRIOR_CONFLICT_LEVEL
                   ) -> PriorConflict | None:
    """The conflict between a bracket's own arms (their sum of squares about each lane's mean, on `df`) and the
    prior, when there is one: the own variance over the prior's is above the F(df, prior.df) quantile at 1 -
    `level`. Under normal arms whose noise is the prior's, it fires with probability `level`."""
    if df < 1:
        return None
    spread = math.sqrt(squares / df)
    allowed = math.sqrt(prior.variance * f_quantile(1 - level, df, prior.df))
    return PriorConflict(spread=spread, allowed=allowed, df=df, level=level) if spread > allowed else None


def pessimistic(prior: ArmNoise) -> ArmNoise:
    """A calibrated prior at the upper end of its one-sided PRIOR_BOUND confidence bound: variance x df / chi2."""
    return ArmNoise(variance=prior.variance * prior.df / chi2_quantile(1 - PRIOR_BOUND, prior.df), df=prior.df)


def ratio_interval(controls: Sequence[Sequence[float]], candidates: Sequence[Sequence[float]], *,
                   prior: ArmNoise | None = None, confidence: float = CONFIDENCE,
                   model: str = INTERVAL_MODEL) -> RatioInterval:
    """The candidate/control ratio of per-request rates, with a t-interval whose unit is the arm.

    Each arm is a list of per-request rates; its figure is their mean. The requests of one arm are not
    independent draws (at 8 streams they share the engine's batches, and the whole arm shares the
    engine's state that day), and arms drift apart, so the interval treats each arm's mean as one
    observation: log(arm mean) = the lane's level + arm noise, the noise normal with one variance for
    every arm of the cell. The ratio is exp(mean log candidate - mean log control); its standard
    error is s * sqrt(1/controls + 1/candidates), where s^2 pools the spread of the bracket's own arms
    about their lane's mean (controls - 1 + candidates - 1 degrees of freedom) with `prior`, the
    spread `gate --calibrate` measured for this cell on this host:

        s^2 = (prior.df * prior.variance + own sum of squares) / (prior.df + own df)

    and the interval is exp(log ratio -+ t * se), t the Student t quantile at `confidence` on the pooled
    df. A/B/A has one control pair, so without a prior the interval rests on 1 df (t = 12.7): honest,
    and wide. A linear drift in time moves the mean of A/B/A's and A/B/B/A's controls exactly as far as
    their candidates', so it cancels from the ratio (and widens s, through the controls' spread).

    Under INTERVAL_MODEL the prior is first tested against the bracket's own arms (`prior_conflict`): when
    they spread further than it allows, it is set aside (the interval's `conflict` says so) and the interval
    is built as without one. A prior that stands enters at its pessimistic end (`pessimistic`), and without a
    prior s is at least UNCALIBRATED_ARM_SD: so an uncalibrated interval is the wider one.
    PESSIMISTIC_PRIOR_MODEL is issue 42's rule (no test) and POINT_PRIOR_MODEL issue 32's (the prior as
    estimated, no floor), kept to recompute the results.json they wrote.
    """
    if not controls or not candidates:
        raise ValueError("a ratio needs at least one control arm and one candidate arm")
    if not 0 < confidence < 1:
        raise ValueError("confidence must be in (0, 1)")
    if model not in INTERVAL_MODELS:
        raise ValueError(f"unknown interval model {model!r}: this lanectl knows {', '.join(INTERVAL_MODELS)}")
    bounded = model != POINT_PRIOR_MODEL  # the prior at its pessimistic end, and a floor without one
    control_logs = [_log_mean(arm_mean(arm)) for arm in controls]
    candidate_logs = [_log_mean(arm_mean(arm)) for arm in candidates]
    squares = math.fsum((x - _mean(group)) ** 2 for group in (control_logs, candidate_logs) for x in group)
    df = len(control_logs) - 1 + len(candidate_logs) - 1
    conflict = prior_conflict(squares, df, prior) if prior is not None and model == INTERVAL_MODEL else None
    if conflict is not None:
        prior = None
    if prior is not None:
        prior = pessimistic(prior) if bounded else prior
        squares += prior.df * prior.variance
        df += prior.df
    if df < 1:
        raise ValueError("no spread to build an interval on: two control arms, or a calibrated prior, are needed")
    sd = math.sqrt(squares / df)
    if prior is None and bounded:
        sd = max(sd, UNCALIBRATED_ARM_SD)
    log_ratio = _mean(candidate_logs) - _mean(control_logs)
    half = t_quantile(0.5 + confidence / 2, df) * sd * math.sqrt(1 / len(control_logs) + 1 / len(candidate_logs))
    return RatioInterval(ratio=math.exp(log_ratio), low=math.exp(log_ratio - half), high=math.exp(log_ratio + half),
                         df=df, arm_sd=sd, conflict=conflict)


# -- Student's t, from the regularized incomplete beta function -----------------------------------


def _beta_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of the incomplete beta function (modified Lentz; Numerical Recipes 6.4)."""
    tiny, c, d = 1e-300, 1.0, 1.0 - (a + b) * x / (a + 1)
    d = 1 / (d if abs(d) > tiny else tiny)
    fraction = d
    for m in range(1, 300):
        for numerator in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                          -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1 + numerator * d
            d = 1 / (d if abs(d) > tiny else tiny)
            c = 1 + numerator / c
            c = c if abs(c) > tiny else tiny
            fraction *= d * c
        if abs(d * c - 1) < 1e-15:
            break
    return fraction


def regularized_beta(x: float, a: float, b: float) -> float:
    """I_x(a, b), for 0 <= x <= 1 and a, b > 0."""
    if x <= 0 or x >= 1:
        return 0.0 if x <= 0 else 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1) / (a + b + 2):
        return front * _beta_fraction(a, b, x) / a
    return 1 - front * _beta_fraction(b, a, 1 - x) / b


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with `df` degrees of freedom."""
    tail = 0.5 * regularized_beta(df / (df + t * t), df / 2, 0.5)
    return 1 - tail if t >= 0 else tail


@functools.lru_cache(maxsize=512)
def t_quantile(p: float, df: float) -> float:
    """The t with P(T <= t) = p, by bisection on `t_cdf` (to 1e-12 of its size)."""
    if not 0 < p < 1 or df <= 0:
        raise ValueError("t_quantile needs 0 < p < 1 and df > 0")
    if p < 0.5:
        return -t_quantile(1 - p, df)
    return _positive_quantile(lambda x: t_cdf(x, df), p)


# -- calibration ----------------------------------------------------------------------------------


@frozen
class CellCalibration:
    """What N arms of one lane, run back to back, say about one cell's noise and the gate's intervals on it."""

    noise: ArmNoise  # from all the arms: the prior later gates use for this cell
    brackets: int  # A/B/A brackets of consecutive arms (k, k + 1, k + 2), the middle one as the "candidate"
    covered: int  # whose interval (with `noise` as its prior) contains 1.0
    passed: int  # whose interval cleared the bar: false promotions this calibration saw
    failed: int  # whose interval fell below min(bar, 1 / bar): false alarms
    false_promotion: float  # the modelled chance that an A/B/A bracket of an unchanged lane passes this cell
    detectable_ratio: float  # the smallest ratio an A/B/A bracket passes here (its interval's low end at the bar)

    @property
    def coverage(self) -> float | None:
        return self.covered / self.brackets if self.brackets else None


# A gate's own bracket: two control arms and one candidate arm.
ABA_CONTROLS, ABA_CANDIDATES = 2, 1


def calibrate_cell(arms: Sequence[Sequence[float]], bar: float, *, confidence: float = CONFIDENCE,
                   model: str = INTERVAL_MODEL) -> CellCalibration:
    """One cell of `gate --calibrate`: `arms` are the per-request rates of N >= 3 arms of one lane, in run order.

    Coverage is measured, not assumed: each run of three consecutive arms is judged as the gate judges an
    A/B/A bracket (`ratio_interval`), with the noise this calibration measured (`arm_noise` of all N arms)
    as its prior, as a later gate of this host takes it; the share of those intervals that contain 1.0 is
    the coverage. The false-promotion chance is modelled for a gate's A/B/A bracket with that prior, s at
    its pessimistic end as the gate takes it (its df and the control pair's 1): its log ratio is normal with
    sd s * sqrt(1/2 + 1), and it passes when the interval's low end clears the bar:
    1 - Phi(ln(bar) / (s * c) + t). The smallest ratio such a bracket passes is bar * exp(t * s * c).
    """
    if len(arms) < 3:
        raise ValueError("a calibration needs at least three arms of the lane")
    means = [arm_mean(arm) for arm in arms]
    noise = arm_noise(means)
    covered = passed = failed = 0
    brackets = len(arms) - 2
    for k in range(brackets):
        interval = ratio_interval([arms[k], arms[k + 2]], [arms[k + 1]], prior=noise, confidence=confidence,
                                  model=model)
        verdict = cell_verdict(interval.ratio, interval.low, interval.high, bar).verdict
        covered += interval.low <= 1.0 <= interval.high
        passed += verdict is Verdict.PASS
        failed += verdict is Verdict.FAIL
    as_taken = pessimistic(noise) if model != POINT_PRIOR_MODEL else noise
    spread = math.sqrt(as_taken.variance) * math.sqrt(1 / ABA_CONTROLS + 1 / ABA_CANDIDATES)
    t = t_quantile(0.5 + confidence / 2, noise.df + ABA_CONTROLS - 1 + ABA_CANDIDATES - 1)
    if spread > 0:
        chance = 1 - NormalDist().cdf(math.log(bar) / spread + t)
    else:
        chance = 1.0 if bar <= 1 else 0.0
    return CellCalibration(noise=noise, brackets=brackets, covered=covered, passed=passed, failed=failed,
                           false_promotion=chance, detectable_ratio=bar * math.exp(t * spread))


@frozen
class Calibration:
    """What the cells of a calibration say together."""

    bar: float
    cells: int
    brackets: int  # A/A brackets over every cell
    covered: int
    brackets_passed: int  # false promotions seen
    brackets_failed: int  # false alarms seen
    false_promotion_rate: float  # the chance that an A/B/A bracket of an unchanged lane PASSes (any cell)
    detectable_ratio: float  # the smallest ratio that passes in every cell: the worst cell's
    detectable_gain: float  # the worst cell's interval half-width as a gain: detectable_ratio / bar - 1

    @property
    def coverage(self) -> float | None:
        return self.covered / self.brackets if self.brackets else None

    def within(self, allowed: float) -> bool:
        return self.brackets_passed == 0 and self.false_promotion_rate <= allowed


def calibrate(cells: Sequence[CellCalibration], bar: float) -> Calibration:
    """The bracket passes when any cell does, so its false-promotion rate is 1 - prod(1 - p_cell) (cells taken
    as independent); the setup detects an effect only where it detects it in every cell, so the worst
    cell's detectable ratio is the setup's."""
    if not cells:
        raise ValueError("no cells to calibrate on")
    clear = math.prod(1 - cell.false_promotion for cell in cells)
    worst = max(cell.detectable_ratio for cell in cells)
    return Calibration(bar=bar, cells=len(cells), brackets=sum(c.brackets for c in cells),
                       covered=sum(c.covered for c in cells), brackets_passed=sum(c.passed for c in cells),
                       brackets_failed=sum(c.failed for c in cells), false_promotion_rate=1 - clear,
                       detectable_ratio=worst, detectable_gain=worst / bar - 1)


# -- fidelity -------------------------------------------------------------------------------------


@frozen
class TokenChoice:
    """One generated position: the token chosen, its logprob, and the server's top logprobs there."""

    token: str
    logprob: float
    top: Mapping[str, float]  # token text -> natural-log probability, as the completions API returns them
    token_id: int | None = None  # the engine's id of `token` (vLLM's return_token_ids); None: it sent none


@frozen
class ForcedPosition:
    """One position of a forced continuation, as the scored arm's prompt logprobs saw it."""

    token: str  # the forced token: the reference arm's greedy choice there
    logprob: float  # the scored arm's logprob of it
    top_token: str  # the scored arm's own most likely token there
    top_logprob: float
    token_id: int | None = None  # the forced token's id: what the scoring request sent at this position
    top_token_id: int | None = None


@frozen
class Flip(Generic[PromptKey]):
    """A position of the reference continuation where the scored arm prefers another token."""

    prompt: PromptKey
    position: int
    reference_token: str
    reference_p: float  # the reference arm's probability of its own (greedy) token
    scored_token: str  # the scored arm's top token there
    weight: float  # reference_p minus the reference's probability of scored_token (0 when not in its top)
    confident: bool  # reference_p >= CONFIDENT_P


@frozen
class ForcedFidelity(Generic[PromptKey]):
    prompts: int  # prompts scored
    positions: int  # positions scored: every position of every scored continuation
    unscored: int  # prompts with no scores, or scores that did not line up (e.g. retokenized apart)
    flips: tuple[Flip[PromptKey], ...]  # every differing position, not only the first of a prompt

    @property
    def confident_flips(self) -> int:
        return sum(1 for f in self.flips if f.confident)

    @property
    def weighted_divergence(self) -> float:
        return math.fsum(f.weight for f in self.flips)


def teacher_forced(reference: Mapping[PromptKey, Sequence[TokenChoice]],
                   scored: Mapping[PromptKey, Sequence[ForcedPosition]]) -> ForcedFidelity[PromptKey]:
    """Score an arm on the reference arm's greedy continuations, every position of them.

    `reference` is what the reference arm generated for each prompt at temperature 0 (its tokens and
    its own top logprobs); `scored` is another arm's prompt logprobs over prompt + that continuation.
    Because the continuation is forced, a position after a difference still continues the same text,
    so every position counts, not only up to a prompt's first difference. With p(t) the reference's
    probability of token t (0 when t is not among its top logprobs there), at each position where the
    scored arm's top token differs from the forced one (by token id: two ids may decode to the same text):

        confident flip  p(reference token) >= CONFIDENT_P (0.9): the reference was sure
        weight          p(reference token) - p(scored arm's top token): the reference's margin there

    The weighted divergence sums the weights: a flip between two near-equal choices costs almost
    nothing, one away from a token the reference was sure of costs almost 1 (the reference's top
    logprobs are keyed by text, as the completions API keys them, so p(scored top) is looked up by the
    scored token's text). A prompt whose scores do not line up with the continuation (other length,
    other forced token ids, or no ids at all), or that has no scores at all (its scoring request failed),
    is counted as unscored: the caller must not read it as agreement.
    """
    flips: list[Flip[PromptKey]] = []
    positions = prompts = unscored = 0
    for key, continuation in reference.items():
        if key not in scored:  # its scoring request failed: nothing about it is known
            unscored += 1
            continue
        scores = scored[key]
        if len(scores) != len(continuation) or any(
                s.token_id is None or s.token_id != c.token_id for s, c in zip(scores, continuation, strict=True)):
            unscored += 1
            continue
        prompts += 1
        positions += len(continuation)
        for i, (ours, theirs) in enumerate(zip(continuation, scores, strict=True)):
            if theirs.top_token_id == ours.token_id:
                continue
            own_p = math.exp(ours.logprob)
            other_lp = ours.top.get(theirs.top_token)
            other_p = math.exp(other_lp) if other_lp is not None else 0.0
            flips.append(Flip(prompt=key, position=i, reference_token=ours.token, reference_p=own_p,
                              scored_token=theirs.top_token, weight=own_p - other_p, confident=own_p >= CONFIDENT_P))
    return ForcedFidelity(prompts=prompts, positions=positions, unscored=unscored, flips=tuple(flips))


def fidelity_verdict(candidate: ForcedFidelity[PromptKey], controls: ForcedFidelity[PromptKey],
                     agent_confident_flips: int = 0) -> Verdict:
    """PASS when the candidate drifted from the reference no more than the other control arm did, and
    made no confident flip on agent/tool prompts.

    `candidate` scores the candidate on the reference control's continuations, `controls` the other
    control arm on the same: its confident flips and weighted divergence are the bars, and meeting a bar
    exactly passes (release note: 4 confident flips against a bar of 4, weighted 2.784 against 3.192, zero
    on agent/tool prompts, PASS; 8 splits' 6 flips against 4, FAIL). A tool call with one confidently
    changed token is a broken call, so agent/tool prompts allow none, whatever the bar. There is no
    INCONCLUSIVE: the counts are exact, not sampled.
    """
    return fidelity_within(candidate.confident_flips, candidate.weighted_divergence, controls.confident_flips,
                           controls.weighted_divergence, agent_confident_flips)


def fidelity_within(confident_flips: int, weighted_divergence: float, flips_bar: int, weighted_bar: float,
                    agent_confident_flips: int) -> Verdict:
    """`fidelity_verdict`'s rule on its figures, as results.json records them."""
    within = confident_flips <= flips_bar and weighted_divergence <= weighted_bar and agent_confident_flips == 0
    return Verdict.PASS if within else Verdict.FAIL
