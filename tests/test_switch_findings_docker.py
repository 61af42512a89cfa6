"""Issue 50's findings that the in-memory engine pinned (tests/test_switch_fuzz.py), each shown once more on the
real Docker engine: a recreate of the serving lane that fails its gate (a standby beside it; a new host port), a
full state folder, a lost secret-digest.key, a companion removed from the recipe, a secret lanectl lacks.

One project for the module (the demo recipe with its standbys, each lane on its own loopback ports), two lanes
built once; each test has its own state folder and leaves the recipe and the engine as it found them.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import docker
import httpx
import pytest

from tests.lane_fixtures import (
    COMPANIONS_BLOCK,
    LaneProject,
    free_port,
    make_lane_project,
    remove_containers,
    remove_everything,
)

pytestmark = pytest.mark.docker

LANES = ["demo-h1", "demo-h2"]


@pytest.fixture(scope="module")
def lanes(tmp_path_factory: pytest.TempPathFactory):
    project = make_lane_project(tmp_path_factory.mktemp("findings"), standby=True, extra_lanes="")
    project.invoke("build", *LANES, state=tmp_path_factory.mktemp("build-state"), check=True, timeout=600)
    yield project
    remove_everything(project)


@pytest.fixture
def state(lanes: LaneProject, tmp_path: Path):
    recipe = lanes.root / "recipes" / "lanes.yaml"
    original = recipe.read_text()
    yield tmp_path / "state"
    recipe.write_text(original)
    remove_containers(lanes)


def cli(lanes: LaneProject, state: Path, *args: str, code: int | None = 0, **env: str):
    result = lanes.invoke(*args, state=state, extra_env=env or None)
    if code is not None:
        assert result.returncode == code, f"exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    return result


def status(lanes: LaneProject, state: Path, **env: str) -> dict:
    return json.loads(cli(lanes, state, "status", "--json", **env).stdout)["data"]


def row(data: dict, lane: str) -> dict:
    return next(r for r in data["lanes"] if r["lane"] == lane)


def inspect(lanes: LaneProject, lane: str, role: str = "primary") -> dict:
    return docker.from_env().api.inspect_container(lanes.container(lane, role))


def published(lanes: LaneProject, lane: str, role: str = "primary") -> int:
    bindings = inspect(lanes, lane, role)["HostConfig"]["PortBindings"]
    return int(next(iter(bindings.values()))[0]["HostPort"])


def is_sleeping(lanes: LaneProject, lane: str, role: str = "primary") -> bool:
    answer = httpx.get(f"http://127.0.0.1:{published(lanes, lane, role)}/is_sleeping", timeout=5)
    return bool(answer.json()["is_sleeping"])


def awake_and_healthy(lanes: LaneProject, lane: str) -> bool:
    return all(httpx.get(f"http://127.0.0.1:{published(lanes, lane, role)}/health", timeout=5).status_code == 200
               and not is_sleeping(lanes, lane, role) for role in ("primary", "rtx"))


def lane_ids(lanes: LaneProject, lane: str) -> dict[str, tuple[str, str]]:
    """Each container of the lane: its ID and when its engine process started (a restart changes the second)."""
    return {role: (inspect(lanes, lane, role)["Id"], inspect(lanes, lane, role)["State"]["StartedAt"])
            for role in ("primary", "rtx")}


def intents(state: Path) -> list[dict]:
    journal = state / "journal.jsonl"
    lines = journal.read_text().splitlines() if journal.exists() else []
    return [record for record in map(json.loads, lines) if record["kind"] == "intent"]


def edit_engine(lanes: LaneProject, lane: str, lines: str, role: str = "primary") -> None:
    """Add fields to the engine of one of the lane's containers, in the lane's own block for it."""
    recipe = lanes.root / "recipes" / "lanes.yaml"
    text = recipe.read_text()
    start = text.index(f"\n  {lane}:\n") + 1
    end = next((m.start() + 1 for m in re.finditer(r"\n  \S", text[start:])), len(text) - start) + start
    head = "\n    engine:\n" if role == "primary" else f"\n    companions:\n      {role}:\n        engine:\n"
    at = text.find(head, start - 1, end)
    assert at >= 0, f"{lane} has an engine block of its own for its {role}"
    at += len(head)
    recipe.write_text(text[:at] + lines + text[at:])


def serving_with_a_standby(lanes: LaneProject, state: Path, **env: str) -> None:
    """demo-h2 serves; demo-h1 waits asleep beside it as its standby."""
    cli(lanes, state, "up", "demo-h1", "--no-gpu", **env)
    switched = cli(lanes, state, "up", "demo-h2", "--no-gpu", **env)
    assert "demo-h1 waits asleep as a standby" in switched.stdout, switched.stdout
    assert is_sleeping(lanes, "demo-h1")


# -- a recreate of the serving lane that fails its gate ----------------------------------------------------------

def test_a_recreate_of_the_serving_lane_that_fails_its_gate_leaves_it_serving_and_its_standby_asleep(lanes, state):
    """A companion env change that makes demo-h2's recreated companion die starting: the way back puts the old
    container back and demo-h2 serves as it was, with demo-h1 still asleep (it stopped demo-h1's standby first and
    ended on demo-h1: "demo-h1 is serving again")."""
    serving_with_a_standby(lanes, state)
    before = lane_ids(lanes, "demo-h2")
    edit_engine(lanes, "demo-h2", "          env: {STUB_FAULT: crash_on_start}\n", "rtx")
    failed = cli(lanes, state, "up", "demo-h2", "--no-gpu", code=1)
    assert "Rolled back: demo-h2 is serving again" in failed.stdout, failed.stdout + failed.stderr
    after = lane_ids(lanes, "demo-h2")
    assert (after["primary"][0], after["rtx"][0]) == (before["primary"][0], before["rtx"][0]), \
        "the very containers that served before"
    assert after["primary"] == before["primary"], "the primary, which the change never touched, kept running"
    assert is_sleeping(lanes, "demo-h1"), "the other lane's standby is still asleep"
    data = status(lanes, state)
    assert data["active"] == "demo-h2" and row(data, "demo-h2")["health"] == "ok"
    assert row(data, "demo-h1")["standby"] is not None


def test_a_recreate_for_a_new_host_port_that_fails_its_gate_is_gated_back_on_its_old_port_and_stays_active(
        lanes, state):
    """A new host port for demo-h2's companion, whose new container dies starting: the old one is put back and
    serves on its old port; the way back's gate probes that port, so demo-h2 serves again and stays `active` (it
    probed the new port, said no lane serves, exited 1 and cleared `active`: the watchdog stopped guarding it)."""
    cli(lanes, state, "up", "demo-h2", "--no-gpu")
    old_port, new_port = published(lanes, "demo-h2", "rtx"), free_port()
    recipe = lanes.root / "recipes" / "lanes.yaml"
    assert recipe.read_text().count(f"host: {old_port},") == 1
    recipe.write_text(recipe.read_text().replace(f"host: {old_port},", f"host: {new_port},"))
    edit_engine(lanes, "demo-h2", "          env: {STUB_FAULT: crash_on_start}\n", "rtx")
    failed = cli(lanes, state, "up", "demo-h2", "--no-gpu", code=1)
    assert "Rolled back: demo-h2 is serving again" in failed.stdout, failed.stdout + failed.stderr
    assert published(lanes, "demo-h2", "rtx") == old_port
    assert httpx.get(f"http://127.0.0.1:{old_port}/health", timeout=5).status_code == 200
    data = status(lanes, state)
    assert data["active"] == "demo-h2" and data["watchdog"]["armed"], data


# -- a full state folder -------------------------------------------------------------------------------------------

FULL_FOLDER_SCRIPT = r"""
set -eu
saved=$(mktemp -d)
cp -a "$STATE"/. "$saved"/
mount -t tmpfs -o size=1m,mode=0700 lanectl-test-full "$STATE"
cp -a "$saved"/. "$STATE"/
head -c 2000000 /dev/zero > "$STATE/.filler" 2>/dev/null || true
set +e
"$@"
code=$?
set -e
rm "$STATE/.filler"
cp -a "$STATE"/. "$saved"/
umount "$STATE"
cp -a "$saved"/. "$STATE"/
rm -r "$saved"
exit $code
"""


def unshare_mount() -> list[str]:
    """A mount namespace of the command's own, where it may mount a filesystem that no one else sees and that goes
    away with it: root's, or an unprivileged user's through a user namespace of its own."""
    return ["unshare", "--mount"] if os.geteuid() == 0 else ["unshare", "--user", "--map-root-user", "--mount"]


def pad_the_journal_to_a_block(state: Path) -> None:
    """A full filesystem still takes what fits in a file's last, partly used block: the journal's appends land there,
    while a state file's atomic replacement (a new file) gets no block at all. A note that ends the journal just
    past a 4 KiB boundary leaves it room for the records of one command, whatever its length was."""
    from lanectl.state.journal import Journal

    journal = Journal(state / "journal.jsonl")
    before = journal.path.stat().st_size
    journal.append("note", message="padding: ")
    size = journal.path.stat().st_size
    journal.append("note", message="padding: " + "." * ((64 - size - (size - before)) % 4096))
    assert journal.path.stat().st_size % 4096 < 128, journal.path.stat().st_size


def test_a_full_state_folder_fails_the_rollback_and_leaves_the_standby_asleep_and_the_lane_serving(lanes, state):
    """The state folder on a filesystem with no free block: a rollback's first step (state.json) fails; its way
    back leaves demo-h1 asleep (it stopped the standby it was about to wake) and says why (the only message was
    "could not write the journal"), and leaves demo-h2 as it was (it stopped and started it again)."""
    if shutil.which("unshare") is None or subprocess.run([*unshare_mount(), "true"]).returncode != 0:
        pytest.skip("no mount namespace can be made here (unshare)")
    serving_with_a_standby(lanes, state)
    pad_the_journal_to_a_block(state)
    before = lane_ids(lanes, "demo-h2")
    full = subprocess.run([*unshare_mount(), "sh", "-c", FULL_FOLDER_SCRIPT, "full-state-folder",
                           sys.executable, "-m", "lanectl", "rollback", "--no-gpu"],
                          cwd=lanes.root, env={**lanes.env(state), "STATE": str(state)}, capture_output=True,
                          text=True, timeout=180)
    assert full.returncode == 1, full.stdout + full.stderr
    assert "No space left on device" in full.stdout, full.stdout + full.stderr
    # Its first step (state.json) failed before any container changed: the way back changes none either.
    assert "No container was changed: demo-h2 serves as it did and passed its gate" in full.stdout, full.stdout
    assert lane_ids(lanes, "demo-h2") == before, "demo-h2 was neither recreated nor restarted"
    assert "last log lines" not in full.stderr, "no engine failed, the disk did: no lane's log is the failed one's"
    assert inspect(lanes, "demo-h1")["State"]["Running"], "the standby it was about to wake was stopped"
    assert is_sleeping(lanes, "demo-h1"), "the standby it was about to wake is still asleep"
    assert awake_and_healthy(lanes, "demo-h2")
    data = status(lanes, state)
    assert data["active"] == "demo-h2" and row(data, "demo-h1")["standby"] is not None


# -- secrets -----------------------------------------------------------------------------------------------------

def test_a_lost_secret_key_with_the_secret_unchanged_recreates_nothing_and_the_dry_run_says_so(lanes, state):
    edit_engine(lanes, "demo-h2", "      secret_env: [LT_SECRET]\n")
    serving_with_a_standby(lanes, state, LT_SECRET="unchanged")
    before = lane_ids(lanes, "demo-h2")
    (state / "secret-digest.key").unlink()
    dry = json.loads(cli(lanes, state, "up", "demo-h2", "--no-gpu", "--dry-run", "--json",
                         LT_SECRET="unchanged").stdout)["data"]
    again = cli(lanes, state, "up", "demo-h2", "--no-gpu", LT_SECRET="unchanged")
    assert dry["kind"] == "noop" and "already active and healthy" in again.stdout, (dry, again.stdout)
    assert lane_ids(lanes, "demo-h2") == before, "nothing was recreated or restarted"
    assert is_sleeping(lanes, "demo-h1"), "the standby was kept"


def test_a_secret_lanectl_lacks_is_refused_before_the_serving_lane_is_touched(lanes, state):
    cli(lanes, state, "up", "demo-h1", "--no-gpu")
    before = lane_ids(lanes, "demo-h1")
    edit_engine(lanes, "demo-h2", "      secret_env: [LT_UNSET]\n")
    refused = cli(lanes, state, "up", "demo-h2", "--no-gpu", code=2)
    assert "its secret LT_UNSET is not set in lanectl's environment; export LT_UNSET" in refused.stderr, \
        refused.stderr
    assert "nothing was changed" in refused.stderr
    assert lane_ids(lanes, "demo-h1") == before and awake_and_healthy(lanes, "demo-h1"), "demo-h1 serves untouched"
    assert [i["to"] for i in intents(state)] == ["demo-h1"], "no switch was begun"
    with pytest.raises(docker.errors.NotFound):
        inspect(lanes, "demo-h2")


# -- orphans -----------------------------------------------------------------------------------------------------

def without_companions(lanes: LaneProject) -> None:
    recipe = lanes.root / "recipes" / "lanes.yaml"
    text, cut = COMPANIONS_BLOCK.subn("", recipe.read_text())
    assert cut >= 1
    recipe.write_text(text)


@pytest.mark.parametrize("command", ["up", "down"])
def test_a_companion_removed_from_the_recipe_is_listed_by_status_and_stopped_and_removed(lanes, state, command):
    cli(lanes, state, "up", "demo-h1", "--no-gpu")
    rtx = lanes.container("demo-h1", "rtx")
    without_companions(lanes)
    orphans = status(lanes, state)["orphan_containers"]
    assert [(o["name"], o["lane"], o["role"]) for o in orphans] == [(rtx, "demo-h1", "rtx")], orphans
    assert f"orphan container {rtx}" in cli(lanes, state, "status").stdout
    done = cli(lanes, state, command, *(["demo-h1", "--no-gpu"] if command == "up" else []))
    assert f"stop {rtx}" in done.stderr and f"remove {rtx}" in done.stderr, done.stderr
    assert not docker.from_env().containers.list(all=True, filters={"name": f"^{rtx}$"}), f"{rtx} is removed"
    assert status(lanes, state)["orphan_containers"] == []


# -- a signal once nothing is left to undo -----------------------------------------------------------------------

def test_a_sigint_after_the_last_step_lets_the_command_finish_and_say_what_it_did(lanes, state):
    """A Ctrl-C that came a few milliseconds after the last step, once the switch's own signal handling had ended
    (the lock released, the result not printed yet), exited 130 with no message; the lane served."""
    up = lanes.cli("up", "demo-h1", "--no-gpu", state=state, extra_env={"LANECTL_TEST_SIGNAL_AFTER_STEP": "end:INT"})
    assert up.returncode == 0, up.stdout + up.stderr
    assert up.stdout == "ok: demo-h1 is serving (SIGINT came when nothing was left to undo: the switch finished)\n"
    assert awake_and_healthy(lanes, "demo-h1")


# -- drift -------------------------------------------------------------------------------------------------------

def test_a_primary_whose_env_changed_is_said_to_differ_by_those_keys_never_their_values(lanes, state):
    """A primary's env is baked into its image: the drift said only "image X → Y"."""
    cli(lanes, state, "up", "demo-h1", "--no-gpu")
    lanes.edit_lane("demo-h1", '    engine:\n      env: {STUB_DECODE_TOKENS_PER_S: "90", LT_FLAG: "lt-value"}\n')
    cli(lanes, state, "build", "demo-h1")
    drift = row(status(lanes, state), "demo-h1")["containers"][0]["drift"]
    assert len(drift) == 1 and re.fullmatch(r"image \w{12} → \w{12} \(env \+LT_FLAG STUB_DECODE_TOKENS_PER_S "
                                            r"\(value\)\)", drift[0]), drift
    plan = cli(lanes, state, "up", "demo-h1", "--no-gpu", "--dry-run").stdout
    assert "(env +LT_FLAG STUB_DECODE_TOKENS_PER_S (value))" in plan and "lt-value" not in plan, plan


