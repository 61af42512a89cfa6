"""Lanes on a real two-node Docker Swarm (this engine plus a second one in a network namespace).

The tests run in order and share the cluster: up on both nodes, a switch, Swarm's rollback of a
lane that fails its health check, lanectl's rollback of a lane that passes /health but generates
nothing, `rollback --fleet`, and a node whose engine stops. A local lane runs beside it throughout.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import docker
import httpx
import pytest

from lanectl.fleet.rollout import MONITOR_SECONDS_ENV
from lanectl.health.engine_exit import EXIT_UNASKED
from tests.lane_fixtures import LOCAL_LANE, LaneProject, free_port, make_fleet_project, remove_everything
from tests.registry_server import start_tls_registry
from tests.streams import Streams
from tests.swarm_cluster import TwoNodeSwarm, two_node_swarm  # noqa: F401 - the fixture

pytestmark = pytest.mark.docker

SWARM_LANES = ["demo-h1", "demo-h2", "t-unhealthy", "t-hang", "t-spare"]
LOST_FROM_REGISTRY = "t-spare"  # pushed, then deleted from the registry: node 2 cannot pull it, this engine has it
NEVER_PUSHED = "t-slow"  # a Swarm lane of the recipe that was never built or pushed
# Swarm watches each new task 1 s after its first healthy answer, not the 8 s the test lanes' health check implies:
# the module runs about 25 updates and rollbacks, and none of its lanes falls over after that answer (t-unhealthy
# never gives one, t-spare's task never starts), so the window only waited.
MONITOR = {MONITOR_SECONDS_ENV: "1"}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory, two_node_swarm: TwoNodeSwarm):  # noqa: F811
    project = make_fleet_project(tmp_path_factory.mktemp("fleet"))
    state = tmp_path_factory.mktemp("fleet-state")
    # On the manager's veth address, which node 2 reaches (its loopback is its own).
    registry = start_tls_registry(tmp_path_factory.mktemp("fleet-registry"), two_node_swarm.manager_addr,
                                  free_port())
    client = docker.from_env()
    try:
        project.cli("build", LOCAL_LANE, state=state, check=True, timeout=600)
        pushed = project.cli("build", *SWARM_LANES, "--push", "--registry", registry.addr, "--json", state=state,
                             check=True, timeout=600)
        references = {b["lane"]: b["reference"] for b in json.loads(pushed.stdout)["data"]["builds"]}
        lost = references[LOST_FROM_REGISTRY]
        registry.delete(lost.split("/", 1)[1].split("@")[0], lost.split("@")[1])
        yield project, two_node_swarm, state, references
    finally:
        for service in client.services.list(filters={"label": f"io.lanectl.recipe={project.recipe_id}"}):
            service.remove()
        remove_everything(project)
        registry.stop()


def fleet_status(project: LaneProject, state: Path) -> tuple[int, dict]:
    result = project.invoke("fleet", "status", "--json", state=state)
    assert result.stdout, result.stderr
    return result.returncode, json.loads(result.stdout)["data"]


def lanes_by_node(data: dict) -> dict[str, dict[str, str]]:
    return {n["hostname"]: {lane["role"]: lane["lane"] for lane in n["lanes"]} for n in data["nodes"]}


def served_model(addr: str, project: LaneProject) -> str:
    port = project_port(project)
    reply = httpx.get(f"http://{addr}:{port}/v1/models", timeout=5)
    reply.raise_for_status()
    return str(reply.json()["data"][0]["id"])


def project_port(project: LaneProject) -> int:
    recipe = (project.root / "recipes" / "lanes.yaml").read_text()
    return int(recipe.split("host: ", 1)[1].split(",", 1)[0])


def service_of(project: LaneProject, role: str, node: str) -> dict:
    client = docker.from_env()
    found = client.services.list(filters={"label": [f"io.lanectl.recipe={project.recipe_id}",
                                                    f"io.lanectl.role={role}", f"io.lanectl.node={node}"]})
    assert len(found) == 1, found
    return found[0].attrs


def up(project: LaneProject, state: Path, lane: str, *args: str, extra_env: dict[str, str] | None = None):
    return project.cli("up", lane, "--fleet", "--no-gpu", "--json", *args, state=state, timeout=400,
                       extra_env={**MONITOR, **(extra_env or {})})


def test_a_local_lane_starts_on_this_engine_beside_the_swarm(fleet):
    project, cluster, state, references = fleet
    result = project.cli("up", LOCAL_LANE, "--no-gpu", state=state)
    assert result.returncode == 0, result.stderr + result.stdout
    refused = project.cli("up", "demo-h1", "--no-gpu", state=state)
    assert refused.returncode == 2 and "placed on Swarm" in refused.stderr and "--fleet" in refused.stderr


def dry_run_keys(project: LaneProject, state: Path, lane: str, *args: str) -> list[str]:
    result = project.invoke("up", lane, "--fleet", "--no-gpu", "--dry-run", "--json", *args, state=state)
    assert result.returncode == 0, result.stderr + result.stdout
    return list(json.loads(result.stdout)["data"]["keys"])


def journaled(project: LaneProject, state: Path) -> list[dict]:
    history = project.invoke("history", "--fleet", "-n", "500", "--json", state=state, check=True)
    return list(json.loads(history.stdout)["data"]["records"])


def test_up_on_both_nodes_canary_first(fleet):
    project, cluster, state, references = fleet
    planned = dry_run_keys(project, state, "demo-h1", "--canary", cluster.worker_hostname)
    result = up(project, state, "demo-h1", "--canary", cluster.worker_hostname)
    assert result.returncode == 0, result.stderr + result.stdout
    outcome = json.loads(result.stdout)["data"]
    assert outcome["result"] == "ok"
    assert outcome["steps"] == planned, "the dry run lists the steps the rollout runs"
    switch = [r for r in journaled(project, state) if r["kind"] == "intent"][-1]["switch"]
    assert [r["step"] for r in journaled(project, state) if r.get("switch") == switch and r["kind"] == "step"] == \
        planned, "and the journal keeps them under the same keys"
    assert [n["node"] for n in outcome["nodes"]] == [cluster.worker_hostname, cluster.manager_hostname]
    assert served_model(cluster.worker_addr, project) == "demo-model"
    assert served_model(cluster.manager_addr, project) == "demo-model"

    spec = service_of(project, "primary", cluster.worker_hostname)["Spec"]
    assert spec["TaskTemplate"]["ContainerSpec"]["Image"] == references["demo-h1"], "pinned by the pushed digest"
    assert service_of(project, "rtx", cluster.manager_hostname)["Spec"]["TaskTemplate"]["ContainerSpec"][
        "Image"] == references["demo-h1"]
    worker = cluster.worker_client()
    try:
        pulled = worker.images.get(references["demo-h1"])  # node 2 had no image but the one it pulled
        assert pulled.labels["io.lanectl.lane"] == "demo-h1"
    finally:
        worker.close()
    assert spec["Mode"] == {"Replicated": {"Replicas": 1}}
    assert spec["UpdateConfig"]["FailureAction"] == "rollback" and spec["UpdateConfig"]["Order"] == "stop-first"
    assert spec["EndpointSpec"]["Ports"][0]["PublishMode"] == "host"
    assert f"node.hostname=={cluster.worker_hostname}" in spec["TaskTemplate"]["Placement"]["Constraints"]
    assert spec["TaskTemplate"]["ContainerSpec"]["Healthcheck"]["Test"][0] == "CMD"

    code, data = fleet_status(project, state)
    assert code == 0 and data["healthy"], data["problems"]
    assert lanes_by_node(data) == {cluster.worker_hostname: {"primary": "demo-h1", "rtx": "demo-h1"},
                                   cluster.manager_hostname: {"primary": "demo-h1", "rtx": "demo-h1"}}

    history = project.invoke("history", "--fleet", "--json", state=state, check=True)
    steps = [r for r in json.loads(history.stdout)["data"]["records"] if r["kind"] == "step"]
    assert {r["node"] for r in steps} == {cluster.worker_hostname, cluster.manager_hostname}
    assert steps[0]["node"] == cluster.worker_hostname, "the canary is journaled first"

    doctor = json.loads(project.invoke("doctor", "--json", state=state).stdout)["data"]["findings"]
    swarm = next(f for f in doctor if f["check"] == "swarm")
    assert (swarm["severity"], swarm["detail"]) == ("ok", "manager of 2 node(s)")


def test_a_lane_never_pushed_is_refused_before_any_change_with_the_command_that_pushes_it(fleet):
    project, cluster, state, references = fleet
    before = service_of(project, "primary", cluster.manager_hostname)
    result = up(project, state, NEVER_PUSHED)
    assert result.returncode == 1
    assert "has not been pushed to a registry" in result.stderr
    assert f"`lanectl build {NEVER_PUSHED} --push --registry HOST:PORT`" in result.stderr
    after = service_of(project, "primary", cluster.manager_hostname)
    assert (after["Version"], after["Spec"]) == (before["Version"], before["Spec"]), "nothing changed"
    history = json.loads(project.invoke("history", "--fleet", "--json", state=state, check=True).stdout)["data"]
    assert not [r for r in history["records"] if r.get("to") == NEVER_PUSHED], "not even an intent"
    dry = project.invoke("up", NEVER_PUSHED, "--fleet", "--dry-run", state=state)
    assert dry.returncode == 1 and "has not been pushed" in dry.stderr


DEMO_H1 = "  demo-h1:\n    description: The control lane (mirrors h1-REF).\n"


def change_demo_h1(project: LaneProject, overlay: str) -> None:
    """Container-only changes: a volume on the primary, the companion's env and stop timeout (its args, not the
    image, carry its --shutdown-timeout), so the pushed build stays the lane's build."""
    path = project.root / "recipes" / "lanes.yaml"
    text = path.read_text()
    start = text.index(DEMO_H1) + len(DEMO_H1)
    end = text.index("\n  demo-h2:\n")
    path.write_text(text[:start] + overlay + text[end + 1:])


