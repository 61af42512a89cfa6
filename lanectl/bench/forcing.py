"""Teacher forcing by token ids: a reference arm's greedy continuation, and another arm's scores over it.

Why ids and not text: text sent back is tokenized again by the server, and a real BPE tokenizer merges
pieces that generation produced apart. On a real vLLM the greedy continuation `":" ":" "Multipart"` of
`class Stack:`, joined and sent back, came back as `"::" ":" ...` (issue 22): the scores no longer line
up with the continuation and the prompt can only be counted unscored. vLLM takes a completion's
`prompt` as a list of token ids and, with `return_token_ids`, answers the ids it read and generated, so
the scored sequence is the one generation produced, token for token, whatever the tokenizer does.

The vLLM shapes relied on (0.31.0's files, the same in 0.26.0):
- `CompletionRequest.prompt` is `list[int] | list[list[int]] | str | list[str]`
  (entrypoints/openai/completion/protocol.py:50); a list of ints becomes the engine's prompt as sent,
  no special tokens added (renderers/inputs/preprocess.py:128-138), so the `prompt_token_ids`
  generation answered, BOS included, are exactly what the scoring request must start with.
- `return_token_ids: true` (protocol.py:169) puts `prompt_token_ids` and `token_ids` on each choice
  (`CompletionResponseChoice`, protocol.py:626-628; filled in completion/serving.py:584-589).
- `prompt_logprobs: K` on a non-streamed completion: `choices[0].prompt_logprobs` (protocol.py:627) is
  `null` for the first prompt token (logprobs.py:165-169), then per token a mapping id -> {"logprob",
  "rank", "decoded_token"} holding that prompt token with its vocabulary rank, then the K most likely
  tokens with ranks 1..K (logprobs.py:178-212); JSON keys the ids as strings.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import httpx

from lanectl.bench.stats import ForcedPosition, TokenChoice
from lanectl.health.engine_http import error_message
from lanectl.records import frozen

COMPLETIONS_PATH = "/v1/completions"
NO_TOKEN_IDS = "this engine does not return token ids (vLLM >= 0.10.2 does)"


@frozen
class GreedyContinuation:
    """One prompt's greedy (temperature 0) continuation, as ids the engine itself produced."""

    prompt_token_ids: tuple[int, ...]  # what the engine read: its tokenization of the prompt, special tokens included
    choices: tuple[TokenChoice, ...]  # one per generated position, each with its token_id

    @property
    def token_ids(self) -> tuple[int, ...]:
        return tuple(c.token_id for c in self.choices if c.token_id is not None)


def _post(client: httpx.Client, base_url: str, body: dict[str, Any], timeout: float, what: str) -> Any:
    """The first choice of a non-streamed completion, or a line saying why there is none."""
    try:
        response = client.post(base_url.rstrip("/") + COMPLETIONS_PATH, json=body, timeout=timeout)
    except httpx.HTTPError as exc:
        return f"{what} failed: {type(exc).__name__}: {exc}"
    if response.status_code != 200:
        return f"{what}: HTTP {response.status_code}: {error_message(response.content) or '(empty body)'}"
    try:
        choice = response.json()["choices"][0]
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        return f"{what}: unexpected answer ({type(exc).__name__}: {exc}): {response.text[:200]!r}"
    if not isinstance(choice, dict):
        return f"{what}: unexpected answer (a choice that is not an object): {response.text[:200]!r}"
    return choice


