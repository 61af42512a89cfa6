"""The pure fleet core: node choice and order, the ServiceSpec each role runs as, reading Swarm's answers."""

from __future__ import annotations

from dataclasses import replace

import pytest

from lanectl.dockerapi.engine_api import EngineAPI
from lanectl.dockerapi.labels import LEASE_LABEL
from lanectl.dockerapi.swarm import NodeInfo, ServiceState, SwarmEngine, TaskInfo
from lanectl.errors import BadInput, OperationFailed
from lanectl.fleet.node_lease import NodeLease, read_lease, why_left_behind
from lanectl.fleet.services import (
    choose_nodes,
    current_task,
    gated_label,
    last_task_error,
    plan_service,
    service_drift,
    service_fields,
    service_labels,
    service_name,
    spec_mark,
    task_problem,
    why_swarm_rolled_back,
)
from lanectl.fleet.status import Probe, summarize
from lanectl.image.containers import plan_containers
from lanectl.image.render import plan_image
from lanectl.project import Project
from lanectl.recipe.catalog import load_catalog
from tests.test_engine_api import Answer, Recorded, ok_json, recording, socket_dir  # noqa: F401 - fixtures

RECIPE = """
schema: lanectl/v1
id: fleet-t
defaults:
  image:
    template: stub-engine
    base: lanectl/base-python:bookworm
    local_base: true
    python_site: /opt/stub
  engine:
    args: [/model, --served-model-name, m, --port, "8000"]
    env: {PLAIN: "1"}
    secret_env: [HF_TOKEN]
    ports:
      - {container: 8000, host: 18000}
    shm_size: 2g
    gpus: {device_ids: ["0", "1"]}
    stop_timeout_seconds: 120
  companions:
    rtx:
      engine:
        args: [/model, --port, "8001"]
        ports: [{container: 8001, host: 18001}]
  health:
    startup_budget_minutes: 10
    poll_interval_seconds: 5
    request_timeout_seconds: 4
    served_model_name: m
  placement:
    backend: swarm
    node_labels: {gpu: gb300}
lanes:
  f1: {}
  f2:
    placement: {backend: swarm, nodes: [s2, s1], canary: s1, node_labels: {gpu: gb300}}
  local:
    placement: {backend: local}
    engine:
      ports: [{container: 8000, host: 19000}]
    companions:
      rtx:
        engine:
          ports: [{container: 8001, host: 19001}]
"""


@pytest.fixture
def catalog(project, write_recipe):
    write_recipe(RECIPE)
    return load_catalog(Project.locate())


def node(hostname: str, *, state: str = "ready", availability: str = "active", labels=None) -> NodeInfo:
    return NodeInfo(id=f"id-{hostname}", hostname=hostname, state=state, availability=availability,
                    role="worker", addr=f"10.0.0.{len(hostname)}", labels={"gpu": "gb300"} if labels is None
                    else labels)


FLEET = [node("s3"), node("s1"), node("s2"), node("cpu-box", labels={})]


def hosts(nodes: list[NodeInfo]) -> list[str]:
    return [n.hostname for n in nodes]


def test_by_default_every_ready_node_with_the_labels_in_hostname_order(catalog):
    assert hosts(choose_nodes(catalog.lane("f1"), FLEET)) == ["s1", "s2", "s3"]


def test_the_canary_goes_first_then_the_rest_keep_their_order(catalog):
    assert hosts(choose_nodes(catalog.lane("f1"), FLEET, canary="s3")) == ["s3", "s1", "s2"]
    assert hosts(choose_nodes(catalog.lane("f1"), FLEET, ["s2", "s3", "s1"], canary="s1")) == ["s1", "s2", "s3"]
    assert hosts(choose_nodes(catalog.lane("f2"), FLEET)) == ["s1", "s2"], "the recipe's nodes and canary"


