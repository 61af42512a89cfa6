"""Figures for lanes (issue: Lanes), each against the raw Docker sequence measured in the same run.

  what one switch costs (issue 30): Docker requests, image plans built per lane, state-file loads
  switch: `lanectl up B` from A  vs  stop A (companion, primary); start B (primary, companion);
          poll B's /health at the recipe's poll interval until 200
  rollback to kept containers  vs  the same raw sequence back
  status: `lanectl status` on 2 recipes, 6 lanes, 1 serving  vs  `docker ps`
  `lanectl --help`
Both the library call (what lanectl adds) and the CLI (what an operator waits for, Python
start-up and imports included) are shown.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
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

from lanectl.dockerapi.containers import ContainerEngine  # noqa: E402
from lanectl.lanes.standby import role_base_url  # noqa: E402
from lanectl.lanes.switcher import LaneSwitcher  # noqa: E402
from lanectl.project import Project  # noqa: E402
from lanectl.recipe.catalog import load_catalog  # noqa: E402
from lanectl.state.journal import Journal  # noqa: E402
from lanectl.state.lanes import LaneStateStore  # noqa: E402
from lanectl.state.paths import StateFiles  # noqa: E402
from tests.lane_fixtures import FAULT_LANES, make_lane_project, remove_everything  # noqa: E402

REPEAT = 3
# Targets (issue 12, then issue 30): the CLI's switch within 250 ms of the raw sequence (stretch: 1.10x), status
# in 300 ms, --help in 200 ms; a switch of two two-container lanes in at most 15 Docker requests, each lane's
# image plan built once, each state file loaded once.
SWITCH_OVERHEAD_TARGET_MS = 250
SWITCH_REQUESTS_TARGET = 15
SWITCH_RATIO_STRETCH = 1.10
STATUS_TARGET_MS = 300
HELP_TARGET_MS = 200


class Quiet:
    def step(self, text: str, *, ok: bool = True) -> None: ...

    def gate(self, progress: object) -> None: ...

    def note(self, text: str) -> None: ...


def raw_switch(client: docker.DockerClient, stop: list[str], start: list[str], urls: list[str],
               interval: float) -> float:
    """The switch by hand: stop, start, then poll until every started engine (primary and companion, as lanectl's
    gate waits for) answers /health 200."""
    started = time.perf_counter()
    for name in stop:
        client.api.stop(name, timeout=10)
    for name in start:
        client.api.start(name)
    waiting = list(urls)
    while True:
        for url in list(waiting):
            try:
                if httpx.get(url, timeout=2).status_code == 200:
                    waiting.remove(url)
            except httpx.HTTPError:
                pass
        if not waiting:
            return time.perf_counter() - started
        time.sleep(interval)


class Counts:
    """What one switch does, counted in this process: Docker requests (the engine client's own count), image
    plans built (per lane) and state files loaded. Counting wraps the functions; nothing else changes."""

    def __init__(self, engine: ContainerEngine) -> None:
        from collections import Counter

        from lanectl.lanes import snapshot
        from lanectl.state.standby import StandbyStore

        self.engine, self.seen = engine, Counter[str]()
        build, lanes_load, standby_load = snapshot.plan_image, LaneStateStore.load, StandbyStore.load

        def counted_plan(lane, *args, **kwargs):
            self.seen[f"image plan {lane.name}"] += 1
            return build(lane, *args, **kwargs)

        def counted_state(store):
            self.seen["state.json loads"] += 1
            return lanes_load(store)

        def counted_standby(store):
            self.seen["standby.json loads"] += 1
            return standby_load(store)

        snapshot.plan_image = counted_plan
        LaneStateStore.load = counted_state  # type: ignore[method-assign]
        StandbyStore.load = counted_standby  # type: ignore[method-assign]

    def of(self, switch) -> dict[str, int]:
        self.seen.clear()
        before = self.engine.api.requests
        switch()
        return {"Docker requests": self.engine.api.requests - before, **dict(sorted(self.seen.items()))}


def median(samples: list[float]) -> float:
    return statistics.median(samples)


class Timed:
    """Wall time and the CPU time of the processes run inside (the CLI's own work, whatever else
    the machine is doing), per run."""

    def __init__(self) -> None:
        self.wall: list[float] = []
        self.cpu: list[float] = []

    def __enter__(self) -> Timed:
        self.started, self.usage = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
        return self

    def __exit__(self, *exc: object) -> None:
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        self.wall.append(time.perf_counter() - self.started)
        self.cpu.append(usage.ru_utime - self.usage.ru_utime + usage.ru_stime - self.usage.ru_stime)

    def cpu_ms(self) -> str:
        return f"CPU {median(self.cpu) * 1000:4.0f} ms"


def main() -> int:
    client = docker.from_env()
    with tempfile.TemporaryDirectory(prefix="lanectl-bench-lanes-") as tmp:
        lanes = make_lane_project(Path(tmp))
        state = Path(tmp) / "state"
        try:
            lanes.cli("build", "demo-h1", "demo-h2", state=state, check=True, timeout=600)
            os.environ["LANECTL_STATE_DIR"] = str(state)
            catalog = load_catalog(Project.locate(lanes.root / "recipes"))
            a, b = catalog.lane("demo-h1"), catalog.lane("demo-h2")
            state.mkdir(parents=True, exist_ok=True)
            engine = ContainerEngine()
            switcher = LaneSwitcher(catalog, engine, Journal(StateFiles(state).journal),
                                    LaneStateStore(StateFiles(state).lanes), reporter=Quiet(), no_gpu=True)
            assert switcher.up(a).result == "ok" and switcher.up(b).result == "ok"  # both lanes' containers exist
            counts = Counts(engine)
            to_a = counts.of(lambda: switcher.up(a))
            back = counts.of(lambda: switcher.rollback(None))
            for label, counted in (("switch B->A (kept containers), `up`", to_a),
                                   ("switch A->B (kept containers), `rollback`", back)):
                requests = counted["Docker requests"]
                print(f"{label}: " + ", ".join(f"{k} {v}" for k, v in counted.items())
                      + f"   target <= {SWITCH_REQUESTS_TARGET} requests, each plan and file once: "
                      + ("met" if requests <= SWITCH_REQUESTS_TARGET and max(counted.values()) == requests
                         and all(v == 1 for k, v in counted.items() if k != "Docker requests") else "MISSED"))
            interval = b.spec.health.poll_interval_seconds

            def names(lane):
                return [lane.container_name(role) for role in lane.roles]

            def health_urls(lane):
                return [role_base_url(lane, role) + "/health" for role in lane.roles]

            ours, raw = [], []
            cli, rollback_cli = Timed(), Timed()
            for _ in range(REPEAT):
                # b is serving: library switch to a, raw back to b, CLI to a, raw back to b.
                started = time.perf_counter()
                assert switcher.up(a).result == "ok"
                ours.append(time.perf_counter() - started)
                raw.append(raw_switch(client, names(a)[::-1], names(b), health_urls(b), interval))
                switcher.states.update(lambda s: s.with_active("demo-h2"))
                with cli:
                    lanes.cli("up", "demo-h1", "--no-gpu", state=state, check=True)
                with rollback_cli:
                    lanes.cli("rollback", "--no-gpu", state=state, check=True)
            raw_back = [raw_switch(client, names(b)[::-1], names(a), health_urls(a), interval) for _ in range(1)]
            switcher.states.update(lambda s: s.with_active("demo-h1"))

            def line(label: str, ours_s: float, raw_s: float, target: bool = True, cpu: str = "") -> str:
                overhead = 1000 * (ours_s - raw_s)
                verdict = ""
                if target:
                    stretch = "met" if ours_s / raw_s <= SWITCH_RATIO_STRETCH else "missed"
                    verdict = (f"   target +{SWITCH_OVERHEAD_TARGET_MS} ms: "
                               f"{'met' if overhead <= SWITCH_OVERHEAD_TARGET_MS else 'MISSED'}, "
                               f"stretch {SWITCH_RATIO_STRETCH:.2f}x: {stretch}")
                return (f"{label:<38} lanectl {ours_s:6.2f} s   raw docker {raw_s:6.2f} s   "
                        f"ratio {ours_s / raw_s:5.2f}x   overhead {overhead:+7.0f} ms{verdict}"
                        + (f"   (lanectl's {cpu})" if cpu else ""))

            print(f"switch A->B, {REPEAT} runs each, medians (poll interval {interval} s, stub load 0.3 s):")
            print(line("  library call LaneSwitcher.up", median(ours), median(raw), target=False))
            print(line("  CLI `lanectl up`", median(cli.wall), median(raw), cpu=cli.cpu_ms()))
            print(line("  CLI `lanectl rollback` (kept)", median(rollback_cli.wall), median(raw + raw_back),
                       cpu=rollback_cli.cpu_ms()))

            # The shape status is asked about: two recipes (the demo's four lanes and the GB300 recipe's
            # two), six lanes, one of them serving (demo-h1, left serving above).
            status_recipes = lanes.root / "recipes-status"
            status_recipes.mkdir()
            text = (lanes.root / "recipes" / "lanes.yaml").read_text()
            (status_recipes / "lanes.yaml").write_text(text[:text.index(FAULT_LANES)])
            shutil.copy(next((REPO / "recipes" / "dgx-station-gb300").glob("*.yaml")), status_recipes)
            status_env = {"LANECTL_RECIPES": str(status_recipes)}
            shown = json.loads(lanes.cli("status", "--json", state=state, check=True, extra_env=status_env).stdout)
            serving = [lane["lane"] for lane in shown["data"]["lanes"] if lane["health"] == "ok"]
            recipes = {lane["recipe"] for lane in shown["data"]["lanes"]}
            assert (len(recipes), len(shown["data"]["lanes"]), serving) == (2, 6, ["demo-h1"]), shown
            status_runs, ps_runs, help_runs = Timed(), Timed(), Timed()
            for _ in range(7):
                with status_runs:
                    lanes.cli("status", state=state, check=True, extra_env=status_env)
                with ps_runs:
                    subprocess.run(["docker", "ps"], capture_output=True, check=True)
                with help_runs:
                    lanes.cli("--help", state=state, check=True)
            started = time.perf_counter()
            subprocess.run([sys.executable, "-c", "import lanectl.cli.app, lanectl.commands.status"], check=True)
            imports = time.perf_counter() - started
            status_ms, help_ms = median(status_runs.wall) * 1000, median(help_runs.wall) * 1000
            print(f"status (2 recipes, 6 lanes, 1 serving): `lanectl status` {status_ms:6.0f} ms "
                  f"({status_runs.cpu_ms()})   `docker ps` {median(ps_runs.wall) * 1000:5.0f} ms   ratio "
                  f"{median(status_runs.wall) / median(ps_runs.wall):5.1f}x   (Python start-up + imports alone: "
                  f"{imports * 1000:.0f} ms)   target {STATUS_TARGET_MS} ms: "
                  f"{'met' if status_ms <= STATUS_TARGET_MS else 'MISSED'}")
            print(f"`lanectl --help` {help_ms:6.0f} ms ({help_runs.cpu_ms()})   target {HELP_TARGET_MS} ms: "
                  f"{'met' if help_ms <= HELP_TARGET_MS else 'MISSED'}")
            print(f"(load average over the last minute: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs)")
        finally:
            remove_everything(lanes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
