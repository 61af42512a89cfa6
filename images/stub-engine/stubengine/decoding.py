"""Deterministic "model": which token comes at which position, and with what probability.

The model is autoregressive over token ids: the distribution at a position is a pure function of
(STUB_TOKEN_SEED, every token id before it), hashed with BLAKE2 rather than Python's salted hash(), so
every process and every lane with the same seed produces the same tokens and the same logprobs. That
is what lets a fidelity gate compare a candidate lane against its controls, and what makes teacher
forcing work: scoring `prompt ids + continuation ids` (a token-id prompt with prompt logprobs) meets,
at each continuation position, exactly the distribution generation met there, because both hash the
same ids. Nothing is tokenized again on the way, as with vLLM's own token-id prompts.

Text is split into pieces by `tokenize` (a space and a run of non-space characters, or one other
whitespace character), so a generated token (" word") is one piece wherever it occurs, and each piece
has an id that is the same in every process: the vocabulary's 251 words are ids 0-250, any other piece
gets an id from a BLAKE2 hash of its text in a range above them (`piece_id`). A process remembers the
pieces it has seen to decode ids back to text; an id it never saw decodes to a placeholder, and is
scored like any other id. Positions count tokens from the start of the prompt; usage and context limits
of a text prompt still count about four bytes per token (`prompt_tokens`), as a BPE tokenizer does on
English (workloads pad prompts to a context length that way), and those of a token-id prompt its ids.
"""

from __future__ import annotations

import hashlib
import math
import re
import struct
import threading
from collections.abc import Sequence
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

    def ranked(self) -> list[tuple[int, float]]:
        return [(self.token_id, self.prob), *zip(self.alternatives, self.alt_probs, strict=True)]


@dataclass(frozen=True)
class Faults:
    """Numerics faults of a candidate lane, applied wherever the model computes a distribution.

    flip_every:        at every absolute position p with (p + 1) % flip_every == 0 where the model is
                       confident, its runner-up wins (STUB_FLIP_EVERY): a kernel that changes tokens in
                       both prefill and decode.
    prefill_flip_from: from absolute position N on, every confident position computed by PREFILL (a
                       prompt's positions, and the first generated token, which prefill produces) has its
                       runner-up win (STUB_PREFILL_FLIP_FROM): a prefill kernel that goes wrong late in
                       long sequences, e.g. past its first chunk. Decoding from short prompts never meets
                       it, so comparing greedy outputs passes it; scoring prompt + continuation (teacher
                       forcing, and every multi-turn conversation that sends earlier answers back) does not.
    """

    flip_every: int = 0
    prefill_flip_from: int = 0

    def flips(self, position: int, *, prefill: bool) -> bool:
        if self.flip_every > 0 and (position + 1) % self.flip_every == 0:
            return True
        return prefill and 0 < self.prefill_flip_from <= position


PIECE = re.compile(r" ?\S+|\s")


def tokenize(text: str) -> list[str]:
    """The pieces the stub scores: ' word' (a space and a run of non-space characters), a run with no
    space before it, or one other whitespace character. Concatenated they give back the text."""
    return PIECE.findall(text)


