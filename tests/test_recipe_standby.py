"""The `standby` recipe key: exact, located messages for a standby that could not work or would expose the box."""

from __future__ import annotations

from pathlib import Path

import pytest

from lanectl.errors import RecipeInvalid
from lanectl.project import Project
from lanectl.recipe.catalog import load_catalog

GOOD = """
schema: lanectl/v1
id: t
defaults:
  image:
    template: stub-engine
    base: lanectl/base-python:bookworm
    local_base: true
    python_site: /opt/stub
  engine:
    args: [/model, --served-model-name, m, --port, "8000", --enable-sleep-mode]
    env: {VLLM_SERVER_DEV_MODE: "1"}
    gpus: {device_ids: ["0"]}
    ports:
      - {container: 8000, host: 18000, host_ip: 127.0.0.1}
  health:
    startup_budget_minutes: 1
    served_model_name: m
  standby: {mode: sleep, level: 1, weights_gib: 16, resident_gib: 2, gpu_memory_gib: 80}
lanes:
  a: {}
  b:
    engine:
      ports:
        - {container: 8000, host: 18001, host_ip: 127.0.0.1}
"""


# tests/test_fleet_rollout.py holds the claim about a Swarm lane's port; here it only comes along.
SWARM_PORT = ("host_ip 127.0.0.1 limits the primary's port %d to that address, but Swarm publishes a port on every "
              "address of its node (it has no host address); with VLLM_SERVER_DEV_MODE=1 vLLM serves its development "
              "routes there, so anyone who reaches the node can POST /sleep (the lane then answers /health and "
              "generates nothing) or /wake_up, and /collective_rpc runs engine methods. Keep this lane local "
              "(placement.backend: local), or say that the port may be public: `public: true` on it")


def problems() -> list[str]:
    with pytest.raises(RecipeInvalid) as caught:
        load_catalog(Project.locate())
    return [str(p) for p in caught.value.problems]


def test_the_good_standby_recipe_loads(write_recipe):
    write_recipe(GOOD)
    lane = load_catalog(Project.locate()).lane("a")
    assert lane.spec.standby is not None
    assert (lane.spec.standby.level, lane.spec.standby.wake_check.max_tokens) == (1, 8)


def test_the_shipped_recipes_say_where_standby_is_on_and_off():
    catalog = load_catalog(Project.locate(Path(__file__).resolve().parent.parent / "recipes"))
    assert all(catalog.lane(name).spec.standby is not None for name in ("demo-h1", "demo-h2", "demo-broken"))
    assert all(catalog.lane(name).spec.standby is None for name in ("h1-REF", "h2-REF"))


