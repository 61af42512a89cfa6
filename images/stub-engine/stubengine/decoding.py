"""Deterministic "model": which token comes at which position, and with what probability.

Tokens are a pure function of (STUB_TOKEN_SEED, prompt text, position), hashed with BLAKE2 rather than
Python's salted hash(), so every process and every lane with the same seed produces the same text and
the same logprobs. That is what lets a fidelity gate compare a candidate lane against its controls.
"""

from __future__ import annotations

import hashlib
import math
import threading
from dataclasses import dataclass

# 251 is prime, so stepping through the vocabulary by any stride 1..250 visits distinct tokens: the
# ranked alternatives of a position never repeat.
VOCAB: tuple[str, ...] = tuple(
    """
    the of and to in is that for it as with was on be by this are from at or an have not but which one
    all were can has more their if will about would there when what so no out up into than them only its
    other new some time could these two may then first any like now my such over also our most made
    after even many must before through back years where much your way well down should because each
    just those people how too little state good very make world still own see men work long get here
    between both life being under never day same another know while last might us great old year off
    come since against go came right used take three value return self def import class function request
    token cache kernel split decode engine model server stream batch queue thread lock step write read
    buffer index offset length size count total error status health ready load start stop lane image
    build patch recipe config metric rate latency seconds memory device tensor layer weight expert
    attention draft sample accept reject target output input prompt result check guard bound range slot
    page block table list map set key field option flag path file line print format string number float
    integer bool none true false loop break continue yield async await open close send receive parse
    render apply revert commit branch merge release version pin digest volume mount port host route
    proxy probe
    """.split()
)
assert len(VOCAB) == 251, len(VOCAB)
V = len(VOCAB)

CONFIDENT_P_MIN = 0.93
# vLLM's default --max-logprobs.
TOP_N = 20
# Where a candidate flips a token it is still fairly sure of itself; the control's token stays second.
FLIP_P = 0.62
# The loop fault: after LOOP_AFTER tokens the last LOOP_PERIOD of them repeat for ever (a degenerate
# decode, as a broken kernel or a bad sampler produces).
LOOP_AFTER = 32
LOOP_PERIOD = 6


@dataclass(frozen=True)
class Choice:
    token_id: int
    prob: float
    alternatives: tuple[int, ...]  # ranked runners-up, best first
    alt_probs: tuple[float, ...]


def prompt_tokens(text: str) -> int:
    # About four bytes per token, like a BPE tokenizer on English text; only used for usage and limits.
    return max(1, (len(text.encode("utf-8")) + 3) // 4)


def token_text(token_id: int) -> str:
    return " " + VOCAB[token_id]


class TokenStream:
    """The tokens one prompt decodes to. Thread-safe: the engine thread looks ahead for the speculative
    sampler while the HTTP thread renders the same positions."""

    def __init__(self, prompt: str, seed: int = 0, flip_every: int = 0, loop: bool = False) -> None:
        self._digest = hashlib.blake2b(
            prompt.encode("utf-8"), digest_size=16, person=b"stubengine", salt=str(seed).encode()[-16:]
        ).digest()
        self._flip_every = flip_every
        self._loop = loop
        self._choices: list[Choice] = []
        self._lock = threading.Lock()

    def _position(self, i: int) -> bytes:
        return hashlib.blake2b(i.to_bytes(8, "little"), digest_size=16, key=self._digest).digest()

    def is_confident(self, i: int) -> bool:
        """Whether the unflipped model is confident (p >= CONFIDENT_P_MIN) at position i."""
        return self._position(i)[2] >= 16

    def _compute(self, i: int) -> Choice:
        if self._loop and i >= LOOP_AFTER:
            # Positions are computed in order under the lock, so the one repeated is already there.
            return self._choices[LOOP_AFTER - LOOP_PERIOD + (i - LOOP_AFTER) % LOOP_PERIOD]
        h = self._position(i)
        base = int.from_bytes(h[0:2], "little") % V
        stride = 1 + h[4] % (V - 1)
        if h[2] >= 16:
            p = CONFIDENT_P_MIN + (h[3] / 255.0) * 0.06
        else:
            # One position in sixteen is genuinely uncertain, so logprobs are not all alike.
            p = 0.45 + (h[3] / 255.0) * 0.35
        ranked = [base] + [(base + j * stride) % V for j in range(1, TOP_N)]
        rest = 1.0 - p
        probs = [p] + [rest * 0.5**j for j in range(1, TOP_N)]
        if self._flip_every > 0 and (i + 1) % self._flip_every == 0 and h[2] >= 16:
            ranked[0], ranked[1] = ranked[1], ranked[0]
            rest = 1.0 - FLIP_P
            probs = [FLIP_P, rest * 0.8] + [rest * 0.2 * 0.5**j for j in range(1, TOP_N - 1)]
        return Choice(ranked[0], probs[0], tuple(ranked[1:]), tuple(probs[1:]))

    def choice(self, i: int) -> Choice:
        choices = self._choices
        if i < len(choices):
            return choices[i]
        with self._lock:
            while len(choices) <= i:
                choices.append(self._compute(len(choices)))
            return choices[i]

    def token(self, i: int) -> int:
        return self.choice(i).token_id

    def top_logprobs(self, i: int, k: int) -> list[tuple[int, float]]:
        """The k most likely tokens at position i (at most TOP_N), best first, with natural-log probs."""
        c = self.choice(i)
        ranked = [(c.token_id, c.prob)] + list(zip(c.alternatives, c.alt_probs, strict=True))
        return [(tok, math.log(p)) for tok, p in ranked[: max(0, k)]]
