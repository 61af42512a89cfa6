"""Teacher forcing by token ids, against a real HTTP server on loopback whose tokenizer merges ":" ":" into "::"."""

from __future__ import annotations

import httpx

from lanectl.bench.forcing import NO_TOKEN_IDS, GreedyContinuation, greedy_continuation, score_continuation
from lanectl.bench.gate import LaneBench, fidelity_pass, judge
from lanectl.bench.stats import teacher_forced
from tests.toy_bpe_server import COLON, DOUBLE_COLON, MODEL, MULTIPART, Toy, tokenize, toy_server

PROMPT = "class Stack:"
TOKENS = 6


def reference(url: str) -> GreedyContinuation:
    with httpx.Client() as client:
        made = greedy_continuation(client, url, MODEL, PROMPT, max_tokens=TOKENS, top_logprobs=2)
    assert isinstance(made, GreedyContinuation), made
    return made


def test_a_continuation_that_re_tokenizes_apart_is_scored_at_every_position_by_ids() -> None:
    with toy_server() as url:
        made = reference(url)
        assert made.prompt_token_ids == (0, 1, COLON)
        assert made.token_ids[:3] == (COLON, COLON, MULTIPART)
        joined = PROMPT + "".join(c.token for c in made.choices)
        # The point: the same text, tokenized again, is other tokens ("::" ":"), and fewer of them.
        assert tokenize(joined)[:4] == [0, 1, DOUBLE_COLON, COLON]
        assert len(tokenize(joined)) < len(made.prompt_token_ids) + TOKENS
        with httpx.Client() as client:
            by_text = client.post(url + "/v1/completions", json={"model": MODEL, "prompt": joined, "max_tokens": 1,
                                                                 "prompt_logprobs": 1}).json()
            tail = by_text["choices"][0]["prompt_logprobs"][-TOKENS:]
            # Scored by text, the last TOKENS positions are not the continuation's: the forced ids are not there.
            assert [next(iter(entry)) for entry in tail] != [str(t) for t in made.token_ids]
            scored = score_continuation(client, url, MODEL, made.prompt_token_ids, made.token_ids, top=1)
    assert isinstance(scored, tuple), scored
    assert [s.token_id for s in scored] == list(made.token_ids)
    assert [s.token for s in scored] == [c.token for c in made.choices]
    assert [s.top_token_id for s in scored] == list(made.token_ids)  # the same model agrees with itself
    fidelity = teacher_forced({"code#0": made.choices}, {"code#0": scored})
    assert (fidelity.prompts, fidelity.positions, fidelity.unscored, fidelity.flips) == (1, TOKENS, 0, ())


def test_a_flip_is_found_at_its_exact_position() -> None:
    with toy_server() as url:
        made = reference(url)
    # Absolute position 4 is continuation position 1 (the prompt is 3 ids).
    with toy_server(Toy(flip_positions=frozenset({4}))) as url, httpx.Client() as client:
        scored = score_continuation(client, url, MODEL, made.prompt_token_ids, made.token_ids, top=1)
    assert isinstance(scored, tuple), scored
    assert [i for i, s in enumerate(scored) if s.top_token_id != s.token_id] == [1]
    assert scored[1].top_token == "::" and scored[1].token == ":"  # its runner-up there won
    fidelity = teacher_forced({"code#0": made.choices}, {"code#0": scored})
    assert [(f.position, f.reference_token, f.scored_token) for f in fidelity.flips] == [(1, ":", "::")]
    assert fidelity.confident_flips == 1 and fidelity.unscored == 0


def test_an_engine_that_returns_no_token_ids_is_named_for_it() -> None:
    with toy_server(Toy(returns_token_ids=False)) as url, httpx.Client() as client:
        made = greedy_continuation(client, url, MODEL, PROMPT, max_tokens=TOKENS, top_logprobs=2)
    assert made == NO_TOKEN_IDS == "this engine does not return token ids (vLLM >= 0.10.2 does)"


def test_a_refused_scoring_request_says_what_the_engine_answered() -> None:
    with toy_server() as url, httpx.Client() as client:
        refused = score_continuation(client, url, MODEL, [0, 1], [99], top=1)
        empty = score_continuation(client, url, MODEL, [], [COLON], top=1)
    assert refused == "scoring request: HTTP 400: prompt must be text or token ids in [0, 8), got [0, 1, 99]"
    assert empty == "nothing to score: 0 prompt token ids, 1 continuation ids"


def bracket(control: Toy, candidate: Toy) -> list[LaneBench]:
    """An A/B/A bracket's fidelity passes, each arm on its own toy server, as bench_lane runs them."""
    arms: list[LaneBench] = []
    for name, toy in (("control-1", control), ("candidate", candidate), ("control-2", control)):
        made = LaneBench(lane="h2" if name == "candidate" else "h1", arm=name, image="i", started="t")
        with toy_server(toy) as url:
            fidelity_pass(url, MODEL, "code", [PROMPT], max_tokens=TOKENS,
                          reference=arms[0].continuations if arms else None, result=made)
        arms.append(made)
    return arms


def test_the_gate_scores_every_prompt_by_ids_on_a_merging_tokenizer() -> None:
    arms = bracket(Toy(), Toy())
    report = judge(arms, 1.025)
    fid = report.fidelity
    assert (fid["verdict"], fid["scored_by"], fid["unscored"], fid["prompts"], fid["positions"]) == (
        "pass", "token_ids", 0, 1, TOKENS)
    assert report.arms[0]["greedy"]["code#0"][:3] == [":", ":", " Multipart"]
    assert report.arms[0]["greedy_token_ids"]["code#0"][:3] == [COLON, COLON, MULTIPART]
    failing = judge(bracket(Toy(), Toy(flip_positions=frozenset({4}))), 1.025)
    assert failing.fidelity["confident_flips"] == 1 and failing.verdict.value == "fail"


def test_an_engine_without_token_ids_leaves_the_gate_inconclusive_and_says_why() -> None:
    old = Toy(returns_token_ids=False)
    report = judge(bracket(old, old), 1.025)
    assert (report.verdict.value, report.fidelity["verdict"], report.fidelity["unscored"]) == (
        "inconclusive", "inconclusive", 1)
    assert report.reasons[0] == ("fidelity: 1 prompt(s) could not be scored in a candidate arm, so teacher forcing "
                                 "cannot vouch for them (code#0: this engine does not return token ids (vLLM >= "
                                 "0.10.2 does))")
    assert "code#0: no reference continuation to score: " + NO_TOKEN_IDS in report.arms[1]["notes"]
