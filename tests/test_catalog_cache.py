"""The validated catalog kept on disk: reused while nothing it was validated from changed, and
validated again, with the same result a fresh load gives, as soon as anything did."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

import lanectl.recipe.catalog as catalog_module
from lanectl.errors import RecipeInvalid
from lanectl.project import Project
from lanectl.recipe import catalog_cache
from lanectl.recipe.catalog import Catalog, load_catalog
from tests.conftest import REPO
from tests.test_recipe_validation import GOOD

DEMO = (REPO / "recipes" / "demo" / "stub.yaml").read_text()


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "cache"
    monkeypatch.setenv("LANECTL_CACHE_DIR", str(folder))
    return folder / "catalogs"


@pytest.fixture
def validations(monkeypatch: pytest.MonkeyPatch) -> list[list[Path]]:
    """The recipe files of each full validation, in order (a load answered by the cache adds none)."""
    calls: list[list[Path]] = []
    validate = catalog_module._validate

    def counted(project: Project, files: list[Path], inputs: set[Path]) -> Catalog:
        calls.append(files)
        return validate(project, files, inputs)

    monkeypatch.setattr(catalog_module, "_validate", counted)
    return calls


@pytest.fixture
def demo(project: Path, write_recipe: Callable[[str, str], Path]) -> Path:
    return write_recipe(DEMO, "demo.yaml")


def load() -> Catalog:
    return load_catalog(Project.locate())


def test_a_second_load_is_answered_by_the_cache(demo, cache, validations):
    first = load()
    second = load()
    assert len(validations) == 1 and len(list(cache.glob("*.pickle"))) == 1
    assert second == first and second is not first
    assert second.lane("demo-h2").kernels[0].name == "stub-splitkv"
    assert second.lane("demo-h2").spec.patches[0].path == "stub-engine/0001-rejection-sampler-guard.patch"


def _append_lane(project: Path) -> None:
    recipe = project / "recipes" / "demo.yaml"
    # Its own host ports: the demo's lanes keep a sleeping standby, which holds its ports.
    recipe.write_text(recipe.read_text() + "  demo-h3:\n    description: a new lane\n"
                      "    engine:\n      ports:\n        - {container: 8000, host: 18030, host_ip: 127.0.0.1}\n"
                      "    companions:\n      rtx:\n        engine:\n          ports:\n"
                      "            - {container: 8001, host: 18031, host_ip: 127.0.0.1}\n")


def _new_recipe_file(project: Path) -> None:
    (project / "recipes" / "more.yaml").write_text(
        DEMO.replace("id: demo-stub", "id: more").replace("lanectl-demo-{lane}", "more-{lane}")
        .replace("demo-h1:", "more-h1:").replace("demo-h2:", "more-h2:").replace("demo-h2-8:", "more-h2-8:")
        .replace("demo-broken:", "more-broken:")
        .replace("18000", "18100").replace("18001", "18101"))


def _kernel_description(project: Path) -> None:
    kernel = project / "kernels" / "stub-splitkv.yaml"
    kernel.write_text(kernel.read_text().replace("description: Split-KV", "description: Changed split-KV"))


@pytest.mark.parametrize(("change", "check"), [
    pytest.param(_append_lane, lambda c: "demo-h3" in c.lanes, id="recipe-edited"),
    pytest.param(_new_recipe_file, lambda c: "more-h1" in c.lanes, id="recipe-added"),
    pytest.param(_kernel_description, lambda c: c.lane("demo-h2").kernels[0].description.startswith("Changed"),
                 id="kernel-edited"),
    # The project's own template gone: lanectl's built-in one of that name serves, after a fresh validation.
    pytest.param(lambda p: (p / "images" / "stub-engine" / "Dockerfile.j2").unlink(),
                 lambda c: "demo-h1" in c.lanes, id="template-removed-built-in-serves"),
])
def test_a_change_is_seen_by_the_next_load(demo, cache, validations, change, check):
    load()
    change(demo.parent.parent)
    assert check(load())
    assert len(validations) == 2
    load()
    assert len(validations) == 2  # and then cached again


def test_a_yaml_file_that_is_no_recipe_leaves_the_entry_valid(demo, cache, validations):
    load()
    (demo.parent / "workloads.yaml").write_text("notes: not a recipe\n")
    assert sorted(load().lanes) == ["demo-broken", "demo-h1", "demo-h2", "demo-h2-8"]
    assert len(validations) == 1


@pytest.mark.parametrize(("change", "problem"), [
    pytest.param(lambda p: (p / "patches" / "stub-engine" / "0001-rejection-sampler-guard.patch").write_text("x\n"),
                 "sha256 does not match patches/stub-engine/0001-rejection-sampler-guard.patch", id="patch-edited"),
    pytest.param(lambda p: (p / "patches" / "stub-engine" / "0001-rejection-sampler-guard.patch").unlink(),
                 "no patch file patches/stub-engine/0001-rejection-sampler-guard.patch", id="patch-removed"),
    pytest.param(lambda p: (p / "kernels" / "stub-splitkv.yaml").unlink(), "no kernel 'stub-splitkv'",
                 id="kernel-removed"),
    pytest.param(lambda p: shutil.rmtree(p / "kernels" / "src" / "stub-splitkv"),
                 "no folder kernels/src/stub-splitkv in the project", id="kernel-source-removed"),
    pytest.param(lambda p: (shutil.rmtree(p / "kernels" / "src"),
                            (p / "kernels" / "src").symlink_to(REPO / "kernels" / "src")),
                 "kernels/src/stub-splitkv leads out of the project", id="kernel-source-now-a-link-out"),
    pytest.param(lambda p: (shutil.move(p / "images" / "stub-engine", p.parent / "elsewhere"),
                            (p / "images" / "stub-engine").symlink_to(p.parent / "elsewhere")),
                 "stub-engine leads out of images/", id="template-folder-now-a-link-out"),
])
def test_a_change_that_breaks_a_cached_catalog_is_reported(demo, cache, validations, change, problem):
    load()
    change(demo.parent.parent)
    with pytest.raises(RecipeInvalid) as caught:
        load()
    assert any(problem in str(p) for p in caught.value.problems), caught.value.problems


def test_other_code_validates_again(demo, cache, validations, monkeypatch):
    load()
    monkeypatch.setattr(catalog_cache, "code_stamp", lambda: "another lanectl")
    load()
    assert len(validations) == 2


def test_an_entry_others_may_write_is_not_trusted(demo, cache, validations):
    load()
    [entry] = cache.glob("*.pickle")
    entry.chmod(0o666)
    load()
    assert len(validations) == 2
    assert entry.stat().st_mode & 0o777 == 0o600  # written again, privately
    load()
    assert len(validations) == 2


def test_a_torn_entry_is_a_miss(demo, cache, validations):
    load()
    [entry] = cache.glob("*.pickle")
    entry.write_bytes(entry.read_bytes()[:100])
    assert sorted(load().lanes) == ["demo-broken", "demo-h1", "demo-h2", "demo-h2-8"]
    assert len(validations) == 2


def test_a_cache_that_cannot_be_written_costs_only_speed(demo, tmp_path, monkeypatch, validations):
    (tmp_path / "not-a-folder").write_text("")
    monkeypatch.setenv("LANECTL_CACHE_DIR", str(tmp_path / "not-a-folder"))
    assert sorted(load().lanes) == sorted(load().lanes) == ["demo-broken", "demo-h1", "demo-h2", "demo-h2-8"]
    assert len(validations) == 2


def test_named_files_are_always_validated(demo, cache, validations):
    load_catalog(Project.locate(), [demo])
    load_catalog(Project.locate(), [demo])
    assert len(validations) == 2 and not cache.exists()


def test_the_folder_keeps_the_most_recently_used_entries(cache, tmp_path, monkeypatch):
    monkeypatch.setattr(catalog_cache, "KEEP_ENTRIES", 2)
    folders = []
    for name in ("a", "b", "c"):
        root = tmp_path / name
        shutil.copytree(REPO / "images", root / "images")
        (root / "recipes").mkdir()
        (root / "recipes" / "r.yaml").write_text(GOOD)
        folders.append(root / "recipes")
        load_catalog(Project.locate(root / "recipes"))
    kept = {cache / catalog_cache.CatalogCache().key(folder) for folder in folders[1:]}
    assert set(cache.glob("*.pickle")) == kept