# -- a switch killed past its last step ---------------------------------------------------------------------------

def test_a_switch_killed_past_its_last_step_is_finished_by_the_next_watchdog_pass(lanes, state):
    """`up` SIGKILLed after its last step was journaled, before its outcome: its lease is already cleared, so the
    watchdog used to judge the lane and leave the switch unfinished in the journal for ever (`status` showing it
    mid-switch). One pass now finishes it, and says so."""
    cli(lanes, state, "up", "demo-h1", "--no-gpu")
    planned = json.loads(cli(lanes, state, "up", "demo-h2", "--no-gpu", "--dry-run", "--json").stdout)["data"]
    killed = lanes.cli("up", "demo-h2", "--no-gpu", state=state,  # its own process: the seam kills it
                       extra_env={"LANECTL_TEST_CRASH_AFTER_STEP": str(len(planned["keys"]))})
    assert killed.returncode == -9, killed.stdout + killed.stderr
    assert status(lanes, state)["unfinished_switch"] is not None
    check = cli(lanes, state, "watchdog", "check", code=None)
    assert "reconciled" in check.stdout + check.stderr, check.stdout + check.stderr
    data = status(lanes, state)
    assert data["unfinished_switch"] is None and data["active"] == "demo-h2", data
    assert row(data, "demo-h2")["health"] == "ok" and awake_and_healthy(lanes, "demo-h2")


