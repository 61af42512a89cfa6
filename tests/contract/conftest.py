"""The contract suite runs only where the vLLM release it checks is installed (scripts/contract.sh makes that venv).

The release is the pin (0.31.0), or the one `make contract VLLM=X.Y.Z` names (scripts/contract.sh passes it on as
LANECTL_CONTRACT_VLLM); flashinfer must be the version that vLLM release pins in its own metadata. Anywhere else
nothing is collected and the run says which command to use, except in CI (`LANECTL_CI=1`), where a suite that did
not run would read as a suite that passed: there a missing vLLM is an error.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import tempfile
from importlib.metadata import PackageNotFoundError, requires, version

import pytest

# Before vLLM is imported: this machine has no GPU, and vLLM's parser infers the device from the platform.
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
# A stand-in for a lane container's filesystem, with HOME at its /root as in vLLM's images, set before flashinfer reads
# HOME at import: where vLLM's and flashinfer's own code put their caches is then a container path the suite can hold
# against a lane's volumes (vllm_oracle.flashinfer_autotune_start), and nothing lands in this machine's home.
CONTAINER_ROOT = tempfile.mkdtemp(prefix="lanectl-contract-root-")
os.environ["HOME"] = os.path.join(CONTAINER_ROOT, "root")

PINNED_VLLM = "0.31.0"
CHECKED_VLLM = os.environ.get("LANECTL_CONTRACT_VLLM") or PINNED_VLLM


def _flashinfer_pin() -> str | None:
    """The flashinfer-python version the installed vLLM pins (`flashinfer-python==X` in its Requires-Dist)."""
    for requirement in requires("vllm") or []:
        found = re.match(r"flashinfer-python==([^;\s]+)", requirement)
        if found:
            return found[1]
    return None


def _missing() -> str | None:
    try:
        found = version("vllm")
    except PackageNotFoundError:
        return f"vllm=={CHECKED_VLLM} is not installed in this Python ({sys.executable})"
    if found != CHECKED_VLLM:
        return f"vllm {found} is installed here, but the suite was asked to check {CHECKED_VLLM}"
    flashinfer = _flashinfer_pin()
    try:
        installed = version("flashinfer-python")
    except PackageNotFoundError:
        return f"flashinfer-python=={flashinfer} (vllm {found}'s pin) is not installed in {sys.executable}"
    if installed != flashinfer:
        return f"flashinfer-python {installed} is installed here, but vllm {found} pins {flashinfer}"
    return None


MISSING = _missing()
# The test modules import vLLM at the top; without it they are not collected at all.
collect_ignore_glob = ["test_*.py"] if MISSING else []


def pytest_configure(config: pytest.Config) -> None:
    if MISSING and os.environ.get("LANECTL_CI") == "1":
        raise pytest.UsageError(f"contract suite: {MISSING}; CI must run it, with `make contract`")


def pytest_unconfigure(config: pytest.Config) -> None:
    shutil.rmtree(CONTAINER_ROOT, ignore_errors=True)


def pytest_report_header(config: pytest.Config) -> str:
    if MISSING:
        return f"contract suite NOT RUN: {MISSING}; run `make contract`"
    import torch

    pinned = "the pin" if CHECKED_VLLM == PINNED_VLLM else f"not the pin ({PINNED_VLLM})"
    return (f"contract suite against vllm {CHECKED_VLLM} ({pinned}), flashinfer {version('flashinfer-python')}, "
            f"torch {torch.__version__}")
