"""Rollback through a standby vs the cold path, on stub lanes whose model load takes 30 s and whose wake takes 1 s.

Both measured in the same run, as an operator sees them: the wall time of `lanectl rollback` (Python start-up,
lock, plan, and the whole health gate included; for the standby also the wake check). Goal: the standby
rollback takes at most 10 % of the cold one.

  cold:     up c-a; up c-b (c-a stopped);      time `lanectl rollback` (c-a started: 30 s load, gate)
  standby:  up s-a; up s-b (s-a left asleep);  time `lanectl rollback` (s-a woken: 1 s per container, gate,
                                                wake check)

The four lanes share GPUs 0 and 1 (run with --no-gpu), so each `up` replaces the lane before it.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import docker

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.lane_fixtures import free_port  # noqa: E402

LOAD_SECONDS = 30
WAKE_SECONDS = 1
REPEAT = 3
GOAL = 0.10

RECIPE = """schema: lanectl/v1
id: {recipe_id}
naming:
  container: "{recipe_id}-{{lane}}"
defaults:
  image: {{template: stub-engine, base: "lanectl/base-python:bookworm", local_base: true, python_site: /opt/stub}}
  engine:
    args: [/model, --served-model-name, bench-model, --host, 0.0.0.0, --port, "8000", --enable-sleep-mode]
    env: {{STUB_LOAD_SECONDS: "{load}", STUB_WAKE_SECONDS: "{wake}", VLLM_SERVER_DEV_MODE: "1"}}
    init: true
    gpus: {{device_ids: ["0"]}}
    stop_timeout_seconds: 30
  companions:
    rtx:
      engine:
        args: [/model, --served-model-name, bench-model-rtx, --host, 0.0.0.0, --port, "8001", --enable-sleep-mode]
        env: {{STUB_LOAD_SECONDS: "{load}", STUB_WAKE_SECONDS: "{wake}", VLLM_SERVER_DEV_MODE: "1"}}
        init: true
        gpus: {{device_ids: ["1"]}}
        stop_timeout_seconds: 30
  health:
    startup_budget_minutes: 5
    poll_interval_seconds: 0.5
    request_timeout_seconds: 2
    served_model_name: bench-model
    startup_log: {{expect: ["KV cache size: [0-9,]+ tokens"]}}
  standby: {{mode: sleep, level: 1, weights_gib: 1, resident_gib: 1, gpu_memory_gib: 80, wake_timeout_seconds: 30}}
lanes:
{lanes}"""


def lane(name: str, standby: bool) -> str:
    text = f"""  {name}:
    engine:
      ports: [{{container: 8000, host: {free_port()}, host_ip: 127.0.0.1}}]
      env: {{STUB_TOKEN_SEED: "{len(name) + ord(name[-1])}"}}
    companions:
      rtx:
        engine:
          ports: [{{container: 8001, host: {free_port()}, host_ip: 127.0.0.1}}]
"""
    return text + ("" if standby else "    standby: null\n")


def main() -> int:
    recipe_id = f"bench-standby-{uuid.uuid4().hex[:6]}"
    client = docker.from_env()
    with tempfile.TemporaryDirectory(prefix="lanectl-bench-standby-") as tmp:
        root = Path(tmp)
        for part in ("images", "kernels", "patches"):
            subprocess.run(["cp", "-r", str(REPO / part), str(root / part)], check=True)
        (root / "recipes").mkdir()
        lanes = "".join([lane("c-a", False), lane("c-b", False), lane("s-a", True), lane("s-b", True)])
        (root / "recipes" / "bench.yaml").write_text(RECIPE.format(recipe_id=recipe_id, load=LOAD_SECONDS,
                                                                   wake=WAKE_SECONDS, lanes=lanes))
        env = {k: v for k, v in os.environ.items() if not k.startswith("LANECTL_")}
        env.update({"LANECTL_STATE_DIR": str(root / "state"), "LANECTL_RECIPES": str(root / "recipes"),
                    "PYTHONPATH": str(REPO)})

        def cli(*args: str) -> float:
            started = time.perf_counter()
            result = subprocess.run([sys.executable, "-m", "lanectl", *args], cwd=root, env=env,
                                    capture_output=True, text=True, timeout=900)
            seconds = time.perf_counter() - started
            if result.returncode != 0:
                raise SystemExit(f"lanectl {' '.join(args)} exited {result.returncode}\n{result.stdout}{result.stderr}")
            if args[0] == "rollback":
                print(f"    {result.stdout.strip()}")
            return seconds

        try:
            cli("build", "c-a", "c-b", "s-a", "s-b")
            cold, warm = [], []
            for run in range(REPEAT):
                print(f"run {run + 1}/{REPEAT} (each `up` loads a stub model for {LOAD_SECONDS} s)", flush=True)
                cli("up", "c-a", "--no-gpu")
                cli("up", "c-b", "--no-gpu")
                cold.append(cli("rollback", "--no-gpu"))
                cli("up", "s-a", "--no-gpu")
                cli("up", "s-b", "--no-gpu")
                warm.append(cli("rollback", "--no-gpu"))
            cli("down")
        finally:
            for container in client.containers.list(all=True, filters={"label": f"io.lanectl.recipe={recipe_id}"}):
                container.remove(force=True)
            for image in client.images.list(filters={"label": f"io.lanectl.recipe={recipe_id}"}):
                client.images.remove(image.id, force=True)

    cold_s, warm_s = statistics.median(cold), statistics.median(warm)
    ratio = warm_s / cold_s
    print(f"rollback, `lanectl rollback` wall time, gate included, median of {REPEAT} "
          f"(stub load {LOAD_SECONDS} s, wake {WAKE_SECONDS} s per container):")
    print(f"  cold path (stop B, start A, gate)                       {cold_s:6.2f} s   runs "
          f"{', '.join(f'{s:.2f}' for s in cold)}")
    print(f"  standby   (stop B, wake A, gate, wake check)            {warm_s:6.2f} s   runs "
          f"{', '.join(f'{s:.2f}' for s in warm)}")
    verdict = "met" if ratio <= GOAL else "MISSED"
    print(f"  standby / cold = {ratio * 100:.1f} %   (goal <= {GOAL * 100:.0f} %: {verdict})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
