"""Speculative-decoding rejection sampler, shaped after vLLM 0.31.0's
vllm/v1/worker/gpu/spec_decode/rejection_sampler_utils.py.

Layout of one engine step, flattened over the batch like the GPU buffers: request r owns the logit
positions cu_num_logits[r] .. cu_num_logits[r + 1] - 1, one per draft step plus the bonus position.
`draft_sampled` has one slot per logit position: slot 0 of a row holds the token sampled on the
previous step, slot j (j >= 1) holds draft token j. Position j of a row verifies draft token j + 1,
so it reads `draft_sampled[logit_idx + 1]`; the row's last position is the bonus token and reads nothing.

As kept in the repository, this file carries the bug that vLLM #60945 fixed upstream: the last
position is found with the *configured* number of speculative steps. When the schedule runs fewer
draft steps (3 of 5 at 9-32 running requests), the last position of every row is taken for a draft
position, and the last row's read lands one slot past the end of the buffer. On a GPU that is a stray
4-byte read that kills the engine when the next page is unmapped; here it raises IndexError, which is
counted instead of being fatal so the bug stays observable (metric stub:oob_draft_reads_total). Lanes
that carry the fix apply patches/stub-engine/0001-rejection-sampler-guard.patch at image build time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass
class SamplerOutput:
    num_accepted: list[int]  # per request: leading draft tokens the target agreed with
    oob_reads: list[int] = field(default_factory=list)  # logit indices whose read fell past the buffer


def expand_local_pos(cu_num_logits: Sequence[int]) -> list[int]:
    """Position of each logit inside its request's row (vLLM's expanded_local_pos)."""
    local_pos: list[int] = []
    for start, end in zip(cu_num_logits, cu_num_logits[1:], strict=False):
        local_pos.extend(range(end - start))
    return local_pos


def rejection_sample(
    target_argmax: Sequence[int],
    draft_sampled: Sequence[int],
    cu_num_logits: Sequence[int],
    num_speculative_steps: int,
) -> SamplerOutput:
    num_logits = len(target_argmax)
    local_pos = expand_local_pos(cu_num_logits)
    # One iteration per logit, each deciding on its own like one Triton program of the GPU kernel:
    # that is why the stray read happens on every such step, not only when all drafts were accepted.
    matches = [False] * num_logits
    oob_reads: list[int] = []
    for logit_idx in range(num_logits):
        draft_step_idx = local_pos[logit_idx]
        if draft_step_idx >= num_speculative_steps:
            continue
        try:
            next_draft = draft_sampled[logit_idx + 1]
        except IndexError:
            oob_reads.append(logit_idx)
            continue
        matches[logit_idx] = target_argmax[logit_idx] == next_draft

    num_accepted = []
    for start, end in zip(cu_num_logits, cu_num_logits[1:], strict=False):
        accepted = 0
        while start + accepted < end and matches[start + accepted]:
            accepted += 1
        num_accepted.append(accepted)
    return SamplerOutput(num_accepted, oob_reads)
