"""`lanectl doctor`: is this host ready to run lanes? Each finding says what to do about it."""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import asdict
from pathlib import Path
from typing import Any, Literal

from lanectl.errors import EXIT_FAILED, EXIT_OK
from lanectl.output import Result
from lanectl.recipe.catalog import Catalog
from lanectl.records import frozen
from lanectl.state.paths import state_dir

# vLLM serving images are ~20 GB; a switch that cannot pull or build for lack of disk is a bad surprise.
MIN_FREE_IMAGE_DISK_GB = 50


@frozen
class Finding:
    check: str
    severity: Literal["ok", "warn", "error"]
    detail: str
    fix: str = ""


def doctor(recipes: Path | None) -> Result:
    """Every finding, with its fix; exit 1 on any error. Broken recipes only leave the recipe checks out."""
    from lanectl.commands import catalog_if_valid

    findings = diagnose(catalog_if_valid(recipes))
    failed = any(f.severity == "error" for f in findings)
    return Result("doctor", {"findings": [asdict(f) for f in findings]}, exit_code=EXIT_FAILED if failed else EXIT_OK)


def diagnose(catalog: Catalog | None) -> list[Finding]:
    findings = []
    try:
        from lanectl.dockerapi.containers import DockerEngine

        engine: Any = DockerEngine()
        info = engine.info()
        findings.append(Finding("docker engine", "ok", f"reachable, Docker {info.get('ServerVersion')}"))
    except Exception as exc:  # any failure to reach the engine is this finding
        engine, info = None, {}
        findings.append(Finding("docker engine", "error", str(exc), "start dockerd, or set DOCKER_HOST"))
    runtimes = set((info.get("Runtimes") or {}).keys())
    if "nvidia" in runtimes:
        findings.append(Finding("nvidia runtime", "ok", "the nvidia runtime is registered with Docker"))
    elif engine is not None:
        findings.append(Finding("nvidia runtime", "warn", f"Docker knows only these runtimes: {sorted(runtimes)}",
                                "install the NVIDIA Container Toolkit (nvidia-ctk runtime configure); until then "
                                "lanes run only with --no-gpu"))
    findings.append(_gpus())
    if engine is not None:
        root = info.get("DockerRootDir") or "/var/lib/docker"
        free_gb = shutil.disk_usage(root).free / 1e9 if os.path.exists(root) else 0.0
        findings.append(Finding("image disk", "ok" if free_gb >= MIN_FREE_IMAGE_DISK_GB else "warn",
                                f"{free_gb:.0f} GB free under {root}",
                                "" if free_gb >= MIN_FREE_IMAGE_DISK_GB else
                                f"free at least {MIN_FREE_IMAGE_DISK_GB} GB (`docker image prune`; lanectl never "
                                "prunes images a kept lane needs)"))
    findings.append(_state_dir())
    findings.append(_cron())
    if engine is not None and catalog is not None:
        findings += _base_images(engine, catalog)
        swarm_lanes = [lane for lane in catalog.lanes.values() if lane.spec.placement.backend == "swarm"]
        if swarm_lanes:
            nodes = []
            if (info.get("Swarm") or {}).get("ControlAvailable"):
                from lanectl.dockerapi.swarm import SwarmEngine

                nodes = SwarmEngine(engine.api).nodes()
            findings += swarm_findings(info, nodes, swarm_lanes)
    return findings


