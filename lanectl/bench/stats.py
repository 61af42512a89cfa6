"""The arithmetic of `bench` and `gate`: percentiles, the bootstrap verdict, calibration and teacher-forced fidelity.

Pure functions on numbers and token lists, so every rule the gate applies can be checked on fixed
figures (the release note's among them) without a server.
"""

from __future__ import annotations

import math
import random
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Generic, TypeVar

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


@dataclass(frozen=True)
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
    band replaced by a bootstrap interval (`bootstrap_ratio`) that also counts request-to-request noise.
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


# -- the bootstrap --------------------------------------------------------------------------------

BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 20261016
CONFIDENCE = 0.95


@dataclass(frozen=True)
class RatioInterval:
    ratio: float  # mean(candidate arm means) / mean(control arm means)
    low: float
    high: float
    replicates: tuple[float, ...]  # every bootstrap ratio, in the order drawn

    def share_at_or_above(self, bar: float) -> float:
        return sum(1 for r in self.replicates if r >= bar) / len(self.replicates)


def _mean(values: Sequence[float]) -> float:
    return math.fsum(values) / len(values)


def bootstrap_ratio(controls: Sequence[Sequence[float]], candidates: Sequence[Sequence[float]], *,
                    resamples: int = BOOTSTRAP_RESAMPLES, seed: int = BOOTSTRAP_SEED,
                    confidence: float = CONFIDENCE) -> RatioInterval:
    """The candidate/control ratio of per-request rates, with a seeded two-stage bootstrap interval.

    Each arm is a list of per-request rates (tok/s of one request); an arm's figure is their mean, and the
    ratio is the mean of the candidate arms' figures over the mean of the control arms'. One replicate
    draws, for the controls and for the candidates separately, as many arms as there are, with
    replacement (so the drift between two control arms widens the interval, as the old band did), then
    each drawn arm's requests with replacement. The interval is the percentile interval of `resamples`
    replicates (2.5th and 97.5th percentiles at 95 %). random.Random(seed): the same figures give the
    same interval on every machine.
    """
    arms = [*controls, *candidates]
    if not controls or not candidates or any(not arm for arm in arms):
        raise ValueError("every arm needs at least one request")
    if any(not math.isfinite(v) or v < 0 for arm in arms for v in arm):
        raise ValueError("per-request rates must be finite and >= 0")
    if resamples < 1 or not 0 < confidence < 1:
        raise ValueError("resamples must be >= 1 and confidence in (0, 1)")
    control_mean = _mean([_mean(arm) for arm in controls])
    if control_mean == 0:
        raise ValueError("the controls measured nothing (mean 0); the bracket cannot judge a candidate")
    ratio = _mean([_mean(arm) for arm in candidates]) / control_mean
    rng = random.Random(seed)

    def draw(group: Sequence[Sequence[float]]) -> float:
        picked = rng.choices(group, k=len(group))
        return _mean([_mean(rng.choices(arm, k=len(arm))) for arm in picked])

    replicates = []
    for _ in range(resamples):
        control, candidate = draw(controls), draw(candidates)
        replicates.append(candidate / control if control > 0 else math.inf)
    tail = (1 - confidence) / 2 * 100
    finite = [r for r in replicates if math.isfinite(r)] or [ratio]
    low, high = percentile(finite, tail), percentile(finite, 100 - tail)
    return RatioInterval(ratio=ratio, low=min(low, ratio), high=max(high, ratio), replicates=tuple(replicates))


@dataclass(frozen=True)
class Calibration:
    """What an A/A bracket (the control against itself) says about the gate's noise."""

    bar: float
    cells: int
    cells_passed: int  # cells whose interval cleared the bar: promotions of an unchanged lane
    false_promotion_rate: float  # share of bootstrap replicates, over every cell, at or above the bar
    detectable_ratio: float  # the smallest candidate/control ratio whose interval would clear the bar in every cell
    detectable_gain: float  # the smallest gain the setup tells from no change in every cell (1 / low - 1, worst cell)

    def within(self, allowed: float) -> bool:
        return self.cells_passed == 0 and self.false_promotion_rate <= allowed


def calibrate(intervals: Sequence[RatioInterval], bar: float) -> Calibration:
    """The false-promotion rate and the smallest detectable effect of an A/A bracket.

    Each cell's interval came from arms that all ran the control, so its true ratio is 1. A bootstrap
    replicate is one plausible re-run of the cell; one at or above the bar is a promotion by noise
    alone, so the false-promotion rate is the share of such replicates over all cells (and a cell whose
    interval itself cleared the bar is an actual false promotion of this run, counted apart).
    A candidate with true ratio r would measure about r times these A/A ratios, so its interval's low
    end is about r * low: it clears the bar when r >= bar / low, and it is told apart from no change
    when r >= 1 / low. The worst cell decides both: the setup detects an effect only where it detects
    it in every cell.
    """
    if not intervals:
        raise ValueError("no cells to calibrate on")
    replicates = [r for interval in intervals for r in interval.replicates]
    worst_low = min(interval.low for interval in intervals)
    if worst_low <= 0:
        raise ValueError("a cell's interval reaches 0: the arms measured nothing")
    return Calibration(
        bar=bar, cells=len(intervals), cells_passed=sum(1 for i in intervals if i.low >= bar),
        false_promotion_rate=sum(1 for r in replicates if r >= bar) / len(replicates),
        detectable_ratio=bar / worst_low, detectable_gain=1 / worst_low - 1)


# -- fidelity -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TokenChoice:
    """One generated position: the token chosen, its logprob, and the server's top logprobs there."""

    token: str
    logprob: float
    top: Mapping[str, float]  # token text -> natural-log probability, as the completions API returns them
    token_id: int | None = None  # the engine's id of `token` (vLLM's return_token_ids); None: it sent none


@dataclass(frozen=True)
class ForcedPosition:
    """One position of a forced continuation, as the scored arm's prompt logprobs saw it."""

    token: str  # the forced token: the reference arm's greedy choice there
    logprob: float  # the scored arm's logprob of it
    top_token: str  # the scored arm's own most likely token there
    top_logprob: float
    token_id: int | None = None  # the forced token's id: what the scoring request sent at this position
    top_token_id: int | None = None


@dataclass(frozen=True)
class Flip(Generic[PromptKey]):
    """A position of the reference continuation where the scored arm prefers another token."""

    prompt: PromptKey
    position: int
    reference_token: str
    reference_p: float  # the reference arm's probability of its own (greedy) token
    scored_token: str  # the scored arm's top token there
    weight: float  # reference_p minus the reference's probability of scored_token (0 when not in its top)
    confident: bool  # reference_p >= CONFIDENT_P


@dataclass(frozen=True)
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
    within = (
        candidate.confident_flips <= controls.confident_flips
        and candidate.weighted_divergence <= controls.weighted_divergence
        and agent_confident_flips == 0
    )
    return Verdict.PASS if within else Verdict.FAIL
