"""Builds against the real Docker engine: the demo lanes, kernel and patch stages included.

Each test builds under its own recipe id (so its own image repository) and removes its images.
"""

from __future__ import annotations

import functools
import json
import re
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import docker
import pytest

from lanectl.dockerapi.containers import DockerEngine
from lanectl.errors import OperationFailed
from lanectl.image.build import build_lane
from lanectl.image.render import plan_image
from lanectl.project import Project
from lanectl.recipe.catalog import load_catalog
from tests.conftest import REPO

pytestmark = pytest.mark.docker


@pytest.fixture(scope="module")
def engine() -> DockerEngine:
    return DockerEngine()


@pytest.fixture
def demo(project: Path, engine: DockerEngine):
    """The shipped demo recipe under a unique id; yields (project root, recipe path, id)."""
    recipe_id = f"test-{uuid.uuid4().hex[:10]}"
    recipe = project / "recipes" / "stub.yaml"
    shipped = (REPO / "recipes" / "demo" / "stub.yaml").read_text()
    recipe.write_text(shipped.replace("id: demo-stub", f"id: {recipe_id}"))
    yield project, recipe, recipe_id
    client = docker.from_env()  # the SDK: an independent view of what lanectl's own client built
    for image in client.images.list(filters={"label": f"io.lanectl.recipe={recipe_id}"}):
        client.images.remove(image.id, force=True)


def lanes(project: Path):
    return load_catalog(Project.locate(project / "recipes"))


def test_build_both_demo_lanes_then_rebuild_does_nothing(demo, engine):
    project, _, recipe_id = demo
    catalog = lanes(project)
    first = [build_lane(engine, catalog.lane(name)) for name in ("demo-h1", "demo-h2")]
    assert [o.status for o in first] == ["built", "built"], [o.message for o in first]
    again = [build_lane(engine, catalog.lane(name)) for name in ("demo-h1", "demo-h2")]
    assert [o.status for o in again] == ["unchanged", "unchanged"]
    assert "inputs unchanged, nothing built" in again[0].message

    plan = plan_image(catalog.lane("demo-h2"))
    labels = engine.image_labels(plan.tag)
    assert labels is not None
    patch_sha = catalog.lane("demo-h2").spec.patches[0].sha256
    assert labels["io.lanectl.recipe"] == recipe_id and labels["io.lanectl.lane"] == "demo-h2"
    assert labels["io.lanectl.inputs"] == plan.input_hash
    assert json.loads(labels["io.lanectl.patches"]) == {"stub-engine/0001-rejection-sampler-guard.patch": patch_sha}
    assert re.fullmatch(r"path:kernels/src/stub-splitkv@[0-9a-f]{12}",
                        json.loads(labels["io.lanectl.kernels"])["stub-splitkv"])
    assert engine.image_id(plan.moving_tag) == engine.image_id(plan.tag)


def test_image_carries_side_module_beside_the_shipped_one_and_the_patch(demo, engine):
    project, _, _ = demo
    catalog = lanes(project)
    for name in ("demo-h1", "demo-h2"):
        assert build_lane(engine, catalog.lane(name)).status == "built"
    probe = ("import stubengine.attention as a, importlib.util as u, pathlib as p;"
             "print(u.find_spec('stubengine._stub_splitkv_C') is not None);"
             "print(p.Path(a.__file__).read_bytes() == p.Path('/opt/stub/stubengine/attention.py').read_bytes());"
             "print('has_next' in p.Path('/opt/stub/stubengine/rejection_sampler.py').read_text())")
    shipped_attention = (project / "images/stub-engine/stubengine/attention.py").read_text()

    def run(lane: str) -> list[str]:
        tag = plan_image(catalog.lane(lane)).tag
        output = docker.from_env().containers.run(tag, entrypoint=["python3", "-c", probe], remove=True)
        return output.decode().split()

    assert run("demo-h1") == ["False", "True", "False"]
    assert run("demo-h2") == ["True", "True", "True"]
    attention = docker.from_env().containers.run(plan_image(catalog.lane("demo-h2")).tag, remove=True,
                                                 entrypoint=["cat", "/opt/stub/stubengine/attention.py"])
    assert attention.decode() == shipped_attention, "the shipped module must stay untouched"


def test_serve_flag_change_reruns_none_of_the_kernel_stage(demo, engine):
    project, recipe, _ = demo
    assert build_lane(engine, lanes(project).lane("demo-h2")).status == "built"
    recipe.write_text(recipe.read_text().replace('- "32"\n', '- "24"\n', 1))
    lane = lanes(project).lane("demo-h2")
    outcome = build_lane(engine, lane)
    assert outcome.status == "built"
    kernel_stage = plan_image(lane).dockerfile.split("\n\nFROM ", 1)[0]
    kernel_steps = [line for line in kernel_stage.splitlines() if line and not line.startswith("#")]
    assert not set(outcome.steps_ran) & set(kernel_steps)
    # The changed CMD, then the labels: every one of them in one step, which never comes from the cache.
    assert [step.split(" ", 1)[0] for step in outcome.steps_ran] == ["CMD", "LABEL"]


