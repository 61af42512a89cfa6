"""The build-time kernel smoke check, run as the image build runs it, on real compiled modules.

It must prove the side module's name, init symbol and op schema without importing it (a GPU-less
build step has no libcuda), and fail with the cause on each way a side build goes wrong.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from tests.conftest import REPO

SMOKE = REPO / "lanectl" / "image" / "in_image" / "kernel_smoke.py"
SOURCE = REPO / "kernels" / "src" / "stub-splitkv" / "stub_splitkv.c"
SUFFIX = sysconfig.get_config_var("EXT_SUFFIX")


def build(folder: Path, module: str, source: Path = SOURCE) -> Path:
    if shutil.which("gcc") is None or not Path(sysconfig.get_paths()["include"], "Python.h").exists():
        pytest.skip("needs gcc and this Python's headers")
    out = folder / f"{module}{SUFFIX}"
    subprocess.run(["gcc", "-O2", "-shared", "-fPIC", f"-I{sysconfig.get_paths()['include']}",
                    f"-DLANECTL_MODULE_NAME={module}", str(source), "-o", str(out)], check=True, capture_output=True)
    return out


def smoke(folder: Path, **overrides: str) -> subprocess.CompletedProcess[str]:
    spec = {"dir": str(folder), "module": "_stub_splitkv_C", "beside": "attention",
            "op": "stubengine._stub_splitkv_C.decode", "argument": "mega_num_splits", **overrides}
    return subprocess.run([sys.executable, str(SMOKE), json.dumps(spec)], capture_output=True, text=True,
                          timeout=60)


@pytest.fixture
def package(tmp_path: Path) -> Path:
    (tmp_path / "attention.py").write_text("def decode(num_tokens, num_requests):\n    return 1.0\n")
    return tmp_path


def test_a_good_side_module_passes_without_being_imported(package: Path) -> None:
    build(package, "_stub_splitkv_C")
    result = smoke(package)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        f"kernel smoke: side module {package}/_stub_splitkv_C{SUFFIX}",
        "kernel smoke: shipped module attention still beside it",
        "kernel smoke: exports PyInit__stub_splitkv_C",
        "kernel smoke: stubengine._stub_splitkv_C.decode takes mega_num_splits",
    ]


def test_a_module_built_under_another_name_is_refused(package: Path) -> None:
    # The file carries the side name, but the rename missed the init function: Python could not import it.
    wrong = build(package, "_stub_other_C")
    wrong.rename(package / f"_stub_splitkv_C{SUFFIX}")
    result = smoke(package)
    assert result.returncode == 1
    assert f"_stub_splitkv_C{SUFFIX} exports no PyInit__stub_splitkv_C" in result.stderr


def test_a_side_module_still_exporting_the_shipped_init_is_refused(package: Path) -> None:
    build(package, "_stub_splitkv_C")
    result = smoke(package, beside="_stub_splitkv_C")
    assert result.returncode == 1
    # The shipped module's file is the side module itself here: exactly one file, so the init check fires.
    assert "still exports PyInit__stub_splitkv_C" in result.stderr


def test_a_missing_capability_argument_is_refused(package: Path) -> None:
    build(package, "_stub_splitkv_C")
    result = smoke(package, argument="mega_num_blocks")
    assert result.returncode == 1
    assert "stubengine._stub_splitkv_C.decode has no argument 'mega_num_blocks'" in result.stderr


def test_the_shipped_module_must_stay_beside_it(package: Path) -> None:
    build(package, "_stub_splitkv_C")
    (package / "attention.py").unlink()
    result = smoke(package)
    assert result.returncode == 1
    assert "the shipped module attention is no longer in" in result.stderr


def test_no_module_or_two_modules_are_refused(package: Path) -> None:
    assert "found none" in smoke(package).stderr
    build(package, "_stub_splitkv_C")
    shutil.copy(package / f"_stub_splitkv_C{SUFFIX}", package / "_stub_splitkv_C.abi3.so")
    result = smoke(package)
    assert result.returncode == 1 and "expected exactly one _stub_splitkv_C.*.so" in result.stderr


def test_a_torch_op_needs_its_renamed_namespace_in_the_module(package: Path) -> None:
    # The stub registers no torch namespace: asking for one must fail, not pass on the schema alone.
    build(package, "_stub_splitkv_C")
    result = smoke(package, op="torch.ops._flashmla_splitkv_C.decode")
    assert result.returncode == 1
    assert "never names the op namespace _flashmla_splitkv_C" in result.stderr
