"""Smoke check of a side-built kernel, run inside the image build right after it is installed.

Stdlib only: it runs on the image's own Python. Every module listed must import (the shipped one
and the side one: installing one must not break the other), and the op must carry the argument
that marks the split-KV capability: vLLM #57711 detects support the same way, by the op schema.

    python3 kernel_smoke.py '{"imports": [...], "op_schema": {"op": "...", "argument": "..."}}'
"""

from __future__ import annotations

import importlib
import inspect
import json
import sys


def argument_names(op_path: str) -> list[str]:
    if op_path.startswith("torch.ops."):
        torch = importlib.import_module("torch")
        _, _, namespace, name = op_path.split(".", 3)
        op = getattr(getattr(torch.ops, namespace), name)
        overload = getattr(op, "default", op)
        return [argument.name for argument in overload._schema.arguments]
    module_name, _, function = op_path.rpartition(".")
    target = getattr(importlib.import_module(module_name), function)
    return list(inspect.signature(target).parameters)


def main(argv: list[str]) -> int:
    spec = json.loads(argv[0])
    for name in spec["imports"]:
        try:
            module = importlib.import_module(name)
        except Exception as exc:  # any import failure is the finding, whatever its type
            print(f"kernel smoke: cannot import {name}: {type(exc).__name__}: {exc}", file=sys.stderr)
            return 1
        print(f"kernel smoke: imported {name} from {getattr(module, '__file__', '?')}")
    check = spec.get("op_schema")
    if check:
        try:
            names = argument_names(check["op"])
        except Exception as exc:
            print(f"kernel smoke: cannot read the schema of {check['op']}: {exc}", file=sys.stderr)
            return 1
        if check["argument"] not in names:
            print(f"kernel smoke: {check['op']} has no argument {check['argument']!r} (it has {names})",
                  file=sys.stderr)
            return 1
        print(f"kernel smoke: {check['op']} takes {check['argument']}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
