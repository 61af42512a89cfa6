"""Split-KV decode attention overlay: the stub's mirror of lanectl's vLLM overlay
(patches/vllm/57711-splitkv-overlay.patch, after vLLM PR #57711).

Reads the same environment and applies the same rule: VLLM_DSV41_MEGA_SPLITKV splits (0 or 1: off),
and a step splits only when exactly one request runs with exactly VLLM_DSV41_MEGA_SPLITKV_MAX_TOKENS
query tokens (default 8). Like the overlay it detects kernel support by the side op's schema (a
`mega_num_splits` argument), so an extension built from the wrong source is refused, not half-used,
and it logs one start-up line in the overlay's words, which demo-h2's health gate requires.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType

from . import attention

EXTENSION = "stubengine._stub_splitkv_C"
STOCK = "stubengine.attention"
LOG_PREFIX = "split-KV overlay:"
# The per-split fp32 partials are sized at warm-up for the configured split count and live beside the
# KV blocks for every step. Up to this many splits they fit; each split beyond it costs every step that
# does not split (every batched step) this share of its time. Fitted to the release note: 4 splits cost
# a batched step nothing, 8 splits are faster alone but slower in the server ("eight splits lost").
SPLITS_FREE = 4
UNSPLIT_COST_PER_EXTRA_SPLIT = 0.015


def _off(reason: str) -> str:
    return f"{LOG_PREFIX} off ({reason}); every call unsplit on {STOCK}"


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
            and num_tokens == self.max_tokens
        )

    def step_factor(self, num_tokens: int, num_requests: int) -> float:
        if self._split_decode is not None and self.engages(num_tokens, num_requests):
            return float(self._split_decode(num_tokens, num_requests, self.num_splits))
        extra = max(0, self.num_splits - SPLITS_FREE) if self._split_decode is not None else 0
        return attention.decode(num_tokens, num_requests) * (1.0 + UNSPLIT_COST_PER_EXTRA_SPLIT * extra)


def _import_extension() -> ModuleType:
    return importlib.import_module(EXTENSION)


def select(
    num_splits: int, max_tokens: int, import_extension: Callable[[], ModuleType] = _import_extension
) -> DecodeAttention:
    try:
        ext = import_extension()
    except ImportError as exc:
        return DecodeAttention(0, max_tokens, _off(f"{EXTENSION} cannot be imported: {exc}"), False)
    try:
        params = inspect.signature(ext.decode).parameters
    except (AttributeError, TypeError, ValueError) as exc:
        reason = f"cannot read the decode op schema of {EXTENSION} ({exc})"
        return DecodeAttention(0, max_tokens, _off(reason), False)
    if "mega_num_splits" not in params:
        reason = f"{EXTENSION}.decode has no mega_num_splits argument"
        return DecodeAttention(0, max_tokens, _off(reason), False)
    if num_splits <= 1:
        return DecodeAttention(
            0,
            max_tokens,
            _off(f"VLLM_DSV41_MEGA_SPLITKV={num_splits}"),
            True,
        )
    try:
        # Probe once so a split count the kernel rejects fails at startup, not on the first request.
        ext.decode(1, 1, num_splits)
    except (ValueError, TypeError) as exc:
        reason = f"{EXTENSION} rejects {num_splits} splits ({exc})"
        return DecodeAttention(0, max_tokens, _off(reason), False)
    return DecodeAttention(
        num_splits,
        max_tokens,
        f"{LOG_PREFIX} on, {num_splits} splits at 1 request x {max_tokens} query tokens via {EXTENSION}; "
        f"every other call unsplit on {STOCK}",
        True,
        ext.decode,
    )