def swarm_findings(info: dict[str, Any], nodes: list[Any], lanes: list[Any]) -> list[Finding]:
    """For recipes that place lanes on Swarm: is this a manager, and do the nodes offer the GPUs asked for."""
    swarm = info.get("Swarm") or {}
    if swarm.get("LocalNodeState") != "active" or not swarm.get("ControlAvailable"):
        state = swarm.get("LocalNodeState") or "inactive"
        role = "a worker" if state == "active" else f"not in a Swarm ({state})"
        return [Finding("swarm", "error", f"{len(lanes)} lane(s) are placed on Swarm but this engine is {role}",
                        "run lanectl --fleet on a manager; create a swarm with `docker swarm init` and join the "
                        "other boxes with `docker swarm join`")]
    down = sorted(n.hostname for n in nodes if n.state != "ready")
    findings = [Finding("swarm", "warn" if down else "ok",
                        f"manager of {len(nodes)} node(s)" + (f"; not ready: {', '.join(down)}" if down else ""),
                        "see `lanectl fleet status`" if down else "")]
    kinds = sorted({lane.spec.placement.gpu_resource for lane in lanes
                    if lane.spec.engine.gpus is not None or any(c.engine.gpus for c in lane.spec.companions.values())})
    for kind in kinds:
        lacking = sorted(n.hostname for n in nodes if not n.gpus.get(kind))
        if lacking:
            findings.append(Finding("swarm gpus", "warn", f"nodes advertising no {kind}: {', '.join(lacking)}",
                                    f"start their dockerd with --node-generic-resource {kind}=GPU-<uuid> per GPU "
                                    "(and swarm-resource in the NVIDIA runtime config), or keep GPU lanes off them"))
        else:
            findings.append(Finding("swarm gpus", "ok", f"every node advertises {kind}"))
    return findings


def _gpus() -> Finding:
    if shutil.which("nvidia-smi") is None:
        return Finding("gpus", "warn", "nvidia-smi not found: no NVIDIA driver on this host",
                       "install the NVIDIA driver; lanes that ask for GPUs need it (or use --no-gpu)")
    try:
        listing = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10)
    except subprocess.TimeoutExpired:
        return Finding("gpus", "error", "nvidia-smi did not answer in 10 s", "check the driver (dmesg for Xid)")
    if listing.returncode != 0:
        return Finding("gpus", "error", listing.stderr.strip() or "nvidia-smi failed", "check the driver")
    return Finding("gpus", "ok", "; ".join(listing.stdout.strip().splitlines()))


def _state_dir() -> Finding:
    directory = state_dir()
    try:
        directory.mkdir(parents=True, exist_ok=True)
        probe = directory / ".doctor-probe"
        probe.write_text("ok")
        probe.unlink()
    except OSError as exc:
        return Finding("state dir", "error", f"{directory}: {exc}",
                       "make it writable, or set LANECTL_STATE_DIR to a writable folder")
    return Finding("state dir", "ok", f"{directory} is writable")


def _cron() -> Finding:
    if shutil.which("cron") is None and shutil.which("crond") is None:
        return Finding("cron", "warn", "no cron daemon installed",
                       "install cron (apt-get install cron) so the watchdog is re-armed every minute")
    running = subprocess.run(["pgrep", "-x", "cron"], capture_output=True).returncode == 0 if shutil.which(
        "pgrep") else False
    if not running:
        return Finding("cron", "warn", "cron is installed but not running", "start it (cron, or `cron -f &`)")
    return Finding("cron", "ok", "cron is running")


def _base_images(engine: Any, catalog: Catalog) -> list[Finding]:
    findings = []
    local = sorted({lane.spec.image.base for lane in catalog.lanes.values() if lane.spec.image.local_base})
    for image in local:
        present = engine.image_id(image) is not None
        findings.append(Finding(f"base image {image}", "ok" if present else "warn",
                                "present" if present else "missing", "" if present else "make base-image"))
    return findings


# The command's page in the docs (docs/reference/commands/, written by scripts/docs_reference.py from the
# command-line app): an example, and what each exit code means.
COMMAND_DOCS = {
    "doctor": {
        "example": """\
$ lanectl doctor
ok    docker engine: reachable, Docker 20.10.24+dfsg1
warn  nvidia runtime: Docker knows only these runtimes: ['io.containerd.runc.v2', 'runc']
      fix: install the NVIDIA Container Toolkit (nvidia-ctk runtime configure); until then lanes run only with --no-gpu
ok    state dir: /var/lib/lanectl is writable
""",
        "exit": {
            0: "no finding is an error (warnings allowed)",
            1: "at least one error: each comes with its fix",
        },
    },
}