def test_a_node_that_cannot_take_the_lane_is_refused_before_anything_changes(catalog):
    lane = catalog.lane("f1")
    with pytest.raises(BadInput, match="no Swarm node 'nope'; the nodes are: cpu-box, s1, s2, s3"):
        choose_nodes(lane, FLEET, ["nope"])
    with pytest.raises(BadInput, match=r"node cpu-box lacks the labels lane f1 requires \(gpu=gb300\)"):
        choose_nodes(lane, FLEET, ["cpu-box"])
    with pytest.raises(OperationFailed, match=r"cannot place f1 on s2 \(down, active\)"):
        choose_nodes(lane, [node("s1"), node("s2", state="down")], ["s1", "s2"])
    with pytest.raises(BadInput, match="canary 's3' is not one of the chosen nodes"):
        choose_nodes(lane, FLEET, ["s1"], canary="s3")
    with pytest.raises(OperationFailed, match="several Swarm nodes share the hostname s1"):
        choose_nodes(lane, [node("s1"), node("s1")])
    with pytest.raises(BadInput, match="not placed on Swarm"):
        choose_nodes(catalog.lane("local"), FLEET)


def test_a_down_node_is_left_out_of_the_default_choice(catalog):
    fleet = [node("s1"), node("s2", state="down"), node("s3", availability="drain")]
    assert hosts(choose_nodes(catalog.lane("f1"), fleet)) == ["s1"]


def service_specs(catalog, lane_name: str, *, with_gpus: bool = True) -> dict[str, dict]:
    lane = catalog.lane(lane_name)
    plan = plan_image(lane)
    return {c.role: plan_service(lane, c, "s1", with_gpus=with_gpus, inputs=plan.input_hash)
            for c in plan_containers(lane, plan)}


def test_a_role_is_one_replica_pinned_to_its_node_with_a_stop_first_self_rolling_back_update(catalog):
    spec = service_specs(catalog, "f1")["primary"]
    assert spec["Name"] == "fleet-t-primary-s1"
    assert spec["Mode"] == {"Replicated": {"Replicas": 1}}
    assert spec["TaskTemplate"]["Placement"] == {"Constraints": ["node.hostname==s1", "node.labels.gpu==gb300"],
                                                 "MaxReplicas": 1}
    update = spec["UpdateConfig"]
    assert (update["Order"], update["FailureAction"], update["Parallelism"]) == ("stop-first", "rollback", 1)
    assert update["Monitor"] == (3 * 5 + 4) * 10**9
    assert spec["RollbackConfig"]["Order"] == "stop-first"
    assert spec["EndpointSpec"]["Ports"] == [{"Protocol": "tcp", "TargetPort": 8000, "PublishedPort": 18000,
                                              "PublishMode": "host"}]


def test_swarm_restarts_a_failed_task_within_the_watchdogs_cap(catalog):
    # on-failure, not any: see plan_service (any broke Swarm's health-check rollback on the two-node swarm).
    policy = service_specs(catalog, "f1")["primary"]["TaskTemplate"]["RestartPolicy"]
    assert policy["Condition"] == "on-failure"
    assert policy["MaxAttempts"] == catalog.lane("f1").spec.watchdog.restart.max_restarts


def test_a_task_that_completed_is_a_dead_engine_not_a_finished_job():
    assert task_problem([task("complete", exit_code=0, message="finished")]) == (
        "task complete (exit code 0: vLLM exits 0 when its engine core dies): finished")


def test_the_recipe_health_check_waits_out_the_startup_budget(catalog):
    check = service_specs(catalog, "f1")["primary"]["TaskTemplate"]["ContainerSpec"]["Healthcheck"]
    assert check["Test"][:2] == ["CMD", "python3"] and "http://127.0.0.1:8000/health" in check["Test"][3]
    assert (check["Interval"], check["Timeout"], check["StartPeriod"]) == (5 * 10**9, 4 * 10**9, 600 * 10**9)
    rtx = service_specs(catalog, "f1")["rtx"]["TaskTemplate"]["ContainerSpec"]["Healthcheck"]
    assert "http://127.0.0.1:8001/health" in rtx["Test"][3], "a companion is checked on its own port"


