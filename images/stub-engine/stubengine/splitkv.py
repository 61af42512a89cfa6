"""Split-KV decode attention overlay, after vLLM PR #57711.

Reads the same environment as the real overlay: VLLM_DSV41_MEGA_SPLITKV (maximum number of KV splits;
0 or 1 disables) and VLLM_DSV41_MEGA_SPLITKV_MAX_TOKENS (split only at or below this many query tokens
per step, default 8). Like #57711 it detects kernel support by inspecting the op schema for a
`mega_num_splits` argument, so an extension built from the wrong source is refused, not half-used.
Splitting only pays for a single running request: with more, the batch already fills the GPU.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType

from . import attention

EXTENSION = "stubengine._stub_splitkv_C"


@dataclass
class DecodeAttention:
    """The attention path chosen at startup; `step_factor` is consulted on every engine step."""

    num_splits: int  # 0 when the split kernel is not in use
    max_tokens: int
    description: str  # the startup log line
    available: bool
    _split_decode: Callable[[int, int, int], float] | None = None

    def engages(self, num_tokens: int, num_requests: int) -> bool:
        """Whether a step of this shape runs the split kernel."""
        return (
            self._split_decode is not None
            and self.num_splits > 1
            and num_requests == 1
            and num_tokens <= self.max_tokens
        )

    def step_factor(self, num_tokens: int, num_requests: int) -> float:
        if self._split_decode is not None and self.engages(num_tokens, num_requests):
            return float(self._split_decode(num_tokens, num_requests, self.num_splits))
        return attention.decode(num_tokens, num_requests)


def _import_extension() -> ModuleType:
    return importlib.import_module(EXTENSION)


def select(
    num_splits: int, max_tokens: int, import_extension: Callable[[], ModuleType] = _import_extension
) -> DecodeAttention:
    try:
        ext = import_extension()
    except ImportError as exc:
        return DecodeAttention(0, max_tokens, f"Split-KV decode attention unavailable: {exc}", False)
    try:
        params = inspect.signature(ext.decode).parameters
    except (AttributeError, TypeError, ValueError) as exc:
        reason = f"cannot read the decode op schema of {EXTENSION} ({exc})"
        return DecodeAttention(0, max_tokens, f"Split-KV decode attention unavailable: {reason}", False)
    if "mega_num_splits" not in params:
        reason = f"{EXTENSION}.decode has no mega_num_splits argument"
        return DecodeAttention(0, max_tokens, f"Split-KV decode attention unavailable: {reason}", False)
    if num_splits <= 1:
        return DecodeAttention(
            0,
            max_tokens,
            f"Split-KV decode attention disabled (VLLM_DSV41_MEGA_SPLITKV={num_splits})",
            True,
        )
    try:
        # Probe once so a split count the kernel rejects fails at startup, not on the first request.
        ext.decode(1, 1, num_splits)
    except (ValueError, TypeError) as exc:
        reason = f"{EXTENSION} rejects {num_splits} splits ({exc})"
        return DecodeAttention(0, max_tokens, f"Split-KV decode attention unavailable: {reason}", False)
    return DecodeAttention(
        num_splits,
        max_tokens,
        f"Using split-KV decode attention ({num_splits} splits, <= {max_tokens} tokens)",
        True,
        ext.decode,
    )
