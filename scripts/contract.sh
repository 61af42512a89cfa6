#!/usr/bin/env bash
# `make contract [VLLM=X.Y.Z]`: lanectl and the stub engine held to a vLLM release's own code (docs/stub-engine.md: "Held to vLLM
# 0.31.0"). Without VLLM it checks the pin (0.31.0), which is what CI runs; VLLM=0.32.0 checks what would break if
# the pin moved there.
#
# vLLM pins torch, transformers and its own pydantic, so each release lives in its own venv, never in .venv:
# .contract-venv/ for the pin, .contract-venv-<version>/ for any other (LANECTL_CONTRACT_VENV overrides). The install
# is the lightest that still imports and runs the code the suite uses on a CPU:
#   - vllm==VLLM without its dependencies; the torch and flashinfer-python versions are read from that vLLM's own
#     metadata (its Requires-Dist), so each release gets what it pins;
#   - torch as the CPU build: PyPI's Linux torch pulls ~3 GB of nvidia-* CUDA libraries that nothing here can load.
#     When the pinned version's CPU build can be reached neither from the machine's wheels and index nor from
#     PyTorch's CPU index, the pin's torch ($FALLBACK_TORCH) is used and the run says so (docs/stub-engine.md: vLLM 0.33.0 pins
#     torch 2.14.0, whose CPU build this workplace cannot download);
#   - flashinfer-python without its dependencies: its full requirement set adds CUDA kernel packages (tilelang,
#     cutlass-dsl, quack, humming-kernels, ...) that a CPU cannot use; xgrammar likewise, for triton;
#   - tests/contract/requirements.txt: what the imported vLLM modules, flashinfer's autotuner, lanectl (imported
#     from this checkout through PYTHONPATH) and pytest need, constrained to the versions that vLLM release states.
# A second run only checks: the venv is reused while the requirements and the versions are unchanged.
# Arguments go to pytest (e.g. -k routes, -x).
set -euo pipefail
cd "$(dirname "$0")/.."

PINNED_VLLM=0.31.0
FALLBACK_TORCH=2.13.0
VLLM_VERSION=${VLLM:-$PINNED_VLLM}
if ! [[ $VLLM_VERSION =~ ^[0-9]+\.[0-9]+\.[0-9]+([.a-z0-9]*)$ ]]; then
  echo "contract: VLLM=$VLLM_VERSION is not a vLLM release version (e.g. 0.32.0)" >&2
  exit 2
fi
if [ "$VLLM_VERSION" = "$PINNED_VLLM" ]; then default_venv=.contract-venv; else default_venv=.contract-venv-$VLLM_VERSION; fi
VENV=${LANECTL_CONTRACT_VENV:-$default_venv}
PY=$VENV/bin/python
REQUIREMENTS=tests/contract/requirements.txt
# Bump when the way the venv is put together changes, so existing venvs are installed again.
INSTALL_FORMAT=3
stamp_value=$( (cat "$REQUIREMENTS"; echo "vllm $VLLM_VERSION format $INSTALL_FORMAT") | sha256sum | cut -d' ' -f1)

# The version of a package vLLM pins with `==` in its metadata (torch, flashinfer-python).
vllm_pins() {
  "$PY" - "$@" <<'EOF'
import re, sys
from importlib.metadata import requires
pins = {}
for requirement in requires("vllm") or []:
    found = re.match(r"([A-Za-z0-9_.-]+)==([^;\s]+)\s*(;.*)?$", requirement)
    if found and "extra ==" not in (found[3] or ""):
        pins[found[1].lower()] = found[2]
print(" ".join(pins[name] for name in sys.argv[1:]))
EOF
}

installed() {
  [ -x "$PY" ] && [ "$(cat "$VENV/.installed" 2>/dev/null)" = "$stamp_value" ] &&
    "$PY" - "$VLLM_VERSION" <<'EOF' >/dev/null 2>&1
import re, sys
from importlib.metadata import requires, version
assert version("vllm") == sys.argv[1]
pins = dict(re.match(r"([A-Za-z0-9_.-]+)==([^;\s]+)", r).groups() for r in requires("vllm") if re.match(r"[^;]*==", r))
assert version("flashinfer-python") == pins["flashinfer-python"]
EOF
}

