"""CUDA-free smoke check of a built extension module: reads the .so, never loads it.

What an image build can prove without libcuda.so.1 (a GPU-less `docker build`
step cannot import the module, since dlopen pulls in libcuda through torch):

* the file's ELF dynamic symbol table exports ``PyInit_<module>`` (the name
  Python's import will look for) and no ``PyInit_`` of another name (a rename
  that missed the init symbol would make the import fail or, worse, load
  under the stock name);
* the op namespace string ``<module>`` is in the binary;
* the op's schema string, as registered, is in the binary, and it has the
  required argument.

Stdlib only.

    python3 elf_smoke.py SO_FILE --module _flashmla_splitkv_C \
        --op fused_norm_rope_attn_rope_cast_decode --argument mega_num_splits
Exit 0 when every check holds, 1 otherwise.
"""

from __future__ import annotations

import argparse
import re
import struct
import sys

SHT_DYNSYM = 11


def dynamic_symbols(blob: bytes) -> list[str]:
    """Names of the defined symbols in .dynsym (ELF64, little-endian)."""
    if blob[:4] != b"\x7fELF" or blob[4] != 2 or blob[5] != 1:
        raise ValueError("not a little-endian ELF64 file")
    e_shoff, = struct.unpack_from("<Q", blob, 0x28)
    e_shentsize, e_shnum = struct.unpack_from("<HH", blob, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", blob, e_shoff + i * e_shentsize) for i in range(e_shnum)]
    names = []
    for sh_name, sh_type, _, _, sh_offset, sh_size, sh_link, _, _, sh_entsize in sections:
        if sh_type != SHT_DYNSYM:
            continue
        strtab = sections[sh_link]
        str_off, str_size = strtab[4], strtab[5]
        for off in range(sh_offset, sh_offset + sh_size, sh_entsize or 24):
            st_name, st_info, _, st_shndx, _, _ = struct.unpack_from("<IBBHQQ", blob, off)
            if st_name == 0 or st_shndx == 0:  # unnamed, or undefined (imported)
                continue
            end = blob.index(b"\0", str_off + st_name, str_off + str_size)
            names.append(blob[str_off + st_name:end].decode())
    return names


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("so")
    ap.add_argument("--module", required=True)
    ap.add_argument("--op", required=True)
    ap.add_argument("--argument", help="argument the op's schema must have")
    ap.add_argument("--expect-missing-argument", action="store_true",
                    help="negative control: the schema must NOT have --argument")
    args = ap.parse_args(argv)
    blob = open(args.so, "rb").read()
    ok = True

    def report(good: bool, what: str) -> None:
        nonlocal ok
        ok &= good
        print(f"  [{'ok' if good else 'FAIL'}] {what}")

    print(f"elf smoke: {args.so} ({len(blob)} bytes), not loaded")
    inits = sorted(s for s in dynamic_symbols(blob) if s.startswith("PyInit_"))
    report(inits == [f"PyInit_{args.module}"], f"exported init symbols {inits} == ['PyInit_{args.module}']")
    report(args.module.encode() + b"\0" in blob, f"namespace string {args.module!r} present")
    # Whole NUL-terminated strings that read as a schema; a compiler may also
    # leave overlapping fragments of the literal, which unbalanced parens reject.
    found = {m.decode(errors="replace") for m in re.findall(rb"(?<=\0)%s\([^\0]*?\) -> [^\0]+(?=\0)" % re.escape(args.op.encode()), blob)}
    schemas = sorted(s for s in found if s.count("(") == s.count(")") and s.endswith(("]", "Tensor", ")")))
    report(len(schemas) >= 1, f"op schema string(s) found verbatim: {schemas}")
    if args.argument and schemas:
        has = any(re.search(r"[(,]\s*\w+(\[\])?\??\s+%s\b" % re.escape(args.argument), s) for s in schemas)
        if args.expect_missing_argument:
            report(not has, f"schema lacks {args.argument!r} (negative control)")
        else:
            report(has, f"schema has argument {args.argument!r}")
    report("torch" not in sys.modules, "ran without importing torch (no CUDA driver needed)")
    print(f"elf smoke: {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
