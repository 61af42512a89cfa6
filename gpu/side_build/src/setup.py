"""A stand-in for FlashMLA's setup.py: same extension name, same arch switches.

Built as ``flash_mla._flashmla_C`` (abi3), with its own -gencode list so
TORCH_CUDA_ARCH_LIST is ignored, exactly the trait the kernel stage must drive
through FLASH_MLA_DISABLE_SM90 / FLASH_MLA_DISABLE_SM100.
"""

import os
import subprocess

from setuptools import setup
from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CUDAExtension


def is_flag_set(flag: str) -> bool:
    return os.getenv(flag, "FALSE").lower() in ["true", "1", "y", "yes"]


def get_arch_flags() -> list[str]:
    assert CUDA_HOME is not None, "PyTorch must be built with CUDA"
    out = subprocess.check_output([os.path.join(CUDA_HOME, "bin", "nvcc"), "--version"]).decode()
    major, minor = map(int, out.split("release ")[1].split(",")[0].strip().split("."))
    print(f"Compiling using NVCC {major}.{minor}")
    disable_sm100 = is_flag_set("FLASH_MLA_DISABLE_SM100")
    disable_sm90 = is_flag_set("FLASH_MLA_DISABLE_SM90")
    if (major, minor) < (12, 9):
        assert disable_sm100, "sm100 needs nvcc >= 12.9; set FLASH_MLA_DISABLE_SM100=1"
    flags = []
    if not disable_sm100:
        flags += ["-gencode", "arch=compute_100a,code=sm_100a", "-gencode", "arch=compute_103a,code=sm_103a"]
    if not disable_sm90:
        flags += ["-gencode", "arch=compute_90a,code=sm_90a"]
    assert flags, "every arch is disabled"
    print("arch flags:", " ".join(flags))
    return flags


nvcc_threads = ["--threads", os.getenv("NVCC_THREADS") or "32"]

setup(
    name="flash_mla",
    version="0.0.0+sidebuildproof",
    packages=["flash_mla"],
    ext_modules=[
        CUDAExtension(
            name="flash_mla._flashmla_C",
            sources=["csrc/api.cpp", "csrc/scaled_add.cu"],
            py_limited_api=True,
            define_macros=[("Py_LIMITED_API", "0x03090000")],
            extra_compile_args={
                "cxx": ["-O3", "-std=c++20"],
                "nvcc": ["-O3", "-std=c++20"] + get_arch_flags() + nvcc_threads,
            },
        )
    ],
    cmdclass={"build_ext": BuildExtension},
    options={"bdist_wheel": {"py_limited_api": "cp39"}},
)
