"""Check the split-KV combine kernel against a pure-torch reference, on a GPU.

The reference computes unsplit attention with the sink in fp32, quantises it
with the same rule (per-32 power-of-two ue8m0 scale, amax floored at 1e-4,
e4m3 round-to-nearest) and lays it out the way vLLM 0.31.0's fused epilogue
does (fused_layout.py: ``fused[(c * G + h) * 32 + j] = standard[h * 512 +
c * 32 + j]`` per wo_a group of G = 8 heads; scales permuted the same way per
32-value chunk, packed 4 ue8m0 bytes per int32, little-endian, MN-major). The
split partials fed to the kernel are derived from the same q/k/v by cutting
the KV into splits. The kernel's output is then compared byte for byte and,
dequantised, against the fp32 truth.

    python3 gpu/check_combine.py [--module gpu/splitkv_combine.py]
    python3 gpu/check_combine.py --cpu-selftest    # the reference alone, no GPU

Exit status: 0 all cases pass, 1 a case failed, 2 bad usage / no GPU.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import sys
import time
from pathlib import Path

import torch

S_Q, H_Q, D_QK, D_V = 6, 64, 576, 512
G = 8  # heads per wo_a group (WV_GROUP_SIZE)
CHUNK = 32  # values per ue8m0 scale
N_KV = 640  # KV positions per token (like topk 512 + window 128)
LOG2E = 1.4426950408889634

# Pass criteria. The partials and the unsplit truth differ by fp32 rounding
# (~1e-6 relative), so a few values may land on the other side of an e4m3
# rounding edge; anything beyond a handful means a real bug.
MIN_BYTE_MATCH = 0.999
MIN_SCALE_MATCH = 0.999


# ---------------------------------------------------------------- reference

def fused_index(heads_per_group: int = G, head_dim: int = D_V) -> torch.Tensor:
    """idx[f] = the standard (head-major) position that fused position f holds."""
    idx = torch.empty(heads_per_group * head_dim, dtype=torch.long)
    for h in range(heads_per_group):
        for c in range(head_dim // CHUNK):
            f0 = (c * heads_per_group + h) * CHUNK
            idx[f0:f0 + CHUNK] = torch.arange(h * head_dim + c * CHUNK, h * head_dim + (c + 1) * CHUNK)
    return idx


FUSED_IDX = fused_index()
FUSED_CHUNK_IDX = FUSED_IDX[::CHUNK] // CHUNK  # fused chunk k -> standard chunk


def ue8m0_exponent(amax: torch.Tensor) -> torch.Tensor:
    """ceil(log2(max(amax, 1e-4) / 448)), exactly, from the float's bits."""
    v = amax.clamp_min(1e-4) / 448.0
    bits = v.view(torch.int32)
    exp = ((bits >> 23) & 0xFF) - 127
    return exp + ((bits & 0x7FFFFF) != 0).to(torch.int32)


