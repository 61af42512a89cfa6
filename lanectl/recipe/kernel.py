"""Kernel side extensions (`kernels/<name>.yaml`, schema `lanectl-kernel/v1`).

A kernel is built in its own image stage from a pinned source and installed as a *second*
module beside the engine's shipped one, which stays untouched: the split-KV FlashMLA fork
becomes `vllm/_flashmla_splitkv_C` next to `vllm/_flashmla_C`.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from lanectl.recipe.model import (
    DIGEST_PIN,
    GIT_COMMIT,
    After,
    EnvName,
    EnvValue,
    Field,
    ImageReference,
    Strict,
    looks_like_secret,
)
from lanectl.records import frozen

MODULE_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"
DOTTED_NAME = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$"
CUDA_ARCH = r"[0-9]+\.[0-9]+[af]?"


def _cuda_arch(value: str) -> str:
    if not re.fullmatch(CUDA_ARCH, value):
        raise ValueError(f"{value!r} is not a CUDA arch like 9.0a or 10.0f")
    return value


CudaArch = Annotated[str, After(_cuda_arch)]
# The source is fetched on the host with `git fetch URL COMMIT`: a URL starting with '-' would be read as an
# option (`--upload-pack=...` runs a command), so only URL and scp-like forms, one word, are allowed.
GIT_URL = r"(?:https?|ssh|git|file)://[^\s'\"\\]+|[A-Za-z0-9_.-]+@[A-Za-z0-9.-]+:[^\s'\"\\]+"
GIT_REF = r"refs/[A-Za-z0-9_./+-]+"
SUBMODULE_PATH = r"[A-Za-z0-9_+][A-Za-z0-9_./+-]*"


def _build_env_name(name: str) -> str:
    if looks_like_secret(name):
        raise ValueError(f"{name!r} looks like a secret; a kernel's env is baked into its build stage and the "
                         "build cache, so a build that needs a credential cannot get it from here")
    return name


BuildEnvName = Annotated[EnvName, After(_build_env_name)]


def _git_url(value: str | None) -> str | None:
    if value is not None and not re.fullmatch(GIT_URL, value):
        raise ValueError(f"{value!r} is not a git URL (https://, ssh://, git://, file:// or user@host:path, "
                         "one word)")
    return value


def _git_ref(value: str | None) -> str | None:
    if value is not None and (not re.fullmatch(GIT_REF, value) or ".." in value):
        raise ValueError(f"{value!r} is not a full git ref like refs/pull/25/head")
    return value


def _submodule_paths(value: list[str]) -> list[str]:
    for path in value:
        if not re.fullmatch(SUBMODULE_PATH, path) or ".." in path.split("/"):
            raise ValueError(f"{path!r} is not a submodule path relative to the repository")
    return value


@frozen(kw_only=True)
class KernelSource(Strict):
    """Where a kernel's source comes from: a pinned git commit or a folder of the project."""

    git: Annotated[str | None, After(_git_url)] = Field(None, description="Repository URL.")
    ref: Annotated[str | None, After(_git_ref)] = Field(
        None, description="The ref that carries the commit, e.g. refs/pull/25/head.")
    commit: str | None = Field(None, pattern=GIT_COMMIT, description="The pinned commit (40 hex).")
    submodules: Annotated[list[str], After(_submodule_paths)] = Field(
        default_factory=list, description="Submodule paths the build needs.")
    path: str | None = Field(None, pattern=r"^[^\x00-\x1f\x7f]+$",
                             description="A source folder in this project, relative to its root.")

    def __post_init__(self) -> None:
        if (self.git is None) == (self.path is None):
            raise ValueError("give exactly one of 'git' (with 'commit') or 'path'")
        if self.git is not None and self.commit is None:
            raise ValueError("a git source must pin 'commit' (40 hex) so the build is reproducible")
        if self.path is not None and (self.ref or self.commit or self.submodules):
            raise ValueError("'ref', 'commit' and 'submodules' belong to a git source, not a path")


@frozen(kw_only=True)
class KernelBuilder(Strict):
    """The image a kernel is built in, and what the build needs from it."""

    image: ImageReference | None = Field(None, description="Builder image; default: the lane's base image.")
    local: bool = Field(False, description="The builder is built on this host (make base-image).")
    requires: list[Literal["nvcc", "torch"]] = Field(
        default_factory=list,
        description="What the build needs from the builder (nvcc; torch with its C++ headers), checked first.",
    )

    def __post_init__(self) -> None:
        if self.image is not None and not self.local and not re.search(DIGEST_PIN, self.image):
            raise ValueError(f"builder image {self.image!r} must be pinned by digest, or set local: true")


@frozen(kw_only=True)
class KernelInstall(Strict):
    """Where the built module goes: a new module beside the engine's own."""

    package: str = Field(pattern=DOTTED_NAME, description="Package the module goes into, e.g. vllm.")
    module: str = Field(pattern=MODULE_NAME, description="The side module's name, e.g. _flashmla_splitkv_C.")
    beside: str = Field(pattern=MODULE_NAME, description="The shipped module that must stay untouched.")

    def __post_init__(self) -> None:
        if self.module == self.beside:
            raise ValueError("module must differ from 'beside': the shipped module is never replaced")


def _dotted(value: str) -> str:
    if not re.fullmatch(DOTTED_NAME, value):
        raise ValueError(f"{value!r} must be a dotted name")
    return value


@frozen(kw_only=True)
class OpSchemaCheck(Strict):
    """An op whose schema must carry an argument, checked in the image build."""

    op: Annotated[str, After(_dotted)] = Field(
        description="The op whose schema must carry the argument: torch.ops.<ns>.<op> or module.function."
    )
    argument: str = Field(pattern=MODULE_NAME)


@frozen(kw_only=True)
class KernelSmoke(Strict):
    """Checked in the image build without importing the module (a GPU-less build step has no
    libcuda): its file name, its init symbol and this op's schema. The engine imports it at start."""

    op_schema: OpSchemaCheck


@frozen(kw_only=True)
class KernelSpec(Strict):
    """A kernel side extension: source, build, and the module it installs beside the shipped one."""

    schema_: Literal["lanectl-kernel/v1"] = Field(alias="schema")
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9-]*$")
    description: str = ""
    upstream: str | None = Field(None, description="Where the change comes from (PR URL).")
    source: KernelSource
    builder: KernelBuilder = Field(default_factory=KernelBuilder)
    archs: list[CudaArch] = Field(default_factory=list, description="CUDA archs, e.g. 9.0a, 10.0f.")
    arch_switches: dict[CudaArch, EnvName] = Field(
        default_factory=dict,
        description="For a source that picks its own archs (FlashMLA ignores TORCH_CUDA_ARCH_LIST): the env "
                    "switch that turns each arch off; an arch not in `archs` gets its switch set to 1.",
    )
    env: dict[BuildEnvName, EnvValue] = Field(default_factory=dict, description="Baked into the build stage; "
                                              "names that look like secrets are refused.")
    build: list[str] = Field(
        min_length=1,
        description="Shell commands run in the source folder; they leave the module in $LANECTL_KERNEL_OUT.",
    )
    install: KernelInstall
    smoke: KernelSmoke

    def __post_init__(self) -> None:
        if not self.arch_switches:
            return
        unknown = [arch for arch in self.archs if arch not in self.arch_switches]
        if unknown:
            raise ValueError(f"archs {unknown} have no entry in arch_switches: this source cannot be told to "
                             f"build them (it builds {sorted(self.arch_switches)})")
        if not self.archs:
            raise ValueError("arch_switches needs archs: name the archs to build")