def drift_by_service(data: dict) -> dict[tuple[str, str], list[str]]:
    return {(n["hostname"], lane["role"]): lane["drift"] for n in data["nodes"] for lane in n["lanes"]}


def rtx_port(project: LaneProject) -> int:
    recipe = (project.root / "recipes" / "lanes.yaml").read_text()
    return int(recipe.split("host: ", 2)[2].split(",", 1)[0])


def test_a_container_only_change_shows_as_drift_reaches_every_node_and_an_interrupt_is_continued(fleet):
    project, cluster, state, references = fleet
    change_demo_h1(project, "    engine:\n      volumes: [{source: /tmp, target: /fleet-probe, read_only: true}]\n"
                            "    companions:\n      rtx:\n        engine:\n          env: {FLEET_DRIFT: \"1\"}\n"
                            "          stop_timeout_seconds: 40\n")
    code, data = fleet_status(project, state)
    drift = drift_by_service(data)
    for node in (cluster.worker_hostname, cluster.manager_hostname):
        assert drift[(node, "primary")] == ["volumes [] → [/tmp:/fleet-probe:ro]"], drift
        assert "env +FLEET_DRIFT" in drift[(node, "rtx")] and "stop_timeout_seconds 18 → 40" in drift[(node, "rtx")]

    planned = dry_run_keys(project, state, "demo-h1", "--canary", cluster.worker_hostname)
    interrupted = up(project, state, "demo-h1", "--canary", cluster.worker_hostname,
                     extra_env={"LANECTL_TEST_SIGNAL_AFTER_STEP": "1:INT"})
    assert interrupted.returncode == 130, interrupted.stderr + interrupted.stdout
    outcome = json.loads(interrupted.stdout)["data"]
    assert outcome["result"] == "interrupted" and outcome["steps"] == planned[:1]
    assert f"{cluster.worker_hostname}: mid-switch" in outcome["message"]
    assert f"{cluster.manager_hostname}: demo-h1 (not reached)" in outcome["message"]
    assert "`lanectl up demo-h1 --fleet`" in outcome["message"] and "`lanectl rollback --fleet`" in outcome["message"]
    assert served_model(cluster.worker_addr, project) == "demo-model", "the canary's updated primary serves"
    assert served_model(cluster.manager_addr, project) == "demo-model"

    rest = dry_run_keys(project, state, "demo-h1", "--canary", cluster.worker_hostname)
    assert rest == planned[1:], "the continuation is what the interrupted run had left"
    result = up(project, state, "demo-h1", "--canary", cluster.worker_hostname)
    assert result.returncode == 0, result.stderr + result.stdout
    assert json.loads(result.stdout)["data"]["steps"] == rest
    outcomes = [r["result"] for r in journaled(project, state) if r["kind"] == "outcome"]
    assert outcomes[-2:] == ["continued", "ok"]
    for node in (cluster.worker_hostname, cluster.manager_hostname):
        container = service_of(project, "primary", node)["Spec"]["TaskTemplate"]["ContainerSpec"]
        assert {"Type": "bind", "Source": "/tmp", "Target": "/fleet-probe", "ReadOnly": True} in container["Mounts"]
        rtx = service_of(project, "rtx", node)["Spec"]["TaskTemplate"]["ContainerSpec"]
        assert "FLEET_DRIFT=1" in rtx["Env"] and rtx["StopGracePeriod"] == 40 * 10**9
        assert rtx["Args"][-2:] == ["--shutdown-timeout", "25"], "rendered as on the box"
    code, data = fleet_status(project, state)
    assert code == 0 and set(map(tuple, drift_by_service(data).values())) == {()}, data