def quantize_ref(x: torch.Tensor):
    """fp32 [s_q, h_q, 512] -> (fp8 data [s_q, h_q/8, 4096], int32 scale MN-major)."""
    s_q, h_q, d = x.shape
    n_group = h_q // G
    chunks = x.reshape(s_q, h_q, d // CHUNK, CHUNK)
    exp = ue8m0_exponent(chunks.abs().amax(-1))  # [s_q, h_q, 16]
    inv_scale = ((127 - exp) << 23).view(torch.float32)  # 2^-exp, exact
    y = (chunks * inv_scale[..., None]).to(torch.float8_e4m3fn).reshape(s_q, n_group, G * d)
    data = y.view(torch.uint8)[:, :, FUSED_IDX.to(x.device)].view(torch.float8_e4m3fn)
    sf = (exp + 127).to(torch.uint8).reshape(s_q, n_group, G * d // CHUNK)
    sf = sf[:, :, FUSED_CHUNK_IDX.to(x.device)].contiguous()  # [s_q, n_group, 128] bytes
    words = sf.view(torch.int32)  # 4 consecutive bytes per word, little-endian
    scale = alloc_scale(s_q, n_group, x.device)
    scale.copy_(words)
    return data, scale


def alloc_scale(s_q: int, n_group: int, device) -> torch.Tensor:
    """int32 [s_q, n_group, 32] with stride 1 along tokens, like alloc_mega_attn_output."""
    aligned = -(-s_q // 4) * 4  # TMA alignment: 16 bytes of int32
    return torch.zeros((n_group, G * D_V // (CHUNK * 4), aligned), dtype=torch.int32,
                       device=device).permute(2, 0, 1)[:s_q]


def dequantize(data: torch.Tensor, scale: torch.Tensor):
    """Back to fp32 [s_q, h_q, 512] (standard layout) and per-value scale, from the fused layout."""
    s_q, n_group, row = data.shape
    sf_bytes = scale.contiguous().view(torch.uint8).to(torch.int32)  # [s_q, n_group, 128]
    sf = torch.exp2((sf_bytes - 127).to(torch.float32))
    val = data.float() * sf.repeat_interleave(CHUNK, dim=-1)
    std = torch.empty_like(val)
    std[:, :, FUSED_IDX.to(data.device)] = val
    sf_std = torch.empty_like(val)
    sf_std[:, :, FUSED_IDX.to(data.device)] = sf.repeat_interleave(CHUNK, dim=-1)
    return std.reshape(s_q, n_group * G, D_V), sf_std.reshape(s_q, n_group * G, D_V)


def make_inputs(gen: torch.Generator, n_kv_per_token, device):
    q = torch.randn(S_Q, H_Q, D_QK, generator=gen) * 2.0
    k = torch.randn(S_Q, N_KV, D_QK, generator=gen)
    v = torch.randn(S_Q, N_KV, D_V, generator=gen)
    # Spread magnitudes over 2^-8 .. 2^7 by head-dim chunk so the scales vary,
    # and push one chunk under the 1e-4 amax floor.
    chunk_scale = torch.exp2(torch.arange(D_V // CHUNK, dtype=torch.float32) - 8)
    chunk_scale[3] = 1e-7
    v = v * chunk_scale.repeat_interleave(CHUNK)
    sink = torch.randn(H_Q, generator=gen) * 2.0
    sink[::9] += 8.0  # some heads where the sink takes most of the mass
    valid = torch.arange(N_KV)[None, :] < torch.tensor(n_kv_per_token)[:, None]  # [s_q, N]
    return [t.to(device) for t in (q, k, v, sink, valid)]


def unsplit_attention(q, k, v, sink, valid):
    """fp32 truth: softmax over the valid KV plus the sink in the denominator."""
    scores = torch.einsum("thd,tnd->thn", q, k) / math.sqrt(D_QK)
    scores = scores.masked_fill(~valid[:, None, :], float("-inf"))
    m = scores.amax(-1, keepdim=True)
    if sink is not None:
        m = torch.maximum(m, sink[None, :, None])
    m = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    p = torch.exp(scores - m)
    den = p.sum(-1, keepdim=True)
    if sink is not None:
        den = den + torch.exp(sink[None, :, None] - m)
    num = torch.einsum("thn,tnd->thd", p, v)
    return torch.where(den > 0, num / torch.where(den > 0, den, torch.ones_like(den)), torch.zeros_like(num))


def split_partials(q, k, v, valid, bounds):
    """Per split [a, b): o normalised by the split's sum, log2 LSE (-inf if empty).

    An empty split's o is filled with NaN: the kernel leaves it undefined, and
    the combine must not read it into the result.
    """
    scores = torch.einsum("thd,tnd->thn", q, k) / math.sqrt(D_QK)
    scores = scores.masked_fill(~valid[:, None, :], float("-inf"))
    o_list, lse_list = [], []
    for a, b in bounds:
        sc = scores[:, :, a:b]
        m = sc.amax(-1, keepdim=True) if b > a else torch.full_like(scores[:, :, :1], float("-inf"))
        empty = torch.isinf(m)
        m0 = torch.where(empty, torch.zeros_like(m), m)
        p = torch.exp(sc - m0)
        l = p.sum(-1, keepdim=True)
        o = torch.einsum("thn,tnd->thd", p, v[:, a:b]) / torch.where(empty, torch.ones_like(l), l)
        o = torch.where(empty, torch.full_like(o, float("nan")), o)
        lse = torch.where(empty, torch.full_like(m, float("-inf")), (m0 + torch.log(l)) * LOG2E)
        o_list.append(o)
        lse_list.append(lse.squeeze(-1))
    return torch.stack(o_list).contiguous(), torch.stack(lse_list).contiguous()


def combine_ref(o_accum, lse_accum, sink):
    """The combine's math in torch, for the CPU self-test of the reference."""
    m = lse_accum.amax(0)
    m = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    w = torch.exp2(lse_accum - m)
    acc = torch.where(w[..., None] > 0, w[..., None] * o_accum, torch.zeros_like(o_accum)).sum(0)
    ws = w.sum(0)
    inv = torch.where(ws > 0, 1 / torch.where(ws > 0, ws, torch.ones_like(ws)), torch.zeros_like(ws))
    if sink is not None:
        log2_s = m + torch.log2(torch.where(ws > 0, ws, torch.ones_like(ws)))
        inv = inv / (1 + torch.exp2(sink * LOG2E - log2_s))
    return acc * inv[..., None]


# ---------------------------------------------------------------- cases

def even_bounds(n_splits: int, n: int = N_KV):
    step = -(-n // n_splits)
    return [(min(i * step, n), min((i + 1) * step, n)) for i in range(n_splits)]


FULL = [N_KV] * S_Q
RAGGED = [N_KV, 300, 1, 0, 37, 161]  # token 3: no KV at all; short tokens leave trailing splits empty

CASES = [
    # name, splits, bounds, kv per token, sink
    ("1 split", 1, even_bounds(1), FULL, True),
    ("1 split, no sink", 1, even_bounds(1), FULL, False),
    ("2 splits", 2, even_bounds(2), FULL, True),
    ("2 splits, no sink", 2, even_bounds(2), FULL, False),
    ("4 splits", 4, even_bounds(4), FULL, True),
    ("4 splits, no sink", 4, even_bounds(4), FULL, False),
    ("8 splits", 8, even_bounds(8), FULL, True),
    ("8 splits, no sink", 8, even_bounds(8), FULL, False),
    ("4 splits, 2 empty mid", 4, [(0, 200), (200, 200), (200, 640), (640, 640)], FULL, True),
    ("8 splits, ragged KV", 8, even_bounds(8), RAGGED, True),
    ("8 splits, ragged, no sink", 8, even_bounds(8), RAGGED, False),
    ("4 splits, all empty", 4, even_bounds(4), [0] * S_Q, True),
    ("2 splits, all empty, no sink", 2, even_bounds(2), [0] * S_Q, False),
]


def empty_desc(bounds, kv):
    n_empty = sum(1 for t in range(S_Q) for a, b in bounds if min(b, kv[t]) <= a)
    return f"{n_empty}/{len(bounds) * S_Q}"


# ---------------------------------------------------------------- running

def load_module(path: str):
    spec = importlib.util.spec_from_file_location("splitkv_combine_under_test", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot load {path}")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def time_call(fn, iters: int):
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    end.synchronize()
    eager_us = start.elapsed_time(end) * 1e3 / iters
    graph_us = float("nan")
    try:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            fn()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        for _ in range(10):
            graph.replay()
        torch.cuda.synchronize()
        start.record()
        for _ in range(iters):
            graph.replay()
        end.record()
        end.synchronize()
        graph_us = start.elapsed_time(end) * 1e3 / iters
    except Exception as exc:  # timing under graphs is informative, not a pass criterion
        print(f"  (graph timing skipped: {type(exc).__name__}: {exc})")
    return eager_us, graph_us


def run_case(mod, case, device, gen, iters):
    name, n_splits, bounds, kv, use_sink = case
    q, k, v, sink, valid = make_inputs(gen, kv, device)
    sink = sink if use_sink else None
    truth = unsplit_attention(q, k, v, sink, valid)
    o_accum, lse_accum = split_partials(q, k, v, valid, bounds)
    ref_data, ref_scale = quantize_ref(truth)

    out_data = torch.full((S_Q, H_Q // G, G * D_V), float("nan"), device=device).to(torch.float8_e4m3fn)
    out_scale = alloc_scale(S_Q, H_Q // G, device)
    out_scale.fill_(-1)
    mod.splitkv_combine(o_accum, lse_accum, sink, out_data, out_scale)
    torch.cuda.synchronize()

    deq, sf = dequantize(out_data, out_scale)
    err = (deq - truth).abs()
    # e4m3 keeps 3 mantissa bits: half an ulp is at most 2^-4 of the value,
    # 2^-10 of the scale in the subnormal range; 1e-5 of the chunk's range covers fp32 noise.
    amax_chunk = truth.abs().reshape(S_Q, H_Q, -1, CHUNK).amax(-1).repeat_interleave(CHUNK, -1)
    bound = truth.abs() * 2.0 ** -4 + sf * 2.0 ** -10 + amax_chunk * 1e-5
    within = bool((err <= bound).all()) and not bool(torch.isnan(deq).any())
    byte_match = (out_data.view(torch.uint8) == ref_data.view(torch.uint8)).float().mean().item()
    scale_match = (out_scale == ref_scale).float().mean().item()
    all_empty = all(n == 0 for n in kv)
    zero_ok = (not all_empty) or bool((out_data.view(torch.uint8) == 0).all())
    ok = within and byte_match >= MIN_BYTE_MATCH and scale_match >= MIN_SCALE_MATCH and zero_ok
    eager_us, graph_us = time_call(lambda: mod.splitkv_combine(o_accum, lse_accum, sink, out_data, out_scale), iters)
    worst = (err / bound).max().item()
    return dict(name=name, splits=n_splits, empty=empty_desc(bounds, kv), sink="yes" if use_sink else "no",
                max_err=err.max().item(), worst=worst, bytes=byte_match, scales=scale_match,
                eager=eager_us, graph=graph_us, ok=ok)


def check_validation(mod, device):
    """The bad inputs the overlay could plausibly pass must raise ValueError."""
    def good():
        return dict(o_accum=torch.zeros(4, S_Q, H_Q, D_V, device=device),
                    lse_accum=torch.zeros(4, S_Q, H_Q, device=device),
                    attn_sink=torch.zeros(H_Q, device=device),
                    out_data=torch.empty(S_Q, H_Q // G, G * D_V, device=device, dtype=torch.float8_e4m3fn),
                    out_scale=alloc_scale(S_Q, H_Q // G, device))
    bad = {
        "3 splits": dict(o_accum=torch.zeros(3, S_Q, H_Q, D_V, device=device),
                         lse_accum=torch.zeros(3, S_Q, H_Q, device=device)),
        f"{2 * mod.MAX_SPLITS} splits": dict(o_accum=torch.zeros(2 * mod.MAX_SPLITS, S_Q, H_Q, D_V, device=device),
                                             lse_accum=torch.zeros(2 * mod.MAX_SPLITS, S_Q, H_Q, device=device)),
        "bf16 o_accum": dict(o_accum=torch.zeros(4, S_Q, H_Q, D_V, device=device, dtype=torch.bfloat16)),
        "head dim 576": dict(o_accum=torch.zeros(4, S_Q, H_Q, 576, device=device)),
        "lse shape": dict(lse_accum=torch.zeros(4, S_Q, H_Q + 1, device=device)),
        "sink shape": dict(attn_sink=torch.zeros(H_Q + 8, device=device)),
        "bf16 out_data": dict(out_data=torch.empty(S_Q, H_Q // G, G * D_V, device=device, dtype=torch.bfloat16)),
        "token-major scale": dict(out_scale=torch.zeros(S_Q, H_Q // G, 32, device=device, dtype=torch.int32)),
        "uint8 scale": dict(out_scale=torch.zeros(S_Q, H_Q // G, 128, device=device, dtype=torch.uint8)),
        "CPU tensors": dict(o_accum=torch.zeros(4, S_Q, H_Q, D_V)),
    }
    failures = []
    for what, override in bad.items():
        kw = good()
        kw.update(override)
        try:
            mod.splitkv_combine(**kw)
        except ValueError:
            continue
        except Exception as exc:
            failures.append(f"{what}: {type(exc).__name__} instead of ValueError: {exc}")
            continue
        failures.append(f"{what}: accepted")
    return len(bad), failures


def cpu_selftest() -> int:
    """The reference against itself: torch combine of the partials == unsplit truth."""
    gen = torch.Generator().manual_seed(0)
    worst = 0.0
    for name, n_splits, bounds, kv, use_sink in CASES:
        q, k, v, sink, valid = make_inputs(gen, kv, "cpu")
        sink = sink if use_sink else None
        truth = unsplit_attention(q, k, v, sink, valid)
        o, lse = split_partials(q, k, v, valid, bounds)
        merged = combine_ref(o, lse, sink)
        scale = truth.abs().reshape(S_Q, H_Q, -1, CHUNK).amax(-1, keepdim=True).clamp_min(1e-30)
        rel = ((merged - truth).abs().reshape(S_Q, H_Q, -1, CHUNK) / scale).amax().item()
        assert not torch.isnan(merged).any(), name
        d1, s1 = quantize_ref(truth)
        d2, s2 = quantize_ref(merged)
        bm = (d1.view(torch.uint8) == d2.view(torch.uint8)).float().mean().item()
        sm = (s1 == s2).float().mean().item()
        deq, sf = dequantize(d1, s1)
        err = (deq - truth).abs()
        bound = truth.abs() * 2.0 ** -4 + sf * 2.0 ** -10
        assert bool((err <= bound * 1.0001 + 1e-30).all()), f"{name}: quantiser exceeds half-ulp bound"
        worst = max(worst, rel)
        print(f"  {name:30s} merge-vs-unsplit |diff|/chunk amax {rel:.2e}  bytes {bm:.6f}  scales {sm:.6f}")
    # The layout rule, spelled out once more by hand for one value and one scale.
    x = torch.zeros(1, H_Q, D_V)
    h, d = 13, 77  # group 1, head-in-group 5, chunk 2, j 13
    x[0, h, d] = 1.0
    data, scale = quantize_ref(x)
    pos = ((d // 32) * G + h % G) * 32 + d % 32
    nz = (data.view(torch.uint8)[0, h // G] != 0).nonzero().flatten().tolist()
    assert nz == [pos], (nz, pos)
    k_chunk = (d // 32) * G + h % G
    word = scale[0, h // G, k_chunk // 4].item() & 0xFFFFFFFF
    byte = (word >> (8 * (k_chunk % 4))) & 0xFF
    assert byte == 127 + ue8m0_exponent(torch.tensor([1.0])).item(), byte
    print(f"cpu self-test ok (worst merge-vs-unsplit relative difference {worst:.2e}; layout spot check ok)")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--module", default=str(Path(__file__).with_name("splitkv_combine.py")),
                    help="file to import splitkv_combine from (default: gpu/splitkv_combine.py)")
    ap.add_argument("--iters", type=int, default=200, help="timed calls per case")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cpu-selftest", action="store_true", help="check the reference alone, on the CPU")
    args = ap.parse_args()
    if args.cpu_selftest:
        return cpu_selftest()
    if not torch.cuda.is_available():
        print("check_combine: no CUDA device", file=sys.stderr)
        return 2
    device = torch.device("cuda")
    mod = load_module(args.module)
    print(f"module: {args.module} (MAX_SPLITS={mod.MAX_SPLITS})")
    print(f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}  "
          f"triton {__import__('triton').__version__}")
    print(f"shape: s_q={S_Q} h_q={H_Q} head_dim={D_V} kv/token={N_KV}; out [s_q, {H_Q // G}, {G * D_V}] e4m3 + "
          f"int32 scales [s_q, {H_Q // G}, {G * D_V // 128}] MN-major")
    gen = torch.Generator().manual_seed(args.seed)
    t0 = time.time()
    rows = [run_case(mod, case, device, gen, args.iters) for case in CASES]
    hdr = (f"{'case':30s} {'splits':>6s} {'empty':>7s} {'sink':>4s} {'max|err|':>10s} {'err/bound':>9s} "
           f"{'fp8 bytes =':>11s} {'scales =':>9s} {'us/call':>8s} {'us/graph':>8s}  result")
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        print(f"{r['name']:30s} {r['splits']:6d} {r['empty']:>7s} {r['sink']:>4s} {r['max_err']:10.3e} "
              f"{r['worst']:9.3f} {r['bytes']:11.6f} {r['scales']:9.6f} {r['eager']:8.2f} {r['graph']:8.2f}  "
              f"{'PASS' if r['ok'] else 'FAIL'}")
    n_bad, failures = check_validation(mod, device)
    print(f"argument validation: {n_bad - len(failures)}/{n_bad} bad inputs rejected with ValueError")
    for f in failures:
        print(f"  FAIL {f}")
    n_fail = sum(not r["ok"] for r in rows) + len(failures)
    print(f"{len(rows) - sum(not r['ok'] for r in rows)} passed, {n_fail} failed  ({time.time() - t0:.1f} s)")
    print("(max|err|: dequantised kernel output vs the fp32 unsplit truth; err/bound <= 1 means within half an "
          "e4m3 ulp; '=': exact-match fraction vs the reference's own quantisation and layout; "
          "us/call: eager incl. argument checks; us/graph: one call replayed in a CUDA graph)")
    return 1 if n_fail else 0


if __name__ == "__main__":
    sys.exit(main())
