"""Pinned kernel sources fetched on the host with real git, from real repositories on disk (file://)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from lanectl.image.kernel_source import KernelSourceError, cached_source, fetch_source, source_dir
from lanectl.recipe.kernel import KernelSpec
from lanectl.recipe.model import validated

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.email=t@example.com", "-c", "user.name=t", "-c",
                           "protocol.file.allow=always", *args], cwd=cwd, check=True, capture_output=True,
                          text=True).stdout.strip()


@pytest.fixture
def upstream(tmp_path: Path) -> dict[str, str]:
    """A kernel repository whose csrc/cutlass submodule is pinned at its first commit, not its newest."""
    sub = tmp_path / "cutlass"
    sub.mkdir()
    git(sub, "init", "-q")
    (sub / "cute.h").write_text("// pinned\n")
    git(sub, "add", ".")
    git(sub, "commit", "-qm", "pinned")
    pinned_sub = git(sub, "rev-parse", "HEAD")
    top = tmp_path / "FlashMLA"
    top.mkdir()
    git(top, "init", "-q")
    (top / "setup.py").write_text("print('build')\n")
    (top / "csrc").mkdir()
    git(top, "submodule", "add", "-q", "../cutlass", "csrc/cutlass")
    git(top, "add", ".")
    git(top, "commit", "-qm", "kernel")
    pinned = git(top, "rev-parse", "HEAD")
    (sub / "cute.h").write_text("// newer, not pinned\n")
    git(sub, "commit", "-qam", "newer")
    (top / "setup.py").write_text("print('newer')\n")
    git(top, "commit", "-qam", "newer")
    return {"url": f"file://{top}", "commit": pinned, "sub_commit": pinned_sub}


def kernel(url: str, commit: str, submodules: tuple[str, ...] = ("csrc/cutlass",)) -> KernelSpec:
    return validated(KernelSpec, {
        "schema": "lanectl-kernel/v1", "name": "flashmla-splitkv",
        "source": {"git": url, "commit": commit, "submodules": list(submodules)},
        "build": ["true"], "install": {"package": "vllm", "module": "_flashmla_splitkv_C", "beside": "_flashmla_C"},
        "smoke": {"op_schema": {"op": "torch.ops._flashmla_splitkv_C.x", "argument": "mega_num_splits"}},
    })


def test_fetches_the_pinned_commit_and_the_submodule_at_the_commit_the_source_pins(upstream, tmp_path):
    said: list[str] = []
    spec = kernel(upstream["url"], upstream["commit"])
    fetched = fetch_source(spec, tmp_path / "cache", said.append)
    assert fetched.path == source_dir(spec, tmp_path / "cache")
    assert (fetched.path / "setup.py").read_text() == "print('build')\n"
    assert (fetched.path / "csrc/cutlass/cute.h").read_text() == "// pinned\n"
    assert not list(fetched.path.rglob(".git")), "no git metadata goes into a build context"
    assert fetched.submodules == {"csrc/cutlass": upstream["sub_commit"]}
    assert json.loads((fetched.path / ".lanectl-source.json").read_text())["commit"] == upstream["commit"]
    assert said == [f"fetching {upstream['url']} at {upstream['commit'][:12]}",
                    f"fetching submodule csrc/cutlass ({upstream['url'].rsplit('/', 1)[0]}/cutlass) at "
                    f"{upstream['sub_commit'][:12]}"]


def test_a_complete_copy_is_reused_without_git(upstream, tmp_path, monkeypatch):
    spec = kernel(upstream["url"], upstream["commit"])
    first = fetch_source(spec, tmp_path / "cache")
    monkeypatch.setenv("PATH", "/nonexistent")  # no git: only the cache can answer
    assert fetch_source(spec, tmp_path / "cache").path == first.path
    assert cached_source(spec, tmp_path / "cache") is not None


def test_an_unknown_commit_fails_and_leaves_nothing_that_looks_fetched(upstream, tmp_path):
    spec = kernel(upstream["url"], "0" * 40)
    with pytest.raises(KernelSourceError, match=r"kernel flashmla-splitkv: git fetch"):
        fetch_source(spec, tmp_path / "cache")
    assert cached_source(spec, tmp_path / "cache") is None
    assert list((tmp_path / "cache" / "kernel-sources").iterdir()) == []


def test_a_submodule_path_that_is_not_a_submodule_fails_with_the_path(upstream, tmp_path):
    spec = kernel(upstream["url"], upstream["commit"], ("csrc",))
    with pytest.raises(KernelSourceError, match=r"csrc is not a submodule at the pinned commit"):
        fetch_source(spec, tmp_path / "cache")


def test_an_interrupted_copy_is_not_taken_for_a_complete_one(upstream, tmp_path):
    spec = kernel(upstream["url"], upstream["commit"])
    partial = source_dir(spec, tmp_path / "cache")
    partial.mkdir(parents=True)
    (partial / "setup.py").write_text("half")
    assert cached_source(spec, tmp_path / "cache") is None
    assert (fetch_source(spec, tmp_path / "cache").path / "setup.py").read_text() == "print('build')\n"