def test_swarm_checks_a_sub_second_poll_every_two_seconds_and_watches_the_update_as_long(project, write_recipe):
    # The gate polls at the recipe's 0.2 s; Docker's check, a process in the task for its whole life, does not.
    write_recipe(RECIPE.replace("poll_interval_seconds: 5", "poll_interval_seconds: 0.2"))
    spec = service_specs(load_catalog(Project.locate()), "f1")["primary"]
    check = spec["TaskTemplate"]["ContainerSpec"]["Healthcheck"]
    assert check["Interval"] == 2 * 10**9
    assert spec["UpdateConfig"]["Monitor"] == (3 * 2 + 4) * 10**9


def test_gpus_are_generic_resources_and_secrets_travel_by_name_only(catalog):
    spec = service_specs(catalog, "f1")["primary"]
    assert spec["TaskTemplate"]["Resources"]["Reservations"]["GenericResources"] == [
        {"DiscreteResourceSpec": {"Kind": "NVIDIA-GPU", "Value": 2}}]
    assert "Reservations" not in service_specs(catalog, "f1", with_gpus=False)["primary"]["TaskTemplate"][
        "Resources"]
    container = spec["TaskTemplate"]["ContainerSpec"]
    assert container["lanectl_secret_env"] == ["HF_TOKEN"]
    assert not any(e.startswith("HF_TOKEN") for e in container["Env"])
    assert {"Type": "tmpfs", "Target": "/dev/shm", "TmpfsOptions": {"SizeBytes": 2 * 1024**3}} in container[
        "Mounts"]
    assert container["StopGracePeriod"] == 120 * 10**9


def test_labels_mark_the_service_but_never_make_its_container_a_local_lane(catalog):
    spec = service_specs(catalog, "f1")["primary"]
    assert spec["Labels"]["io.lanectl.lane"] == "f1" and spec["Labels"]["io.lanectl.node"] == "s1"
    container_labels = spec["TaskTemplate"]["ContainerSpec"]["Labels"]
    assert "io.lanectl.lane" not in container_labels and "io.lanectl.recipe" not in container_labels
    assert container_labels["io.lanectl.fleet-lane"] == "f1"


def test_service_names_stay_within_swarm_limits(catalog):
    lane = catalog.lane("f1")
    name = service_name(lane, "primary", "a-very-long-hostname-" * 4)
    assert len(name) == 63 and name != service_name(lane, "primary", "a-very-long-hostname-" * 4 + "x")


def test_a_service_stamped_with_its_recipes_fields_has_no_drift_and_a_change_is_named_field_by_field(catalog):
    lane = catalog.lane("f1")
    [primary, _] = plan_containers(lane, plan_image(lane))
    fields = service_fields(primary, {"HF_TOKEN": "d1"})
    labels = service_labels(lane, "primary", "s1", "inputs", fields)
    assert service_drift(labels, lane, fields) == []
    changed = service_fields(replace(primary, env={"X": "2"}, stop_timeout_seconds=90), {"HF_TOKEN": "d2"})
    assert service_drift(labels, lane, changed) == ["env +X", "secret_env HF_TOKEN (value)",
                                                    "stop_timeout_seconds 120 → 90"]
    assert service_drift(labels, catalog.lane("f2"), fields)[0] == "lane f1 → f2"
    assert service_drift({}, lane, fields) == ["lane none → f1", "created before lanectl recorded container specs"]
    assert "ipc" not in fields, "Swarm has no ipc field: the plan says so instead"


def task(state: str, desired: str = "running", created: str = "2026-11-30T10:00:00Z", **kw) -> TaskInfo:
    return TaskInfo(id=f"t-{state}-{created}", node_id="n", state=state, desired_state=desired,
                    message=kw.get("message", ""), error=kw.get("error", ""), exit_code=kw.get("exit_code"),
                    created=created)


