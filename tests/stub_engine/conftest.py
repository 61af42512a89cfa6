"""Fixtures that run the stub engine as a real process, the way a lane container runs it."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

import pytest

from .stubproc import PATCH, STUB_DIR, StubProcess

Spawn = Callable[..., StubProcess]


@pytest.fixture
def spawn() -> Iterator[Spawn]:
    """spawn(env=..., args=..., pythonpath=..., port=..., ready=True) -> StubProcess; all killed at teardown."""
    procs: list[StubProcess] = []

    def _spawn(
        env: Mapping[str, str] | None = None,
        args: Sequence[str] = (),
        pythonpath: Path = STUB_DIR,
        port: int = 0,
        ready: bool = True,
    ) -> StubProcess:
        p = StubProcess(env or {}, args, pythonpath, port)
        procs.append(p)
        if ready:
            p.wait_ready()
        return p

    yield _spawn
    for p in procs:
        p.kill()


@pytest.fixture
def stub(spawn: Spawn) -> StubProcess:
    """A ready stub engine with default test settings."""
    return spawn()


@pytest.fixture(scope="session")
def patched_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of images/stub-engine with the rejection-sampler patch applied by `patch -p1`."""
    if shutil.which("patch") is None:
        pytest.skip("GNU patch is not installed")
    root = tmp_path_factory.mktemp("patched") / "stub-engine"
    shutil.copytree(STUB_DIR, root, ignore=shutil.ignore_patterns("__pycache__"))
    with PATCH.open("rb") as fh:
        subprocess.run(["patch", "-p1", "--forward", "--batch"], cwd=root, stdin=fh, check=True, capture_output=True)
    return root