# -- a standby paused by an operator -------------------------------------------------------------------------------

def test_a_paused_standby_is_stopped_when_dropped_and_the_active_lanes_restart_goes_ahead(lanes, state, tmp_path):
    """`docker pause` of demo-h1 while it waits asleep beside demo-h2: the watchdog's pass dropped the standby (it
    can answer nothing, so it cannot be woken) and left it paused on its GPUs; demo-h2's restart was then refused
    every pass (a paused container counts as awake), and each refusal used one of the watchdog's restarts. Now the
    pass that drops it stops it, with its own drain, and demo-h2's restart goes ahead: one restart counted."""
    serving_with_a_standby(lanes, state)
    client = docker.from_env()
    for role in ("primary", "rtx"):
        client.api.pause(lanes.container("demo-h1", role))
    kernel_log = tmp_path / "kern.log"
    kernel_log.write_text("")
    quiet = {"LANECTL_KERNEL_LOG": f"file:{kernel_log}"}
    check = cli(lanes, state, "watchdog", "check", code=None, **quiet)
    assert "the standby of demo-h1 is gone" in check.stdout + check.stderr, check.stdout + check.stderr
    assert {inspect(lanes, "demo-h1", role)["State"]["Status"] for role in ("primary", "rtx")} == {"exited"}, \
        "a dropped standby is stopped, not left paused on its GPUs"
    assert row(status(lanes, state), "demo-h1")["standby"] is None
    client.api.kill(lanes.container("demo-h2"))
    check = cli(lanes, state, "watchdog", "check", "--json", code=None, **quiet)
    data = json.loads(check.stdout)["data"]
    assert data["action"] == "restart" and "not restarted" not in check.stdout, check.stdout + check.stderr
    assert awake_and_healthy(lanes, "demo-h2")
    memory = json.loads((state / "watchdog.json").read_text())
    assert memory["restarts_total"] == {"demo-h2": 1}, memory


