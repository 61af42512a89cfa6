"""A lane project on the real engine, shared by the lane tests: the demo recipe under a unique id,
unique container names and free host ports, with extra lanes that fail their gate in each way.
Images are built once per session; containers and images are removed at the end."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tests.cli_in_process import run_cli
from tests.conftest import REPO

if TYPE_CHECKING:
    import docker

FAULT_LANES = """
  t-spare:
    description: a third healthy lane
    engine:
      env: {STUB_TOKEN_SEED: "7"}
  t-crashloop:
    description: passes its gate, then crashes 3 s after every start
    engine:
      env: {STUB_FAULT: crash, STUB_FAULT_AFTER_S: "3"}
  t-slow:
    description: takes 8 s to load, inside a 30 s budget
    engine:
      env: {STUB_FAULT: slow_start, STUB_SLOW_START_SECONDS: "8"}
    health:
      startup_budget_minutes: 0.5
  t-crash:
    description: crashes while loading (EngineCore failed to start)
    engine:
      env: {STUB_FAULT: crash_on_start}
  t-unhealthy:
    description: /health answers 503 for ever
    engine:
      env: {STUB_FAULT: unhealthy}
    health:
      startup_budget_minutes: 0.1
  t-autotune:
    description: starts the autotune and goes silent (the 74-minute retune)
    engine:
      env: {STUB_AUTOTUNE_STALL: "1"}
    health:
      startup_log:
        stall:
          - after: "^\\\\[Autotuner\\\\]: Autotuning process starts"
            until: "^\\\\[Autotuner\\\\]: Autotuning process ends"
            minutes: 0.05
            name: autotune
  t-hang:
    description: /health 200 but never generates a token
    engine:
      env: {STUB_FAULT: hang}
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def checked(args: tuple[str, ...], result: subprocess.CompletedProcess[str],
            check: bool) -> subprocess.CompletedProcess[str]:
    if check and result.returncode != 0:
        raise AssertionError(f"lanectl {' '.join(args)} exited {result.returncode}\n{result.stdout}\n{result.stderr}")
    return result


