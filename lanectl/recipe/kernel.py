"""Kernel side extensions (`kernels/<name>.yaml`, schema `lanectl-kernel/v1`).

A kernel is built in its own image stage from a pinned source and installed as a *second*
module beside the engine's shipped one, which stays untouched: the split-KV FlashMLA fork
becomes `vllm/_flashmla_splitkv_C` next to `vllm/_flashmla_C`.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from lanectl.recipe.model import DIGEST_PIN, GIT_COMMIT, EnvName, EnvValue, Strict

MODULE_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"
DOTTED_NAME = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$"
CUDA_ARCH = r"[0-9]+\.[0-9]+[af]?"


class KernelSource(Strict):
    git: str | None = Field(None, description="Repository URL.")
    ref: str | None = Field(None, description="The ref that carries the commit, e.g. refs/pull/25/head.")
    commit: str | None = Field(None, pattern=GIT_COMMIT, description="The pinned commit (40 hex).")
    submodules: list[str] = Field(default_factory=list, description="Submodule paths the build needs.")
    path: str | None = Field(None, description="A source folder in this project, relative to its root.")

    @model_validator(mode="after")
    def _one_kind(self) -> KernelSource:
        if (self.git is None) == (self.path is None):
            raise ValueError("give exactly one of 'git' (with 'commit') or 'path'")
        if self.git is not None and self.commit is None:
            raise ValueError("a git source must pin 'commit' (40 hex) so the build is reproducible")
        if self.path is not None and (self.ref or self.commit or self.submodules):
            raise ValueError("'ref', 'commit' and 'submodules' belong to a git source, not a path")
        return self


class KernelBuilder(Strict):
    image: str | None = Field(None, description="Builder image; default: the lane's base image.")
    local: bool = Field(False, description="The builder is built on this host (make base-image).")
    requires: list[Literal["nvcc", "torch"]] = Field(
        default_factory=list,
        description="What the build needs from the builder (nvcc; torch with its C++ headers), checked first.",
    )

    @model_validator(mode="after")
    def _pinned(self) -> KernelBuilder:
        if self.image is not None and not self.local and not DIGEST_PIN.search(self.image):
            raise ValueError(f"builder image {self.image!r} must be pinned by digest, or set local: true")
        return self


class KernelInstall(Strict):
    package: str = Field(pattern=DOTTED_NAME, description="Package the module goes into, e.g. vllm.")
    module: str = Field(pattern=MODULE_NAME, description="The side module's name, e.g. _flashmla_splitkv_C.")
    beside: str = Field(pattern=MODULE_NAME, description="The shipped module that must stay untouched.")

    @model_validator(mode="after")
    def _distinct(self) -> KernelInstall:
        if self.module == self.beside:
            raise ValueError("module must differ from 'beside': the shipped module is never replaced")
        return self


class OpSchemaCheck(Strict):
    op: str = Field(
        description="The op whose schema must carry the argument: torch.ops.<ns>.<op> or module.function."
    )
    argument: str = Field(pattern=MODULE_NAME)

    @field_validator("op")
    @classmethod
    def _dotted(cls, value: str) -> str:
        if not re.fullmatch(DOTTED_NAME, value):
            raise ValueError(f"{value!r} must be a dotted name")
        return value


class KernelSmoke(Strict):
    """Checked in the image build without importing the module (a GPU-less build step has no
    libcuda): its file name, its init symbol and this op's schema. The engine imports it at start."""

    op_schema: OpSchemaCheck


class KernelSpec(Strict):
    schema_: Literal["lanectl-kernel/v1"] = Field(alias="schema")
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9-]*$")
    description: str = ""
    upstream: str | None = Field(None, description="Where the change comes from (PR URL).")
    source: KernelSource
    builder: KernelBuilder = KernelBuilder()
    archs: list[str] = Field(default_factory=list, description="CUDA archs, e.g. 9.0a, 10.0f.")
    arch_switches: dict[str, EnvName] = Field(
        default_factory=dict,
        description="For a source that picks its own archs (FlashMLA ignores TORCH_CUDA_ARCH_LIST): the env "
                    "switch that turns each arch off; an arch not in `archs` gets its switch set to 1.",
    )
    env: dict[EnvName, EnvValue] = Field(default_factory=dict)
    build: list[str] = Field(
        min_length=1,
        description="Shell commands run in the source folder; they leave the module in $LANECTL_KERNEL_OUT.",
    )
    install: KernelInstall
    smoke: KernelSmoke

    @field_validator("archs")
    @classmethod
    def _archs(cls, value: list[str]) -> list[str]:
        for arch in value:
            if not re.fullmatch(CUDA_ARCH, arch):
                raise ValueError(f"{arch!r} is not a CUDA arch like 9.0a or 10.0f")
        return value

    @model_validator(mode="after")
    def _switches_cover_archs(self) -> KernelSpec:
        if not self.arch_switches:
            return self
        for arch in self.arch_switches:
            if not re.fullmatch(CUDA_ARCH, arch):
                raise ValueError(f"arch_switches: {arch!r} is not a CUDA arch like 9.0a or 10.0f")
        unknown = [arch for arch in self.archs if arch not in self.arch_switches]
        if unknown:
            raise ValueError(f"archs {unknown} have no entry in arch_switches: this source cannot be told to "
                             f"build them (it builds {sorted(self.arch_switches)})")
        if not self.archs:
            raise ValueError("arch_switches needs archs: name the archs to build")
        return self