def test_a_restart_refused_because_another_lane_runs_on_its_gpus_uses_none_of_the_restart_budget(
        lanes, state, tmp_path):
    """demo-h2 dies while someone has started demo-h1 by hand on its GPUs: each pass refuses the restart (two
    lanes awake on one GPU is worse than one down) and alerts. A refusal changed nothing, so it is not one of the
    watchdog's restarts; counting it sent the lane to its rollback after two passes, a restart never having run."""
    serving_with_a_standby(lanes, state)
    client = docker.from_env()
    for role in ("rtx", "primary"):
        client.api.stop(lanes.container("demo-h1", role), timeout=5)
    kernel_log = tmp_path / "kern.log"
    kernel_log.write_text("")
    quiet = {"LANECTL_KERNEL_LOG": f"file:{kernel_log}"}
    cli(lanes, state, "watchdog", "check", code=None, **quiet)  # drops the standby that exited
    for role in ("primary", "rtx"):
        client.api.start(lanes.container("demo-h1", role))
    client.api.kill(lanes.container("demo-h2"))
    for _ in range(3):
        check = cli(lanes, state, "watchdog", "check", "--json", code=None, **quiet)
        data = json.loads(check.stdout)["data"]
        assert data["action"] == "restart" and data["outcome"].startswith("not restarted: not restarting demo-h2: "
                                                                          "demo-h1 runs on its GPUs"), data
    memory = json.loads((state / "watchdog.json").read_text())
    assert memory["restarts_total"].get("demo-h2", 0) == 0 and memory["memory"]["restarts"] == [], memory