def test_no_stream_in_flight_is_cut_by_a_fleet_update_whose_drain_fits_the_stop_timeout(fleet):
    project, cluster, state, references = fleet
    change_demo_h1(project, "    engine:\n      volumes: [{source: /tmp, target: /fleet-probe, read_only: true}]\n"
                            "    companions:\n      rtx:\n        engine:\n          env: {FLEET_DRIFT: \"2\"}\n"
                            "          stop_timeout_seconds: 40\n")
    # 10 s of tokens against the canary's companion, whose engine drains 25 s of its 40 s stop grace period. Only
    # that node is updated: the drain is the canary's, and the other node's update would add 12 s of Swarm's timers
    # (the next test's switch updates it anyway).
    streams = Streams(f"http://{cluster.worker_addr}:{rtx_port(project)}", "demo-model-rtx", max_tokens=1000).start()
    streams.running()
    result = up(project, state, "demo-h1", "--nodes", cluster.worker_hostname)
    assert result.returncode == 0, result.stderr + result.stdout
    assert streams.ends() == ["length"] * 8, [vars(s) for s in streams.streams]
    assert all(s.tokens == 1000 and s.done for s in streams.streams)
    drains = json.loads(result.stdout)["data"]["drains"]
    assert drains[cluster.worker_hostname]["rtx"].startswith("8 request(s) in flight, all finished"), drains


