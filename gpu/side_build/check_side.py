"""Load the stock and the side-built module side by side in one process and run both.

    python3 check_side.py SITE_DIR

SITE_DIR holds a throwaway ``vllm`` package (empty __init__.py) with
``vllm/_flashmla_C<suffix>`` and ``vllm/_flashmla_splitkv_C<suffix>`` beside
each other, the way the image installs them (run.sh lays it out); this imports
them as vLLM and the overlay would.
Exit 0 when every check holds.
"""

from __future__ import annotations

import importlib
import os
import sys

OP = "fused_norm_rope_attn_rope_cast_decode"


def main(root: str) -> int:
    print("fake package:", sorted(os.listdir(os.path.join(root, "vllm"))))
    sys.path.insert(0, root)

    import torch  # the extensions resolve libtorch's symbols from the loaded torch

    ok = True

    def check(good: bool, what: str) -> None:
        nonlocal ok
        ok &= bool(good)
        print(f"  [{'ok' if good else 'FAIL'}] {what}")

    stock_mod = importlib.import_module("vllm._flashmla_C")
    side_mod = importlib.import_module("vllm._flashmla_splitkv_C")
    print("imported", stock_mod.__file__)
    print("imported", side_mod.__file__)
    stock_ns, side_ns = torch.ops._flashmla_C, torch.ops._flashmla_splitkv_C
    stock_op, side_op = getattr(stock_ns, OP), getattr(side_ns, OP)
    stock_schema = str(stock_op.default._schema)
    side_schema = str(side_op.default._schema)
    print("stock schema:", stock_schema)
    print("side  schema:", side_schema)
    check(stock_ns is not side_ns and stock_op is not side_op, "two distinct op namespaces, each with the op")
    check(stock_schema.startswith("_flashmla_C::") and side_schema.startswith("_flashmla_splitkv_C::"),
          "schemas are qualified by their own namespace")
    check("mega_num_splits" in side_schema, "side schema has mega_num_splits (what the overlay tests)")
    check("mega_num_splits" not in stock_schema, "stock schema has no mega_num_splits (as vLLM 0.31.0 ships)")

    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    q = torch.randn(6, 64, 512, device=dev, generator=g)
    kv = torch.randn(6, 64, 512, device=dev, generator=g)
    scale = 0.125
    (a,) = stock_op(q, kv, scale)
    (b,) = side_op(q, kv, scale, mega_num_splits=4)
    (c,) = side_op(q, kv, scale)
    torch.cuda.synchronize()
    check(torch.allclose(a, q * scale + kv), f"stock op on {torch.cuda.get_device_name()}: q*s + kv")
    check(torch.allclose(b, q * scale + 4 * kv), "side op, mega_num_splits=4: q*s + 4*kv")
    check(torch.allclose(c, q * scale + kv), "side op, default mega_num_splits=1: q*s + kv")
    try:
        stock_op(q, kv, scale, mega_num_splits=4)
        check(False, "stock op must refuse mega_num_splits")
    except (RuntimeError, TypeError) as exc:
        check(True, f"stock op refuses mega_num_splits ({type(exc).__name__})")
    print(f"side-by-side check: {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