# -- the active lane dies beside its standby ---------------------------------------------------------------------

def test_the_active_lane_that_dies_beside_its_standby_is_restarted_beside_it(lanes, state, tmp_path):
    """demo-h2 serves, demo-h1 waits asleep beside it on the same GPUs, and demo-h2's engine dies: every watchdog
    pass refused the restart ("demo-h1 runs on its GPUs") and alerted, uncounted, so it never rolled back either:
    nothing served until someone came. A standby asleep is what every switch leaves beside the lane it starts;
    the restart starts demo-h2 beside it, once demo-h1's engines say they sleep."""
    serving_with_a_standby(lanes, state)
    kernel_log = tmp_path / "kern.log"
    kernel_log.write_text("")
    docker.from_env().api.kill(lanes.container("demo-h2"))
    check = cli(lanes, state, "watchdog", "check", "--json", code=None, LANECTL_KERNEL_LOG=f"file:{kernel_log}")
    data = json.loads(check.stdout)["data"]
    assert data["action"] == "restart" and "not restarted" not in data["outcome"], data
    assert awake_and_healthy(lanes, "demo-h2")
    assert is_sleeping(lanes, "demo-h1") and is_sleeping(lanes, "demo-h1", "rtx"), "the standby still waits"
    memory = json.loads((state / "watchdog.json").read_text())
    assert memory["restarts_total"] == {"demo-h2": 1}, memory
    assert row(status(lanes, state), "demo-h1")["standby"] is not None


