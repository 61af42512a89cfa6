# SPDX-License-Identifier: Apache-2.0
"""Combine step of split-KV mega decode: merge per-split partials into FP8.

In split mode the mega decode kernel skips its FP8 epilogue and leaves, per
KV split ``s``, an fp32 partial output ``o_accum[s]`` already divided by that
split's own softmax sum, and ``lse_accum[s]``, the split's log-sum-exp in
log2 space (``log2(sum_j 2^(score_j * log2(e)))``; ``-inf`` when the split
saw no KV). This module does what the epilogue would have done, once, over
the merged result:

* merge: with ``m = max_s lse_s`` and ``w_s = 2^(lse_s - m)``,
  ``merged = sum_s w_s * o_s / sum_s w_s``. Splits with ``-inf`` LSE get
  weight 0 and their ``o_accum`` is never multiplied in, so whatever an
  empty split left there (a kernel job that re-ran a block with
  ``contributes=false``) cannot leak NaN into the result.
* sink: the per-head sink logit (natural-log space) joins the softmax
  denominator once, not once per split:
  ``out = merged * S / (S + e^sink)`` with ``S = sum_s 2^lse_s``.
  A token with no KV in any split writes 0 (not NaN).
* cast: per 32 consecutive head-dim values of one head, a power-of-two
  scale ``2^ceil(log2(amax / 448))`` with ``amax`` floored at ``1e-4``;
  values are stored as ``e4m3(x / scale)`` rounded to nearest, the scale as
  its ue8m0 byte (``exponent + 127``).

Output layout (what vLLM 0.31.0's unsplit epilogue writes and the permuted
``wo_a`` fp8_einsum reads; see ``common/ops/fused_layout.py``
``o_fused_permutation``, ``O_CHUNK = 32``, ``WV_GROUP_SIZE = 8``):

* ``out_data[t, g, (c * 8 + hl) * 32 + j]`` holds head ``h = 8 * g + hl``,
  head-dim index ``d = 32 * c + j`` (``c`` in 0..15, ``j`` in 0..31) of token
  ``t``: within a ``wo_a`` group the 32-wide head-dim chunks of the 8 heads
  are interleaved, chunk-major.
* The ue8m0 byte of that 32-value chunk is chunk number ``k = c * 8 + hl`` of
  the group row; ``out_scale[t, g, k // 4]`` (int32) holds it in byte
  ``k % 4``, little-endian (bits ``8 * (k % 4)`` .. ``+7``). So word ``w``
  covers head-dim chunk ``c = w // 2`` of heads ``hl = 4 * (w % 2)`` .. ``+3``.
  This is DeepGEMM's packed-ue8m0 form (four consecutive K-groups per int32)
  applied to the permuted K order, which is the order ``permute_wo_a_``
  gives ``wo_a``'s own scales (``o_fused_chunk_permutation``).
* ``out_scale`` is MN-major: stride 1 along tokens, as
  ``alloc_mega_attn_output`` allocates it (TMA-aligned token count).
"""

import torch
import triton
import triton.language as tl

# Largest split count the combine supports (power of two). The split loop is
# unrolled at compile time, so each count is its own specialisation.
MAX_SPLITS = 8

_HEAD_DIM = 512
_WV_GROUP_SIZE = 8
_QUANT_GROUP = 32


