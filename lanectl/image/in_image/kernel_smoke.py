"""Smoke check of a side-built kernel, run inside the image build right after it is installed.

Stdlib only: it runs on the image's own Python. It proves what can be proven without loading the
module: a GPU-less `docker build` step has no libcuda.so.1, and importing vLLM's CUDA extensions
needs it. So the check reads the installed files instead:

- exactly one file is the side module (`<module>.*.so`), and the shipped module beside it is still there;
- the side module's ELF dynamic symbols export `PyInit_<module>` (the name Python will look for)
  and not the shipped module's init symbol (a rename that missed the init function);
- its read-only data holds the op's schema with the capability argument (vLLM #57711 detects
  split-KV support by that argument) and, for a torch op, the renamed op namespace.

The full import of both modules happens when the engine starts, where the overlay logs it.

    python3 kernel_smoke.py '{"dir": "...", "module": "...", "beside": "...", "op": "...", "argument": "..."}'
"""

from __future__ import annotations

import json
import re
import struct
import sys
from pathlib import Path


class SmokeFailure(Exception):
    pass


def module_file(folder: Path, module: str) -> Path:
    found = sorted(p for p in folder.glob(f"{module}.*so") if p.is_file())
    if len(found) != 1:
        names = ", ".join(p.name for p in found) or "none"
        raise SmokeFailure(f"expected exactly one {module}.*.so in {folder}, found {names}")
    return found[0]


def shipped_module_present(folder: Path, beside: str) -> bool:
    return any(folder.glob(f"{beside}.*so")) or (folder / f"{beside}.py").is_file() or (folder / beside).is_dir()


def dynamic_symbols(data: bytes) -> set[str]:
    """Names in the ELF64 little-endian .dynsym: what the dynamic loader (and Python) can find."""
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise SmokeFailure("not a 64-bit little-endian ELF shared object")
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    names: set[str] = set()
    for _name, kind, _flags, _addr, offset, size, link, _info, _align, entsize in sections:
        if kind != 11:  # SHT_DYNSYM
            continue
        strtab_offset = sections[link][4]
        for i in range(size // (entsize or 24)):
            name_offset, = struct.unpack_from("<I", data, offset + i * (entsize or 24))
            end = data.index(b"\0", strtab_offset + name_offset)
            names.add(data[strtab_offset + name_offset:end].decode("ascii", "replace"))
    return names


def schema_strings(data: bytes, op_name: str) -> list[str]:
    """NUL-terminated strings that start a signature of `op_name`: a torch schema or a docstring."""
    pattern = re.compile(rb"(?<![A-Za-z0-9_])" + re.escape(op_name.encode()) + rb"(\.[A-Za-z0-9_]+)?\([^\0]*")
    return [m.group(0).decode("utf-8", "replace") for m in pattern.finditer(data)]


def check(spec: dict[str, str]) -> list[str]:
    folder = Path(spec["dir"])
    module, beside, op, argument = spec["module"], spec["beside"], spec["op"], spec["argument"]
    path = module_file(folder, module)
    lines = [f"kernel smoke: side module {path}"]
    if not shipped_module_present(folder, beside):
        raise SmokeFailure(f"the shipped module {beside} is no longer in {folder}")
    lines.append(f"kernel smoke: shipped module {beside} still beside it")
    data = path.read_bytes()
    symbols = dynamic_symbols(data)
    if f"PyInit_{module}" not in symbols:
        raise SmokeFailure(f"{path.name} exports no PyInit_{module}: Python could not import it as {module}")
    if f"PyInit_{beside}" in symbols:
        raise SmokeFailure(f"{path.name} still exports PyInit_{beside}: the rename missed the init function")
    lines.append(f"kernel smoke: exports PyInit_{module}")
    parts = op.split(".")
    if op.startswith("torch.ops.") and len(parts) == 4:
        namespace, op_name = parts[2], parts[3]
        if not re.search(rb"(?<![A-Za-z0-9_])" + re.escape(namespace.encode()) + rb"(?![A-Za-z0-9_])", data):
            raise SmokeFailure(f"{path.name} never names the op namespace {namespace}")
        lines.append(f"kernel smoke: registers ops under {namespace}")
    else:
        op_name = parts[-1]
    schemas = schema_strings(data, op_name)
    if not schemas:
        raise SmokeFailure(f"{path.name} holds no signature of {op_name}")
    if not any(re.search(rf"\b{re.escape(argument)}\b", s) for s in schemas):
        raise SmokeFailure(f"{op} has no argument {argument!r}: {schemas[0][:300]}")
    lines.append(f"kernel smoke: {op} takes {argument}")
    return lines


def main(argv: list[str]) -> int:
    try:
        for line in check(json.loads(argv[0])):
            print(line)
    except (SmokeFailure, OSError, ValueError, struct.error) as exc:
        print(f"kernel smoke: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
