#!/usr/bin/env bash
# Side-build proof: build the stand-in extension once as is (the stock
# _flashmla_C) and once through the kernel stage's own build steps, read from
# kernels/flashmla-splitkv.yaml (rename included), sm_90a only; check the side
# module without loading it (what a GPU-less image build can do), then load
# both in one process and run an op of each on the GPU.
#
#   bash gpu/side_build/run.sh            (logs under $SIDEBUILD_LOGDIR if set)
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
YAML=$REPO/kernels/flashmla-splitkv.yaml
WORK=$(mktemp -d /tmp/sidebuild.XXXXXX)
LOGS=${SIDEBUILD_LOGDIR:-$WORK}
OP=fused_norm_rope_attn_rope_cast_decode
now() { date +%s.%N; }
secs() { python3 -c "print(f'{$2 - $1:.1f}')"; }

cp -r "$HERE/src" "$WORK/stock"
cp -r "$HERE/src" "$WORK/side"
mkdir -p "$WORK/kernel_out" "$WORK/site/vllm"
: > "$WORK/site/vllm/__init__.py"

# The build: list and env: exactly as the recipe has them, one shell line each,
# run with sh -e as the kernel stage's build script runs them.
python3 - "$YAML" "$WORK/build.sh" "$WORK/env.sh" <<'PY'
import shlex, sys, yaml
spec = yaml.safe_load(open(sys.argv[1]))
open(sys.argv[2], "w").write("\n".join(spec["build"]) + "\n")
open(sys.argv[3], "w").write("".join(f"export {k}={shlex.quote(str(v))}\n" for k, v in spec.get("env", {}).items()))
PY
echo "== build steps from kernels/flashmla-splitkv.yaml =="
cat "$WORK/build.sh"
echo "== env from the recipe =="
cat "$WORK/env.sh"
. "$WORK/env.sh"

echo "== stock build (as is: its own -gencode list, sm_100a + sm_103a + sm_90a) =="
t0=$(now)
if ! (cd "$WORK/stock" && python3 setup.py build_ext --inplace) > "$LOGS/stock_build.log" 2>&1; then
  tail -40 "$LOGS/stock_build.log"; echo "stock build FAILED"; exit 1
fi
t1=$(now)
grep -E "^(Compiling using|arch flags)" "$LOGS/stock_build.log" || true
STOCK_SO=$(ls "$WORK"/stock/flash_mla/_flashmla_C*.so)
echo "stock: $STOCK_SO  ($(secs "$t0" "$t1") s)"

echo "== side build: the recipe's steps, FLASH_MLA_DISABLE_SM100=1 =="
t2=$(now)
if ! (cd "$WORK/side" && FLASH_MLA_DISABLE_SM100=1 LANECTL_KERNEL_OUT="$WORK/kernel_out" \
      LANECTL_KERNEL_MODULE=_flashmla_splitkv_C sh -e "$WORK/build.sh") > "$LOGS/side_build_compile.log" 2>&1; then
  tail -40 "$LOGS/side_build_compile.log"; echo "side build FAILED"; exit 1
fi
t3=$(now)
grep -E "^(Compiling using|arch flags)" "$LOGS/side_build_compile.log" || true
echo "left-over check: $(cd "$WORK/side" && grep -rc _flashmla_C csrc setup.py | awk -F: '{s+=$2} END {print s+0}') occurrences of _flashmla_C in csrc/ setup.py"
ls -l "$WORK/kernel_out"
SIDE_SO=$(ls "$WORK"/kernel_out/_flashmla_splitkv_C*.so)
others=$(ls "$WORK/kernel_out" | grep -v '^_flashmla_splitkv_C\.' || true)
[ -z "$others" ] || { echo "kernel output holds more than the side module: $others"; exit 1; }
echo "side: $SIDE_SO  ($(secs "$t2" "$t3") s)"