@dataclass
class LaneProject:
    root: Path
    recipe_id: str
    prefix: str

    def env(self, state: Path) -> dict[str, str]:
        environment = {key: value for key, value in os.environ.items() if not key.startswith("LANECTL_")}
        # The engine lock of this project's tests: one engine serves every test run at once, and a switch in
        # another module's test must not make this one wait (the production default is /run/lock/lanectl).
        environment.update({"LANECTL_STATE_DIR": str(state), "LANECTL_RECIPES": str(self.root / "recipes"),
                            "LANECTL_LOCK_DIR": str(self.root / "engine-lock"), "COLUMNS": "200"})
        return environment

    def cli(self, *args: str, state: Path, check: bool = False, timeout: float = 180,
            extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        result = subprocess.run([sys.executable, "-m", "lanectl", *args], cwd=self.root, capture_output=True,
                                text=True, timeout=timeout, env={**self.env(state), **(extra_env or {})})
        return checked(args, result, check)

    def invoke(self, *args: str, state: Path, check: bool = False, timeout: float = 180,
               extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        """As `cli`, in this process (tests/cli_in_process.py): for what the command does, where `cli` holds what
        the installed command's process does (a kill mid-switch, signals, its exit status, a timed run)."""
        result = run_cli(*args, cwd=self.root, env={**self.env(state), **(extra_env or {})}, timeout=timeout)
        return checked(args, result, check)

    def container(self, lane: str, role: str = "primary") -> str:
        return f"{self.prefix}-{lane}" + ("" if role == "primary" else f"-{role}")

    def edit_lane(self, lane: str, block: str) -> None:
        """Add fields to one lane of the test recipe (maps merge into the defaults, lists replace)."""
        recipe = self.root / "recipes" / "lanes.yaml"
        text = recipe.read_text()
        head = re.search(rf"^  {re.escape(lane)}:\n(    description: .*\n)?", text, re.MULTILINE)
        assert head, lane
        recipe.write_text(text[:head.end()] + block + text[head.end():])


DEMO_PORTS = {"demo-h1": (18000, 18001), "demo-h2": (18010, 18011), "demo-h2-8": (18040, 18041),
              "demo-broken": (18020, 18021)}
DEMO_GPUS = re.compile(r"^(?:    # As h1-REF/h2-REF: GPU .*\n)?\s+gpus: \{device_ids: \[\"[01]\"\]\}\n", re.MULTILINE)
# A `companions:` key and every line indented deeper than it (the defaults' and each lane's).
COMPANIONS_BLOCK = re.compile(r"^(?P<indent> *)companions:\n(?:(?P=indent) +\S.*\n)*", re.MULTILINE)
STANDBY_BLOCK = re.compile(r"^  # standby: begin\n.*^  # standby: end\n", re.MULTILINE | re.DOTALL)


# The demo's stop timeout (30 s) drains 15 s: a test lane that never finishes a request (t-hang) would wait that out
# at every stop. The tests' lanes drain 3 s, which their short requests fit; the drain tests ask for the demo's.
TEST_STOP_TIMEOUT_SECONDS = 18


def make_lane_project(base: Path, *, standby: bool = False, extra_lanes: str = FAULT_LANES,
                      stop_timeout_seconds: int = TEST_STOP_TIMEOUT_SECONDS, companions: bool = True) -> LaneProject:
    """The demo recipe for tests. Without `standby`, its standby block is cut out and every lane publishes the
    same two host ports, so lanes switch stop-first exactly as before standbys existed; with it, each demo
    lane keeps its own ports (a sleeping lane holds its port). Without `companions`, every lane is its primary
    alone: for tests whose claim is not about companions, half the containers to start and stop."""
    unique = uuid.uuid4().hex[:8]
    root = base / "lanes-project"
    for part in ("images", "kernels", "patches"):
        shutil.copytree(REPO / part, root / part, ignore=shutil.ignore_patterns("__pycache__"))
    (root / "recipes").mkdir()
    text = (REPO / "recipes" / "demo" / "stub.yaml").read_text()
    primary_port, rtx_port = free_port(), free_port()
    if not standby:
        text, cut = STANDBY_BLOCK.subn("", text)
        assert cut == 1, "the demo recipe's standby block is marked by '# standby: begin/end'"
        # Nor the GPU requests that standbys need: these lanes conflict by their shared port, and a test may
        # give a lane its GPUs itself.
        text, cut = DEMO_GPUS.subn("", text)
        assert cut == 2, "the demo's primary and rtx GPU requests"
    for lane, (primary, rtx) in DEMO_PORTS.items():
        assert f"host: {primary}," in text and f"host: {rtx}," in text, lane
        if lane == "demo-h1" or not standby:
            text = text.replace(f"host: {primary},", f"host: {primary_port},").replace(f"host: {rtx},",
                                                                                      f"host: {rtx_port},")
        else:
            text = text.replace(f"host: {primary},", f"host: {free_port()},").replace(f"host: {rtx},",
                                                                                     f"host: {free_port()},")
    text = (text.replace("id: demo-stub", f"id: lt-{unique}")
            .replace('container: "lanectl-demo-{lane}"', f'container: "lt-{unique}-{{lane}}"')
            .replace('STUB_LOAD_SECONDS: "2"', 'STUB_LOAD_SECONDS: "0.3"')
            .replace('STUB_LOAD_SECONDS: "1"', 'STUB_LOAD_SECONDS: "0.2"')
            .replace("poll_interval_seconds: 0.5", "poll_interval_seconds: 0.2")
            # The watchdog tests drive faults through the stub's admin endpoint, probe generation on
            # every pass, and restart without backoff waits, at most twice before a rollback.
            .replace('STUB_DECODE_TOKENS_PER_S: "100"', 'STUB_DECODE_TOKENS_PER_S: "100"\n      STUB_ADMIN: "1"')
            .replace("interval_seconds: 10", "interval_seconds: 0.1")
            .replace("stop_timeout_seconds: 30\n", f"stop_timeout_seconds: {stop_timeout_seconds}\n")
            # A hung stub answers a generation never: the tests that wait for its probes to time out wait 2 s each.
            .replace("      timeout_seconds: 5\n", "      timeout_seconds: 2\n")
            .replace("max_restarts: 3", "max_restarts: 2")
            .replace("backoff_initial_seconds: 1", "backoff_initial_seconds: 0"))
    assert f"host: {primary_port}" in text and f"lt-{unique}" in text
    if not companions:
        text, cut = COMPANIONS_BLOCK.subn("", text)
        assert cut >= 1 and "rtx" not in text.split("\nlanes:", 1)[1], "every companions block is cut"
    (root / "recipes" / "lanes.yaml").write_text(text.rstrip() + "\n" + extra_lanes)
    return LaneProject(root=root, recipe_id=f"lt-{unique}", prefix=f"lt-{unique}")


LOCAL_LANE = "t-local"


def make_fleet_project(base: Path) -> LaneProject:
    """The demo recipe placed on Swarm, plus one lane that stays on the local engine with its own ports."""
    project = make_lane_project(base)
    path = project.root / "recipes" / "lanes.yaml"
    text = path.read_text()
    text = text.replace("\ndefaults:\n", "\ndefaults:\n  placement: {backend: swarm}\n", 1)
    # Swarm publishes each port on every address of its node, the dev-mode routes with it: the recipe says so.
    text = text.replace("host_ip: 127.0.0.1}", "host_ip: 127.0.0.1, public: true}")
    # The fault lanes' waits are Swarm's timers here, paid at every update and rollback. t-unhealthy's budget is
    # its health check's start period, whose failures do not count: at 1.2 s Swarm finds it unhealthy at its
    # third check (6 s) instead of its sixth. t-hang never finishes a request: its probes hang until its drain
    # ends, so it drains 1 s (the least its stop timeout may leave), and its generation probe gives up after 1 s.
    for old, new in (("      env: {STUB_FAULT: unhealthy}\n    health:\n      startup_budget_minutes: 0.1\n",
                      "      env: {STUB_FAULT: unhealthy}\n    health:\n      startup_budget_minutes: 0.02\n"),
                     ("      env: {STUB_FAULT: hang}\n",
                      "      env: {STUB_FAULT: hang}\n      stop_timeout_seconds: 16\n"
                      "    health:\n      generation_probe: {timeout_seconds: 1}\n")):
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    local_port, local_rtx_port = free_port(), free_port()
    text += f"""
  {LOCAL_LANE}:
    description: not placed on Swarm; runs on this box's engine beside the fleet
    placement: {{backend: local}}
    engine:
      ports: [{{container: 8000, host: {local_port}, host_ip: 127.0.0.1}}]
    companions:
      rtx:
        engine:
          ports: [{{container: 8001, host: {local_rtx_port}, host_ip: 127.0.0.1}}]
"""
    path.write_text(text)
    return project


def remove_containers(project: LaneProject) -> None:
    import docker

    client = docker.from_env()
    for container in client.containers.list(all=True, filters={"label": f"io.lanectl.recipe={project.recipe_id}"}):
        remove_container(client, container.id)


def remove_container(client: docker.DockerClient, container_id: str, timeout: float = 60) -> None:
    """Force-remove a container, tolerating an engine that is already removing it (a Swarm service's
    removal takes its task containers away on its own): then wait until it is gone."""
    import docker

    deadline = time.monotonic() + timeout
    while True:
        try:
            client.api.remove_container(container_id, force=True)
            return
        except docker.errors.NotFound:
            return
        except docker.errors.APIError as exc:
            if exc.status_code != 409 or time.monotonic() > deadline:
                raise
            time.sleep(0.2)  # 409: "removal of container … is already in progress"


def remove_everything(project: LaneProject) -> None:
    import docker

    remove_containers(project)
    client = docker.from_env()
    for image in client.images.list(filters={"label": f"io.lanectl.recipe={project.recipe_id}"}):
        client.images.remove(image.id, force=True)