def test_reading_tasks():
    old = task("shutdown", desired="shutdown", created="2026-11-30T09:00:00Z")
    assert current_task([old, task("running")]).state == "running"
    assert task_problem([old, task("starting")]) is None
    assert task_problem([task("failed", error="task: non-zero exit (1)", exit_code=1)]) == (
        "task failed (exit code 1): task: non-zero exit (1)")
    assert task_problem([task("rejected", error="No such image: x")]) == "task rejected: No such image: x"
    assert task_problem([]) == "no task"
    assert last_task_error([task("failed", error="old", created="2026-11-30T09:00:00Z"),
                            task("shutdown", desired="shutdown", error="unhealthy container"),
                            task("running", created="2026-11-30T11:00:00Z")]) == "unhealthy container"
    # The rollback's task queued behind the failed one for its host port is not why the update failed.
    assert last_task_error([task("rejected", error="No such image: x", created="2026-11-30T10:00:00Z"),
                            task("pending", error="no suitable node (host-mode port already in use on 1 node)",
                                 created="2026-11-30T11:00:00Z")]) == "No such image: x"
    assert last_task_error([task("pending", error="no suitable node")]) == "no suitable node"


def test_why_swarm_rolled_back_reads_the_update_tasks_final_record():
    old = task("shutdown", desired="shutdown", message="shutdown", exit_code=0, created="2026-11-30T09:00:00Z")
    rollback = task("starting", message="starting", created="2026-11-30T11:00:00Z")
    # What this machine's swarm records for a task Docker stopped as unhealthy whose engine exited 0.
    stopped = task("complete", desired="shutdown", message="finished", exit_code=0)
    assert why_swarm_rolled_back([old, stopped, rollback]) == (
        "the new task failed its health check and Swarm stopped it (it ended complete, exit 0, with no error)")
    # An error in the record says more than the state, and wins.
    crashed = task("failed", desired="shutdown", error="task: non-zero exit (137): unhealthy container",
                   exit_code=137)
    assert why_swarm_rolled_back([old, crashed, rollback]) == "task: non-zero exit (137): unhealthy container"
    # A non-zero exit with no error is not called a health check failure.
    killed = task("failed", desired="shutdown", message="started", exit_code=137)
    assert why_swarm_rolled_back([old, killed, rollback]).startswith("the new task ended failed, exit code 137")
    assert why_swarm_rolled_back([rollback]) == "Swarm's record names no task that stopped"


def service(lane: str, role: str, node_name: str, sid: str, **kw) -> ServiceState:
    return ServiceState(id=sid, name=f"r-{role}-{node_name}", version=1,
                        spec={"Labels": {"io.lanectl.lane": lane, "io.lanectl.role": role,
                                         "io.lanectl.node": node_name, "io.lanectl.recipe": "r"},
                              "EndpointSpec": {"Ports": [{"PublishedPort": 18000}]}},
                        previous_spec=kw.get("previous"), update_state=kw.get("update"), update_started=None,
                        update_message="")


def gated(name: str, services: list[ServiceState], **labels: str) -> NodeInfo:
    """A node whose last passed gate saw `services` as they are."""
    marks = {gated_label(s.name): spec_mark(s.spec) for s in services if s.node == name}
    return node(name, labels={"gpu": "gb300", **labels, **marks})