# -- an orphan asleep on the GPUs ---------------------------------------------------------------------------------

def test_an_orphan_asleep_beside_a_lane_is_asked_whether_it_sleeps_on_the_port_it_publishes(lanes, state):
    """demo-h1's companion leaves its recipe while demo-h1 waits asleep: the companion's container is an orphan
    (its role has no port in the recipe to ask). The check before every start and wake (invariant 1) counted it
    awake on the GPUs, so a start beside it was refused. It is asked on the host port it publishes."""
    from lanectl.dockerapi.containers import ContainerEngine
    from lanectl.lanes.engine_calls import LaneEngines
    from lanectl.lanes.invariants import awake_beside
    from lanectl.project import Project
    from lanectl.recipe.catalog import load_catalog

    serving_with_a_standby(lanes, state)
    without_companions(lanes)
    engine = ContainerEngine()
    engines = LaneEngines(engine, on_gate=lambda progress: None, interrupted=lambda: None)
    listed = engine.list_containers()
    orphan = next(c for c in listed if c.name == lanes.container("demo-h1", "rtx"))
    assert engines.is_sleeping_in(orphan) is True
    catalog = load_catalog(Project.locate(lanes.root / "recipes"))
    assert awake_beside(catalog, catalog.lanes["demo-h2"], listed, engines.is_sleeping_in) == []
    httpx.post(f"http://127.0.0.1:{published(lanes, 'demo-h1', 'rtx')}/wake_up", timeout=10)
    assert engines.is_sleeping_in(orphan) is False
    assert awake_beside(catalog, catalog.lanes["demo-h2"], engine.list_containers(), engines.is_sleeping_in) == [
        f"{orphan.name} (rtx of demo-h1) is awake on the same GPUs"]


# -- the active lane paused by an operator ------------------------------------------------------------------------

def test_up_of_the_active_lane_whose_primary_someone_paused_stops_it_and_starts_it(lanes, state):
    """`docker pause` of demo-h1's primary, then `lanectl up demo-h1`: the plan started the paused container, the
    engine refused ("cannot start a paused container, try unpause instead"), and the lane was stopped for
    debugging. The plan stops it first (Docker unpauses it to deliver the signal) and starts it."""
    cli(lanes, state, "up", "demo-h1", "--no-gpu")
    docker.from_env().api.pause(lanes.container("demo-h1"))
    up = cli(lanes, state, "up", "demo-h1", "--no-gpu")
    assert f"stop {lanes.container('demo-h1')} (primary of demo-h1)" in up.stderr, up.stderr
    assert "it is paused: a start begins from stopped" in up.stderr, up.stderr
    assert awake_and_healthy(lanes, "demo-h1")
