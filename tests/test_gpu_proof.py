"""The GPU proofs of the split-KV overlay, where a GPU exists; everywhere else they skip and say why.

CI machines have no GPU: the figures from the last run on an NVIDIA H200 are in gpu/RESULTS.md, with
the command that produced them (`bash gpu/run-on-h200.sh`).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.test_splitkv_overlay import COMBINE, created_file


def _gpu_or_skip() -> None:
    torch = pytest.importorskip("torch", reason="needs torch and triton with an NVIDIA GPU; this machine has no "
                                                "torch (results of the last GPU run: gpu/RESULTS.md)")
    if not torch.cuda.is_available():
        pytest.skip("needs an NVIDIA GPU (sm_90 or newer); run `bash gpu/run-on-h200.sh` on one "
                    "(results of the last run: gpu/RESULTS.md)")


def test_the_combine_the_overlay_ships_matches_the_torch_reference(tmp_path: Path) -> None:
    _gpu_or_skip()
    module = tmp_path / "splitkv_combine.py"
    module.write_text(created_file(COMBINE))  # exactly the file the image gets
    result = subprocess.run([sys.executable, str(REPO / "gpu" / "check_combine.py"), "--module", str(module)],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
