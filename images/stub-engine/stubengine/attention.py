"""The shipped decode-attention kernel of the stub engine: the stand-in for vLLM's `_flashmla_C`.

It never splits the KV cache, so it costs nothing extra: the step-time factor is always 1.0. The
split-KV kernel is a separate extension, `stubengine._stub_splitkv_C`, installed beside this module
the way `_flashmla_splitkv_C` is installed beside the untouched `_flashmla_C`; `splitkv.py` chooses
between the two.
"""

from __future__ import annotations


def decode(num_tokens: int, num_requests: int) -> float:
    """Step-time factor of one decode step over `num_tokens` query tokens of `num_requests` requests."""
    if num_tokens < 1 or num_requests < 0:
        raise ValueError(f"bad decode shape: num_tokens={num_tokens}, num_requests={num_requests}")
    return 1.0