# vLLM's own version constraints for what requirements.txt names, without extras (pip refuses them in a
# constraints file) and without the torch family, which is installed apart, as its CPU build.
write_constraints() {
  "$PY" - >"$VENV/constraints.txt" <<'EOF'
import re
from importlib.metadata import requires
for requirement in requires("vllm") or []:
    spec, _, marker = requirement.partition(";")
    if "extra ==" in marker:
        continue
    name = re.match(r"[A-Za-z0-9_.-]+", spec.strip())[0]
    if name.lower().startswith("torch") or name.lower() == "flashinfer-python":
        continue
    rest = re.sub(r"^\[[^]]*\]", "", spec.strip()[len(name):]).strip()
    if rest:
        print(f"{name}{rest}" + (f"; {marker.strip()}" if marker.strip() else ""))
EOF
}

install_torch() {
  local wanted=$1
  # From the machine's wheel folder or index when it has the CPU build (PIP_FIND_LINKS), else PyTorch's CPU index.
  if "${pip[@]}" --no-deps "torch==$wanted+cpu" 2>/dev/null ||
     "${pip[@]}" --no-deps "torch==$wanted+cpu" --extra-index-url https://download.pytorch.org/whl/cpu 2>/dev/null; then
    return 0
  fi
  if [ "$wanted" = "$FALLBACK_TORCH" ]; then
    echo "contract: torch $wanted's CPU build cannot be installed here" >&2
    return 1
  fi
  echo "contract: NOTE torch $wanted's CPU build (which vllm $VLLM_VERSION pins) cannot be reached from here;" \
       "using torch $FALLBACK_TORCH+cpu: the suite runs vLLM's Python (API server, parser, configs, loggers), not its kernels"
  "${pip[@]}" --no-deps "torch==$FALLBACK_TORCH+cpu" ||
    "${pip[@]}" --no-deps "torch==$FALLBACK_TORCH+cpu" --extra-index-url https://download.pytorch.org/whl/cpu
}

if ! installed; then
  started=$(date +%s)
  echo "contract: installing vllm==$VLLM_VERSION into $VENV (several minutes, once)"
  [ -x "$PY" ] || python3 -m venv "$VENV"
  rm -f "$VENV/.installed"
  # --no-compile: compiling every module of vLLM and torch would take CPU from the main test run beside this one
  # in CI; Python compiles the few hundred modules the suite imports on first use instead.
  pip=("$PY" -m pip install -q --disable-pip-version-check --no-compile)
  "${pip[@]}" --no-deps "vllm==$VLLM_VERSION"
  read -r torch_version flashinfer_version <<<"$(vllm_pins torch flashinfer-python)"
  install_torch "$torch_version"
  "${pip[@]}" --no-deps "flashinfer-python==$flashinfer_version"
  write_constraints
  # xgrammar without its dependencies too: on Linux x86_64 it requires triton (1 GB installed, a third of the venv),
  # which only its GPU kernels use; the rest of what it requires is in $REQUIREMENTS. Without triton, vLLM's
  # code takes its own no-triton path (vllm.triton_utils), as on any machine without it.
  "${pip[@]}" --no-deps -c "$VENV/constraints.txt" xgrammar
  # pip then lists what vLLM and flashinfer require and this venv leaves out (CUDA kernels, media, telemetry,
  # torchvision/torchaudio): expected, none of it is imported by the suite.
  "${pip[@]}" -r "$REQUIREMENTS" -c "$VENV/constraints.txt"
  echo "$stamp_value" >"$VENV/.installed"
  echo "contract: installed vllm $VLLM_VERSION, flashinfer $flashinfer_version, torch" \
       "$("$PY" -c 'import torch; print(torch.__version__)') in $(( $(date +%s) - started )) s ($(du -sh "$VENV" | cut -f1))"
fi

# The modules installed with --no-compile are compiled on first use and kept: not with PYTHONDONTWRITEBYTECODE=1,
# which would compile them again in every process of the suite.
unset PYTHONDONTWRITEBYTECODE
# lanectl and the stub from this checkout; VLLM_* from the caller's shell must not change what vLLM's code does.
unset $(env | grep -o '^VLLM_[A-Za-z0-9_]*' || true)
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 HF_HUB_OFFLINE=1
export LANECTL_CONTRACT_VLLM=$VLLM_VERSION
exec "$PY" -m pytest -c tests/contract/pytest.ini --rootdir tests/contract -q "$@" tests/contract
