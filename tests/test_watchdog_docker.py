"""The watchdog against real stub-engine lanes on the real engine, faults injected for real:
a killed container, the stub's admin endpoint (hang, fatal line, crash), Xid lines through a kernel
log in /dev/kmsg's record format (and the real /dev/kmsg, for forged lines), and alerts received by
a real local HTTP server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import docker
import httpx
import pytest

from lanectl.health.engine_exit import EXIT_UNASKED, exit_meaning
from tests.lane_fixtures import LaneProject, make_lane_project, remove_containers, remove_everything

pytestmark = pytest.mark.docker

LANES = ["demo-h1", "demo-h2", "t-crashloop", "t-slow"]
KMSG_WRITABLE = os.access("/dev/kmsg", os.W_OK)


@pytest.fixture(scope="module")
def lanes(tmp_path_factory: pytest.TempPathFactory):
    project = make_lane_project(tmp_path_factory.mktemp("watchdog"))
    project.invoke("build", *LANES, state=tmp_path_factory.mktemp("build-state"), check=True, timeout=600)
    yield project
    remove_everything(project)


class AlertSink:
    """A webhook receiver on loopback that records what it is sent."""

    def __init__(self) -> None:
        received: list[dict] = []

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                length = int(self.headers.get("Content-Length", 0))
                received.append(json.loads(self.rfile.read(length)))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.received = received
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hooks/T000/SECRET-TOKEN"

    def close(self) -> None:
        self.server.shutdown()


@pytest.fixture
def sink():
    receiver = AlertSink()
    yield receiver
    receiver.close()


@pytest.fixture
def state(lanes: LaneProject, tmp_path: Path):
    yield tmp_path / "state"
    remove_containers(lanes)


def check(lanes: LaneProject, state: Path, sink: AlertSink | None = None, kernel_log: str = "") -> dict:
    env = {"LANECTL_ALERT_WEBHOOK": sink.url} if sink else {}
    if kernel_log:
        env["LANECTL_KERNEL_LOG"] = kernel_log
    result = lanes.invoke("watchdog", "check", "--json", state=state, extra_env=env)
    assert result.returncode in (0, 1), result.stderr
    data = json.loads(result.stdout)["data"]
    assert data["exit_code"] == result.returncode
    return data


def admin(lanes: LaneProject, fault: str) -> None:
    recipe = (lanes.root / "recipes" / "lanes.yaml").read_text()
    port = int(recipe.split("host: ", 1)[1].split(",", 1)[0])
    httpx.post(f"http://127.0.0.1:{port}/admin/fault", json={"fault": fault}, timeout=5).raise_for_status()


def lane_url(lanes: LaneProject) -> str:
    recipe = (lanes.root / "recipes" / "lanes.yaml").read_text()
    return f"http://127.0.0.1:{int(recipe.split('host: ', 1)[1].split(',', 1)[0])}"


def primary_running(lanes: LaneProject, lane: str) -> bool:
    return docker.from_env().containers.get(lanes.container(lane)).status == "running"


def watchdog_status(lanes: LaneProject, state: Path) -> dict:
    return json.loads(lanes.invoke("watchdog", "status", "--json", state=state, check=True).stdout)["data"]


def empty_kernel_log(tmp_path: Path) -> str:
    log = tmp_path / "kern.log"
    log.write_text("")
    return f"file:{log}"


def test_healthy_lane_passes_and_leaves_a_heartbeat_and_metrics(lanes, state, tmp_path):
    recipe = lanes.root / "recipes" / "lanes.yaml"
    original = recipe.read_text()
    metrics_dir = tmp_path / "textfiles"
    metrics_dir.mkdir()
    try:
        alert = f"  watchdog:\n    alert: {{textfile_dir: {metrics_dir}}}\n"
        recipe.write_text(original.replace("  watchdog:\n", alert, 1))
        lanes.invoke("up", "demo-h1", "--no-gpu", state=state, check=True)
        data = check(lanes, state, kernel_log=empty_kernel_log(tmp_path))
        assert (data["exit_code"], data["action"], data["reason"]) == (0, "none", "healthy")
        # Engine lines are printed as they are: "[Autotuner]: ..." is not rich markup.
        assert "[Autotuner]: Loaded " in lanes.invoke("logs", "demo-h1", state=state, check=True).stdout
        status = watchdog_status(lanes, state)
        assert status["armed"] and status["heartbeat_age_seconds"] < 30
        assert status["last_pass_result"] == "none: healthy"
        metrics = (metrics_dir / "lanectl.prom").read_text()
        assert 'lanectl_watchdog_lane_up{lane="demo-h1"} 1' in metrics
        assert "lanectl_watchdog_armed 1" in metrics
    finally:
        recipe.write_text(original)


def test_a_crash_is_restarted(lanes, state, sink, tmp_path):
    lanes.invoke("up", "demo-h1", "--no-gpu", state=state, check=True)
    docker.from_env().containers.get(lanes.container("demo-h1")).kill()
    data = check(lanes, state, sink, kernel_log=empty_kernel_log(tmp_path))
    assert data["exit_code"] == 1 and data["action"] == "restart"
    assert data["reason"].startswith("primary exited (exit code 137); restart 1 of at most 2")
    assert data["outcome"].startswith("ok: demo-h1 restarted and passed its gate")
    assert primary_running(lanes, "demo-h1")
    assert check(lanes, state, kernel_log=empty_kernel_log(tmp_path))["exit_code"] == 0
    assert watchdog_status(lanes, state)["restarts_total"] == {"demo-h1": 1}
    assert sink.received and sink.received[0]["alert"]["severity"] == "warning"


def test_a_pass_killed_mid_restart_is_finished_by_the_next_one_and_counted_once(lanes, state, tmp_path):
    lanes.invoke("up", "demo-h1", "--no-gpu", state=state, check=True)
    docker.from_env().containers.get(lanes.container("demo-h1")).kill()
    # The restart's steps: stop the companion, wait for GPU memory, start the primary: killed right after it.
    killed = lanes.cli("watchdog", "check", state=state, extra_env={"LANECTL_KERNEL_LOG": empty_kernel_log(tmp_path),
                                                                    "LANECTL_TEST_CRASH_AFTER_STEP": "3"})
    assert killed.returncode == -9
    assert watchdog_status(lanes, state)["restarts_total"] == {"demo-h1": 1}, "counted when it began"
    data = check(lanes, state, kernel_log=empty_kernel_log(tmp_path))
    # The killed pass's restart is the journal's last switch, left open: the next pass finishes it first.
    assert (data["action"], data["outcome"]) == ("reconcile", "finished"), data
    assert "finished the interrupted switch: demo-h1 passed its gate" in data["reason"], data
    assert watchdog_status(lanes, state)["restarts_total"] == {"demo-h1": 1}, "finished, not counted again"
    assert check(lanes, state, kernel_log=empty_kernel_log(tmp_path))["exit_code"] == 0


def test_a_paused_lane_is_called_paused_not_an_exit_without_a_code(lanes, state, tmp_path):
    lanes.invoke("up", "demo-h1", "--no-gpu", state=state, check=True)
    lanes.invoke("watchdog", "disarm", "--for", "10m", "--reason", "look only", state=state, check=True)
    docker.from_env().containers.get(lanes.container("demo-h1")).pause()
    try:
        data = check(lanes, state, kernel_log=empty_kernel_log(tmp_path))
    finally:
        docker.from_env().containers.get(lanes.container("demo-h1")).unpause()
    assert data["reason"].startswith("primary is paused (docker pause): it answers nothing until `docker "
                                     "unpause`"), data
    assert "exit code" not in data["reason"]


def test_a_crash_loop_rolls_back_to_the_known_good_lane(lanes, state, sink, tmp_path):
    kernel_log = empty_kernel_log(tmp_path)
    lanes.invoke("up", "demo-h1", "--no-gpu", state=state, check=True)
    lanes.invoke("up", "t-crashloop", "--no-gpu", state=state, check=True)
    actions = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        time.sleep(1)
        data = check(lanes, state, sink, kernel_log=kernel_log)
        if data["action"] != "none":
            actions.append(data["action"])
        if data["action"] == "rollback":
            break
    assert actions == ["restart", "restart", "rollback"], actions
    assert primary_running(lanes, "demo-h1") and not primary_running(lanes, "t-crashloop")
    assert json.loads(lanes.invoke("status", "--json", state=state, check=True).stdout)["data"]["active"] == "demo-h1"
    assert sink.received[-1]["alert"]["severity"] == "critical"


def test_a_hang_is_caught_by_the_generation_probe(lanes, state, tmp_path):
    kernel_log = empty_kernel_log(tmp_path)
    lanes.invoke("up", "demo-h1", "--no-gpu", state=state, check=True)
    admin(lanes, "hang")
    first, second, third = (check(lanes, state, kernel_log=kernel_log) for _ in range(3))
    assert (first["action"], first["exit_code"]) == ("none", 1)
    assert first["reason"].startswith("probe failed 1/3: generation probe timed out")
    assert second["reason"].startswith("probe failed 2/3")
    assert third["action"] == "restart" and third["outcome"].startswith("ok:")
    assert check(lanes, state, kernel_log=kernel_log)["exit_code"] == 0


def test_a_fatal_engine_line_is_restarted(lanes, state, tmp_path):
    lanes.invoke("up", "demo-h1", "--no-gpu", state=state, check=True)
    kernel_log = empty_kernel_log(tmp_path)
    assert check(lanes, state, kernel_log=kernel_log)["exit_code"] == 0
    admin(lanes, "fatal_log")
    data = check(lanes, state, kernel_log=kernel_log)
    assert data["action"] == "restart"
    assert "fatal engine line" in data["reason"] and "illegal memory access" in data["reason"]


def test_a_request_for_a_path_naming_a_fatal_line_leaves_a_healthy_lane_alone(lanes, state, tmp_path):
    """uvicorn's access line carries the path a client chose; before the rules read only the engine's own
    records, `GET /EngineDeadError` made this check restart a healthy lane (issue 23)."""
    lanes.invoke("up", "demo-h1", "--no-gpu", state=state, check=True)
    url = lane_url(lanes)
    for path in ("/EngineDeadError", "/EngineCore%20encountered%20a%20fatal%20error.",
                 "/v1/CUDA%20error:%20an%20illegal%20memory%20access%20was%20encountered",
                 "/engine core exited unexpectedly"):
        assert httpx.get(url + path, timeout=5).status_code == 404
    logs = lanes.invoke("logs", "demo-h1", state=state, check=True).stdout
    assert "GET /EngineDeadError HTTP/1.1" in logs, "the access line is in the log the watchdog reads"
    data = check(lanes, state, kernel_log=empty_kernel_log(tmp_path))
    assert (data["exit_code"], data["action"], data["reason"]) == (0, "none", "healthy")
    assert primary_running(lanes, "demo-h1")


def test_an_engine_core_death_that_exits_0_is_a_dead_lane_and_is_restarted(lanes, state, tmp_path):
    lanes.invoke("up", "demo-h1", "--no-gpu", state=state, check=True)
    admin(lanes, "crash")
    container = docker.from_env().containers.get(lanes.container("demo-h1"))
    # The stub exits 0 as vLLM does; the image's exit guard turns that unasked 0 into 70.
    assert container.wait(timeout=30)["StatusCode"] == EXIT_UNASKED
    assert "the engine exited 0 although nothing asked it to stop" in container.logs().decode()
    meaning = exit_meaning(EXIT_UNASKED)
    row = next(r for r in json.loads(lanes.invoke("status", "--json", state=state, check=True).stdout)["data"]["lanes"]
               if r["lane"] == "demo-h1")
    assert row["active"] and row["dead"] == f"primary exited with code 70 ({meaning})"
    data = check(lanes, state, kernel_log=empty_kernel_log(tmp_path))
    assert data["action"] == "restart", data
    assert data["reason"].startswith(f"primary exited (exit code 70: {meaning})")
    assert data["outcome"].startswith("ok: demo-h1 restarted and passed its gate")
    assert primary_running(lanes, "demo-h1")


class KmsgFeed:
    """A kernel log the test writes: /dev/kmsg records (`prio,seq,usec,flags;text`) in a file read through
    `kmsg-file:`, the same parser and cursor as /dev/kmsg. Unlike /dev/kmsg, where the kernel files
    every line user space writes under `user`, it can carry the kernel facility (0) a real Xid has."""

    KERN_ERR = 3  # facility 0 (kern) << 3 | level 3 (err)
    USER_ERR = 11  # facility 1 (user) << 3 | level 3: what root's `echo ... > /dev/kmsg` gets

    def __init__(self, path: Path) -> None:
        self.path = path
        self.seq = 0
        path.write_text("")

    @property
    def spec(self) -> str:
        return f"kmsg-file:{self.path}"

    def write(self, text: str, prio: int = KERN_ERR) -> None:
        self.seq += 1
        with self.path.open("a") as log:
            log.write(f"{prio},{self.seq},{self.seq * 1000},-;{text}\n SUBSYSTEM=pci\n")


def xid(code: int, pci: str = "0000:01:00", tag: str = "") -> str:
    return f"NVRM: Xid (PCI:{pci}): {code}, pid=4242, name=python3-{tag}, Ch 00000008, test line"


def test_an_application_xid_restarts_and_a_hardware_xid_stops_and_alerts(lanes, state, sink, tmp_path):
    feed = KmsgFeed(tmp_path / "kmsg")
    lanes.invoke("up", "demo-h1", "--no-gpu", state=state, check=True)
    assert check(lanes, state, sink, kernel_log=feed.spec)["exit_code"] == 0  # sets the cursor to "now"
    feed.write(xid(31))
    data = check(lanes, state, sink, kernel_log=feed.spec)
    assert data["action"] == "restart" and "application Xid 31" in data["reason"]
    # No nvidia-smi here: the GPU map is unknown, and the rule (fail safe) is said.
    assert data["reason"].endswith("; GPU map unknown (no nvidia-smi): the Xid is taken as on the lane's GPU")
    assert primary_running(lanes, "demo-h1")

    feed.write(xid(79))
    data = check(lanes, state, sink, kernel_log=feed.spec)
    assert data["action"] == "stop" and data["reason"].startswith("hardware Xid 79")
    assert not primary_running(lanes, "demo-h1"), "never restarted onto a GPU that needs attention"
    critical = [a for a in sink.received if a["alert"]["severity"] == "critical"]
    assert critical and critical[-1]["alert"]["facts"]["xid"] == "79"
    assert check(lanes, state, sink, kernel_log=feed.spec)["reason"] == "no active lane: nothing to watch"
    journal = (state / "journal.jsonl").read_text()
    assert "SECRET-TOKEN" not in journal, "the webhook URL never reaches the journal"
    assert "GPU map unknown (no nvidia-smi)" in journal


def test_an_unlisted_xid_beside_a_restart_is_counted_and_journaled(lanes, state, sink, tmp_path):
    feed = KmsgFeed(tmp_path / "kmsg")
    lanes.invoke("up", "demo-h1", "--no-gpu", state=state, check=True)
    assert check(lanes, state, sink, kernel_log=feed.spec)["exit_code"] == 0
    feed.write(xid(31))
    feed.write(xid(63))  # in neither list (NVIDIA's catalog: IGNORE): never acted on, but never lost either
    data = check(lanes, state, sink, kernel_log=feed.spec)
    assert data["action"] == "restart" and "unlisted Xid 63 recorded (not acted on)" in data["reason"]
    assert watchdog_status(lanes, state)["xid_total"] == {"31": 1, "63": 1}
    records = [json.loads(line) for line in (state / "journal.jsonl").read_text().splitlines()]
    observation = [r for r in records if r.get("event") == "observation"][-1]
    assert any(": 63, pid=4242" in line for line in observation["xids"])
    check(lanes, state, sink, kernel_log=feed.spec)
    assert watchdog_status(lanes, state)["xid_total"] == {"31": 1, "63": 1}, "the next pass does not count it again"


FORGED = {
    "user facility (root writing /dev/kmsg)": (xid(79), KmsgFeed.USER_ERR),
    "daemon facility": (xid(79), 3 << 3 | 3),
    "quoted inside a kernel line": ("python3[4242]: worker said NVRM: Xid (PCI:0000:01:00): 79, pid=1, name=x, y",
                                    KmsgFeed.KERN_ERR),
    "after a container log prefix": ("[core.py:700] NVRM: Xid (PCI:0000:01:00): 79, pid=1, name=x, y",
                                     KmsgFeed.KERN_ERR),
    "not NVRM's shape": ("NVRM: Xid 79 (PCI:0000:01:00)", KmsgFeed.KERN_ERR),
}


def test_forged_xid_lines_are_not_believed(lanes, state, tmp_path):
    feed = KmsgFeed(tmp_path / "kmsg")
    lanes.invoke("up", "demo-h1", "--no-gpu", state=state, check=True)
    assert check(lanes, state, kernel_log=feed.spec)["exit_code"] == 0
    for text, prio in FORGED.values():
        feed.write(text, prio)
    data = check(lanes, state, kernel_log=feed.spec)
    assert (data["exit_code"], data["action"], data["reason"]) == (0, "none", "healthy")
    # A plain text log cannot say the facility: its NVRM lines are not believed either.
    plain = tmp_path / "kern.log"
    plain.write_text("")
    assert check(lanes, state, kernel_log=f"file:{plain}")["exit_code"] == 0
    plain.write_text(xid(79) + "\n")
    assert check(lanes, state, kernel_log=f"file:{plain}")["reason"] == "healthy"
    if KMSG_WRITABLE:  # the real /dev/kmsg: what root writes there is filed under `user`
        from lanectl.host.kernel_log import write_kmsg

        assert check(lanes, state, kernel_log="kmsg")["exit_code"] == 0
        write_kmsg(xid(79, tag=uuid.uuid4().hex[:6]))
        assert check(lanes, state, kernel_log="kmsg")["reason"] == "healthy"
    assert primary_running(lanes, "demo-h1")
    assert watchdog_status(lanes, state)["xid_total"] == {}


def test_an_xid_on_a_gpu_the_lane_does_not_use_leaves_it_running(lanes, state, tmp_path):
    recipe = lanes.root / "recipes" / "lanes.yaml"
    original = recipe.read_text()
    # nvidia-smi as a GPU host answers it: two GPUs, the lane declares device 0.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\ncase \"$*\" in\n  *pci.bus_id*) printf '0, 00000000:01:00.0, GPU-aaaa\\n"
                   "1, 00000000:02:00.0, GPU-bbbb\\n' ;;\n  *) printf '0, 0\\n1, 0\\n' ;;\nesac\n")
    smi.chmod(0o755)
    path = {"PATH": f"{bin_dir}:{os.environ['PATH']}"}
    feed = KmsgFeed(tmp_path / "kmsg")
    try:
        recipe.write_text(original.replace("    description: The control lane (mirrors h1-REF).\n",
                                           "    description: The control lane (mirrors h1-REF).\n"
                                           "    engine: {gpus: {device_ids: [\"0\"]}}\n", 1))
        lanes.invoke("up", "demo-h1", "--no-gpu", state=state, check=True)
        env = {**path, "LANECTL_KERNEL_LOG": feed.spec}
        first = lanes.invoke("watchdog", "check", "--json", state=state, extra_env=env)
        assert first.returncode == 0, first.stderr
        feed.write(xid(79, pci="0000:02:00"))
        other = json.loads(lanes.invoke("watchdog", "check", "--json", state=state, extra_env=env).stdout)["data"]
        assert (other["exit_code"], other["action"], other["reason"]) == (0, "none", "healthy")
        assert primary_running(lanes, "demo-h1")
        elsewhere = [json.loads(line) for line in (state / "journal.jsonl").read_text().splitlines()
                     if '"xid-elsewhere"' in line]
        assert elsewhere and elsewhere[0]["message"] == (
            "Xid 79 is on GPU 1 (PCI 0000:02:00), which the lane does not use: recorded, not acted on")
        assert watchdog_status(lanes, state)["xid_total"] == {"79": 1}

        feed.write(xid(79, pci="0000:01:00"))
        ours = json.loads(lanes.invoke("watchdog", "check", "--json", state=state, extra_env=env).stdout)["data"]
        assert ours["action"] == "stop" and ours["reason"] == (
            "hardware Xid 79: the GPU needs attention; restarting onto it would loop")
        assert not primary_running(lanes, "demo-h1")
    finally:
        recipe.write_text(original)


def test_a_lease_observes_only_and_rearm_rearms_after_it_expires(lanes, state, tmp_path):
    kernel_log = empty_kernel_log(tmp_path)
    lanes.invoke("up", "demo-h1", "--no-gpu", state=state, check=True)
    lanes.invoke("watchdog", "disarm", "--for", "10s", "--reason", "bench h2-REF", state=state, check=True)
    # The lease began inside that command, so it has ended 10 s after the command returned, however long a loaded
    # machine took to start it.
    disarmed = time.monotonic()
    assert lanes.invoke("watchdog", "rearm", state=state, check=True).stdout.startswith("still disarmed until")
    docker.from_env().containers.get(lanes.container("demo-h1")).kill()
    data = check(lanes, state, kernel_log=kernel_log)
    assert data["exit_code"] == 1 and data["outcome"] is None
    assert "(disarmed: observed only, would restart)" in data["reason"]
    assert not primary_running(lanes, "demo-h1")
    time.sleep(max(0.0, 10.5 - (time.monotonic() - disarmed)))
    assert lanes.invoke("watchdog", "rearm", state=state, check=True).stdout.startswith("re-armed")
    assert lanes.invoke("watchdog", "rearm", state=state, check=True).stdout.strip() == "armed", "idempotent"
    assert check(lanes, state, kernel_log=kernel_log)["action"] == "restart"
    assert primary_running(lanes, "demo-h1")


def test_a_slow_starting_lane_is_never_killed_inside_its_budget(lanes, state, tmp_path):
    kernel_log = empty_kernel_log(tmp_path)
    lanes.invoke("up", "t-slow", "--no-gpu", state=state, check=True)
    docker.from_env().containers.get(lanes.container("t-slow")).restart(timeout=5)
    reasons = []
    started = time.monotonic()
    while time.monotonic() - started < 6:  # the stub loads for 8 s
        data = check(lanes, state, kernel_log=kernel_log)
        assert data["action"] == "none", data
        reasons.append(data["reason"])
    assert reasons and all(r.startswith("starting (inside its startup budget)") for r in reasons), reasons
    # Once loaded (8 s on a quiet machine, later on a busy one) it is healthy, and until then it is left alone.
    while (data := check(lanes, state, kernel_log=kernel_log))["reason"] != "healthy":
        assert data["action"] == "none", data
        assert time.monotonic() - started < 60, f"not healthy 60 s after the restart: {data}"
        time.sleep(0.5)


def test_run_mode_reacts_to_a_crash_within_seconds(lanes, state, tmp_path):
    lanes.invoke("up", "demo-h1", "--no-gpu", state=state, check=True)
    run = subprocess.Popen([sys.executable, "-m", "lanectl", "watchdog", "run", "--kernel-log",
                            empty_kernel_log(tmp_path)], cwd=lanes.root, env=lanes.env(state),
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(3)
        docker.from_env().containers.get(lanes.container("demo-h1")).kill()
        killed = time.monotonic()
        deadline = killed + 30
        # The restart is counted when it begins and its outcome recorded when it ends: a stop before that is an
        # interrupted restart, which goes back (stops the lane) by design.
        while time.monotonic() < deadline:
            if watchdog_status(lanes, state)["last_action"]:
                break
            time.sleep(0.2)
        assert watchdog_status(lanes, state)["restarts_total"] == {"demo-h1": 1}
        assert primary_running(lanes, "demo-h1")
    finally:
        run.terminate()
        _, stderr = run.communicate(timeout=30)
    # Woken by the die event or by the probe interval (0.2 s here), whichever comes first.
    assert "demo-h1: restart: primary exited" in stderr, stderr
    assert run.returncode in (0, 143)


def test_run_mode_overlaps_the_probes_of_a_hung_engine(lanes, state, tmp_path):
    """Each probe of a hung engine waits out the generation timeout: issued one after another, three failed probes
    would span at least two timeouts. Issued at the probe interval (0.2 s), they are out at the same time (the
    journal says how many others were out when each failure came), and the restart comes with the third."""
    lanes.invoke("up", "demo-h1", "--no-gpu", state=state, check=True)
    lanes.invoke("watchdog", "arm", state=state, check=True)
    run = subprocess.Popen([sys.executable, "-m", "lanectl", "watchdog", "run", "--kernel-log",
                            empty_kernel_log(tmp_path)], cwd=lanes.root, env=lanes.env(state),
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(2)
        admin(lanes, "hang")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not watchdog_status(lanes, state)["last_action"]:
            time.sleep(0.2)
        assert watchdog_status(lanes, state)["restarts_total"] == {"demo-h1": 1}
    finally:
        run.terminate()
        _, stderr = run.communicate(timeout=30)
    records = [json.loads(line) for line in (state / "journal.jsonl").read_text().splitlines()]
    observed = [r for r in records if r["kind"] == "watchdog" and r.get("event") == "observation"]
    failures = [r for r in observed if "generation probe timed out" in r["reason"]]
    assert [r["action"] for r in failures[:3]] == ["none", "none", "restart"], observed
    assert failures[0]["reason"].startswith("probe failed 1/3") and failures[1]["reason"].startswith("probe failed 2/3")
    # Overlap as an outcome, whatever the machine's speed: a failed round was answered while others were still out.
    assert max(r["rounds_overlapping"] for r in failures[:3]) >= 1, failures
    assert "demo-h1: restart: 3 consecutive failed probes: generation probe timed out" in stderr, stderr


def test_a_webhook_that_never_answers_does_not_stall_the_pass(lanes, state, tmp_path):
    import socket

    listener = socket.create_server(("127.0.0.1", 0))  # accepts (the kernel does) and never answers
    url = f"http://127.0.0.1:{listener.getsockname()[1]}/hooks/T000/SECRET-TOKEN"
    feed = KmsgFeed(tmp_path / "kmsg")
    try:
        lanes.invoke("up", "demo-h1", "--no-gpu", state=state, check=True)
        env = {"LANECTL_ALERT_WEBHOOK": url, "LANECTL_KERNEL_LOG": feed.spec}
        assert lanes.cli("watchdog", "check", state=state, extra_env=env).returncode == 0
        feed.write(xid(79))
        result = lanes.cli("watchdog", "check", "--json", state=state, extra_env=env, timeout=60)
    finally:
        listener.close()
    data = json.loads(result.stdout)["data"]
    assert data["action"] == "stop" and result.returncode == 1
    alerts = [json.loads(line) for line in (state / "journal.jsonl").read_text().splitlines()
              if '"event":"alert"' in line]
    assert alerts and alerts[-1]["delivered"] is False
    assert alerts[-1]["detail"].startswith("webhook ($LANECTL_ALERT_WEBHOOK) timed out"), alerts[-1]["detail"]
    assert "SECRET-TOKEN" not in (state / "journal.jsonl").read_text()
