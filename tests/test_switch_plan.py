"""The pure switch planner: every kind of switch planned from a snapshot built in memory; no engine needed."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pytest

from lanectl.cli.durations import parse_duration
from lanectl.dockerapi.labels import CREATED_AS_LABEL
from lanectl.errors import BadInput, OperationFailed
from lanectl.lanes.plan import lanes_conflict, plan_down, plan_reconcile, plan_restart, plan_rollback, plan_up
from lanectl.recipe.catalog import Catalog
from tests.switch_box import Box, keys, listed, repo_catalog, way_back, with_engine, with_lane

H1, H2 = "dsv41-vllm-1017-h1-REF", "dsv41-vllm-1017-h2-REF"


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return repo_catalog()


def serving_h1(catalog: Catalog) -> Box:
    return Box(catalog).run("h1-REF").build("h2-REF").active("h1-REF", "h1-REF")


def test_a_switch_disarms_stops_the_old_lane_companion_first_starts_the_new_primary_first_and_re_arms(catalog):
    plan = plan_up(catalog, serving_h1(catalog).snapshot(), catalog.lane("h2-REF"))
    assert keys(plan) == ["disarm:h2-REF", f"stop:{H1}-rtx", f"stop:{H1}", f"create:{H2}", f"start:{H2}",
                          f"create:{H2}-rtx", f"start:{H2}-rtx", "gate:h2-REF", "activate:h2-REF", "arm:h2-REF"]
    assert [s.seconds for s in plan.steps[1:3]] == [60, 120], "each container's own stop timeout"
    assert plan.steps[0].seconds == 20 * 60 + 300, "the startup budget and a margin"
    assert way_back(plan) == [f"stop:{H2}-rtx", f"stop:{H2}", f"start:{H1}", f"start:{H1}-rtx", "gate:h1-REF",
                              "activate:h1-REF", "arm:h1-REF"]
    assert plan.previous == "h1-REF"


def test_kept_containers_are_started_not_created_and_a_rollback_takes_the_same_path(catalog):
    box = Box(catalog).run("h1-REF", "exited").run("h2-REF").active("h2-REF", "h1-REF", "h2-REF")
    plan = plan_rollback(catalog, box.snapshot(), None)
    assert (plan.kind, plan.lane, plan.previous) == ("rollback", "h1-REF", "h2-REF")
    assert keys(plan) == ["disarm:h1-REF", f"stop:{H2}-rtx", f"stop:{H2}", f"start:{H1}", f"start:{H1}-rtx",
                          "gate:h1-REF", "activate:h1-REF", "arm:h1-REF"]


def test_the_active_healthy_current_lane_is_a_noop_and_its_plan_says_so(catalog):
    box = Box(catalog).run("h2-REF").active("h2-REF", "h2-REF")
    plan = plan_up(catalog, box.snapshot(), catalog.lane("h2-REF"))
    assert (plan.kind, plan.steps) == ("noop", ())
    assert plan.lines() == ["would do nothing: h2-REF is already active and healthy; nothing to do"]


def test_the_active_lane_that_does_not_answer_health_is_gated_again_not_called_a_noop(catalog):
    box = Box(catalog).run("h2-REF").active("h2-REF", "h2-REF")
    box.active_healthy = False
    assert keys(plan_up(catalog, box.snapshot(), catalog.lane("h2-REF"))) == [
        "disarm:h2-REF", "gate:h2-REF", "activate:h2-REF", "arm:h2-REF"]


def _engine(field: str, value: object) -> Callable[[Catalog], Catalog]:
    return lambda catalog: with_engine(catalog, "h2-REF", **{field: value})


def _port(**change: object) -> Callable[[Catalog], Catalog]:
    def edit(catalog: Catalog) -> Catalog:
        ports = catalog.lanes["h2-REF"].spec.engine.ports
        return with_engine(catalog, "h2-REF", ports=[replace(ports[0], **change), *ports[1:]])
    return edit


def _companion(**change: object) -> Callable[[Catalog], Catalog]:
    def edit(catalog: Catalog) -> Catalog:
        rtx = catalog.lanes["h2-REF"].spec.companions["rtx"]
        return with_lane(catalog, "h2-REF", companions={"rtx": replace(rtx, engine=replace(rtx.engine, **change))})
    return edit


def _volumes(catalog: Catalog) -> Catalog:
    engine = catalog.lanes["h2-REF"].spec.engine
    return with_engine(catalog, "h2-REF", volumes=[*engine.volumes, replace(engine.volumes[0], source="/srv/extra",
                                                                                  target="/extra", read_only=True)])


# One edit per field a container's digest covers (README: "Exact to the recipe"), each reaching the container.
FIELD_EDITS = [
    ("ports (host port)", _port(host=30007), H2, "ports "),
    ("ports (host_ip)", _port(host_ip="127.0.0.1"), H2, "127.0.0.1:30006->30006/tcp"),
    ("volumes", _volumes, H2, "volumes "),
    ("secret_env names", _engine("secret_env", ["HF_TOKEN", "WANDB_API_KEY"]), H2, "secret_env +WANDB_API_KEY"),
    ("shm_size", _engine("shm_size", "32g"), H2, "shm_size 16g → 32g"),
    ("ipc", _engine("ipc", "private"), H2, "ipc host → private"),
    ("user", _engine("user", "1000:1000"), H2, "user none → 1000:1000"),
    ("init", _engine("init", False), H2, "init True → False"),
    ("stop timeout", _engine("stop_timeout_seconds", 300), H2, "stop_timeout_seconds 120 → 300"),
    ("gpus", _engine("gpus", None), H2, "gpus device 0 → none"),
    ("companion args", _companion(args=["/model", "--port", "30008"]), f"{H2}-rtx", "command "),
    ("companion env", _companion(env={"NCCL_DEBUG": "INFO"}), f"{H2}-rtx", "env +NCCL_DEBUG"),
    ("companion ports", _companion(ports=[]), f"{H2}-rtx", "ports "),
    ("companion shm_size", _companion(shm_size="1g"), f"{H2}-rtx", "shm_size "),
]


@pytest.mark.parametrize(("field", "edit", "container", "change"), FIELD_EDITS, ids=[e[0] for e in FIELD_EDITS])
@pytest.mark.parametrize("status", ["running", "exited"])
def test_a_recipe_change_that_lives_on_the_container_recreates_it_naming_the_change(catalog, field, edit, container,
                                                                                    change, status):
    box = Box(catalog).run("h2-REF", status).active("h2-REF" if status == "running" else None, "h2-REF")
    edited = edit(catalog)
    plan = plan_up(edited, box.snapshot(catalog=edited), edited.lane("h2-REF"))
    assert plan.kind == "up", "never a no-op"
    create = next(s for s in plan.steps if s.key == f"create:{container}")
    assert create.why.startswith("recreated: ") and change in create.why, create.why
    assert f"set-aside:{container}" in keys(plan), "renamed, not removed: the old one is the way back"
    if status == "running":
        assert keys(plan).index(f"stop:{container}") < keys(plan).index(f"set-aside:{container}")


def test_a_recreate_of_the_serving_lane_goes_back_to_the_containers_it_set_aside(catalog):
    box = Box(catalog).run("h2-REF").active("h2-REF", "h2-REF")
    edited = with_engine(catalog, "h2-REF", shm_size="32g")
    plan = plan_up(edited, box.snapshot(catalog=edited), edited.lane("h2-REF"))
    aside = next(s for s in plan.steps if s.action == "set-aside")
    assert aside.rename_to == f"{H2}.was-" + box.containers[H2].id[:12]
    assert plan.previous == "h2-REF"
    assert way_back(plan) == [f"stop:{H2}-rtx", f"stop:{H2}", f"put-back:{aside.rename_to}",
                              f"start:{H2}", f"start:{H2}-rtx", "gate:h2-REF", "activate:h2-REF", "arm:h2-REF"]
    assert keys(plan)[-2:] == [f"remove:{aside.rename_to}", "arm:h2-REF"], "dropped once the new one passed"


def test_a_secret_value_changed_in_lanectls_environment_recreates_the_container_without_naming_the_value(catalog):
    edited = catalog
    box = Box(edited)
    box.secret_digests = {"HF_TOKEN": "digest-of-old-value"}
    box.run("h2-REF").active("h2-REF", "h2-REF")
    box.secret_digests = {"HF_TOKEN": "digest-of-new-value"}
    plan = plan_up(edited, box.snapshot(), edited.lane("h2-REF"))
    create = next(s for s in plan.steps if s.key == f"create:{H2}")
    assert "secret_env HF_TOKEN (value)" in create.why and "digest" not in create.why
    box.secret_digests = {}
    assert plan_up(edited, box.snapshot(), edited.lane("h2-REF")).kind == "noop", \
        "a secret lanectl's environment does not have is not judged: it cannot be compared"


def test_a_rebuild_under_the_same_tag_reaches_the_containers_by_image_id(catalog):
    box = Box(catalog).run("h2-REF").active("h2-REF", "h2-REF")
    box.build("h2-REF", build_id="-no-cache")
    plan = plan_up(catalog, box.snapshot(), catalog.lane("h2-REF"))
    create = next(s for s in plan.steps if s.key == f"create:{H2}")
    assert "image h2-REF-build → h2-REF-build" in create.why


def test_a_primary_whose_baked_env_changed_names_the_variables_and_never_their_values(catalog):
    box = Box(catalog).run("h2-REF").active("h2-REF", "h2-REF")
    box.build("h2-REF", build_id="-env")
    snapshot = replace(box.snapshot(), image_env={
        "sha256:h2-REF-build": {"PATH": "/usr/bin", "VLLM_DSV41_MEGA_SPLITKV": "4", "OLD": "x"},
        "sha256:h2-REF-build-env": {"PATH": "/usr/bin", "VLLM_DSV41_MEGA_SPLITKV": "8", "NEW": "token-like"}})
    plan = plan_up(catalog, snapshot, catalog.lane("h2-REF"))
    create = next(s for s in plan.steps if s.key == f"create:{H2}")
    assert "image h2-REF-build → h2-REF-build (env +NEW -OLD VLLM_DSV41_MEGA_SPLITKV (value))" in create.why
    assert "token-like" not in create.why and "8" not in create.why.partition("(env ")[2]


def test_a_lane_first_brought_up_with_no_gpu_gets_its_gpus_back_with_a_plain_up(catalog):
    box = Box(catalog)
    box.with_gpus = False
    box.run("h2-REF").active("h2-REF", "h2-REF")
    plan = plan_up(catalog, box.snapshot(), catalog.lane("h2-REF"), with_gpus=True)
    assert "gpus none → device 0" in next(s for s in plan.steps if s.key == f"create:{H2}").why
    assert plan_up(catalog, box.snapshot(), catalog.lane("h2-REF"), with_gpus=False).kind == "noop"


def test_the_create_step_carries_the_stamped_spec_it_creates(catalog):
    plan = plan_up(catalog, serving_h1(catalog).snapshot(), catalog.lane("h2-REF"))
    spec = next(s for s in plan.steps if s.key == f"create:{H2}").spec
    assert spec is not None and spec.labels[CREATED_AS_LABEL] == H2
    assert spec.gpus == {"device_ids": ["0"]}


def test_a_running_companion_is_stopped_while_its_primary_is_restarted(catalog):
    box = Box(catalog).run("h2-REF", roles=("primary",), ).run("h2-REF", roles=("rtx",))
    box.containers[H2] = replace(box.containers[H2], state="exited", host_ports=())
    box.active("h2-REF", "h2-REF")
    assert keys(plan_up(catalog, box.snapshot(), catalog.lane("h2-REF"))) == [
        "disarm:h2-REF", f"stop:{H2}-rtx", f"start:{H2}", f"start:{H2}-rtx", "gate:h2-REF", "activate:h2-REF",
        "arm:h2-REF"]


def test_an_unbuilt_lane_is_refused_before_any_step(catalog):
    with pytest.raises(OperationFailed, match=r"h2-REF: image lanectl/.*:h2-REF-\w+ is not built; run `lanectl build "
                                              r"h2-REF` first"):
        plan_up(catalog, Box(catalog).run("h1-REF").active("h1-REF").snapshot(), catalog.lane("h2-REF"))


# -- containers lanectl did not make ---------------------------------------------------------------------------

def _renamed(box: Box) -> None:
    box.containers["h2-renamed"] = replace(box.containers.pop(H2), name="h2-renamed")


def _hand_run(box: Box) -> None:
    container = box.containers[H2]
    labels = {k: v for k, v in container.labels.items() if k in ("io.lanectl.recipe", "io.lanectl.lane",
                                                                  "io.lanectl.inputs")}
    box.containers[H2] = replace(container, labels=labels)


def _name_holder(box: Box) -> None:
    box.containers[H2] = replace(box.containers[H2], labels={}, image="busybox")


def _port_holder(box: Box) -> None:
    del box.containers[H2], box.containers[f"{H2}-rtx"]
    from lanectl.dockerapi.containers import ContainerSpec

    web = ContainerSpec(name="web", role="", image="nginx", command=None, entrypoint=None, env={}, secret_env=[],
                        ports=[], volumes=[], gpus=None, shm_size=None, ipc=None, init=False, user=None,
                        stop_timeout_seconds=10)
    box.put(listed(web, "sha256:nginx", host_ports=(("tcp", 30006),)))


@pytest.mark.parametrize(("make", "what"), [
    (_renamed, f"h2-renamed (renamed: lanectl created it as {H2})"),
    (_hand_run, f"{H2} (made from h2-REF's image but not created by lanectl)"),
    (_name_holder, f"{H2} (holds the name of h2-REF's primary container)"),
    (_port_holder, "web (holds a host port)"),
])
def test_a_container_lanectl_did_not_make_is_never_adopted_and_up_is_refused_before_anything_stops(catalog, make,
                                                                                                  what):
    box = serving_h1(catalog).run("h2-REF")
    make(box)
    with pytest.raises(BadInput, match="h2-REF cannot start: ") as refused:
        plan_up(catalog, box.snapshot(), catalog.lane("h2-REF"))
    assert what in str(refused.value) and "nothing was changed" in str(refused.value)
    assert ("docker stop web" if make is _port_holder else "docker rm -f") in str(refused.value)


def test_the_prune_removes_only_containers_lanectl_created(catalog):
    demo = repo_catalog()
    box = Box(demo).run("demo-h1", "exited").run("demo-h2", "exited").run("demo-broken", "exited").build("demo-h2-8")
    box.active(None, "demo-broken", "demo-h1", "demo-h2")
    _hand_run_copy = replace(box.containers["lanectl-demo-demo-broken"], name="debug-copy",
                             labels={k: v for k, v in box.containers["lanectl-demo-demo-broken"].labels.items()
                                     if k != CREATED_AS_LABEL and k != "io.lanectl.role"})
    box.put(_hand_run_copy)
    recipe = demo.lane("demo-h2-8").recipe
    demo = replace(demo, lanes={name: replace(lane, recipe=replace(recipe, keep_stopped_lanes=1))
                                if lane.recipe.id == recipe.id else lane for name, lane in demo.lanes.items()})
    plan = plan_up(demo, box.snapshot(catalog=demo), demo.lane("demo-h2-8"))
    removed = [s.container for s in plan.steps if s.action == "remove"]
    assert removed == ["lanectl-demo-demo-h1", "lanectl-demo-demo-h1-rtx", "lanectl-demo-demo-broken",
                       "lanectl-demo-demo-broken-rtx"], "keep 1: demo-h2, the most recent known-good"
    assert "debug-copy" not in removed


# -- restart, down, reconcile -------------------------------------------------------------------------------------

def test_the_watchdog_restart_starts_the_lane_as_it_was(catalog):
    box = Box(catalog).run("h2-REF", roles=("rtx",)).run("h2-REF", "exited", roles=("primary",))
    box.active("h2-REF", "h2-REF")
    plan = plan_restart(catalog, box.snapshot(), catalog.lane("h2-REF"), with_gpus=True)
    assert keys(plan) == [f"stop:{H2}-rtx", "gpu-memory:h2-REF", f"start:{H2}", f"start:{H2}-rtx", "gate:h2-REF",
                          "activate:h2-REF"]
    assert way_back(plan) == [f"stop:{H2}-rtx", f"stop:{H2}"]


def test_the_watchdog_never_restarts_a_lane_onto_gpus_another_lane_runs_on(catalog):
    box = Box(catalog).run("h1-REF", "exited").run("h2-REF").active("h1-REF", "h1-REF")
    with pytest.raises(OperationFailed, match="not restarting h1-REF: h2-REF runs on its GPUs or host ports"):
        plan_restart(catalog, box.snapshot(), catalog.lane("h1-REF"), with_gpus=True)


def test_down_stops_the_lane_companion_first_and_marks_it_inactive(catalog):
    box = Box(catalog).run("h2-REF").active("h2-REF", "h2-REF")
    assert keys(plan_down(catalog, box.snapshot(), "h2-REF", with_standbys=True)) == [
        f"stop:{H2}-rtx", f"stop:{H2}", "deactivate:h2-REF"]


def test_an_unfinished_switch_whose_target_runs_is_finished_by_its_gate(catalog):
    box = Box(catalog).run("h1-REF", "exited").run("h2-REF").active("h1-REF", "h1-REF")
    box.unfinished = {"switch": "s1", "action": "up", "from": "h1-REF", "to": "h2-REF", "done_steps": []}
    plan = plan_reconcile(catalog, box.snapshot())
    assert plan is not None and plan.kind == "finish"
    assert keys(plan) == ["gate:h2-REF", "activate:h2-REF", "arm:h2-REF"]
    assert way_back(plan)[:2] == [f"stop:{H2}-rtx", f"stop:{H2}"] and "start:" + H1 in way_back(plan)


def test_an_unfinished_switch_whose_target_does_not_run_is_undone(catalog):
    box = Box(catalog).run("h1-REF", "exited").run("h2-REF", "exited").active("h1-REF", "h1-REF")
    box.unfinished = {"switch": "s1", "action": "up", "from": "h1-REF", "to": "h2-REF", "done_steps": []}
    plan = plan_reconcile(catalog, box.snapshot())
    assert plan is not None and plan.kind == "undo"
    assert keys(plan) == [f"stop:{H2}-rtx", f"stop:{H2}", f"start:{H1}", f"start:{H1}-rtx", "gate:h1-REF",
                          "activate:h1-REF", "arm:h1-REF"]


def test_the_json_plan_names_the_same_steps_as_the_text(catalog):
    plan = plan_up(catalog, serving_h1(catalog).snapshot(), catalog.lane("h2-REF"))
    data = plan.as_dict()
    assert data["keys"] == keys(plan) and len(data["steps"]) == len(plan.lines())
    assert data["way_back"][0]["steps"] == [f"stop:{H2}-rtx", f"stop:{H2}"]


def test_lanes_conflict_by_gpu_or_host_port(catalog):
    assert lanes_conflict(catalog.lane("h1-REF"), catalog.lane("h2-REF"))
    # The demo lanes each have their own loopback port (a sleeping lane keeps its port) and share GPU 0 and 1.
    assert lanes_conflict(catalog.lane("demo-h1"), catalog.lane("demo-h2")), "same GPUs"
    assert lanes_conflict(catalog.lane("demo-h1"), catalog.lane("h1-REF")), "both ask for GPU 0"
    spec = catalog.lane("demo-h1").spec
    elsewhere = replace(spec, engine=replace(spec.engine, gpus=None), companions={})
    assert not lanes_conflict(replace(catalog.lane("demo-h1"), spec=elsewhere), catalog.lane("h1-REF")), \
        "no shared GPU or port"


@pytest.mark.parametrize(("text", "seconds"), [("90", 90), ("90s", 90), ("10m", 600), ("2h", 7200),
                                               ("1h30m", 5400), ("0.5s", 0.5)])
def test_durations(text, seconds):
    assert parse_duration(text, option="--x") == seconds


@pytest.mark.parametrize("text", ["", "soon", "10 m", "5x", "m5"])
def test_bad_durations_name_the_option(text):
    with pytest.raises(BadInput, match=r"^--lock-wait .*: expected a duration like 90s, 10m, 2h or 1h30m$"):
        parse_duration(text, option="--lock-wait")


def test_the_watchdog_restarts_the_active_lane_beside_its_standby_asleep_on_the_same_gpus(catalog):
    """demo-h2 serves with demo-h1 asleep beside it on the same GPUs, and demo-h2 dies: its restart was refused
    ("demo-h1 runs on its GPUs") on every pass, and nothing served. A standby asleep is what a switch leaves beside
    the lane it starts, so the restart starts demo-h2 beside it (the executor asks demo-h1 /is_sleeping first)."""
    catalog = repo_catalog()
    box = Box(catalog).run("demo-h1").run("demo-h2", "exited").active("demo-h2", "demo-h1", "demo-h2")
    box.asleep("demo-h1").fingerprinted("demo-h2")
    plan = plan_restart(catalog, box.snapshot(), catalog.lane("demo-h2"), with_gpus=True)
    assert "start:lanectl-demo-demo-h2" in keys(plan) and not [k for k in keys(plan) if "demo-h1" in k], keys(plan)


def test_the_watchdog_never_restarts_a_lane_beside_a_standby_that_is_paused_or_holds_its_ports(catalog):
    paused = Box(catalog).run("h1-REF").run("h2-REF", "exited").active("h2-REF", "h1-REF", "h2-REF").asleep("h1-REF")
    with pytest.raises(OperationFailed, match="not restarting h2-REF: h1-REF runs on its GPUs or host ports"):
        plan_restart(catalog, paused.snapshot(), catalog.lane("h2-REF"), with_gpus=True)  # h1-REF holds port 30006
    frozen = Box(catalog).run("demo-h1", "paused").run("demo-h2", "exited").active("demo-h2", "demo-h1", "demo-h2")
    with pytest.raises(OperationFailed, match="not restarting demo-h2: demo-h1 runs on its GPUs or host ports"):
        plan_restart(catalog, frozen.asleep("demo-h1").snapshot(), catalog.lane("demo-h2"), with_gpus=True)
