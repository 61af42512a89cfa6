"""What clients see of a switch (issue 31): streaming requests sent through each kind of switch, and per switch
the answers cut short, the requests that failed, and the gap (the longest time in which no request that ended
whole got its first token).

Eight client threads send 100-token streaming completions without pause to the active lane (read from
state.json for each request, as a proxy that follows lanectl would) while the switch runs, and two seconds past it.
A request is *whole* when it ends with finish_reason "length" and [DONE], *cut* when it ends "abort" or without an
end, *failed* when it got an error or no connection. Each kind is measured against the same switch of a lane
that does not drain (`--shutdown-timeout 0`, vLLM's default), in the same run:

  cold switch     up demo-h2 from demo-h1 (stop-first, one host port)      baseline: from t-nodrain
  rollback, wake  rollback from demo-h2 to demo-h1 asleep as a standby    baseline: from t-nodrain (not asleep)
  restart         the watchdog restarts demo-h1 after a fatal line        baseline: t-nodrain's restart

Goals: no answer cut short when the drain fits the stop timeout; a rollback by wake leaves a gap under 2 s.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
os.environ["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])

from lanectl.project import Project  # noqa: E402
from lanectl.recipe.catalog import load_catalog  # noqa: E402
from tests.lane_fixtures import LaneProject, free_port, make_lane_project, remove_everything  # noqa: E402

NO_DRAIN = """
  t-nodrain:
    description: demo-h1 at vLLM's default --shutdown-timeout 0
    engine:
      args: [/model, --served-model-name, demo-model, --max-num-seqs, "32", --host, 0.0.0.0, --port, "8000",
             --enable-sleep-mode, --shutdown-timeout, "0"]
      ports: [{{container: 8000, host: {primary}, host_ip: 127.0.0.1}}]
    companions:
      rtx:
        engine:
          ports: [{{container: 8001, host: {rtx}, host_ip: 127.0.0.1}}]
    standby: {{weights_gib: 60000}}