@triton.jit
def _splitkv_combine_kernel(
    o_ptr,
    lse_ptr,
    sink_ptr,
    data_ptr,
    scale_ptr,
    stride_o_s,
    stride_o_t,
    stride_o_h,
    stride_lse_s,
    stride_lse_t,
    stride_data_t,
    stride_data_g,
    stride_scale_t,
    stride_scale_g,
    stride_scale_w,
    NUM_SPLITS: tl.constexpr,
    HAS_SINK: tl.constexpr,
    GROUP: tl.constexpr,
    CHUNK: tl.constexpr,
):
    # One program = one token, one wo_a group, one 32-wide head-dim chunk of
    # all GROUP heads: exactly the 8 contiguous scale bytes (2 int32 words)
    # and GROUP * CHUNK contiguous output bytes, so nothing is shared across
    # programs and no atomics are needed.
    t = tl.program_id(0)
    g = tl.program_id(1)
    c = tl.program_id(2)

    hl = tl.arange(0, GROUP)
    j = tl.arange(0, CHUNK)
    heads = g * GROUP + hl

    # Max LSE over splits first, so the weights 2^(lse - m) cannot overflow.
    m = tl.full([GROUP], float("-inf"), tl.float32)
    for s in tl.static_range(NUM_SPLITS):
        lse = tl.load(lse_ptr + s * stride_lse_s + t * stride_lse_t + heads)
        m = tl.maximum(m, lse)
    # All splits empty: keep m finite so -inf - m stays -inf, not NaN.
    m_safe = tl.where(m == float("-inf"), 0.0, m)

    acc = tl.zeros([GROUP, CHUNK], tl.float32)
    wsum = tl.zeros([GROUP], tl.float32)
    o_off = t * stride_o_t + heads[:, None] * stride_o_h + (c * CHUNK + j)[None, :]
    for s in tl.static_range(NUM_SPLITS):
        lse = tl.load(lse_ptr + s * stride_lse_s + t * stride_lse_t + heads)
        w = tl.exp2(lse - m_safe)
        o = tl.load(o_ptr + s * stride_o_s + o_off)
        # An empty split's partial is undefined; 0 * NaN would still be NaN.
        acc += tl.where(w[:, None] > 0.0, w[:, None] * o, 0.0)
        wsum += w

    has_kv = wsum > 0.0
    inv = tl.where(has_kv, 1.0 / tl.where(has_kv, wsum, 1.0), 0.0)
    if HAS_SINK:
        # S / (S + e^sink) = 1 / (1 + 2^(sink*log2e - log2 S)), log2 S = m + log2(wsum)
        sink = tl.load(sink_ptr + heads)
        log2_s = m_safe + tl.log2(tl.where(has_kv, wsum, 1.0))
        inv = inv / (1.0 + tl.exp2(sink * 1.4426950408889634 - log2_s))  # log2(e)
    x = acc * inv[:, None]

    # Power-of-two scale from the exponent bits of amax/448: ceil(log2(v)) is
    # the exponent, plus one unless the mantissa is zero. Bit arithmetic keeps
    # it exact (no log2 rounding at powers of two). amax >= 1e-4 keeps v normal.
    # (1e-4: amax floor; 448: e4m3's largest finite value.) div_rn, not "/",
    # because "/" may lower to an approximate divide and move a power-of-two edge.
    amax = tl.maximum(tl.max(tl.abs(x), axis=1), 1e-4)
    v = tl.div_rn(amax, 448.0)
    bits = v.to(tl.int32, bitcast=True)
    exp = ((bits >> 23) & 0xFF) - 127 + ((bits & 0x7FFFFF) != 0).to(tl.int32)
    # 2^-exp, built from its bits: multiplying by it is exact, like x / scale.
    inv_scale = ((127 - exp) << 23).to(tl.float32, bitcast=True)
    y = (x * inv_scale[:, None]).to(tl.float8e4nv)

    d_off = t * stride_data_t + g * stride_data_g + (c * GROUP + hl)[:, None] * CHUNK + j[None, :]
    tl.store(data_ptr + d_off, y)

    # Chunk k = c*GROUP + hl lives in word k // 4, byte k % 4 (little-endian).
    # The bytes are disjoint, so adding the shifted values is an OR; the top
    # byte may wrap the int32 sign, which is the intended bit pattern.
    ue8m0 = (exp + 127).to(tl.int32)
    shifted = ue8m0 << ((hl % 4) * 8)
    words = tl.sum(tl.reshape(shifted, (GROUP // 4, 4)), axis=1)
    w_idx = c * (GROUP // 4) + tl.arange(0, GROUP // 4)
    tl.store(scale_ptr + t * stride_scale_t + g * stride_scale_g + w_idx * stride_scale_w, words)


def _fail(msg: str) -> None:
    raise ValueError(f"splitkv_combine: {msg}")


def splitkv_combine(o_accum, lse_accum, attn_sink, out_data, out_scale) -> None:
    """Merge split-KV partials, apply the sink once, write FP8 + ue8m0 scales.

    Args:
        o_accum: fp32 ``[num_splits, s_q, h_q, 512]``, each split's output
            normalised by its own softmax sum.
        lse_accum: fp32 ``[num_splits, s_q, h_q]``, log2-space LSE per split,
            ``-inf`` for a split with no KV.
        attn_sink: fp32 ``[h_q]`` natural-log sink logits, or None.
        out_data: float8_e4m3fn ``[s_q, h_q // 8, 8 * 512]`` (written).
        out_scale: int32 ``[s_q, h_q // 8, 8 * 512 // 128]``, MN-major
            (stride 1 along tokens), four packed ue8m0 bytes per word (written).

    The layout of ``out_data`` / ``out_scale`` is the module docstring's.
    """
    tensors = {"o_accum": o_accum, "lse_accum": lse_accum, "out_data": out_data, "out_scale": out_scale}
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            _fail(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if o_accum.dim() != 4:
        _fail(f"o_accum must be [num_splits, s_q, h_q, {_HEAD_DIM}], got shape {tuple(o_accum.shape)}")
    num_splits, s_q, h_q, head_dim = o_accum.shape
    if head_dim != _HEAD_DIM:
        _fail(f"o_accum's head dim must be {_HEAD_DIM}, got {head_dim}")
    if num_splits < 1 or num_splits > MAX_SPLITS or num_splits & (num_splits - 1):
        _fail(f"num_splits must be a power of two in [1, {MAX_SPLITS}], got {num_splits}")
    if h_q % _WV_GROUP_SIZE:
        _fail(f"h_q must be a multiple of {_WV_GROUP_SIZE} (heads per wo_a group), got {h_q}")
    n_group = h_q // _WV_GROUP_SIZE
    row = _WV_GROUP_SIZE * _HEAD_DIM
    expected = {
        "lse_accum": ((num_splits, s_q, h_q), torch.float32),
        "out_data": ((s_q, n_group, row), torch.float8_e4m3fn),
        "out_scale": ((s_q, n_group, row // (_QUANT_GROUP * 4)), torch.int32),
    }
    if o_accum.dtype != torch.float32:
        _fail(f"o_accum must be float32, got {o_accum.dtype}")
    for name, (shape, dtype) in expected.items():
        t = tensors[name]
        if tuple(t.shape) != shape:
            _fail(f"{name} must have shape {shape} for o_accum {tuple(o_accum.shape)}, got {tuple(t.shape)}")
        if t.dtype != dtype:
            _fail(f"{name} must be {dtype}, got {t.dtype}")
    if attn_sink is not None:
        if not isinstance(attn_sink, torch.Tensor) or tuple(attn_sink.shape) != (h_q,):
            _fail(f"attn_sink must be None or a tensor of shape ({h_q},)")
        if attn_sink.dtype != torch.float32:
            _fail(f"attn_sink must be float32, got {attn_sink.dtype}")
        if attn_sink.stride(0) != 1:
            _fail("attn_sink must be contiguous")
    devices = {t.device for t in tensors.values()} | ({attn_sink.device} if attn_sink is not None else set())
    if len(devices) != 1 or next(iter(devices)).type != "cuda":
        _fail(f"all tensors must be on one CUDA device, got {sorted(map(str, devices))}")
    # The kernel addresses heads and head-dim chunks with unit inner strides,
    # which is how the mega kernel's split buffers and vLLM's output are laid out.
    if o_accum.stride(3) != 1:
        _fail("o_accum must be contiguous along its head dim")
    if lse_accum.stride(2) != 1:
        _fail("lse_accum must be contiguous over h_q")
    if out_data.stride(2) != 1:
        _fail("out_data must be contiguous along its last dim")
    # wo_a's fp8_einsum reads MN-major scales; a token-major buffer would be
    # written "correctly" here and then misread there.
    if s_q > 1 and out_scale.stride(0) != 1:
        _fail(f"out_scale must be MN-major (stride 1 along tokens), got strides {tuple(out_scale.stride())}")
    if s_q == 0:
        return

    grid = (s_q, n_group, _HEAD_DIM // _QUANT_GROUP)
    _splitkv_combine_kernel[grid](
        o_accum,
        lse_accum,
        attn_sink if attn_sink is not None else lse_accum,
        out_data,
        out_scale,
        o_accum.stride(0),
        o_accum.stride(1),
        o_accum.stride(2),
        lse_accum.stride(0),
        lse_accum.stride(1),
        out_data.stride(0),
        out_data.stride(1),
        out_scale.stride(0),
        out_scale.stride(1),
        out_scale.stride(2),
        NUM_SPLITS=num_splits,
        HAS_SINK=attn_sink is not None,
        GROUP=_WV_GROUP_SIZE,
        CHUNK=_QUANT_GROUP,
        num_warps=2,
    )

