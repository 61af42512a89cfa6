"""`make bench`: figures for recipes → images, each next to a baseline measured in the same run.

Figures, not pass/fail: these machines are shared and noisy, so targets live here, not in tests.
  1. render time for all lanes (validate + plan every image) vs. yaml.safe_load of the same files
  2. no-op rebuild time of lanectl vs. Docker's own fully cached build of the same context
  3. build steps re-run when only a serve flag of demo-h2 (a lane with a kernel stage) changes
"""

from __future__ import annotations

import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
# The CLI runs in subprocesses too: they must import this checkout's lanectl, not an installed one.
os.environ["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])
# As installed (pip compiles the bytecode), not compiling every lanectl module again on every run.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)

from lanectl.dockerapi.containers import DockerEngine  # noqa: E402
from lanectl.image.build import build_lane  # noqa: E402
from lanectl.image.render import plan_image  # noqa: E402
from lanectl.project import Project  # noqa: E402
from lanectl.recipe.catalog import load_catalog  # noqa: E402


def timed(action, repeat: int) -> float:
    """Median wall time of `repeat` runs, in seconds."""
    samples = []
    for _ in range(repeat):
        started = time.perf_counter()
        action()
        samples.append(time.perf_counter() - started)
    return statistics.median(samples)


def bench_render(project: Project) -> None:
    from lanectl.recipe.catalog import recipe_files

    files = recipe_files(project)

    def render_all() -> None:
        catalog = load_catalog(project)
        for lane in catalog.lanes.values():
            plan_image(lane)

    def parse_only() -> None:
        for file in files:
            yaml.safe_load(file.read_text())

    lanes = len(load_catalog(project).lanes)
    ours, floor = timed(render_all, 20), timed(parse_only, 20)
    print(f"render, all {lanes} lanes (validate + plan): {ours * 1000:7.1f} ms   "
          f"baseline yaml.safe_load only: {floor * 1000:6.1f} ms   ratio {ours / floor:5.1f}x")


def bench_builds(project_root: Path, engine: DockerEngine) -> None:
    recipe = project_root / "recipes" / "demo" / "stub.yaml"
    catalog = load_catalog(Project.locate(project_root / "recipes"))
    lane = catalog.lane("demo-h2")
    first = build_lane(engine, lane)
    print(f"first build of demo-h2: {first.seconds:6.2f} s ({first.steps_run} of {first.steps_total} steps run; "
          "layers cached by earlier builds on this host are reused)")

    plan = plan_image(lane)
    ours = timed(lambda: build_lane(engine, lane), 5)
    docker_cached = timed(lambda: engine.build(plan.context_tar(plan.labels), plan.tag, no_cache=False), 5)
    print(f"no-op rebuild: lanectl {ours * 1000:7.1f} ms   baseline docker build, all steps cached: "
          f"{docker_cached * 1000:7.1f} ms   ratio {ours / docker_cached:5.2f}x")

    recipe.write_text(recipe.read_text().replace('- "32"\n', '- "24"\n', 1))
    changed_lane = load_catalog(Project.locate(project_root / "recipes")).lane("demo-h2")
    outcome = build_lane(engine, changed_lane)
    kernel_stage = plan_image(changed_lane).dockerfile.split("\n\nFROM ", 1)[0]
    kernel_steps = {line for line in kernel_stage.splitlines() if line and not line.startswith(("#", "FROM"))}
    rerun_kernel = [step for step in outcome.steps_ran if step in kernel_steps]
    rerun_other = [step.split(" ", 1)[0] for step in outcome.steps_ran if step not in kernel_steps]
    print(f"serve flag changed on demo-h2: {outcome.steps_run} of {outcome.steps_total} steps re-run; "
          f"kernel stage {len(rerun_kernel)} of {len(kernel_steps)} (target 0); re-run: {', '.join(rerun_other)}; "
          f"{outcome.seconds:5.2f} s")


def main() -> int:
    bench_render(Project.locate(REPO / "recipes"))
    engine = DockerEngine()
    recipe_id = f"bench-{uuid.uuid4().hex[:8]}"
    with tempfile.TemporaryDirectory(prefix="lanectl-bench-") as tmp:
        root = Path(tmp)
        for part in ("images", "kernels", "patches", "recipes"):
            shutil.copytree(REPO / part, root / part, ignore=shutil.ignore_patterns("__pycache__"))
        recipe = root / "recipes" / "demo" / "stub.yaml"
        recipe.write_text(recipe.read_text().replace("id: demo-stub", f"id: {recipe_id}"))
        try:
            bench_builds(root, engine)
        finally:
            # lanectl's engine adapter has no image removal (it never prunes): the SDK cleans up, as registry.py does.
            import docker

            client = docker.from_env()
            for image in client.images.list(filters={"label": f"io.lanectl.recipe={recipe_id}"}):
                client.images.remove(image.id, force=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
