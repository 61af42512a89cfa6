"""Token ids on the stub, as vLLM takes and returns them: id prompts, return_token_ids, prompt logprobs keyed
by id, /tokenize and /detokenize; ids the same in every process, distributions a function of the ids before."""

from __future__ import annotations

import math

import httpx
import pytest
from stubengine import decoding

from .stubproc import MODEL_NAME

PROMPT = "Say what a write-ahead log is for."


def _complete(url: str, **body: object) -> httpx.Response:
    return httpx.post(url + "/v1/completions", json={"model": MODEL_NAME, "temperature": 0, **body}, timeout=30)


def _tokenize(url: str, text: str) -> list[int]:
    answer = httpx.post(url + "/tokenize", json={"model": MODEL_NAME, "prompt": text}).json()
    assert answer["count"] == len(answer["tokens"]) and answer["max_model_len"] == 32768
    return answer["tokens"]


def test_ids_are_the_same_in_every_process_and_decode_back(spawn) -> None:
    a, b = spawn(), spawn(env={"STUB_TOKEN_SEED": "7"})
    ids = _tokenize(a.url, PROMPT)
    assert ids == _tokenize(b.url, PROMPT) == decoding.encode(PROMPT)
    assert len(ids) == len(decoding.tokenize(PROMPT)) == 7
    assert _tokenize(a.url, " the of") == [0, 1]  # vocabulary words have fixed ids
    assert all(t >= decoding.V for t in ids[:1])  # "Say" is no vocabulary word: a hashed id above them
    assert httpx.post(a.url + "/detokenize", json={"tokens": ids}).json() == {"prompt": PROMPT}
    strs = httpx.post(a.url + "/tokenize", json={"prompt": " the log", "return_token_strs": True}).json()
    assert strs["token_strs"] == [" the", " log"]
    chat = httpx.post(a.url + "/tokenize", json={"messages": [{"role": "user", "content": "hi"}]}).json()
    assert chat["tokens"] == decoding.encode("user: hi")


def test_a_token_id_prompt_is_the_same_prompt_as_its_text(stub) -> None:
    by_text = _complete(stub.url, prompt=PROMPT, max_tokens=12, logprobs=1, return_token_ids=True).json()
    text_choice = by_text["choices"][0]
    ids = text_choice["prompt_token_ids"]
    assert ids == decoding.encode(PROMPT)
    for prompt in (ids, [ids]):  # vLLM takes list[int] and list[list[int]]
        by_ids = _complete(stub.url, prompt=prompt, max_tokens=12, logprobs=1, return_token_ids=True).json()
        choice = by_ids["choices"][0]
        assert (choice["text"], choice["logprobs"]) == (text_choice["text"], text_choice["logprobs"])
        assert choice["prompt_token_ids"] == ids and choice["token_ids"] == text_choice["token_ids"]
        assert by_ids["usage"]["prompt_tokens"] == len(ids)
    choice = by_text["choices"][0]
    assert len(choice["token_ids"]) == 12
    assert "".join(decoding.token_text(t) for t in choice["token_ids"]) == choice["text"]
    assert choice["logprobs"]["tokens"] == [decoding.token_text(t) for t in choice["token_ids"]]
    plain = _complete(stub.url, prompt=PROMPT, max_tokens=2).json()["choices"][0]
    assert "token_ids" not in plain and "prompt_token_ids" not in plain


def test_scoring_prompt_ids_plus_continuation_ids_meets_generations_distributions(spawn) -> None:
    control, candidate = spawn(), spawn(env={"STUB_FLIP_EVERY": "4"})
    made = _complete(control.url, prompt=PROMPT, max_tokens=24, logprobs=1, return_token_ids=True).json()
    choice = made["choices"][0]
    prompt_ids, continuation = choice["prompt_token_ids"], choice["token_ids"]
    scored = _complete(control.url, prompt=prompt_ids + continuation, max_tokens=1, prompt_logprobs=1).json()
    entries = scored["choices"][0]["prompt_logprobs"]
    assert entries[0] is None and len(entries) == len(prompt_ids) + len(continuation)
    tail = entries[len(prompt_ids):]
    forced = [entry[str(t)] for entry, t in zip(tail, continuation, strict=True)]
    assert [f["rank"] for f in forced] == [1] * 24  # the control's own greedy choice, at every position
    assert [f["logprob"] for f in forced] == pytest.approx(choice["logprobs"]["token_logprobs"])
    # The candidate flips confident positions p with (p + 1) % 4 == 0, counted from the prompt's first id.
    flipped = _complete(candidate.url, prompt=prompt_ids + continuation, max_tokens=1, prompt_logprobs=1).json()
    ranks = [entry[str(t)]["rank"] for entry, t in zip(flipped["choices"][0]["prompt_logprobs"][len(prompt_ids):],
                                                        continuation, strict=True)]
    stream = decoding.TokenStream(prompt_ids)
    expected = {i for i in range(24) if (i + len(prompt_ids) + 1) % 4 == 0 and stream.is_confident(i)}
    assert expected and {i for i, rank in enumerate(ranks) if rank != 1} == expected
    assert all(math.exp(choice["logprobs"]["token_logprobs"][i]) >= 0.93 for i in expected)


def test_ids_are_scored_as_sent_even_where_their_text_would_tokenize_otherwise(stub) -> None:
    """"a" and "b" are two pieces sent as ids; their text "ab" would be one."""
    a, b = decoding.piece_id("a"), decoding.piece_id("b")
    assert decoding.encode("ab") != [a, b]

    def decoded() -> list[str]:
        entries = _complete(stub.url, prompt=[0, a, b], max_tokens=1, prompt_logprobs=1).json()["choices"][0]
        assert [next(iter(e)) for e in entries["prompt_logprobs"][1:]] == [str(a), str(b)]
        return [e[str(t)]["decoded_token"] for e, t in zip(entries["prompt_logprobs"][1:], (a, b), strict=True)]

    # A process decodes only the pieces it has seen; the ids are scored all the same.
    assert decoded() == [f"<|id:{a}|>", f"<|id:{b}|>"]
    assert _tokenize(stub.url, "a") == [a] and _tokenize(stub.url, "b") == [b]
    assert decoded() == ["a", "b"]


def test_bad_token_id_prompts_are_refused_as_vllm_refuses_them(stub) -> None:
    for prompt, says in (([0, decoding.VOCAB_SIZE], "out of vocabulary"), ([], "non-empty list"),
                         ([0, True], "non-empty list"), ([0, -1], "out of vocabulary")):
        refused = _complete(stub.url, prompt=prompt, max_tokens=1)
        assert refused.status_code == 400 and says in refused.json()["error"]["message"], prompt
        assert refused.json()["error"]["param"] == "prompt"
    assert httpx.post(stub.url + "/detokenize", json={"tokens": ["x"]}).status_code == 400
    assert httpx.post(stub.url + "/tokenize", json={"prompt": 3}).status_code == 400