def test_fleet_status_is_healthy_only_when_every_node_is_up_and_every_lane_answers():
    services = [service("f1", "primary", "s1", "a"), service("f1", "primary", "s2", "b")]
    nodes = [gated("s1", services), gated("s2", services, **{LEASE_LABEL: "ops@s1 pid 7 @1"})]
    tasks = {"a": [task("running")], "b": [task("running")]}
    ok = summarize(nodes, services, tasks, {"a": Probe(True, "200"), "b": Probe(True, "200")})
    assert ok["healthy"] and ok["problems"] == []
    assert ok["nodes"][1]["lease"] == "ops@s1 pid 7 @1" and LEASE_LABEL not in ok["nodes"][1]["labels"]
    assert ok["nodes"][1]["labels"] == {"gpu": "gb300"}, "the gated marks are not the node's own labels"
    assert [lane["lane"] for row in ok["nodes"] for lane in row["lanes"]] == ["f1", "f1"]

    changed = [services[0], service("f2", "primary", "s2", "b")]
    ungated = summarize(nodes, changed, tasks, {"a": Probe(True, "200"), "b": Probe(True, "200")})
    assert ungated["problems"] == ["s2: f2 primary changed since the node last passed its gate (r-primary-s2); "
                                   "`lanectl up f2 --fleet` gates it"]
    assert [lane["gated"] for row in ungated["nodes"] for lane in row["lanes"]] == [True, False]
    never = summarize([node("s1"), nodes[1]], services, tasks, {"a": Probe(True, "200"), "b": Probe(True, "200")})
    assert not never["healthy"], "a service no gate ever saw is not called serving"

    down = summarize([nodes[0], node("s2", state="down")], services, tasks, {"a": Probe(True, "200")})
    assert not down["healthy"]
    assert down["problems"] == ["s2: node is down; its lanes (f1) cannot be reached"]

    hung = summarize(nodes, services, tasks, {"a": Probe(True, "200"), "b": Probe(False, "HTTP 503")})
    assert hung["problems"] == ["s2: f1 primary is not serving (HTTP 503)"]

    restarted = summarize(nodes, services, {**tasks, "b": [task("failed", desired="shutdown", error="exit 1"),
                                                          task("running", created="2026-11-30T11:00:00Z")]}, {})
    assert restarted["healthy"], "Swarm restarted it and it serves"
    assert [lane["failed_tasks"] for row in restarted["nodes"] for lane in row["lanes"]] == [0, 1]


def test_render_shows_the_service_spec_of_each_role_on_each_of_the_recipe_nodes(catalog):
    from lanectl.commands.render import render_lane

    rendered = render_lane(catalog.lane("f2"), None).data
    assert [s["Name"] for s in rendered["services"]] == [
        "fleet-t-primary-s2", "fleet-t-rtx-s2", "fleet-t-primary-s1", "fleet-t-rtx-s1"]
    assert render_lane(catalog.lane("local"), None).data["services"] == []


def test_doctor_says_what_a_swarm_placement_needs(catalog):
    from lanectl.commands.doctor import swarm_findings

    lanes = [catalog.lane("f1")]
    [finding] = swarm_findings({"Swarm": {"LocalNodeState": "inactive"}}, [], lanes)
    assert finding.severity == "error" and "not in a Swarm (inactive)" in finding.detail
    assert "docker swarm init" in finding.fix
    worker = swarm_findings({"Swarm": {"LocalNodeState": "active", "ControlAvailable": False}}, [], lanes)
    assert "is a worker" in worker[0].detail
    gpu_node = NodeInfo(id="a", hostname="s1", state="ready", availability="active", role="manager", addr="",
                        gpus={"NVIDIA-GPU": 4})
    manager = {"Swarm": {"LocalNodeState": "active", "ControlAvailable": True}}
    found = swarm_findings(manager, [gpu_node, node("s2", state="down")], lanes)
    assert [(f.check, f.severity) for f in found] == [("swarm", "warn"), ("swarm gpus", "warn")]
    assert found[0].detail == "manager of 2 node(s); not ready: s2"
    assert found[1].detail == "nodes advertising no NVIDIA-GPU: s2"
    assert [f.severity for f in swarm_findings(manager, [gpu_node], lanes)] == ["ok", "ok"]


def test_a_lease_is_left_behind_once_its_term_passed_its_process_is_gone_or_its_switch_closed():
    lease = read_lease("ops@box1 pid 4242 switch abc123 @1000 +600")
    assert (lease.holder, lease.pid, lease.switch, lease.since, lease.seconds) == ("ops@box1", 4242, "abc123", 1000,
                                                                                    600)
    assert read_lease(lease.label()) == lease

    def judge(lease: NodeLease, *, now: float = 1100, host: str = "box1", alive: bool = True,
              closed: frozenset[str] = frozenset()) -> str | None:
        return why_left_behind(lease, now=now, host=host, pid_alive=lambda pid: alive,
                               switch_closed=closed.__contains__, term_seconds=3600)

    assert judge(lease) is None, "a live run within its term holds the node"
    assert judge(lease, alive=False) == "its process (pid 4242 on box1) is gone"
    assert judge(lease, alive=False, host="box2") is None, "another host's pid says nothing here"
    assert judge(lease, closed=frozenset({"abc123"})) == "its run (switch abc123) has ended"
    assert judge(lease, now=1600) == "it was taken 600 s ago, longer than its run could last (600 s)"
    legacy = read_lease("ops@box1 pid 7 @1000")
    assert (legacy.switch, legacy.seconds) == (None, None)
    assert judge(legacy) is None and judge(legacy, now=4600) is not None, "an old lease keeps the legacy term"
    assert judge(read_lease("garbage")) == "it does not say when it was taken"


