"""Rendered Dockerfiles kept in the cache folder: used again only while the context and every template
the rendering loaded (the lane's Dockerfile.j2 and what it includes) are unchanged."""

from __future__ import annotations

from pathlib import Path

import pytest

from lanectl.image import render
from lanectl.image.render import plan_image
from lanectl.project import BUILTIN_IMAGES_DIR, Project
from lanectl.recipe.catalog import load_catalog
from tests.conftest import REPO

DEMO = (REPO / "recipes" / "demo" / "stub.yaml").read_text()
ENVIRONMENT = render._environment  # the real one, with its cache of compiled templates


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("LANECTL_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache" / "dockerfiles"


@pytest.fixture
def renders(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The template of each rendering Jinja did (a Dockerfile answered by the cache adds none)."""
    calls: list[str] = []

    def counted(images_dir: Path):  # type: ignore[no-untyped-def]
        calls.append(str(images_dir))
        return ENVIRONMENT(images_dir)

    monkeypatch.setattr(render, "_environment", counted)
    return calls


def new_process() -> None:
    """What a new command starts with: no compiled template in memory."""
    ENVIRONMENT.cache_clear()


def dockerfile(lane: str = "demo-h2") -> str:
    return plan_image(load_catalog(Project.locate()).lane(lane)).dockerfile


def test_a_rendering_is_used_again(project, write_recipe, cache, renders):
    write_recipe(DEMO, "demo.yaml")
    first = dockerfile()
    new_process()
    assert dockerfile() == first
    assert len(renders) == 1 and len(list(cache.iterdir())) == 1


@pytest.mark.parametrize("changed", ["stub-engine/Dockerfile.j2", "_lane/engine.j2", "_lane/install-kernels.j2"])
@pytest.mark.parametrize("fresh", [True, False], ids=["next-command", "same-process"])
def test_a_changed_template_is_rendered_again(project, write_recipe, cache, renders, changed, fresh):
    write_recipe(DEMO, "demo.yaml")
    before = dockerfile()
    if fresh:
        new_process()
    template = project / "images" / changed
    if not template.exists():  # a built-in block: the project overrides it with a changed copy
        template.parent.mkdir(parents=True, exist_ok=True)
        template.write_text((BUILTIN_IMAGES_DIR / changed).read_text())
    template.write_text(template.read_text() + "# changed\n")
    after = dockerfile()
    assert after.count("# changed\n") == 1 and after.replace("# changed\n", "") == before
    assert len(renders) == 2


def test_a_changed_context_is_rendered_again(project, write_recipe, cache, renders):
    recipe = write_recipe(DEMO, "demo.yaml")
    before = dockerfile()
    new_process()
    recipe.write_text(recipe.read_text().replace('VLLM_DSV41_MEGA_SPLITKV: "4"', 'VLLM_DSV41_MEGA_SPLITKV: "8"'))
    after = dockerfile()
    assert after == before.replace('VLLM_DSV41_MEGA_SPLITKV="4"', 'VLLM_DSV41_MEGA_SPLITKV="8"') != before
    assert len(renders) == 2


def test_a_torn_entry_is_rendered_again(project, write_recipe, cache, renders):
    write_recipe(DEMO, "demo.yaml")
    before = dockerfile()
    [entry] = cache.iterdir()
    entry.write_bytes(entry.read_bytes()[:20])
    new_process()
    assert dockerfile() == before and len(renders) == 2


def test_an_entry_others_may_write_is_not_used(project, write_recipe, cache, renders):
    write_recipe(DEMO, "demo.yaml")
    before = dockerfile()
    [entry] = cache.iterdir()
    entry.write_text(entry.read_text().replace("FROM ", "FROM planted/"))
    entry.chmod(0o646)
    new_process()
    assert dockerfile() == before and len(renders) == 2