echo "== machine code in each module (cuobjdump --list-elf) =="
for so in "$STOCK_SO" "$SIDE_SO"; do
  echo "$(basename "$so"): $(cuobjdump --list-elf "$so" 2>/dev/null | grep -o 'sm_[0-9]*a\?' | sort -u | tr '\n' ' ')"
done

echo "== CUDA-free smoke check (reads the .so, never loads it) =="
nm -D --defined-only "$SIDE_SO" | grep PyInit_ || true
smoke_rc=0
CUDA_VISIBLE_DEVICES= python3 "$HERE/elf_smoke.py" "$SIDE_SO" --module _flashmla_splitkv_C --op $OP \
  --argument mega_num_splits || smoke_rc=1
echo "-- negative control: the stock module must fail the side module's smoke check"
if CUDA_VISIBLE_DEVICES= python3 "$HERE/elf_smoke.py" "$STOCK_SO" --module _flashmla_splitkv_C --op $OP \
     --argument mega_num_splits; then echo "negative control FAILED (stock passed)"; smoke_rc=1; fi
CUDA_VISIBLE_DEVICES= python3 "$HERE/elf_smoke.py" "$STOCK_SO" --module _flashmla_C --op $OP \
  --argument mega_num_splits --expect-missing-argument || smoke_rc=1

echo "== side by side in one process, on the GPU =="
cp "$STOCK_SO" "$WORK/site/vllm/"
cp "$SIDE_SO" "$WORK/site/vllm/"
side_rc=0
python3 "$HERE/check_side.py" "$WORK/site" || side_rc=1
ks_rc=0
if [ -f "$REPO/lanectl/image/in_image/kernel_smoke.py" ]; then
  echo "== lanectl/image/in_image/kernel_smoke.py (the image build's own CUDA-free check) on the installed layout =="
  KS="{\"dir\": \"$WORK/site/vllm\", \"module\": \"_flashmla_splitkv_C\", \"beside\": \"_flashmla_C\", \"op\": \"torch.ops._flashmla_splitkv_C.$OP\", \"argument\": \"mega_num_splits\"}"
  CUDA_VISIBLE_DEVICES= python3 "$REPO/lanectl/image/in_image/kernel_smoke.py" "$KS" || ks_rc=1
  echo "-- negative control: the stock module copied in under the side name (a build that skipped the rename)"
  mkdir -p "$WORK/norename/vllm"
  cp "$STOCK_SO" "$WORK/norename/vllm/"
  cp "$STOCK_SO" "$WORK/norename/vllm/_flashmla_splitkv_C.abi3.so"
  KS_NORENAME="{\"dir\": \"$WORK/norename/vllm\", \"module\": \"_flashmla_splitkv_C\", \"beside\": \"_flashmla_C\", \"op\": \"torch.ops._flashmla_splitkv_C.$OP\", \"argument\": \"mega_num_splits\"}"
  if CUDA_VISIBLE_DEVICES= python3 "$REPO/lanectl/image/in_image/kernel_smoke.py" "$KS_NORENAME"; then
    echo "negative control FAILED (kernel_smoke accepted an unrenamed module)"; ks_rc=1
  else
    echo "negative control ok: kernel_smoke refused it"
  fi
fi

echo "== build times =="
printf '%-44s %8s s\n' "stock (sm_100a, sm_103a, sm_90a)" "$(secs "$t0" "$t1")"
printf '%-44s %8s s\n' "side, recipe steps (sm_90a only)" "$(secs "$t2" "$t3")"
echo "NVCC_THREADS=$NVCC_THREADS MAX_JOBS=$MAX_JOBS  $(nproc) CPUs"
if [ $smoke_rc -ne 0 ] || [ $side_rc -ne 0 ] || [ $ks_rc -ne 0 ]; then
  echo "side-build proof: FAIL (elf smoke rc=$smoke_rc, side-by-side rc=$side_rc, kernel_smoke rc=$ks_rc)"; exit 1
fi
echo "side-build proof: PASS"