def test_a_switch_updates_the_same_services_and_a_rerun_changes_nothing(fleet):
    project, cluster, state, references = fleet
    before = service_of(project, "primary", cluster.manager_hostname)["ID"]
    result = up(project, state, "demo-h2")
    assert result.returncode == 0, result.stderr + result.stdout
    assert service_of(project, "primary", cluster.manager_hostname)["ID"] == before, "an update, not a new service"
    code, data = fleet_status(project, state)
    assert code == 0, data["problems"]
    primaries = [lane for n in data["nodes"] for lane in n["lanes"] if lane["role"] == "primary"]
    assert {(p["lane"], p["previous_lane"], p["update"]) for p in primaries} == {("demo-h2", "demo-h1", "completed")}

    again = up(project, state, "demo-h2")
    assert again.returncode == 0 and json.loads(again.stdout)["data"]["result"] == "noop"


def test_rollback_fleet_is_swarms_rollback_node_by_node_and_does_not_flip_back(fleet):
    project, cluster, state, references = fleet
    result = project.cli("rollback", "--fleet", "--json", state=state, timeout=400, extra_env=MONITOR)
    assert result.returncode == 0, result.stderr + result.stdout
    outcome = json.loads(result.stdout)["data"]
    assert outcome["result"] == "ok" and outcome["lane"] == "demo-h1"
    code, data = fleet_status(project, state)
    assert code == 0, data["problems"]
    primaries = [lane for n in data["nodes"] for lane in n["lanes"] if lane["role"] == "primary"]
    assert {(p["lane"], p["update"]) for p in primaries} == {("demo-h1", "rollback_completed")}
    assert served_model(cluster.worker_addr, project) == "demo-model"
    # Swarm's PreviousSpec is now demo-h2: a second rollback would flip forward again, so lanectl refuses.
    again = project.cli("rollback", "--fleet", state=state)
    assert again.returncode == 2 and "nothing to roll back" in again.stderr