def drift_the_patched_source(project: Path) -> None:
    """Change a line the stub patch removes, as an upstream bump would."""
    sampler = project / "images/stub-engine/stubengine/rejection_sampler.py"
    patch = (project / "patches/stub-engine/0001-rejection-sampler-guard.patch").read_text()
    removed = next(line[1:] for line in patch.splitlines() if line.startswith("-") and not line.startswith("---"))
    assert removed in sampler.read_text()
    sampler.write_text(sampler.read_text().replace(removed, removed + "  # drifted"))


def test_a_patch_that_no_longer_applies_fails_the_build_with_its_hunk(demo, engine):
    project, _, _ = demo
    drift_the_patched_source(project)
    outcome = build_lane(engine, lanes(project).lane("demo-h2"))
    assert outcome.status == "failed"
    tail = "\n".join(outcome.log_tail)
    assert "conflicts  stub-engine/0001-rejection-sampler-guard.patch" in tail
    assert "@@ " in tail and "drifted" in tail
    assert "patching.py" in outcome.message


def test_a_git_kernel_is_fetched_on_the_host_and_built_without_git_or_network(demo, engine, tmp_path):
    # The builder image (lanectl/base-build) has no git, and this machine no route out: the stage can only
    # succeed from the tree lanectl fetched on the host and sent in the context.
    project, _, _ = demo
    repo = tmp_path / "stub-splitkv.git"
    shutil.copytree(project / "kernels/src/stub-splitkv", repo)
    run = functools.partial(subprocess.run, cwd=repo, check=True, capture_output=True, text=True)
    run(["git", "init", "-q"])
    run(["git", "add", "."])
    run(["git", "-c", "user.email=t@example.com", "-c", "user.name=t", "commit", "-qm", "kernel"])
    commit = run(["git", "rev-parse", "HEAD"]).stdout.strip()
    kernel = project / "kernels/stub-splitkv.yaml"
    kernel.write_text(kernel.read_text().replace("  path: kernels/src/stub-splitkv",
                                                 f"  git: file://{repo}\n  commit: {commit}"))
    said: list[str] = []
    outcome = build_lane(engine, lanes(project).lane("demo-h2"), cache_dir=tmp_path / "cache", say=said.append)
    assert outcome.status == "built", (outcome.message, outcome.log_tail)
    assert said == [f"fetching file://{repo} at {commit[:12]}"]
    assert json.loads(engine.image_labels(outcome.tag)["io.lanectl.kernels"]) == {"stub-splitkv": commit}


def test_a_failing_kernel_smoke_check_fails_the_build(demo, engine):
    project, _, _ = demo
    kernel = project / "kernels/stub-splitkv.yaml"
    kernel.write_text(kernel.read_text().replace("argument: mega_num_splits", "argument: mega_num_blocks"))
    outcome = build_lane(engine, lanes(project).lane("demo-h2"))
    assert outcome.status == "failed"
    assert any("has no argument 'mega_num_blocks'" in line for line in outcome.log_tail)


def test_missing_local_base_says_how_to_make_it(demo, engine):
    project, recipe, _ = demo
    recipe.write_text(recipe.read_text().replace("base: lanectl/base-python:bookworm", "base: lanectl/absent:x"))
    with pytest.raises(OperationFailed, match=r"base image lanectl/absent:x is not on this host; build it with "
                                              r"`make base-image`"):
        build_lane(engine, lanes(project).lane("demo-h1"))


def test_cli_build_json_and_exit_codes(demo, engine):
    project, _, _ = demo

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "lanectl", "build", *args], cwd=project, capture_output=True,
                              text=True, timeout=300)

    built = cli("demo-h1", "--json")
    assert built.returncode == 0, built.stderr
    assert json.loads(built.stdout)["data"]["builds"][0]["status"] == "built"
    drift_the_patched_source(project)
    failed = cli("demo-h2", "--json")
    assert failed.returncode == 1
    assert json.loads(failed.stdout)["data"]["builds"][0]["status"] == "failed"
    shown = cli("demo-h2")
    assert shown.returncode == 1
    assert "failed" in shown.stdout and "last lines of the failing step:" in shown.stderr


def test_built_demo_h2_serves_with_split_kv_active(demo, engine):
    project, _, recipe_id = demo
    tag = build_lane(engine, lanes(project).lane("demo-h2")).tag
    container = docker.from_env().containers.run(tag, detach=True, init=True,
                                                 environment={"STUB_LOAD_SECONDS": "0.2"},
                                                 labels={"io.lanectl.test": recipe_id})
    try:
        deadline, logs = time.monotonic() + 30, ""
        while time.monotonic() < deadline and "Application startup complete" not in logs:
            logs = container.logs().decode()
            time.sleep(0.2)
        assert "Application startup complete" in logs, logs
        assert "split-KV overlay: on, 4 splits at 1 request x 6 query tokens" in logs
    finally:
        container.remove(force=True)


def test_engine_unreachable_is_a_clear_operation_failure(monkeypatch):
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    with pytest.raises(OperationFailed, match="cannot reach the Docker engine"):
        DockerEngine()
