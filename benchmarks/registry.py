"""`make bench`: the no-op `lanectl build --all --push` (every content tag already in the registry), against
`docker push` of the same tags (every layer already there) measured in the same run.

A real registry (Debian's docker-registry, scripts/registry.sh) on a free loopback port, the demo lanes under
a fresh recipe id. Target: a lane the registry already holds costs well under a second.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
REPEAT = 5


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def timed(action, repeat: int) -> float:
    samples = []
    for _ in range(repeat):
        started = time.perf_counter()
        action()
        samples.append(time.perf_counter() - started)
    return statistics.median(samples)


def main() -> int:
    if shutil.which("docker-registry") is None:
        print("registry: skipped (docker-registry is not installed; `make setup` installs it)")
        return 0
    recipe_id = f"bench-reg-{uuid.uuid4().hex[:8]}"
    work = Path(tempfile.mkdtemp(prefix="lanectl-bench-registry-"))
    for part in ("images", "kernels", "patches"):
        shutil.copytree(REPO / part, work / part, ignore=shutil.ignore_patterns("__pycache__"))
    (work / "recipes").mkdir()
    # The demo lanes only: the production lanes need their vLLM base, which this machine cannot pull.
    shipped = (REPO / "recipes" / "demo" / "stub.yaml").read_text()
    (work / "recipes" / "stub.yaml").write_text(shipped.replace("id: demo-stub", f"id: {recipe_id}"))
    addr = f"127.0.0.1:{free_port()}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("LANECTL_")}
    env.update(LANECTL_STATE_DIR=str(work / "state"), PYTHONPATH=str(REPO))
    script = REPO / "scripts" / "registry.sh"
    subprocess.run(["bash", str(script), "start", str(work / "registry"), "--addr", addr], check=True,
                   capture_output=True)

    def lanectl(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "lanectl", *args], cwd=work, env=env, capture_output=True,
                              text=True, check=True, timeout=900)

    try:
        started = time.perf_counter()
        first = json.loads(lanectl("build", "--all", "--push", "--registry", addr, "--json").stdout)["data"]["builds"]
        cold = time.perf_counter() - started
        tags = [b["remote_tag"] for b in first]
        noop = timed(lambda: lanectl("build", "--all", "--push", "--registry", addr), REPEAT)
        again = json.loads(lanectl("build", "--all", "--push", "--registry", addr, "--json").stdout)["data"]["builds"]
        assert all(b["status"] == "skipped" for b in again), again
        per_lane = statistics.median(b["seconds"] for b in again)

        def docker_push_all() -> None:
            for tag in tags:
                subprocess.run(["docker", "push", tag], check=True, capture_output=True, timeout=300)

        raw = timed(docker_push_all, REPEAT)
        startup = timed(lambda: lanectl("validate"), REPEAT)
        print(f"build --all --push, {len(tags)} demo lanes, first run (build + push): {cold:6.2f} s")
        print(f"no-op build --all --push (CLI, all in the registry): {noop * 1000:7.1f} ms   baseline docker push "
              f"of the same {len(tags)} tags (layers all there): {raw * 1000:7.1f} ms   ratio {noop / raw:5.2f}x")
        print(f"  per lane, registry check and skip: {per_lane * 1000:6.1f} ms (target < 1 s); CLI start-up and "
              f"recipe loading alone (`lanectl validate`): {startup * 1000:6.1f} ms")
    finally:
        subprocess.run(["bash", str(script), "stop", str(work / "registry")], check=False)
        import docker

        client = docker.from_env()
        for image in client.images.list(filters={"label": f"io.lanectl.recipe={recipe_id}"}):
            client.images.remove(image.id, force=True)
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