def test_a_service_named_like_a_lanes_that_lanectl_did_not_create_is_named_and_refused(fleet):
    project, cluster, state, references = fleet
    client = docker.from_env()
    name = f"{project.recipe_id}-primary-elsewhere"
    foreign = client.services.create(references["demo-h1"], name=name,
                                     mode=docker.types.ServiceMode("replicated", replicas=0))
    try:
        before = service_of(project, "primary", cluster.manager_hostname)
        refused = up(project, state, "demo-h2")
        assert refused.returncode == 1 and name in refused.stderr and "did not create" in refused.stderr
        after = service_of(project, "primary", cluster.manager_hostname)
        assert after["Version"] == before["Version"], "nothing changed"
        kept = client.services.get(foreign.id).attrs
        assert kept["Version"] == foreign.attrs["Version"], "and the foreign one is untouched"
    finally:
        foreign.remove()


def test_swarm_rolls_back_a_lane_that_fails_its_health_check_and_the_rollout_stops(fleet):
    project, cluster, state, references = fleet
    result = up(project, state, "t-unhealthy", "--canary", cluster.worker_hostname)
    assert result.returncode == 1, result.stderr
    outcome = json.loads(result.stdout)["data"]
    assert outcome["result"] == "rolled-back"
    assert [(n["node"], n["result"]) for n in outcome["nodes"]] == [
        (cluster.worker_hostname, "rolled-back-by-swarm"), (cluster.manager_hostname, "not-reached")]
    # From Swarm's final record of the task, not from what lanectl's polls caught (on a busy machine they
    # missed the task's 'starting' and said "last seen pending").
    assert "the new task failed its health check" in outcome["message"], outcome["message"]
    worker = service_of(project, "primary", cluster.worker_hostname)
    assert worker["UpdateStatus"]["State"] == "rollback_completed"
    assert worker["Spec"]["Labels"]["io.lanectl.lane"] == "demo-h1"
    manager = service_of(project, "primary", cluster.manager_hostname)
    assert manager["Spec"]["Labels"]["io.lanectl.lane"] == "demo-h1", "the rollout never reached it"
    assert served_model(cluster.worker_addr, project) == "demo-model"


def test_lanectl_rolls_back_a_lane_swarm_thinks_healthy_but_that_generates_nothing(fleet):
    project, cluster, state, references = fleet
    result = up(project, state, "t-hang", "--canary", cluster.manager_hostname)
    assert result.returncode == 1, result.stderr
    outcome = json.loads(result.stdout)["data"]
    assert [(n["node"], n["result"]) for n in outcome["nodes"]] == [
        (cluster.manager_hostname, "rolled-back"), (cluster.worker_hostname, "not-reached")]
    assert outcome["diagnostics"]["check"] == "generation"
    manager = service_of(project, "primary", cluster.manager_hostname)
    assert manager["UpdateStatus"]["State"] == "rollback_completed", "lanectl asked Swarm for its rollback"
    assert manager["Spec"]["Labels"]["io.lanectl.lane"] == "demo-h1"
    code, data = fleet_status(project, state)
    assert code == 0, data["problems"]


def test_a_failure_on_a_later_node_rolls_back_the_canary_too(fleet):
    project, cluster, state, references = fleet
    result = up(project, state, LOST_FROM_REGISTRY, "--canary", cluster.manager_hostname)
    assert result.returncode == 1, result.stderr + result.stdout
    outcome = json.loads(result.stdout)["data"]
    assert [(n["node"], n["result"]) for n in outcome["nodes"]] == [
        (cluster.manager_hostname, "rolled-back"), (cluster.worker_hostname, "rolled-back-by-swarm")], (
        outcome["message"], outcome["nodes"], outcome.get("diagnostics"), result.stderr[-3000:])
    assert "node 2/2" in outcome["message"] and "No such image" in outcome["message"]
    manager = service_of(project, "primary", cluster.manager_hostname)
    assert manager["Spec"]["Labels"]["io.lanectl.lane"] == "demo-h1"
    assert manager["UpdateStatus"]["State"] == "rollback_completed", "the canary went back by Swarm's rollback"
    code, data = fleet_status(project, state)
    assert code == 0, data["problems"]
    assert {lanes["primary"] for lanes in lanes_by_node(data).values()} == {"demo-h1"}