def test_fleet_status_names_a_lease_left_behind_and_is_not_healthy():
    services = [service("f1", "primary", "s1", "a")]
    held = "ops@box1 pid 4242 switch abc123 @1000 +600"
    nodes = [gated("s1", services, **{LEASE_LABEL: held})]
    tasks = {"a": [task("running")]}
    live = summarize(nodes, services, tasks, {"a": Probe(True, "200")})
    assert live["healthy"] and live["nodes"][0]["lease_left_behind"] is None, "a run in progress is no problem"
    dead = summarize(nodes, services, tasks, {"a": Probe(True, "200")},
                     leases_left={"s1": "its process (pid 4242 on box1) is gone"})
    assert dead["problems"] == ["s1: the lease of ops@box1 pid 4242 is left behind (its process (pid 4242 on box1) "
                                "is gone); the next `up --fleet` or `rollback --fleet` takes it over"]
    from lanectl.cli.views import fleet_status
    from lanectl.output import Result

    shown = [line.text for line in fleet_status(Result("fleet-status", dead))]
    assert f"    lease left behind by {held}: its process (pid 4242 on box1) is gone" in shown
    assert not any("being changed" in text for text in shown)


def test_the_swarm_adapter_writes_gated_marks_and_takes_over_only_a_lease_left_behind(recording):  # noqa: F811
    held = "ops@box1 pid 4242 switch abc123 @1000 +600"
    labels = {"gpu": "gb300", LEASE_LABEL: held, gated_label("r-rtx-s1"): "0" * 16}

    def answer(request: Recorded) -> Answer:
        if request.path.endswith("/info"):
            return ok_json({"Swarm": {"LocalNodeState": "active", "ControlAvailable": True, "NodeID": "n1"}})
        if request.path.endswith("/nodes/n1"):
            return ok_json({"ID": "n1", "Version": {"Index": 7}, "Spec": {"Labels": labels, "Role": "manager"},
                            "Description": {"Hostname": "s1"}})
        return 200, {}, b""

    engine = recording(answer)
    swarm = SwarmEngine(EngineAPI(engine.url))
    s1 = node("s1")
    swarm.record_gated(replace(s1, id="n1"), {"r-primary-s1": "f" * 16, "r-rtx-s1": None})
    update = engine.requests[-1]
    assert (update.path.endswith("/nodes/n1/update"), update.query) == (True, {"version": "7"})
    assert update.json()["Labels"] == {"gpu": "gb300", LEASE_LABEL: held, gated_label("r-primary-s1"): "f" * 16}

    engine.requests.clear()
    with pytest.raises(OperationFailed, match="node s1 is being changed by ops@box1 pid 4242 switch abc123;"):
        swarm.take_lease(replace(s1, id="n1"), "ops@box2 pid 1 switch def @2000 +600", left_behind=lambda _: None)
    assert [r.method for r in engine.requests] == ["GET"], "nothing written"
    replaced = swarm.take_lease(replace(s1, id="n1"), "ops@box2 pid 1 switch def @2000 +600",
                                left_behind=lambda value: "its process (pid 4242 on box1) is gone")
    assert replaced == f"{held}: its process (pid 4242 on box1) is gone"
    assert engine.requests[-1].json()["Labels"][LEASE_LABEL] == "ops@box2 pid 1 switch def @2000 +600"