def prompt_tokens(text: str) -> int:
    # About four bytes per token, like a BPE tokenizer on English text; only used for usage and limits.
    return max(1, (len(text.encode("utf-8")) + 3) // 4)


# Ids of pieces outside the vocabulary: V + a 32-bit hash, so the stub's "vocabulary size" is V + 2**32.
VOCAB_SIZE = V + 2**32

# piece -> id, the vocabulary's and then every other piece's this process has tokenized (a long padded
# prompt repeats a few pieces thousands of times: hashing each once keeps a 64K-token prompt's encode
# fast). Written under the GIL, one key at a time.
_PIECE_IDS = {" " + word: i for i, word in enumerate(VOCAB)}
# id -> piece for every piece outside the vocabulary this process has tokenized (ids are the same in every
# process; only the way back to text is per process).
_SEEN_PIECES: dict[int, str] = {}


def token_text(token_id: int) -> str:
    """The text of a token id: a vocabulary word, a piece this process has seen, or a placeholder."""
    if 0 <= token_id < V:
        return " " + VOCAB[token_id]
    return _SEEN_PIECES.get(token_id, f"<|id:{token_id}|>")


def piece_id(piece: str) -> int:
    """A vocabulary token's index; any other piece a stable id above the vocabulary, from a hash of its text."""
    known = _PIECE_IDS.get(piece)
    if known is not None:
        return known
    token_id = V + int.from_bytes(hashlib.blake2b(piece.encode("utf-8"), digest_size=4).digest(), "little")
    _SEEN_PIECES.setdefault(token_id, piece)
    _PIECE_IDS[piece] = token_id
    return token_id


def encode(text: str) -> list[int]:
    """The token ids of `text`: what /tokenize answers and what a text prompt is read as."""
    ids = _PIECE_IDS
    return [ids[piece] if piece in ids else piece_id(piece) for piece in tokenize(text)]


def decode(token_ids: Sequence[int]) -> str:
    return "".join(token_text(t) for t in token_ids)


def _update(hasher: hashlib._Hash, token_id: int) -> None:  # type: ignore[name-defined]
    hasher.update(struct.pack("<Q", token_id))


def _hasher(seed: int) -> hashlib._Hash:  # type: ignore[name-defined]
    return hashlib.blake2b(digest_size=16, person=b"stubengine", salt=str(seed).encode()[-16:])


def distribution(h: bytes, position: int, faults: Faults, *, prefill: bool) -> Choice:
    """The model's distribution at absolute `position`, from the digest `h` of the text before it."""
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
    if h[2] >= 16 and faults.flips(position, prefill=prefill):
        ranked[0], ranked[1] = ranked[1], ranked[0]
        rest = 1.0 - FLIP_P
        probs = [FLIP_P, rest * 0.8] + [rest * 0.2 * 0.5**j for j in range(1, TOP_N - 1)]
    return Choice(ranked[0], probs[0], tuple(ranked[1:]), tuple(probs[1:]))


class TokenStream:
    """The tokens one prompt decodes to. Thread-safe: the engine thread looks ahead for the speculative
    sampler while the HTTP thread renders the same positions."""

    def __init__(self, prompt: str | Sequence[int], seed: int = 0, flip_every: int = 0, prefill_flip_from: int = 0,
                 loop: bool = False) -> None:
        self.prompt_ids: tuple[int, ...] = tuple(encode(prompt) if isinstance(prompt, str) else prompt)
        self.seed = seed
        self.faults = Faults(flip_every, prefill_flip_from)
        self.prompt_pieces = len(self.prompt_ids)
        self._loop = loop
        self._hasher = _hasher(seed)
        # One update of the packed ids digests the same as one update per id (_update), only faster.
        self._hasher.update(struct.pack(f"<{len(self.prompt_ids)}Q", *self.prompt_ids))
        self._choices: list[Choice] = []
        self._digests: list[bytes] = []
        self._lock = threading.Lock()

    def is_confident(self, i: int) -> bool:
        """Whether the model, unflipped, is confident (p >= CONFIDENT_P_MIN) at generated position i."""
        self.choice(i)
        return self._digests[i][2] >= 16

    def choice(self, i: int) -> Choice:
        """Generated position i (absolute position prompt tokens + i); the first comes from prefill."""
        choices = self._choices
        if i < len(choices):
            return choices[i]
        with self._lock:
            while len(choices) <= i:
                n = len(choices)
                if self._loop and n >= LOOP_AFTER:
                    # The loop fault: positions are computed in order under the lock, so the one repeated is there.
                    repeated = LOOP_AFTER - LOOP_PERIOD + (n - LOOP_AFTER) % LOOP_PERIOD
                    digest, c = self._digests[repeated], choices[repeated]
                else:
                    digest = self._hasher.copy().digest()
                    c = distribution(digest, self.prompt_pieces + n, self.faults, prefill=n == 0)
                self._digests.append(digest)
                choices.append(c)
                _update(self._hasher, c.token_id)
            return choices[i]

    def token(self, i: int) -> int:
        return self.choice(i).token_id

    def top_logprobs(self, i: int, k: int) -> list[tuple[int, float]]:
        """The k most likely tokens at position i (at most TOP_N), best first, with natural-log probs."""
        return [(tok, math.log(p)) for tok, p in self.choice(i).ranked()[: max(0, k)]]

    def prompt_logprobs(self, k: int) -> list[dict[str, dict[str, object]] | None]:
        """vLLM's `prompt_logprobs` for this prompt: None for the first token, then per token a mapping
        token id -> {logprob, rank, decoded_token}: the prompt's own token first (with its rank in the
        vocabulary), then the k most likely tokens, best first, as vLLM's completions API returns them
        (JSON keys the ids as strings). Every distribution here is computed by prefill."""
        hasher = _hasher(self.seed)
        out: list[dict[str, dict[str, object]] | None] = []
        for position, own in enumerate(self.prompt_ids):
            if position == 0:
                out.append(None)
            else:
                ranked = distribution(hasher.copy().digest(), position, self.faults, prefill=True).ranked()
                ids = [tok for tok, _ in ranked]
                if own in ids:
                    rank = ids.index(own) + 1
                    own_lp = math.log(ranked[rank - 1][1])
                else:
                    # Outside the ranked top: the tail's probability, below every listed one.
                    rank, own_lp = TOP_N + 1 + own % 1000, math.log(ranked[-1][1] * 0.5)
                entry = {str(own): {"logprob": own_lp, "rank": rank, "decoded_token": token_text(own)}}
                for j, (tok, p) in enumerate(ranked[: max(0, k)]):
                    entry.setdefault(str(tok), {"logprob": math.log(p), "rank": j + 1,
                                                "decoded_token": token_text(tok)})
                out.append(entry)
            _update(hasher, own)
        return out