def test_swarm_restarts_a_task_whose_vllm_exited_0_after_its_engine_core_died(fleet):
    """vLLM's API server exits 0 when its engine core dies (the GPU record), and Swarm's on-failure never
    restarts an exit 0; the image's exit guard turns that unasked 0 into 70, so Swarm restarts the task."""
    project, cluster, state, references = fleet
    node = cluster.worker_hostname
    service = service_of(project, "primary", node)
    client = docker.from_env()

    def tasks() -> list[dict]:
        return client.api.tasks(filters={"service": service["ID"]})

    before = {t["ID"] for t in tasks()}
    url = f"http://{cluster.worker_addr}:{project_port(project)}"
    httpx.post(url + "/admin/fault", json={"fault": "crash"}, timeout=5).raise_for_status()
    deadline = time.monotonic() + 120
    while True:
        ended = [t for t in tasks() if t["ID"] in before and t["Status"]["State"] in ("complete", "failed")]
        fresh = [t for t in tasks() if t["ID"] not in before and t["Status"]["State"] == "running"]
        if ended and fresh or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert ended, "the crashed task never ended: " + repr([t["Status"] for t in tasks()])
    assert (ended[0]["Status"]["State"], ended[0]["Status"]["ContainerStatus"]["ExitCode"]) == (
        "failed", EXIT_UNASKED), "the stub exits 0 as vLLM does; the exit guard makes it a failure"
    assert fresh, "Swarm did not restart a task that exited 0: " + repr([t["Status"] for t in tasks()])
    deadline = time.monotonic() + 60
    while True:
        try:
            assert served_model(cluster.worker_addr, project) == "demo-model"
            break
        except (httpx.HTTPError, AssertionError):
            assert time.monotonic() < deadline, "the restarted task never served"
            time.sleep(0.5)


def test_a_stopped_node_engine_shows_in_fleet_status_and_blocks_a_rollout_to_it(fleet):
    project, cluster, state, references = fleet
    cluster.stop_worker_engine()
    deadline = time.monotonic() + 90
    while True:
        code, data = fleet_status(project, state)
        states = {n["hostname"]: n["state"] for n in data["nodes"]}
        if states[cluster.worker_hostname] == "down" or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert states == {cluster.worker_hostname: "down", cluster.manager_hostname: "ready"}
    assert code == 1 and not data["healthy"]
    assert any(p.startswith(f"{cluster.worker_hostname}: node is down") for p in data["problems"])
    manager_lanes = next(n for n in data["nodes"] if n["hostname"] == cluster.manager_hostname)["lanes"]
    assert all(lane["serving"] for lane in manager_lanes), "the other node keeps serving"
    refused = up(project, state, "demo-h1", "--nodes", f"{cluster.manager_hostname},{cluster.worker_hostname}")
    assert refused.returncode == 1 and "down" in refused.stderr


def test_the_local_lane_kept_running_on_this_engine_throughout(fleet):
    project, cluster, state, references = fleet
    result = project.invoke("status", "--json", state=state, check=True)
    data = json.loads(result.stdout)["data"]
    row = next(r for r in data["lanes"] if r["lane"] == LOCAL_LANE)
    assert row["active"] and row["health"] == "ok"
    assert all(c["status"] == "running" and c["restarts"] == 0 for c in row["containers"])
    on_swarm = [c["name"] for r in data["lanes"] if r["lane"] != LOCAL_LANE for c in r["containers"]]
    assert on_swarm == [], "Swarm's task containers are not listed as containers of local lanes"
    mistaken = [name for name in data["unknown_containers"] if name.startswith(project.prefix)]
    assert mistaken == [], "Swarm's task containers carry the image's lane labels but are not local lanes"
    project.cli("down", LOCAL_LANE, state=state, check=True)
