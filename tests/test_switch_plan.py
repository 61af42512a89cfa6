"""The pure switch plan: exact steps from what the engine shows, no engine needed."""

from __future__ import annotations

import pytest

from lanectl.cli.durations import parse_duration
from lanectl.dockerapi.containers import ContainerState
from lanectl.errors import BadInput
from lanectl.lanes.plan import lanes_conflict, plan_switch
from lanectl.project import Project
from lanectl.recipe.catalog import load_catalog
from tests.conftest import REPO


@pytest.fixture(scope="module")
def catalog():
    return load_catalog(Project.locate(REPO / "recipes"))


def container(catalog, lane: str, role: str, status: str, image: str) -> ContainerState:
    target = catalog.lane(lane)
    return ContainerState(name=target.container_name(role), id=f"id-{lane}-{role}", lane=lane, role=role,
                          recipe=target.recipe.id, inputs="", image=image, status=status, exit_code=None,
                          started_at=None, finished_at=None, restart_count=0, device_requests=())


def keys(steps) -> list[str]:
    return [step.key for step in steps]


def test_switch_stops_the_conflicting_lane_companion_first_then_starts_primary_first(catalog):
    observed = [container(catalog, "h1-REF", "primary", "running", "img:h1"),
                container(catalog, "h1-REF", "rtx", "running", "img:h1")]
    steps = plan_switch(catalog.lane("h2-REF"), "img:h2", catalog, observed)
    assert keys(steps) == [
        "stop:dsv41-vllm-1017-h1-REF-rtx", "stop:dsv41-vllm-1017-h1-REF",
        "create:dsv41-vllm-1017-h2-REF", "start:dsv41-vllm-1017-h2-REF",
        "create:dsv41-vllm-1017-h2-REF-rtx", "start:dsv41-vllm-1017-h2-REF-rtx",
        "gate:h2-REF", "activate:h2-REF",
    ]
    assert steps[0].timeout == 60 and steps[1].timeout == 120, "each container's own stop timeout"


def test_kept_containers_are_started_not_created(catalog):
    observed = [container(catalog, "h1-REF", "primary", "exited", "img:h1"),
                container(catalog, "h1-REF", "rtx", "exited", "img:h1"),
                container(catalog, "h2-REF", "primary", "running", "img:h2"),
                container(catalog, "h2-REF", "rtx", "running", "img:h2")]
    assert keys(plan_switch(catalog.lane("h1-REF"), "img:h1", catalog, observed)) == [
        "stop:dsv41-vllm-1017-h2-REF-rtx", "stop:dsv41-vllm-1017-h2-REF",
        "start:dsv41-vllm-1017-h1-REF", "start:dsv41-vllm-1017-h1-REF-rtx", "gate:h1-REF", "activate:h1-REF"]


def test_a_container_of_an_older_build_is_recreated(catalog):
    observed = [container(catalog, "h2-REF", "primary", "exited", "img:h2-old")]
    assert keys(plan_switch(catalog.lane("h2-REF"), "img:h2", catalog, observed))[:4] == [
        "remove:dsv41-vllm-1017-h2-REF", "create:dsv41-vllm-1017-h2-REF", "start:dsv41-vllm-1017-h2-REF",
        "create:dsv41-vllm-1017-h2-REF-rtx"]


def test_a_running_companion_is_stopped_while_its_primary_is_restarted(catalog):
    observed = [container(catalog, "h2-REF", "primary", "exited", "img:h2"),
                container(catalog, "h2-REF", "rtx", "running", "img:h2")]
    assert keys(plan_switch(catalog.lane("h2-REF"), "img:h2", catalog, observed)) == [
        "stop:dsv41-vllm-1017-h2-REF-rtx", "start:dsv41-vllm-1017-h2-REF", "start:dsv41-vllm-1017-h2-REF-rtx",
        "gate:h2-REF", "activate:h2-REF"]


def test_another_projects_lane_of_the_same_name_is_not_touched(catalog):
    stranger = container(catalog, "h1-REF", "primary", "running", "img:h1")
    from dataclasses import replace

    stranger = replace(stranger, recipe="someone-else", name="other-h1")
    assert "stop:other-h1" not in keys(plan_switch(catalog.lane("h2-REF"), "img:h2", catalog, [stranger]))


def test_lanes_conflict_by_gpu_or_host_port(catalog):
    assert lanes_conflict(catalog.lane("h1-REF"), catalog.lane("h2-REF"))
    # The demo lanes each have their own loopback port (a sleeping lane keeps its port) and share GPU 0 and 1.
    assert lanes_conflict(catalog.lane("demo-h1"), catalog.lane("demo-h2")), "same GPUs"
    assert lanes_conflict(catalog.lane("demo-h1"), catalog.lane("h1-REF")), "both ask for GPU 0"
    from dataclasses import replace

    elsewhere = catalog.lane("demo-h1").spec.model_copy(update={"engine": catalog.lane("demo-h1").spec.engine
                                                                .model_copy(update={"gpus": None}),
                                                                "companions": {}})
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
