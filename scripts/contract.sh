#!/usr/bin/env bash
# `make contract`: lanectl and the stub engine held to vLLM 0.31.0's own code (README: "Held to vLLM 0.31.0").
#
# vLLM pins torch, transformers and its own pydantic, so it lives in its own venv, .contract-venv/, never in
# .venv. The install is the lightest that still imports and runs the code the suite uses on a CPU:
#   - torch 2.13.0 (the version vllm 0.31.0 pins) as the CPU build: PyPI's Linux torch pulls ~3 GB of nvidia-*
#     CUDA libraries that nothing here can load;
#   - vllm==0.31.0 and flashinfer-python==0.7.0.post1 without their dependencies: their full requirement set
#     adds CUDA kernels packages (tilelang, cutlass-dsl, quack, humming-kernels, ...) that a CPU cannot use;
#   - tests/contract/requirements.txt: what the imported vLLM modules, flashinfer's autotuner, lanectl (imported
#     from this checkout through PYTHONPATH) and pytest need.
# A second run only checks: the venv is reused while this script and the requirements are unchanged.
# Arguments go to pytest (e.g. -k routes, -x).
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${LANECTL_CONTRACT_VENV:-.contract-venv}
PY=$VENV/bin/python
VLLM_VERSION=0.31.0
FLASHINFER_VERSION=0.7.0.post1
TORCH_VERSION=2.13.0
REQUIREMENTS=tests/contract/requirements.txt
stamp_value=$( (cat "$0" "$REQUIREMENTS"; echo "$VLLM_VERSION $FLASHINFER_VERSION $TORCH_VERSION") | sha256sum | cut -d' ' -f1)

installed() {
  [ -x "$PY" ] && [ "$(cat "$VENV/.installed" 2>/dev/null)" = "$stamp_value" ] &&
    "$PY" - "$VLLM_VERSION" "$FLASHINFER_VERSION" "$TORCH_VERSION" <<'EOF' >/dev/null 2>&1
import sys
from importlib.metadata import version
vllm, flashinfer, torch = sys.argv[1:]
assert version("vllm") == vllm and version("flashinfer-python") == flashinfer
assert version("torch").split("+")[0] == torch
EOF
}

if ! installed; then
  started=$(date +%s)
  echo "contract: installing vllm==$VLLM_VERSION into $VENV (several minutes, once)"
  [ -x "$PY" ] || python3 -m venv "$VENV"
  rm -f "$VENV/.installed"
  # --no-compile: compiling every module of vLLM and torch would take CPU from the main test run beside this one
  # in CI; Python compiles the few hundred modules the suite imports on first use instead.
  pip=("$PY" -m pip install -q --disable-pip-version-check --no-compile)
  # The CPU build of torch: from the machine's wheel folder or index when it has one (PIP_FIND_LINKS), else from
  # PyTorch's CPU index. --no-deps: its other requirements are in the requirements file.
  if ! "${pip[@]}" --no-deps "torch==$TORCH_VERSION+cpu" 2>/dev/null; then
    "${pip[@]}" --no-deps "torch==$TORCH_VERSION+cpu" --extra-index-url https://download.pytorch.org/whl/cpu
  fi
  "${pip[@]}" --no-deps "vllm==$VLLM_VERSION" "flashinfer-python==$FLASHINFER_VERSION"
  # pip then lists what vLLM and flashinfer require and this venv leaves out (CUDA kernels, media, telemetry,
  # torchvision/torchaudio): expected, none of it is imported by the suite.
  "${pip[@]}" -r "$REQUIREMENTS"
  echo "$stamp_value" >"$VENV/.installed"
  echo "contract: installed in $(( $(date +%s) - started )) s ($(du -sh "$VENV" | cut -f1))"
fi

# lanectl and the stub from this checkout; VLLM_* from the caller's shell must not change what vLLM's code does.
unset $(env | grep -o '^VLLM_[A-Za-z0-9_]*' || true)
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 HF_HUB_OFFLINE=1
exec "$PY" -m pytest -c tests/contract/pytest.ini --rootdir tests/contract -q "$@" tests/contract
