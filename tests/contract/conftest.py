"""The contract suite runs only where vLLM 0.31.0 is installed (scripts/contract.sh makes that venv).

Anywhere else nothing is collected and the run says which command to use, except in CI (`LANECTL_CI=1`), where a
suite that did not run would read as a suite that passed: there a missing vLLM is an error.
"""

from __future__ import annotations

import os
import sys
from importlib.metadata import PackageNotFoundError, version

import pytest

# Before vLLM is imported: this machine has no GPU, and vLLM's parser infers the device from the platform.
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

PINNED = {"vllm": "0.31.0", "flashinfer-python": "0.7.0.post1"}


def _missing() -> str | None:
    for package, pinned in PINNED.items():
        try:
            found = version(package)
        except PackageNotFoundError:
            return f"{package}=={pinned} is not installed in this Python ({sys.executable})"
        if found != pinned:
            return f"{package} {found} is installed here, but the recipes pin {pinned}"
    return None


MISSING = _missing()
# The test modules import vLLM at the top; without it they are not collected at all.
collect_ignore_glob = ["test_*.py"] if MISSING else []


def pytest_configure(config: pytest.Config) -> None:
    if MISSING and os.environ.get("LANECTL_CI") == "1":
        raise pytest.UsageError(f"contract suite: {MISSING}; CI must run it, with `make contract`")


def pytest_report_header(config: pytest.Config) -> str:
    if MISSING:
        return f"contract suite NOT RUN: {MISSING}; run `make contract`"
    return f"contract suite against vllm {PINNED['vllm']}, flashinfer {PINNED['flashinfer-python']}"
