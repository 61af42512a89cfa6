"""The arithmetic of `bench` and `gate`: percentiles, the A/B/A verdict and token fidelity.

Pure functions on numbers and token lists, so every rule the gate applies can be checked on fixed
figures (the release note's among them) without a server.
"""

from __future__ import annotations

import math
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
    """The verdict on one (workload class, concurrency) cell of an A/B/A bracket."""

    ratio: float  # candidate / mean(controls), inverted when lower is better: > 1 means the candidate is better
    band: float  # |A1 - A2| / mean(A1, A2): how far the controls moved with nothing changed
    bar: float
    verdict: Verdict

    def __str__(self) -> str:
        return f"{self.verdict.value}: {self.ratio:.3f}x against a bar of {self.bar:.3f}x (noise band ±{self.band:.3f})"


def cell_verdict(
    control_first: float, control_last: float, candidate: float, bar: float, *, higher_is_better: bool = True
) -> CellVerdict:
    """Judge a candidate against the controls that ran before and after it (A/B/A).

    ratio = B / mean(A1, A2) (mean(A1, A2) / B when lower is better, e.g. ms/step), so ratio > 1
    always means the candidate is better. band = |A1 - A2| / mean(A1, A2): the controls ran the same
    configuration, so their drift is the noise of this bracket, and the candidate's ratio is only
    known to within ±band. With floor = min(bar, 1 / bar):

        PASS          ratio - band >= bar     the gain holds even at the pessimistic end of the noise
        FAIL          ratio + band <  floor   a loss at least as large as the gain the bar asks for,
                                              even at the optimistic end (for a "no worse than" bar
                                              below 1, floor is the bar itself)
        INCONCLUSIVE  otherwise               no clear gain and no clear loss: rerun, do not promote

    A candidate as fast as its controls is therefore INCONCLUSIVE, not FAIL: it did not lose, it
    just did not earn a promotion. Only PASS may promote.
    Release note: controls 467.5 and 467.5, candidate 484.5 -> 1.036x, PASS at a 1.025x bar;
    8 splits at 477.8 -> 1.022x, INCONCLUSIVE: not promoted.
    """
    figures = {"control_first": control_first, "control_last": control_last, "candidate": candidate, "bar": bar}
    for name, value in figures.items():
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"{name} must be a finite figure >= 0, got {value}")
    mean = (control_first + control_last) / 2
    if mean == 0:
        raise ValueError("the controls measured nothing (mean 0); the bracket cannot judge a candidate")
    if higher_is_better:
        ratio = candidate / mean
    elif candidate == 0:
        raise ValueError("candidate measured 0 for a lower-is-better figure; the arm measured nothing")
    else:
        ratio = mean / candidate
    band = abs(control_first - control_last) / mean
    if ratio - band >= bar:
        verdict = Verdict.PASS
    elif ratio + band < min(bar, 1 / bar):
        verdict = Verdict.FAIL
    else:
        verdict = Verdict.INCONCLUSIVE
    return CellVerdict(ratio=ratio, band=band, bar=bar, verdict=verdict)


# -- fidelity -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TokenChoice:
    """One generated position: the token chosen, its logprob, and the server's top logprobs there."""

    token: str
    logprob: float
    top: Mapping[str, float]  # token text -> natural-log probability, as the completions API returns them


@dataclass(frozen=True)
class Divergence(Generic[PromptKey]):
    """The first position of one prompt where the candidate chose a different token than the control."""

    prompt: PromptKey
    position: int
    control_token: str
    control_p: float  # the control's probability of its own token
    candidate_token: str
    weight: float  # control_p minus the control's probability of the candidate's token
    confident: bool  # control_p >= CONFIDENT_P


@dataclass(frozen=True)
class FidelityReport(Generic[PromptKey]):
    prompts: int  # prompts present in both runs and compared
    positions: int  # positions compared, up to and including each prompt's first divergence
    length_mismatches: int  # prompts whose outputs differ in length with no divergence before the shorter ends
    divergences: tuple[Divergence[PromptKey], ...]  # at most one per prompt

    @property
    def confident_flips(self) -> int:
        return sum(1 for d in self.divergences if d.confident)

    @property
    def weighted_divergence(self) -> float:
        return math.fsum(d.weight for d in self.divergences)


def fidelity(
    control: Mapping[PromptKey, Sequence[TokenChoice]], candidate: Mapping[PromptKey, Sequence[TokenChoice]]
) -> FidelityReport[PromptKey]:
    """Compare the tokens two runs chose for the same prompts (keys present in both; same prompt text).

    Without teacher forcing, once the candidate picks another token it continues from a different
    text, so later positions measure that text, not the candidate's numerics. Each prompt is therefore
    compared position by position up to and including its first divergence, and contributes at most
    one divergence. For that position, with p(t) the control's probability of token t (0 when t is
    not in the control's top logprobs there):

        confident flip       p(control's token) >= 0.9
        weight               p(control's token) - p(candidate's token)

    The weighted divergence is the sum of the weights: a flip between two near-equal choices costs
    almost nothing, a flip away from a token the control was sure of costs almost 1. Outputs of
    different lengths are compared over the shorter one; a length difference with no divergence
    before it is counted in `length_mismatches`, not as a flip, since the stop has no logprob.
    """
    divergences: list[Divergence[PromptKey]] = []
    positions = 0
    mismatched = 0
    shared = [key for key in control if key in candidate]
    for key in shared:
        ours, theirs = control[key], candidate[key]
        common = min(len(ours), len(theirs))
        for i in range(common):
            positions += 1
            if ours[i].token == theirs[i].token:
                continue
            own_p = math.exp(ours[i].logprob)
            other_lp = ours[i].top.get(theirs[i].token)
            other_p = math.exp(other_lp) if other_lp is not None else 0.0
            divergences.append(
                Divergence(
                    prompt=key,
                    position=i,
                    control_token=ours[i].token,
                    control_p=own_p,
                    candidate_token=theirs[i].token,
                    weight=own_p - other_p,
                    confident=own_p >= CONFIDENT_P,
                )
            )
            break
        else:
            if len(ours) != len(theirs):
                mismatched += 1
    return FidelityReport(
        prompts=len(shared), positions=positions, length_mismatches=mismatched, divergences=tuple(divergences)
    )


def fidelity_verdict(candidate: FidelityReport[PromptKey], controls: FidelityReport[PromptKey]) -> Verdict:
    """PASS when the candidate drifted from the controls no more than the controls drifted from each other.

    `candidate` compares a control run with the candidate, `controls` the two control runs: both its
    confident flips and its weighted divergence are the bars, and meeting a bar exactly passes
    (release note: 4 confident flips against a bar of 4, weighted 2.784 against 3.192, PASS;
    8 splits' 6 flips against 4, FAIL). There is no INCONCLUSIVE: the counts are exact, not sampled.
    """
    within = (
        candidate.confident_flips <= controls.confident_flips
        and candidate.weighted_divergence <= controls.weighted_divergence
    )
    return Verdict.PASS if within else Verdict.FAIL
