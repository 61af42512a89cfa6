"""`lanectl build --push` against a real registry (Debian's docker-registry, started by scripts/registry.sh).

Each test builds the demo recipe under its own id, so its own repository in the registry, and keeps its
state (push records, journal) in its own folder. Broken registries (stopped, read-only, full) are real
registries too, started for the one test that needs them.
"""

from __future__ import annotations

import json
import os
import pty
import shutil
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

import docker
import pytest

from lanectl.errors import OperationFailed
from lanectl.fleet.rollout import pushed_image
from lanectl.project import Project
from lanectl.recipe.catalog import load_catalog
from lanectl.state.pushes import PushStore
from tests.cli_in_process import run_cli
from tests.conftest import REPO
from tests.lane_fixtures import free_port
from tests.registry_server import Registry, start_registry
from tests.test_build_docker import drift_the_patched_source

pytestmark = pytest.mark.docker


@dataclass
class Demo:
    root: Path
    recipe: Path
    recipe_id: str
    state: Path

    @property
    def repository(self) -> str:
        return f"lanectl/{self.recipe_id}"

    def cli(self, *args: str, state: Path | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        """lanectl in this process (tests/cli_in_process.py); the terminal test below runs the real command."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("LANECTL_")}
        env.update(LANECTL_STATE_DIR=str(state or self.state), COLUMNS="200")
        return run_cli(*args, cwd=self.root, env=env, timeout=timeout)

    def build_json(self, *args: str, state: Path | None = None) -> tuple[int, dict[str, dict]]:
        result = self.cli("build", *args, "--json", state=state)
        assert result.stdout, result.stderr
        return result.returncode, {b["lane"]: b for b in json.loads(result.stdout)["data"]["builds"]}

    def catalog(self):
        return load_catalog(Project.locate(self.root / "recipes"))

    def tag(self, lane: str) -> str:
        from lanectl.image.render import plan_image

        return plan_image(self.catalog().lane(lane)).tag

    def remove_images(self) -> None:
        client = docker.from_env()
        for image in client.images.list(filters={"label": f"io.lanectl.recipe={self.recipe_id}"}):
            client.images.remove(image.id, force=True)


@pytest.fixture
def demo(project: Path, tmp_path: Path):
    recipe_id = f"reg-{uuid.uuid4().hex[:10]}"
    recipe = project / "recipes" / "stub.yaml"
    shipped = (REPO / "recipes" / "demo" / "stub.yaml").read_text()
    recipe.write_text(shipped.replace("id: demo-stub", f"id: {recipe_id}"))
    made = Demo(project, recipe, recipe_id, tmp_path / "state")
    yield made
    made.remove_images()


def journal_pushes(state: Path) -> list[dict]:
    journal = state / "journal.jsonl"
    if not journal.exists():
        return []
    records = [json.loads(line) for line in journal.read_text().splitlines() if line.strip()]
    return [r for r in records if r.get("event") == "push"]


def nothing_recorded(state: Path) -> bool:
    return not list((state / "pushes").glob("*")) if (state / "pushes").exists() else True


def test_push_records_the_registry_digest_and_a_rerun_pushes_nothing(demo: Demo, registry: Registry):
    code, builds = demo.build_json("demo-h1", "--push", "--registry", registry.addr)
    assert code == 0, builds
    first = builds["demo-h1"]
    tag = demo.tag("demo-h1")
    content_tag = tag.rpartition(":")[2]
    held = registry.digest(demo.repository, content_tag)
    assert (first["status"], first["push"]) == ("built", "pushed")
    assert first["digest"] == held, "the digest recorded is the one the registry serves"
    assert first["remote_tag"] == f"{registry.addr}/{tag}"
    assert first["reference"] == f"{registry.addr}/{demo.repository}@{held}"
    assert first["inputs"].startswith(content_tag.rpartition("-")[2]) and first["tag"] == tag
    assert registry.digest(demo.repository, "demo-h1") is None, "only the content tag is pushed, never a moving one"

    record = PushStore(demo.state).find(tag, registry.addr)
    assert record is not None and record.reference == first["reference"]
    assert [(r["lane"], r["digest"], r["pushed"]) for r in journal_pushes(demo.state)] == [("demo-h1", held, True)]
    status = json.loads(demo.cli("status", "--json").stdout)["data"]
    row = next(r for r in status["lanes"] if r["lane"] == "demo-h1")
    assert row["pushed"]["reference"] == first["reference"]
    assert "    pushed   " + first["reference"] in demo.cli("status").stdout

    code, again = demo.build_json("demo-h1", "--push", "--registry", registry.addr)
    assert code == 0
    assert (again["demo-h1"]["status"], again["demo-h1"]["push"], again["demo-h1"]["digest"]) == (
        "skipped", "skipped", held)
    assert "already in the registry" in again["demo-h1"]["message"]
    assert len(journal_pushes(demo.state)) == 1, "a no-op adds nothing to the journal"
    text = demo.cli("build", "demo-h1", "--push", "--registry", registry.addr)
    assert text.returncode == 0 and text.stdout.startswith("skipped   demo-h1:"), text.stdout


def test_a_fresh_host_records_the_registry_copy_without_building_and_pulls_it_by_digest(demo: Demo,
                                                                                       registry: Registry):
    code, builds = demo.build_json("demo-h1", "--push", "--registry", registry.addr)
    assert code == 0, builds
    reference = builds["demo-h1"]["reference"]
    demo.remove_images()  # as a CI runner or a fleet manager that never built it
    fresh_state = demo.state.parent / "fresh-state"
    code, builds = demo.build_json("demo-h1", "--push", "--registry", registry.addr, state=fresh_state)
    assert code == 0, builds
    assert (builds["demo-h1"]["status"], builds["demo-h1"]["reference"]) == ("skipped", reference)
    assert "nothing built here" in builds["demo-h1"]["message"]
    assert docker.from_env().images.list(filters={"label": f"io.lanectl.recipe={demo.recipe_id}"}) == []
    assert PushStore(fresh_state).find(demo.tag("demo-h1")).reference == reference

    pulled = docker.from_env().images.pull(reference)
    assert pulled.labels["io.lanectl.lane"] == "demo-h1"
    assert pulled.labels["io.lanectl.inputs"] == builds["demo-h1"]["inputs"]


def test_the_recipe_names_the_registry_and_the_fleet_image_is_the_recorded_digest(demo: Demo, registry: Registry):
    text = demo.recipe.read_text().replace("    python_site: /opt/stub\n",
                                           f"    python_site: /opt/stub\n    registry: {registry.addr}\n")
    demo.recipe.write_text(text)
    lane = demo.catalog().lane("demo-h1")
    with pytest.raises(OperationFailed, match=r"demo-h1: image .* has not been pushed to a registry.*"
                                              r"`lanectl build demo-h1 --push`"):
        pushed_image(PushStore(demo.state), lane)
    code, builds = demo.build_json("demo-h1", "--push")
    assert code == 0 and builds["demo-h1"]["registry"] == registry.addr, builds
    assert pushed_image(PushStore(demo.state), lane) == builds["demo-h1"]["reference"]


def test_a_content_tag_the_registry_holds_as_another_image_is_refused(demo: Demo, registry: Registry):
    code, builds = demo.build_json("demo-h1", "--push", "--registry", registry.addr)
    assert code == 0, builds
    held = builds["demo-h1"]["digest"]
    demo.remove_images()
    rebuilt = demo.cli("build", "demo-h1", "--no-cache")  # same inputs, other bytes (build timestamps)
    assert rebuilt.returncode == 0, rebuilt.stderr
    other_state = demo.state.parent / "other-state"
    code, builds = demo.build_json("demo-h1", "--push", "--registry", registry.addr, state=other_state)
    assert code == 1
    refused = builds["demo-h1"]
    assert (refused["status"], refused["push"], refused["digest"]) == ("failed", "refused", None)
    assert "another image than this host's" in refused["message"] and "content tags never move" in refused["message"]
    assert registry.digest(demo.repository, demo.tag("demo-h1").rpartition(":")[2]) == held, "the tag did not move"
    assert nothing_recorded(other_state) and journal_pushes(other_state) == []


def test_every_lane_is_attempted_and_reported_and_only_pushed_ones_are_recorded(demo: Demo, registry: Registry):
    drift_the_patched_source(demo.root)  # demo-h2's patch no longer applies; demo-h1 has no patch
    code, builds = demo.build_json("demo-h2", "demo-h1", "--push", "--registry", registry.addr)
    assert code == 1
    assert (builds["demo-h2"]["status"], builds["demo-h2"]["push"]) == ("failed", None)
    assert builds["demo-h2"]["log_tail"], "the failing step's output is reported"
    assert (builds["demo-h1"]["status"], builds["demo-h1"]["push"]) == ("built", "pushed")
    assert set(builds["demo-h1"]) >= {"tag", "digest", "inputs", "status", "push", "seconds", "build_seconds",
                                      "push_seconds"}
    store = PushStore(demo.state)
    assert store.find(demo.tag("demo-h1")) is not None and store.find(demo.tag("demo-h2")) is None


def test_push_progress_is_shown_per_layer_on_a_terminal(demo: Demo, registry: Registry):
    main, terminal = pty.openpty()
    env = {k: v for k, v in os.environ.items() if not k.startswith("LANECTL_")}
    env.update(LANECTL_STATE_DIR=str(demo.state), COLUMNS="160", TERM="xterm")
    process = subprocess.Popen([sys.executable, "-m", "lanectl", "build", "demo-h1", "--push", "--registry",
                                registry.addr], cwd=demo.root, stdin=terminal, stdout=terminal, stderr=terminal,
                               env=env)
    os.close(terminal)
    screen = b""
    while True:
        try:
            chunk = os.read(main, 65536)
        except OSError:  # EIO: the terminal's other end is closed
            break
        if not chunk:
            break
        screen += chunk
    os.close(main)
    assert process.wait(timeout=300) == 0, screen.decode(errors="replace")
    text = screen.decode(errors="replace")
    # The engine names each layer by the first 12 hex of its diff id.
    layers = docker.from_env().images.get(demo.tag("demo-h1")).attrs["RootFS"]["Layers"]
    assert all(f"layer {layer.removeprefix('sha256:')[:12]}" in text for layer in layers), text
    assert any(state in text for state in ("Pushed", "Layer already exists", "Mounted from")), text


def test_no_registry_named_is_bad_input_and_builds_nothing(demo: Demo):
    result = demo.cli("build", "demo-h1", "demo-h2", "--push")
    assert result.returncode == 2
    assert "nowhere to push demo-h1, demo-h2: set image.registry in the recipe, or pass --registry" in result.stderr
    bad = demo.cli("build", "demo-h1", "--push", "--registry", "not a registry")
    assert bad.returncode == 2 and "--registry: 'not a registry' is not a registry" in bad.stderr
    assert docker.from_env().images.list(filters={"label": f"io.lanectl.recipe={demo.recipe_id}"}) == []


def test_a_wrong_registry_in_the_recipe_is_a_validation_error_at_its_line(demo: Demo):
    demo.recipe.write_text(demo.recipe.read_text().replace(
        "    python_site: /opt/stub\n", "    python_site: /opt/stub\n    registry: Registry_Host/Team\n"))
    result = demo.cli("build", "demo-h1", "--push")
    assert result.returncode == 2
    line = demo.recipe.read_text().splitlines().index("    registry: Registry_Host/Team") + 1
    assert f"recipes/stub.yaml:{line}:15: defaults.image.registry: 'Registry_Host/Team' is not a registry" in (
        result.stderr)


def test_an_unreachable_registry_fails_the_lane_with_its_cause_and_records_nothing(demo: Demo, tmp_path: Path):
    stopped = start_registry(tmp_path / "stopped", f"127.0.0.1:{free_port()}")
    stopped.stop()
    code, builds = demo.build_json("demo-h1", "--push", "--registry", stopped.addr)
    assert code == 1
    failed = builds["demo-h1"]
    assert (failed["status"], failed["push"], failed["digest"]) == ("failed", "failed", None)
    assert f"cannot reach the registry {stopped.addr}" in failed["message"] and "connection refused" in (
        failed["message"])
    assert nothing_recorded(demo.state) and journal_pushes(demo.state) == []


def test_a_read_only_registry_refuses_the_push_and_nothing_is_recorded(demo: Demo, tmp_path: Path):
    read_only = start_registry(tmp_path / "ro", f"127.0.0.1:{free_port()}", "--readonly")
    try:
        code, builds = demo.build_json("demo-h1", "--push", "--registry", read_only.addr)
    finally:
        read_only.stop()
    assert code == 1
    failed = builds["demo-h1"]
    assert (failed["status"], failed["push"], failed["digest"]) == ("failed", "failed", None)
    assert f"the registry {read_only.addr} refuses writes" in failed["message"]
    assert "built lanectl/" in failed["message"], "the build itself succeeded and says so"
    assert nothing_recorded(demo.state) and journal_pushes(demo.state) == []


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("mount") is None, reason="a tmpfs mount needs root")
def test_a_full_registry_fails_the_push_part_way_and_leaves_nothing_recorded(demo: Demo, tmp_path: Path):
    # 2 MB holds the lane's small layers but not the 61 MB base layer: some blobs land, the manifest never does.
    # The engine retries a failed upload 5 times over ~50 s before it gives up.
    storage = tmp_path / "full"
    storage.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(storage)], check=True)
    full: Registry | None = None
    try:
        full = start_registry(tmp_path / "full-registry", f"127.0.0.1:{free_port()}", "--storage", str(storage))
        code, builds = demo.build_json("demo-h1", "--push", "--registry", full.addr)
        assert code == 1
        failed = builds["demo-h1"]
        assert (failed["status"], failed["push"], failed["digest"]) == ("failed", "failed", None)
        assert f"the registry {full.addr} failed to store the upload" in failed["message"], failed["message"]
        assert "no space left on device" in full.log(), "the registry's own log names the cause"
        assert full.digest(demo.repository, demo.tag("demo-h1").rpartition(":")[2]) is None
        assert nothing_recorded(demo.state) and journal_pushes(demo.state) == []
    finally:
        if full is not None:
            full.stop()
        subprocess.run(["umount", "-l", str(storage)], check=False)