def _ids(value: Any) -> tuple[int, ...] | None:
    if isinstance(value, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        return tuple(value)
    return None


def greedy_continuation(client: httpx.Client, base_url: str, model: str, prompt: str, *, max_tokens: int,
                        top_logprobs: int, timeout: float = 120) -> GreedyContinuation | str:
    """Generate `max_tokens` tokens of `prompt` at temperature 0 with `top_logprobs` logprobs and the
    engine's token ids; or a line saying why that could not be had (NO_TOKEN_IDS for an engine that
    ignores `return_token_ids`, as vLLM before 0.10.2 does)."""
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
            "logprobs": top_logprobs, "return_token_ids": True,
            # Every arm generates exactly max_tokens, so the continuations compare equal work.
            "ignore_eos": True}
    choice = _post(client, base_url, body, timeout, "reference generation")
    if isinstance(choice, str):
        return choice
    prompt_ids, token_ids = _ids(choice.get("prompt_token_ids")), _ids(choice.get("token_ids"))
    if prompt_ids is None or token_ids is None:
        return NO_TOKEN_IDS
    try:
        logprobs = choice["logprobs"]
        tokens, token_logprobs = logprobs["tokens"], logprobs["token_logprobs"]
        tops = logprobs.get("top_logprobs") or [None] * len(tokens)
        if not len(tokens) == len(token_logprobs) == len(tops) == len(token_ids):
            return (f"reference generation: {len(token_ids)} token ids but {len(tokens)} logprob positions: "
                    "the engine's answer does not line up")
        choices = tuple(TokenChoice(token=str(token), logprob=float(lp), top=dict(top or {}), token_id=token_id)
                        for token, lp, top, token_id in zip(tokens, token_logprobs, tops, token_ids, strict=True))
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        return f"reference generation: unexpected logprobs shape ({type(exc).__name__}: {exc})"
    return GreedyContinuation(prompt_token_ids=prompt_ids, choices=choices)


def score_continuation(client: httpx.Client, base_url: str, model: str, prompt_token_ids: Sequence[int],
                       continuation_ids: Sequence[int], *, top: int = 1,
                       timeout: float = 120) -> tuple[ForcedPosition, ...] | str:
    """Teacher forcing: the server's prompt logprobs over the token-id prompt `prompt_token_ids +
    continuation_ids`, one ForcedPosition per continuation id, read at exactly that position and keyed
    by exactly that id; or a line saying why they could not be read.

    Sent as ids, so nothing is tokenized again: a continuation whose text would re-tokenize otherwise
    is scored all the same. max_tokens 1: only the prompt's logprobs are wanted. `top` (>= 1) top
    tokens per position are asked for; rank 1 is the scored arm's own choice there.
    """
    prompt_ids, forced_ids = list(prompt_token_ids), list(continuation_ids)
    if not prompt_ids or not forced_ids:
        # vLLM gives the first prompt token no logprobs: a continuation needs a prompt to be scored after.
        return f"nothing to score: {len(prompt_ids)} prompt token ids, {len(forced_ids)} continuation ids"
    body = {"model": model, "prompt": prompt_ids + forced_ids, "max_tokens": 1, "temperature": 0.0,
            "prompt_logprobs": max(1, top)}
    choice = _post(client, base_url, body, timeout, "scoring request")
    if isinstance(choice, str):
        return choice
    entries = choice.get("prompt_logprobs")
    if not isinstance(entries, list) or len(entries) != len(prompt_ids) + len(forced_ids):
        count = len(entries) if isinstance(entries, list) else "no"
        return (f"prompt_logprobs has {count} entries for a prompt of {len(prompt_ids) + len(forced_ids)} "
                "token ids: the engine did not score the ids as sent")
    scored = []
    try:
        for i, forced_id in enumerate(forced_ids):
            entry = entries[len(prompt_ids) + i]
            forced = entry.get(str(forced_id)) if isinstance(entry, dict) else None
            if forced is None:
                return (f"prompt_logprobs at continuation position {i} has no entry for the forced token id "
                        f"{forced_id}: {str(entry)[:200]}")
            best = next(((int(k), v) for k, v in entry.items() if v.get("rank") == 1), None)
            if best is None:
                return f"prompt_logprobs at continuation position {i} lists no rank-1 token: {str(entry)[:200]}"
            top_id, top_entry = best
            scored.append(ForcedPosition(token=str(forced.get("decoded_token")), logprob=float(forced["logprob"]),
                                         top_token=str(top_entry.get("decoded_token")),
                                         top_logprob=float(top_entry["logprob"]),
                                         token_id=forced_id, top_token_id=top_id))
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        return f"unexpected prompt_logprobs shape ({type(exc).__name__}: {exc})"
    return tuple(scored)