"""
CLIENTS = 8
TOKENS = 100
AFTER_SECONDS = 2.0
WAKE_GAP_GOAL = 2.0


@dataclass
class Answer:
    served: float  # its first token, or when it ended without one
    ended: float
    outcome: str  # whole | cut | failed


class Clients:
    def __init__(self, project: LaneProject, state: Path):
        self.catalog = load_catalog(Project.locate(project.root / "recipes"))
        self.state, self.stop, self.answers = state, threading.Event(), list[Answer]()
        self.threads = [threading.Thread(target=self._loop, daemon=True) for _ in range(CLIENTS)]

    def url(self) -> str:
        active = json.loads((self.state / "state.json").read_text())["active"] or "demo-h1"
        return f"http://127.0.0.1:{self.catalog.lanes[active].spec.engine.ports[0].published}"

    def _loop(self) -> None:
        while not self.stop.is_set():
            first: list[float] = []
            outcome = self._one(first)
            self.answers.append(Answer(first[0] if first else time.monotonic(), time.monotonic(), outcome))

    def _one(self, first: list[float]) -> str:
        body = {"model": "demo-model", "prompt": "Go on:", "max_tokens": TOKENS, "stream": True, "ignore_eos": True}
        reason, done = None, False
        try:
            with httpx.stream("POST", self.url() + "/v1/completions", json=body,
                              timeout=httpx.Timeout(5.0, read=10.0)) as response:
                if response.status_code != 200:
                    time.sleep(0.05)
                    return "failed"
                for line in response.iter_lines():
                    if line == "data: [DONE]":
                        done = True
                    elif line.startswith("data: {"):
                        if not first:
                            first.append(time.monotonic())
                        for choice in json.loads(line[6:]).get("choices") or []:
                            reason = choice.get("finish_reason") or reason
        except httpx.HTTPError:
            time.sleep(0.05)
            return "failed" if reason is None else "cut"
        return "whole" if reason == "length" and done else "cut"

    def around(self, switch: list[str], project: LaneProject) -> tuple[dict[str, int], float, float]:
        for thread in self.threads:
            thread.start()
        time.sleep(1.0)
        began = time.monotonic()
        done = project.cli(*switch, state=self.state, timeout=300)
        ended = time.monotonic()
        # A switch exits 0; a watchdog pass that acted exits 1 (for cron): both ran what they had to.
        assert done.returncode in (0, 1), done.stdout + done.stderr
        time.sleep(AFTER_SECONDS)
        self.stop.set()
        for thread in self.threads:
            thread.join(30)
        during = [a for a in self.answers if a.ended >= began]
        counts = {kind: sum(1 for a in during if a.outcome == kind) for kind in ("whole", "cut", "failed")}
        # The gap: the longest time, reaching into the switch, in which no request that was answered whole got its
        # first token (the service answered nobody new).
        served = sorted(a.served for a in self.answers if a.outcome == "whole")
        gap = max((later - earlier for earlier, later in zip(served, served[1:], strict=False) if later >= began),
                  default=0.0)
        return counts, gap, ended - began


def measure(project: LaneProject, setup: list[list[str]], switch: list[str], fault: str | None = None) -> str:
    with tempfile.TemporaryDirectory(prefix="lanectl-bench-drain-") as tmp:
        state = Path(tmp)
        for command in setup:
            project.cli(*command, state=state, check=True, timeout=300)
        clients = Clients(project, state)
        if fault:
            httpx.post(clients.url() + "/admin/fault", json={"fault": fault}, timeout=5).raise_for_status()
        counts, gap, seconds = clients.around(switch, project)
        return (f"whole {counts['whole']:3d}  cut short {counts['cut']:3d}  failed {counts['failed']:3d}  "
                f"gap {gap:5.2f} s  (the switch took {seconds:5.2f} s)")


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="lanectl-bench-drain-") as tmp:
        project = make_lane_project(Path(tmp), standby=True, stop_timeout_seconds=30,
                                    extra_lanes=NO_DRAIN.format(primary=free_port(), rtx=free_port()))
        kernel_log = Path(tmp) / "kern.log"
        kernel_log.write_text("")
        os.environ["LANECTL_KERNEL_LOG"] = f"file:{kernel_log}"
        try:
            project.cli("build", "demo-h1", "demo-h2", "t-nodrain", state=Path(tmp) / "build", check=True,
                        timeout=900)
            print(f"{CLIENTS} clients, {TOKENS}-token streams, stub lanes draining 15 s of a 30 s stop timeout:")
            rows = [
                ("cold switch", [["up", "demo-h1", "--no-gpu"]], ["up", "demo-h2", "--no-gpu"], None),
                ("  baseline: from a lane without drain", [["up", "t-nodrain", "--no-gpu"]],
                 ["up", "demo-h2", "--no-gpu"], None),
                ("rollback by wake", [["up", "demo-h1", "--no-gpu"], ["up", "demo-h2", "--no-gpu"]],
                 ["rollback", "--no-gpu"], None),
                ("  baseline: from a lane without drain",
                 [["up", "demo-h2", "--no-gpu"], ["up", "t-nodrain", "--no-gpu"]], ["rollback", "--no-gpu"], None),
                ("watchdog restart", [["up", "demo-h1", "--no-gpu"]], ["watchdog", "check"], "fatal_log"),
                ("  baseline: a lane without drain", [["up", "t-nodrain", "--no-gpu"]], ["watchdog", "check"],
                 "fatal_log"),
            ]
            for label, setup, switch, fault in rows:
                print(f"  {label:<38} {measure(project, setup, switch, fault)}")
                for name in subprocess.run(["docker", "ps", "-aq", "--filter",
                                            f"label=io.lanectl.recipe={project.recipe_id}"],
                                           capture_output=True, text=True).stdout.split():
                    subprocess.run(["docker", "rm", "-f", name], capture_output=True)
            print(f"goals: no answer cut short where the lane drains; a rollback by wake under {WAKE_GAP_GOAL:g} s "
                  "of gap")
            print(f"(load average over the last minute: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs)")
        finally:
            remove_everything(project)
    return 0


if __name__ == "__main__":
    sys.exit(main())
