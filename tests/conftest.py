from __future__ import annotations

import shutil
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from tests.registry_server import Registry

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A throwaway project: the repo's images, kernels and patches, and an empty recipes folder.

    The working directory is the project, so messages show paths relative to it, as a user sees them.
    """
    root = tmp_path / "project"
    for part in ("images", "kernels", "patches"):
        shutil.copytree(REPO / part, root / part, ignore=shutil.ignore_patterns("__pycache__"))
    (root / "recipes").mkdir()
    monkeypatch.chdir(root)
    monkeypatch.delenv("LANECTL_RECIPES", raising=False)
    return root


@pytest.fixture
def write_recipe(project: Path) -> Callable[[str, str], Path]:
    def write(text: str, name: str = "r.yaml") -> Path:
        path = project / "recipes" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip("\n"))
        return path

    return write


@pytest.fixture(scope="session")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    """A real registry (scripts/registry.sh) on a free loopback port, for the whole test session."""
    from tests.registry_server import session_registry

    yield from session_registry(tmp_path_factory)
