"""Teacher forcing by token ids against real stub-engine processes on 127.0.0.1: the same model agrees with
itself everywhere, another seed nearly nowhere, and STUB_FLIP_EVERY's flips are found where they are."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import httpx
import pytest

from lanectl.bench.forcing import GreedyContinuation, greedy_continuation, score_continuation
from lanectl.bench.stats import CONFIDENT_P, ForcedPosition, teacher_forced
from lanectl.bench.workload import load_workload
from tests.stub_engine.stubproc import MODEL_NAME, StubProcess, stub_spawner
from tests.test_workload import WORKLOADS

Spawn = Callable[..., StubProcess]
TOKENS = 16


@pytest.fixture
def spawn() -> Iterator[Spawn]:
    with stub_spawner({"STUB_STATS_INTERVAL_S": "0", "STUB_DECODE_TOKENS_PER_S": "1000"}) as spawn_stub:
        yield spawn_stub


def continuations(url: str, prompts: list[str]) -> dict[int, GreedyContinuation]:
    with httpx.Client() as client:
        made = {i: greedy_continuation(client, url, MODEL_NAME, p, max_tokens=TOKENS, top_logprobs=5)
                for i, p in enumerate(prompts)}
    assert all(isinstance(m, GreedyContinuation) for m in made.values()), made
    return {i: m for i, m in made.items() if isinstance(m, GreedyContinuation)}


def forced(url: str, reference: dict[int, GreedyContinuation]) -> dict[int, tuple[ForcedPosition, ...]]:
    with httpx.Client() as client:
        scored = {i: score_continuation(client, url, MODEL_NAME, m.prompt_token_ids, m.token_ids)
                  for i, m in reference.items()}
    assert not [s for s in scored.values() if isinstance(s, str)], scored
    return {i: s for i, s in scored.items() if not isinstance(s, str)}


def test_teacher_forced_fidelity_between_stubs_by_token_ids(spawn: Spawn) -> None:
    prompts = load_workload(WORKLOADS / "coding.yaml").prompts("tool_json")
    control = spawn({"STUB_TOKEN_SEED": "0"})
    made = continuations(control.url, prompts)
    reference = {i: m.choices for i, m in made.items()}
    assert all(len(m.token_ids) == TOKENS and m.prompt_token_ids for m in made.values())

    same = teacher_forced(reference, forced(spawn({"STUB_TOKEN_SEED": "0"}).url, made))
    assert (same.prompts, same.positions, same.unscored, same.flips) == (len(prompts), TOKENS * len(prompts), 0, ())
    # The reference lane scoring its own outputs agrees with them everywhere: prefill meets what decode met.
    assert teacher_forced(reference, forced(control.url, made)).flips == ()

    other_seed = teacher_forced(reference, forced(spawn({"STUB_TOKEN_SEED": "7"}).url, made))
    assert other_seed.confident_flips > len(prompts) * 8  # another model: nearly every position differs

    # STUB_FLIP_EVERY=4: the runner-up wins at every 4th position (prompt tokens counted) where the model is sure.
    flips = teacher_forced(reference, forced(spawn({"STUB_FLIP_EVERY": "4"}).url, made))
    assert flips.confident_flips == len(flips.flips) > len(prompts)
    for f in flips.flips:
        assert f.reference_p >= CONFIDENT_P
        assert f.scored_token in reference[f.prompt][f.position].top
        assert (len(made[f.prompt].prompt_token_ids) + f.position + 1) % 4 == 0
