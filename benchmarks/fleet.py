"""Figures for a fleet switch on a real two-node Swarm, against Swarm's own update measured in the same run.

  lanectl: `up B --fleet` from A on both nodes (snapshot, plan, FleetRollout): lease, update each role's service,
           wait for UpdateStatus completed, then the full gate (models, startup log, a generated token), node by node
  raw:     the same ServiceSpecs sent node by node with the docker SDK; wait for UpdateStatus completed,
           then for the node's /health to answer 200 (what a hand-written script would do)
Both poll every 0.5 s. The difference is what lanectl adds on top of Swarm per switch: the lease, the
journal and the gate. The CLI figure adds Python start-up and imports.
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import docker
import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
# The CLI runs in subprocesses too: they must import this checkout's lanectl, not an installed one.
os.environ["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])
# As installed (pip compiles the bytecode), not compiling every lanectl module again on every run.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)

from lanectl.commands.fleet import plan_and_run  # noqa: E402
from lanectl.dockerapi.swarm import SwarmEngine  # noqa: E402
from lanectl.fleet.plan import plan_fleet_up  # noqa: E402
from lanectl.fleet.rollout import FleetOutcome, FleetRollout, pushed_image  # noqa: E402
from lanectl.fleet.services import plan_service  # noqa: E402
from lanectl.image.containers import plan_containers  # noqa: E402
from lanectl.image.render import plan_image  # noqa: E402
from lanectl.project import Project  # noqa: E402
from lanectl.recipe.catalog import Lane, load_catalog  # noqa: E402
from lanectl.state.journal import Journal  # noqa: E402
from lanectl.state.paths import StateFiles  # noqa: E402
from lanectl.state.pushes import PushStore  # noqa: E402
from tests.lane_fixtures import free_port, make_fleet_project, remove_everything  # noqa: E402
from tests.registry_server import missing_registry, start_tls_registry  # noqa: E402
from tests.swarm_cluster import missing_prerequisites, start_two_node_swarm, stop_two_node_swarm  # noqa: E402

REPEAT = 3
POLL_SECONDS = 0.5


class Quiet:
    def step(self, text: str, *, ok: bool = True) -> None: ...

    def gate(self, progress: object) -> None: ...

    def note(self, text: str) -> None: ...


def raw_switch(swarm: SwarmEngine, lane: Lane, image: str, nodes: list[tuple[str, str]]) -> float:
    """Swarm's own update of the same specs (the same image, by digest), node by node, waiting for completed and
    then /health."""
    plan = plan_image(lane)
    port = lane.spec.engine.ports[0].published
    started = time.perf_counter()
    for hostname, addr in nodes:
        services = {(s.role, s.node): s for s in swarm.lane_services()}
        for container in plan_containers(lane, plan):
            container = dataclasses.replace(container, image=image)
            current = services[(container.role, hostname)]
            mark = time.time()
            swarm.update_service(current, plan_service(lane, container, hostname, with_gpus=False,
                                                       inputs=plan.input_hash), os.environ)
            while True:
                service = swarm.service(current.id)
                if service and service.update_state == "completed" and (service.update_started or 0) >= mark - 2:
                    break
                time.sleep(POLL_SECONDS)
        while True:
            try:
                if httpx.get(f"http://{addr}:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(POLL_SECONDS)
    return time.perf_counter() - started


def main() -> None:
    reason = missing_prerequisites() or missing_registry()
    if reason:
        print(f"fleet: skipped ({reason})")
        return
    work = Path(tempfile.mkdtemp(prefix="lanectl-bench-fleet-"))
    cluster = registry = None
    project = make_fleet_project(work)
    state = work / "state"
    try:
        cluster = start_two_node_swarm(work / "swarm")
        # Node 2 pulls from a registry on the manager's veth address, as in tests/test_fleet_swarm.py.
        registry = start_tls_registry(work / "registry", cluster.manager_addr, free_port())
        project.cli("build", "demo-h1", "demo-h2", "--push", "--registry", registry.addr, state=state, check=True,
                    timeout=600)
        catalog = load_catalog(Project.locate(project.root / "recipes"))
        swarm = SwarmEngine()
        pushes = PushStore(state)
        files = StateFiles(state)
        rollout = FleetRollout(catalog, swarm, Journal(files.fleet_journal), reporter=Quiet(),
                               poll_seconds=POLL_SECONDS)
        h1, h2 = catalog.lane("demo-h1"), catalog.lane("demo-h2")

        def up(lane: Lane) -> FleetOutcome:
            return plan_and_run(rollout, files, lambda snapshot: plan_fleet_up(catalog, snapshot, lane,
                                                                                with_gpus=False), [lane], why="bench")

        assert up(h1).result == "ok"
        nodes = [(cluster.manager_hostname, cluster.manager_addr), (cluster.worker_hostname, cluster.worker_addr)]
        lanectl_times, raw_times = [], []
        for _ in range(REPEAT):
            started = time.perf_counter()
            outcome = up(h2)
            assert outcome.result == "ok", outcome.message
            lanectl_times.append(time.perf_counter() - started)
            # Back to h1 the raw way, ready for the next round.
            raw_times.append(raw_switch(swarm, h1, pushed_image(pushes, h1), nodes))
        started = time.perf_counter()
        subprocess.run([sys.executable, "-m", "lanectl", "up", "demo-h2", "--fleet", "--no-gpu"], check=True,
                       capture_output=True, env={**project.env(state)}, cwd=project.root, timeout=600)
        cli = time.perf_counter() - started
        lanectl_s, raw_s = statistics.median(lanectl_times), statistics.median(raw_times)
        print("fleet switch on 2 nodes (stub lanes, medians of 3):")
        print(f"  lanectl up --fleet (library)  {lanectl_s:6.2f} s")
        print(f"  Swarm update + /health wait   {raw_s:6.2f} s   ratio {lanectl_s / raw_s:.2f}x, "
              f"{(lanectl_s - raw_s) * 1000:+.0f} ms for leases, journal and the full gate")
        print(f"  lanectl up --fleet (CLI)      {cli:6.2f} s   ratio {cli / raw_s:.2f}x (one run)")
    finally:
        if cluster is not None:
            for service in docker.from_env().services.list(filters={"label": f"io.lanectl.recipe={project.recipe_id}"}):
                service.remove()
        stop_two_node_swarm(cluster)
        remove_everything(project)
        if registry is not None:
            registry.stop()


if __name__ == "__main__":
    main()
