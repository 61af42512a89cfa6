#!/usr/bin/env bash
# Builds, on the developer's machine, what a real `vllm serve` needs on the GPU machine (which has no
# network): vLLM 0.26.0 (the newest release that pins torch 2.11.0, the GPU machine's torch) and the 36
# wheels it lacks there, installed into one folder, trimmed, xz-compressed and split into parts that fit
# one device call's 64 MiB carry each. Cached: a second run with the parts present only lists them.
#   bash gpu/vllm_serve/payload.sh          -> .gpu-payload/part-aa, part-ab, ... (ignored by git)
set -euo pipefail
cd "$(dirname "$0")/../.."
here=gpu/vllm_serve
cache=${LANECTL_GPU_CACHE:-/work/gpu-cache}
out=.gpu-payload
if ls "$out"/part-* >/dev/null 2>&1; then ls -l "$out"; exit 0; fi
mkdir -p "$cache/wheels" "$out"
# pip downloads for the GPU machine's interpreter (CPython 3.12, x86-64 manylinux), never this one's.
target=(--only-binary=:all: --python-version 3.12 --implementation cp)
for n in 1 5 14 17 24 26 27 28 31 34 35; do target+=(--platform "manylinux_2_${n}_x86_64"); done
target+=(--platform manylinux2014_x86_64 --platform manylinux1_x86_64)
# The machine's pip constraints cap torch for this machine's own installs; nothing here installs torch.
export PIP_CONSTRAINT=
python3 -m pip download -q --no-deps "${target[@]}" -d "$cache/wheels" vllm==0.26.0 -r "$here/wheels.txt"
# --no-deps checks nothing: every requirement among the carried wheels must be met by the carried version.
python3 "$here/check_wheels.py" "$cache/wheels"
site=$cache/site
rm -rf "$site"
# One wheel per project: a cache filled under another platform list may hold two builds of one version.
wheels=$(ls "$cache"/wheels/*.whl | awk -F/ '{ split($NF, p, "-"); if (!seen[p[1]]++) print }')
# shellcheck disable=SC2086
python3 -m pip install -q --no-deps --no-compile --target "$site" "${target[@]}" $wheels
# Unused on an H200 serving a Llama: FlashAttention 2 (sm_90 runs FA3), the Rust frontend binary, the MoE
# kernels, DeepGEMM builds for other Pythons. Without them the tree fits two parts instead of four.
rm -f "$site"/vllm/vllm_flash_attn/_vllm_fa2_C*.so "$site"/vllm/_moe_C*.so
find "$site" -name 'vllm-rs*' -type f -delete
find "$site" -path '*deep_gemm*' -name '*.so' ! -name '*cpython-312*' ! -name '*abi3*' -delete 2>/dev/null || true
rm -rf "$site"/bin
du -sh "$site"
tar -C "$site" -cf - . | xz -9 -T2 | split -b 60M - "$out/part-"
ls -l "$out"
