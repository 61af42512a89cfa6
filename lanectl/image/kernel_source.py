"""Pinned kernel sources fetched on the host, once, into lanectl's cache.

A kernel stage used to `git fetch` inside `docker build`: the engine's runtime image has no git,
and a build machine may have no network at build time. So lanectl fetches the pinned commit (and
each submodule at the commit the source itself pins) here, with the host's git, and sends the
tree, without `.git`, in the build context. The tree is content-addressed by those commits, so the
image's input hash names the commits, not the bytes.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

from lanectl.errors import OperationFailed
from lanectl.recipe.kernel import KernelSpec
from lanectl.records import frozen

MANIFEST = ".lanectl-source.json"
GIT_TIMEOUT_S = 600


class KernelSourceError(OperationFailed):
    """A pinned kernel source could not be fetched or did not match its pin."""


@frozen
class FetchedSource:
    kernel: str
    path: Path  # the tree, without .git
    commit: str
    submodules: dict[str, str]  # path -> commit the source pins


def source_dir(kernel: KernelSpec, cache_dir: Path) -> Path:
    assert kernel.source.commit is not None
    return cache_dir / "kernel-sources" / f"{kernel.name}-{kernel.source.commit}"


def cached_source(kernel: KernelSpec, cache_dir: Path) -> FetchedSource | None:
    """The fetched tree of a git kernel, if a complete one is in the cache."""
    folder = source_dir(kernel, cache_dir)
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    if manifest.get("commit") != kernel.source.commit or manifest.get("git") != kernel.source.git:
        return None
    submodules = manifest.get("submodules")
    if not isinstance(submodules, dict) or sorted(submodules) != sorted(kernel.source.submodules):
        return None
    return FetchedSource(kernel.name, folder, kernel.source.commit or "", dict(submodules))


def fetch_source(kernel: KernelSpec, cache_dir: Path, say: Callable[[str], None] = lambda _: None) -> FetchedSource:
    """The kernel's pinned tree in the cache: fetched now unless a complete copy is there."""
    if kernel.source.git is None or kernel.source.commit is None:
        raise ValueError(f"kernel {kernel.name} has no git source")
    cached = cached_source(kernel, cache_dir)
    if cached is not None:
        return cached
    if shutil.which("git") is None:
        raise KernelSourceError(f"kernel {kernel.name}: fetching {kernel.source.git} needs git on this host "
                                "(apt-get install git)")
    final = source_dir(kernel, cache_dir)
    final.parent.mkdir(parents=True, exist_ok=True)
    # Built beside its final place and renamed into it: an interrupted fetch never looks complete.
    work = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
    try:
        say(f"fetching {kernel.source.git} at {kernel.source.commit[:12]}")
        _checkout(work, kernel.source.git, kernel.source.commit, kernel.source.ref, kernel.name)
        submodules: dict[str, str] = {}
        for sub_path in kernel.source.submodules:
            url, commit = _pinned_submodule(work, kernel.source.git, sub_path, kernel.name)
            say(f"fetching submodule {sub_path} ({url}) at {commit[:12]}")
            target = work / sub_path
            if target.exists():
                shutil.rmtree(target)
            _checkout(target, url, commit, None, kernel.name)
            shutil.rmtree(target / ".git")
            submodules[sub_path] = commit
        shutil.rmtree(work / ".git")
        (work / MANIFEST).write_text(json.dumps(
            {"git": kernel.source.git, "commit": kernel.source.commit, "submodules": submodules},
            indent=2, sort_keys=True) + "\n")
        if final.exists():
            shutil.rmtree(final)  # an incomplete or stale copy
        os.replace(work, final)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return FetchedSource(kernel.name, final, kernel.source.commit, submodules)


def _git(cwd: Path, *args: str, kernel: str) -> str:
    env = {**os.environ, "GIT_TERMINAL_PROMPT": "0", "GIT_CONFIG_NOSYSTEM": "1"}
    try:
        result = subprocess.run(["git", "-c", "advice.detachedHead=false", *args], cwd=cwd, env=env,
                                capture_output=True, text=True, timeout=GIT_TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        raise KernelSourceError(f"kernel {kernel}: git {args[0]} took over {GIT_TIMEOUT_S} s") from exc
    if result.returncode != 0:
        detail = (result.stderr.strip() or result.stdout.strip())[-500:]
        raise KernelSourceError(f"kernel {kernel}: git {' '.join(args)} failed: {detail}")
    return result.stdout


def _checkout(folder: Path, url: str, commit: str, ref: str | None, kernel: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    _git(folder, "init", "-q", kernel=kernel)
    try:
        _git(folder, "fetch", "-q", "--depth", "1", url, commit, kernel=kernel)
    except KernelSourceError:
        if ref is None:
            raise
        # Servers that refuse to serve a bare commit still serve the ref that carries it.
        _git(folder, "fetch", "-q", url, ref, kernel=kernel)
    _git(folder, "checkout", "-q", commit, kernel=kernel)
    head = _git(folder, "rev-parse", "HEAD", kernel=kernel).strip()
    if head != commit:
        raise KernelSourceError(f"kernel {kernel}: {url} gave {head} where {commit} is pinned")


def _pinned_submodule(tree: Path, parent_url: str, sub_path: str, kernel: str) -> tuple[str, str]:
    listing = _git(tree, "ls-tree", "HEAD", "--", sub_path, kernel=kernel).split()
    if len(listing) < 3 or listing[0] != "160000":
        raise KernelSourceError(f"kernel {kernel}: {sub_path} is not a submodule at the pinned commit")
    commit = listing[2]
    url = None
    if (tree / ".gitmodules").is_file():
        entries = _git(tree, "config", "-f", ".gitmodules", "--get-regexp", r"^submodule\..*\.(path|url)$",
                       kernel=kernel)
        by_name: dict[str, dict[str, str]] = {}
        for line in entries.splitlines():
            key, _, value = line.partition(" ")
            name, _, field = key[len("submodule."):].rpartition(".")
            by_name.setdefault(name, {})[field] = value
        url = next((e.get("url") for e in by_name.values() if e.get("path") == sub_path), None)
    if not url:
        raise KernelSourceError(f"kernel {kernel}: .gitmodules names no url for {sub_path}")
    return _resolve_relative(parent_url, url), commit


def _resolve_relative(parent_url: str, url: str) -> str:
    # git resolves "../x" against the superproject's URL, minus its last component.
    if not url.startswith(("./", "../")):
        return url
    base = parent_url.rstrip("/")
    for part in url.split("/"):
        if part == "..":
            base = base.rsplit("/", 1)[0]
        elif part not in ("", "."):
            base = f"{base}/{part}"
    return base