@pytest.mark.parametrize(("change", "expected"), [
    pytest.param(
        ('    args: [/model, --served-model-name, m, --port, "8000", --enable-sleep-mode]\n',
         '    args: [/model, --served-model-name, m, --port, "8000"]\n'),
        ["recipes/r.yaml:10:11: defaults.engine.args: standby needs --enable-sleep-mode in the primary engine's "
         "args: vLLM picks the allocator that can give memory back at start, and without it POST /sleep fails. "
         "Add --enable-sleep-mode"],
        id="no-sleep-mode-flag"),
    pytest.param(
        ('    env: {VLLM_SERVER_DEV_MODE: "1"}\n', ""),
        [f"recipes/r.yaml:{where}: lanes.{lane}.engine.env: standby needs VLLM_SERVER_DEV_MODE: \"1\" in the "
         "primary engine's env: vLLM mounts POST /sleep, POST /wake_up and GET /is_sleeping only in development "
         "mode" for where, lane in (("19:6", "a"), ("22:7", "b"))],
        id="no-dev-mode"),
    pytest.param(
        ("      - {container: 8000, host: 18000, host_ip: 127.0.0.1}\n",
         "      - {container: 8000, host: 18000}\n"),
        ["recipes/r.yaml:14:9: defaults.engine.ports[0]: host_ip 0.0.0.0 publishes the primary's port 18000 off "
         "the box, and with VLLM_SERVER_DEV_MODE=1 vLLM serves development routes on it: anyone who reaches it can "
         "put the lane to sleep or wake it, and /collective_rpc runs engine methods. Publish on 127.0.0.1 and let "
         "clients in through a proxy on the box, or set standby.acknowledge_exposed_dev_routes: true"],
        id="port-off-the-box"),
    pytest.param(
        ("    served_model_name: m\n", "    served_model_name: m\n  placement: {backend: swarm}\n"),
        [f"recipes/r.yaml:14:49: defaults.engine.ports[0].host_ip: {SWARM_PORT % 18000}",
         "recipes/r.yaml:19:12: defaults.standby: Swarm lanes (placement.backend: swarm) cannot keep a standby "
         "yet: an update replaces the service's task, so no process is left to wake. Remove standby for this "
         "lane",
         f"recipes/r.yaml:25:51: lanes.b.engine.ports[0].host_ip: {SWARM_PORT % 18001}"],
        id="swarm"),
    pytest.param(
        ('    gpus: {device_ids: ["0"]}\n', ""),
        ["recipes/r.yaml:17:12: defaults.standby: a standby frees GPU memory for the next lane, and this lane asks "
         "for no GPU (engine.gpus): it has nothing to free. Remove standby, or give the lane its GPUs"],
        id="no-gpu"),
    pytest.param(
        ("weights_gib: 16, resident_gib: 2", "weights_gib: 16, resident_gib: 12"),
        [f"recipes/r.yaml:18:67: defaults.standby.resident_gib: asleep, this lane holds 12 GiB of each 80 GiB GPU, "
         f"but lane {other}'s primary asks vLLM for --gpu-memory-utilization 0.92 of it, which leaves 6.4 GiB: vLLM "
         f"would refuse to start {other} beside it. Lower that to 0.85 or less, or prove a resident_gib of 6.4 or "
         f"less (`lanectl standby check {lane} --beside {other}` measures both), or leave standby off"
         for lane, other in (("b", "a"), ("a", "b"))],
        id="does-not-fit-by-vllm-default-share"),
    pytest.param(
        ("      ports:\n        - {container: 8000, host: 18001, host_ip: 127.0.0.1}\n",
         "      args: [/model, --served-model-name, m, --enable-sleep-mode, --gpu-memory-utilization=0.99]\n"),
        ["recipes/r.yaml:14:9: defaults.engine.ports[0]: lane a publishes host port 18000/tcp too; asleep, this "
         "lane keeps its port, so a could not start beside it. Give each lane its own port (clients reach the "
         "serving lane through a proxy on the box)",
         "recipes/r.yaml:14:9: defaults.engine.ports[0]: lane b publishes host port 18000/tcp too; asleep, this "
         "lane keeps its port, so b could not start beside it. Give each lane its own port (clients reach the "
         "serving lane through a proxy on the box)",
         "recipes/r.yaml:18:67: defaults.standby.resident_gib: asleep, this lane holds 2 GiB of each 80 GiB GPU, "
         "but lane b's primary asks vLLM for --gpu-memory-utilization 0.99 of it, which leaves 0.8 GiB: vLLM would "
         "refuse to start b beside it. Lower that to 0.97 or less, or prove a resident_gib of 0.8 or less "
         "(`lanectl standby check a --beside b` measures both), or leave standby off"],
        id="shared-port-and-a-greedy-neighbour"),
    pytest.param(
        ("    ports:\n      - {container: 8000, host: 18000, host_ip: 127.0.0.1}\n", ""),
        ["recipes/r.yaml:10:5: defaults.engine: a standby's primary must publish a port: lanectl puts it to sleep "
         "and wakes it through its sleep routes there"],
        id="no-port"),
    pytest.param(
        ("level: 1,", "level: 2,"),
        ["recipes/r.yaml:18:33: defaults.standby.level: level 2: only level 1 is supported. Level 2 discards the "
         "weights, so a wake must reload them (a wake without a reload serves garbage, vllm#29341): no faster than "
         "a start"],
        id="level-2"),
    pytest.param(
        ("mode: sleep, ", "mode: hibernate, "),
        ["recipes/r.yaml:18:19: defaults.standby.mode: Input should be 'sleep', got 'hibernate'"],
        id="unknown-mode"),
    pytest.param(
        (", gpu_memory_gib: 80}", "}"),
        ["recipes/r.yaml:20:6: lanes.a.standby.gpu_memory_gib: required key is missing",
         "recipes/r.yaml:22:5: lanes.b.standby.gpu_memory_gib: required key is missing"],
        id="missing-gpu-memory"),
])
def test_standby_problems(write_recipe, change, expected):
    old, new = change
    assert old in GOOD
    write_recipe(GOOD.replace(old, new))
    assert problems() == expected


def test_an_acknowledged_exposure_loads(write_recipe):
    write_recipe(GOOD.replace("host: 18000, host_ip: 127.0.0.1", "host: 18000, host_ip: 0.0.0.0")
                 .replace("gpu_memory_gib: 80}", "gpu_memory_gib: 80, acknowledge_exposed_dev_routes: true}"))
    assert load_catalog(Project.locate()).lane("a").spec.standby is not None


def test_a_lane_on_other_gpus_is_not_a_neighbour(write_recipe):
    """A lane that never shares the standby's GPUs never starts beside it asleep: its share does not matter."""
    write_recipe(GOOD + """  c:
    standby: null
    engine:
      args: [/model, --served-model-name, m, --gpu-memory-utilization, "0.99"]
      env: {}
      gpus: {device_ids: ["1"]}
      ports:
        - {container: 8000, host: 18002, host_ip: 127.0.0.1}
""")
    assert sorted(load_catalog(Project.locate()).lanes) == ["a", "b", "c"]
