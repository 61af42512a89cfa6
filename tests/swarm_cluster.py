"""A real two-node Docker Swarm on this one machine, for integration tests.

Node 1 (manager) is the host engine. Node 2 (worker) is a second dockerd started inside its own network
namespace (joined to the host by a veth pair) and its own UTS namespace (so Swarm sees a distinct hostname),
with its own data-root, exec-root and managed containerd. It shares the host's mount namespace and kernel.

Why it is built this way (learned on this machine, see the project brief):
- A second dockerd in the *host* network namespace fights the host engine over docker0 and iptables
  (with --bridge=none it even deletes the host's docker0), so node 2 gets a namespace of its own.
- Swarm's ingress routing mesh needs IPVS, which this kernel lacks: services must publish with mode=host,
  and then a task's port answers on the address of the node it runs on (manager_addr / worker_addr).
- Node 2 pulls lane images as a real fleet node does: from a registry the tests start on the manager's veth
  address (tests/registry_server.start_tls_registry; TLS, since Docker trusts plain HTTP only on loopback, and
  node 2's loopback is its own). Services name images by digest, so the manager, which pushed them, runs its
  local copy and node 2 pulls the same bytes.

Everything node 2 owns lives at fixed names (netns, veth, /run/lanectl-swarm, cgroup parent) so that a run
that crashed can be cleaned up by the next one; the bulky data-root lives under the caller's tmp_root and its
path is recorded in a state file for the same reason.

Use the `two_node_swarm` fixture (import it into a test module: `from tests.swarm_cluster import two_node_swarm`)
or call start_two_node_swarm / stop_two_node_swarm directly.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import docker
import docker.errors
import pytest

NETNS = "lanectl-n2"
NETNS_PATH = Path("/var/run/netns") / NETNS
VETH_HOST = "lanectl-n2h"  # interface names are limited to 15 characters
VETH_WORKER = "lanectl-n2w"
MANAGER_ADDR = "10.231.77.1"
WORKER_ADDR = "10.231.77.2"
PREFIX_LEN = 24
WORKER_DOCKER_PORT = 2375
SWARM_PORT = 2377
# Overlay networks (including the ingress network swarm init always creates) come from this pool instead of
# the default 10.0.0.0/8 slices, which are more likely to clash with a real network on the host.
DEFAULT_ADDR_POOL = "10.231.80.0/20"
DEFAULT_WORKER_HOSTNAME = "lanectl-node-2"
# Short and fixed on purpose: dockerd and containerd put unix sockets under the exec-root (108-byte limit on
# socket paths), and a later run must find a crashed run's leftovers without knowing its tmp_root.
RUN_DIR = Path("/run/lanectl-swarm")
WORKER_EXEC_ROOT = RUN_DIR / "node-2"
WORKER_PIDFILE = RUN_DIR / "node-2-dockerd.pid"
WORKER_CONFIG = RUN_DIR / "node-2-daemon.json"
STATE_FILE = RUN_DIR / "state.json"
# Node 2's containers go under this cgroup (cgroupfs driver) so that their processes can be found and killed
# even when the dockerd/containerd/shims that owned them are already gone.
WORKER_CGROUP_PARENT = "lanectl-node-2"
GWBRIDGE = "docker_gwbridge"

ENGINE_START_TIMEOUT_S = 60.0
ENGINE_STOP_TIMEOUT_S = 45.0
NODE_READY_TIMEOUT_S = 60.0
LOG_TAIL_LINES = 40


class SwarmSetupError(RuntimeError):
    """The two-node swarm did not come up; the message ends with the tail of node 2's dockerd log."""


@dataclass
class TwoNodeSwarm:
    manager_hostname: str  # Swarm node hostname of the host engine
    worker_hostname: str  # Swarm node hostname of node 2
    manager_addr: str  # host-side veth IP: node 2 reaches the manager here; manager host-mode ports answer here
    worker_addr: str  # node 2's IP, reachable from the host: host-mode ports of tasks on node 2 answer here
    worker_docker_url: str  # tcp://<worker_addr>:2375
    worker_data_root: Path
    worker_log: Path
    _process: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    def manager_client(self) -> docker.DockerClient:
        return docker.from_env()

    def worker_client(self, timeout: int = 120) -> docker.DockerClient:
        return docker.DockerClient(base_url=self.worker_docker_url, timeout=timeout)

    def stop_worker_engine(self, graceful: bool = True) -> None:
        """Stop node 2's dockerd so the manager sees the node go down.

        graceful=True is a clean daemon shutdown: the swarm agent goes first (the manager reports the node down
        after a few heartbeats, ~4 s with the 1 s default here), then its containers are stopped, each within
        its stop grace period (10 s unless the service sets stop_grace_period; a python PID 1 ignores SIGTERM
        and uses all of it), so the call can take that long. Task ports on worker_addr stop answering.

        graceful=False SIGKILLs dockerd and containerd, like a crash; returns at once, node down after ~2-4 s.
        Task containers keep running under their shims and, since node 2's iptables DNAT rules stay in place,
        their host-mode ports on worker_addr KEEP ANSWERING. A later start_worker_engine() then first stops
        those orphans (no live-restore: another full stop grace period) before Swarm starts fresh tasks.
        """
        if graceful:
            _signal_and_wait(_worker_daemon_pids(("dockerd",)), signal.SIGTERM, ENGINE_STOP_TIMEOUT_S)
        # Shims are spared: after a kill they keep the containers running, as after a real daemon crash.
        _signal_and_wait(_worker_daemon_pids(("dockerd", "containerd")), signal.SIGKILL, 10.0)
        if self._process is not None:
            # Reap our child so it does not linger as a zombie that looks alive in /proc.
            try:
                self._process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
            self._process = None
        WORKER_PIDFILE.unlink(missing_ok=True)

    def start_worker_engine(self) -> None:
        """Start node 2's dockerd again (same data-root: it rejoins the swarm by itself) and wait until the
        manager reports the node ready."""
        if self._process is not None and self._process.poll() is None:
            return
        self._process = _spawn_worker_dockerd(self.worker_hostname, self.worker_data_root, self.worker_log)
        _wait_for_worker_api(self)
        _wait_for_nodes_ready({self.manager_hostname, self.worker_hostname}, self.worker_log)


def missing_prerequisites() -> str | None:
    """Why the two-node swarm cannot run here, or None if it can."""
    if os.geteuid() != 0:
        return "two-node swarm needs root (network namespaces, a second dockerd)"
    missing = [tool for tool in ("ip", "nsenter", "unshare", "dockerd", "umount") if shutil.which(tool) is None]
    if missing:
        return f"two-node swarm needs {', '.join(missing)} on PATH"
    try:
        client = docker.from_env(timeout=10)
        client.ping()
        client.close()
    except Exception as e:  # any failure here means "no engine to test against", not a test failure
        return f"no Docker engine reachable: {e}"
    return None


def start_two_node_swarm(
    tmp_root: Path, worker_hostname: str = DEFAULT_WORKER_HOSTNAME, heartbeat_period_s: float = 1.0
) -> TwoNodeSwarm:
    """Set up the two-node swarm from a clean slate (a previous run's leftovers are removed first).

    Raises SwarmSetupError with the tail of node 2's dockerd log when something does not come up; whatever was
    set up by then is torn down again.
    """
    reason = missing_prerequisites()
    if reason:
        raise SwarmSetupError(reason)
    host = docker.from_env(timeout=60)
    manager_hostname = str(host.info()["Name"])
    if worker_hostname == manager_hostname:
        raise ValueError(f"node 2's hostname must differ from the host's ({manager_hostname!r})")

    # A previous run that crashed may have left the host in our swarm with task containers, and node 2 running.
    stop_two_node_swarm(None)
    _leave_leftover_swarm(host)  # raises if the host is in somebody else's swarm

    tmp_root.mkdir(parents=True, exist_ok=True)
    cluster = TwoNodeSwarm(
        manager_hostname=manager_hostname,
        worker_hostname=worker_hostname,
        manager_addr=MANAGER_ADDR,
        worker_addr=WORKER_ADDR,
        worker_docker_url=f"tcp://{WORKER_ADDR}:{WORKER_DOCKER_PORT}",
        worker_data_root=tmp_root / "node-2-data",
        worker_log=tmp_root / "node-2-dockerd.log",
    )
    try:
        RUN_DIR.mkdir(parents=True, exist_ok=True)
        # Written before anything is created, so a crash at any later point leaves enough to clean up.
        _write_state(
            {
                "data_root": str(cluster.worker_data_root),
                "host_had_gwbridge": _network_exists(host, GWBRIDGE),
            }
        )
        _create_netns()
        cluster._process = _spawn_worker_dockerd(worker_hostname, cluster.worker_data_root, cluster.worker_log)
        _wait_for_worker_api(cluster)

        host.swarm.init(
            advertise_addr=MANAGER_ADDR,
            listen_addr=f"{MANAGER_ADDR}:{SWARM_PORT}",
            default_addr_pool=[DEFAULT_ADDR_POOL],
            subnet_size=24,
            # Nanoseconds (the Engine API's Duration). Swarm marks a node down after a few missed heartbeats,
            # so a short period makes a killed node show up as down in 2-4 s instead of ~15 s (measured here).
            dispatcher_heartbeat_period=int(heartbeat_period_s * 1e9),
        )
        host.swarm.reload()
        token = host.swarm.attrs["JoinTokens"]["Worker"]
        worker = cluster.worker_client()
        try:
            worker.swarm.join(
                remote_addrs=[f"{MANAGER_ADDR}:{SWARM_PORT}"],
                join_token=token,
                listen_addr=f"{WORKER_ADDR}:{SWARM_PORT}",
                advertise_addr=f"{WORKER_ADDR}:{SWARM_PORT}",
            )
        finally:
            worker.close()
        _wait_for_nodes_ready({manager_hostname, worker_hostname}, cluster.worker_log)
    except BaseException as e:
        stop_two_node_swarm(cluster)
        if isinstance(e, SwarmSetupError) or not isinstance(e, Exception):
            raise
        raise SwarmSetupError(f"two-node swarm setup failed: {e}\n{_log_tail(cluster.worker_log)}") from e
    finally:
        host.close()
    return cluster


def stop_two_node_swarm(cluster: TwoNodeSwarm | None) -> None:
    """Tear everything down: services, the host's swarm membership, node 2 and its namespace, veth, data.

    Works from any partial state (cluster may be None, e.g. when setup never returned) and never raises:
    each step is attempted even if an earlier one failed.
    """
    state = _read_state()
    host: docker.DockerClient | None = None
    try:
        host = docker.from_env(timeout=60)
    except Exception:
        pass
    if host is not None:
        _best_effort(lambda: _remove_services(host))
    # Killed rather than stopped: a task's PID 1 that ignores SIGTERM (python does) would otherwise hold up the
    # worker's shutdown for the whole stop grace period (10 s by default), for nothing.
    _best_effort(_kill_worker_containers)
    if host is not None:
        _best_effort(lambda: _leave_leftover_swarm(host))
        _best_effort(lambda: _remove_task_containers(host))
        if not state.get("host_had_gwbridge", True):
            _best_effort(lambda: _remove_network_if_unused(host, GWBRIDGE))
    if cluster is not None and cluster._process is not None:
        _best_effort(lambda: cluster.stop_worker_engine())
    _best_effort(_cleanup_worker)
    if host is not None:
        _best_effort(host.close)


@pytest.fixture(scope="module")
def two_node_swarm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TwoNodeSwarm]:
    """The two-node swarm for one test module (module scope: a test that stops node 2 or leaves services
    behind cannot leak that into other modules). Skips where it cannot run."""
    reason = missing_prerequisites()
    if reason and os.environ.get("LANECTL_CI"):
        pytest.fail(f"CI must run the Swarm tests: {reason}")  # a skip would let CI pass untested
    if reason:
        pytest.skip(reason)
    cluster: TwoNodeSwarm | None = None
    try:
        cluster = start_two_node_swarm(tmp_path_factory.mktemp("swarm"))
        yield cluster
    finally:
        stop_two_node_swarm(cluster)


# --- node 2's engine -------------------------------------------------------------------------------------


def _spawn_worker_dockerd(hostname: str, data_root: Path, log_path: Path) -> subprocess.Popen[bytes]:
    data_root.mkdir(parents=True, exist_ok=True)
    WORKER_EXEC_ROOT.mkdir(parents=True, exist_ok=True)
    # An explicit, empty config: otherwise node 2 would read the host engine's /etc/docker/daemon.json.
    WORKER_CONFIG.write_text("{}\n")
    dockerd_args = [
        "dockerd",
        f"--config-file={WORKER_CONFIG}",
        f"--data-root={data_root}",
        f"--exec-root={WORKER_EXEC_ROOT}",
        f"--pidfile={WORKER_PIDFILE}",
        f"--cgroup-parent={WORKER_CGROUP_PARENT}",
        # Only TCP: the default unix socket would take over the host engine's /var/run/docker.sock.
        f"--host=tcp://{WORKER_ADDR}:{WORKER_DOCKER_PORT}",
        # Explicitly off, or dockerd 20.10 waits 15 s warning about an unencrypted TCP socket.
        "--tls=false",
    ]
    # Without DOCKER_SERVICE_PREFER_OFFLINE_IMAGE in its environment: node 2's tasks pull their image.
    env = {k: v for k, v in os.environ.items() if k != "DOCKER_SERVICE_PREFER_OFFLINE_IMAGE"}
    # nsenter/unshare/sh all exec, so the Popen pid is dockerd's own. The hostname is written through /proc
    # inside the new UTS namespace (no dependency on a `hostname` binary); the host's hostname is untouched.
    # nsenter rather than `ip netns exec`: the latter also unshares the mount namespace and remounts /sys, which
    # hides the cgroup v1 mounts under /sys/fs/cgroup ("Devices cgroup isn't mounted", dockerd exits). Staying
    # in the host's mount namespace also keeps node 2's mounts visible, so teardown can unmount and delete them.
    command = [
        "nsenter",
        f"--net={NETNS_PATH}",
        "--",
        "unshare",
        "--uts",
        "--",
        "sh",
        "-c",
        'printf %s "$0" > /proc/sys/kernel/hostname && exec "$@"',
        hostname,
        *dockerd_args,
    ]
    # Appended to, so a restarted node 2 keeps the earlier run's lines; the child keeps its own descriptor.
    log = open(log_path, "ab")
    try:
        log.write(f"\n--- {time.strftime('%H:%M:%S')} starting node 2 dockerd ---\n".encode())
        log.flush()
        return subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    finally:
        log.close()


def _wait_for_worker_api(cluster: TwoNodeSwarm) -> None:
    deadline = time.monotonic() + ENGINE_START_TIMEOUT_S
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        if cluster._process is not None and cluster._process.poll() is not None:
            raise SwarmSetupError(
                f"node 2 dockerd exited with status {cluster._process.returncode}\n{_log_tail(cluster.worker_log)}"
            )
        try:
            client = cluster.worker_client(timeout=5)
            try:
                client.ping()
                return
            finally:
                client.close()
        except Exception as e:  # connection refused until dockerd listens
            last_error = e
        time.sleep(0.3)
    raise SwarmSetupError(
        f"node 2 dockerd API at {cluster.worker_docker_url} did not answer within {ENGINE_START_TIMEOUT_S:.0f} s "
        f"({last_error})\n{_log_tail(cluster.worker_log)}"
    )


def _wait_for_nodes_ready(hostnames: set[str], log_path: Path) -> None:
    host = docker.from_env(timeout=30)
    deadline = time.monotonic() + NODE_READY_TIMEOUT_S
    seen: dict[str, str] = {}
    try:
        while time.monotonic() < deadline:
            # A restarted node can briefly appear twice (old entry down, new one ready): any ready one counts.
            seen = {}
            for node in host.nodes.list():
                name = node.attrs["Description"]["Hostname"]
                state = node.attrs["Status"]["State"]
                if seen.get(name) != "ready":
                    seen[name] = state
            if all(seen.get(name) == "ready" for name in hostnames):
                return
            time.sleep(0.3)
    finally:
        host.close()
    raise SwarmSetupError(
        f"swarm nodes not ready within {NODE_READY_TIMEOUT_S:.0f} s: want {sorted(hostnames)}, manager sees {seen}\n"
        f"{_log_tail(log_path)}"
    )


def _log_tail(path: Path) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:]
    except OSError:
        return f"(no node 2 dockerd log at {path})"
    return f"--- last {len(lines)} lines of node 2 dockerd log {path} ---\n" + "\n".join(lines)


# --- host engine -----------------------------------------------------------------------------------------


def _our_swarm(host: docker.DockerClient) -> bool:
    """Whether the host engine is in a swarm that this module created (advertised on our veth address)."""
    swarm = host.info()["Swarm"]
    return bool(swarm.get("LocalNodeState") != "inactive" and swarm.get("NodeAddr") == MANAGER_ADDR)


def _leave_leftover_swarm(host: docker.DockerClient) -> None:
    swarm = host.info()["Swarm"]
    if swarm.get("LocalNodeState") == "inactive":
        return
    if swarm.get("NodeAddr") != MANAGER_ADDR:
        # Someone else's swarm: leaving it would destroy their services, so refuse loudly instead.
        raise SwarmSetupError(
            f"the host engine is already in a swarm (node address {swarm.get('NodeAddr')!r}, not ours "
            f"{MANAGER_ADDR}); leave it first with `docker swarm leave --force`"
        )
    host.swarm.leave(force=True)


def _remove_services(host: docker.DockerClient) -> None:
    # So that Swarm stops rescheduling tasks while the containers are being removed. Not waited for: the task
    # containers are force-removed after the leave anyway, which is much faster than their stop grace period.
    if not _our_swarm(host):
        return
    for service in host.services.list():
        service.remove()


def _kill_worker_containers() -> None:
    if not NETNS_PATH.exists():
        return
    worker = docker.DockerClient(base_url=f"tcp://{WORKER_ADDR}:{WORKER_DOCKER_PORT}", timeout=10)
    try:
        for container in worker.containers.list():
            _best_effort(container.kill)
    finally:
        worker.close()


def _remove_task_containers(host: docker.DockerClient) -> None:
    # Only once out of swarm: any container still labelled as a swarm task is then a leftover of ours.
    if host.info()["Swarm"].get("LocalNodeState") != "inactive":
        return
    # The leaving agent may still be removing some of them itself, hence a few rounds.
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        leftovers = host.containers.list(all=True, filters={"label": "com.docker.swarm.task"})
        if not leftovers:
            return
        for container in leftovers:
            _best_effort(functools.partial(container.remove, force=True))
        time.sleep(0.2)


def _network_exists(host: docker.DockerClient, name: str) -> bool:
    return any(n.name == name for n in host.networks.list(names=[name]))


def _remove_network_if_unused(host: docker.DockerClient, name: str) -> None:
    # docker_gwbridge is created by swarm on first use and survives `swarm leave`; remove it only if this
    # module created it (checked by the caller) and nothing is attached, so the host looks as before.
    for network in host.networks.list(names=[name]):
        network.reload()
        if network.name == name and not network.attrs.get("Containers"):
            network.remove()


# --- namespace, veth, processes, files ------------------------------------------------------------------


def _run(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(list(args), capture_output=True, text=True)
    if check and result.returncode != 0:
        raise RuntimeError(f"`{' '.join(args)}` failed ({result.returncode}): {result.stderr.strip()}")
    return result


def _create_netns() -> None:
    _run("ip", "netns", "add", NETNS)
    _run("ip", "link", "add", VETH_HOST, "type", "veth", "peer", "name", VETH_WORKER)
    _run("ip", "link", "set", VETH_WORKER, "netns", NETNS)
    _run("ip", "addr", "add", f"{MANAGER_ADDR}/{PREFIX_LEN}", "dev", VETH_HOST)
    _run("ip", "link", "set", VETH_HOST, "up")
    _run("ip", "-n", NETNS, "addr", "add", f"{WORKER_ADDR}/{PREFIX_LEN}", "dev", VETH_WORKER)
    _run("ip", "-n", NETNS, "link", "set", VETH_WORKER, "up")
    # dockerd and containerd talk to themselves over loopback; a fresh namespace has it down.
    _run("ip", "-n", NETNS, "link", "set", "lo", "up")


def _read_state() -> dict[str, object]:
    try:
        data = json.loads(STATE_FILE.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _write_state(state: dict[str, object]) -> None:
    STATE_FILE.write_text(json.dumps(state))


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    # A zombie has exited; it only waits to be reaped by its parent.
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def _all_pids() -> list[int]:
    return [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()]


def _worker_daemon_pids(names: tuple[str, ...] | None = None) -> list[int]:
    """Node 2's dockerd, containerd and shims (all of them name the exec-root on their command line),
    optionally only those whose executable is one of `names`."""
    marker = str(WORKER_EXEC_ROOT)
    me = os.getpid()
    pids = []
    for pid in _all_pids():
        argv = _cmdline(pid)
        if pid == me or not any(marker in arg for arg in argv) or not _alive(pid):
            continue
        if names is None or Path(argv[0]).name in names:
            pids.append(pid)
    return pids


def _netns_pids() -> list[int]:
    """Processes in node 2's network namespace (covers docker-proxy, which names no path of ours)."""
    try:
        st = NETNS_PATH.stat()
    except OSError:
        return []
    target = f"net:[{st.st_ino}]"
    pids = []
    for pid in _all_pids():
        try:
            if os.readlink(f"/proc/{pid}/ns/net") == target:
                pids.append(pid)
        except OSError:
            continue
    return pids


def _worker_cgroup_dirs() -> list[Path]:
    # The parent is relative, so runc puts it under dockerd's own cgroup in each hierarchy: at the top of most
    # v1 controllers here, but deeper where this process sits in a sub-cgroup (memory is under
    # /process_api/<id> on this machine). Hence a walk over all hierarchies rather than fixed paths; it is cheap.
    found: list[Path] = []
    for dirpath, dirnames, _ in os.walk("/sys/fs/cgroup"):
        if WORKER_CGROUP_PARENT in dirnames:
            found.append(Path(dirpath) / WORKER_CGROUP_PARENT)
            dirnames.remove(WORKER_CGROUP_PARENT)
    return found


def _cgroup_pids() -> list[int]:
    pids: set[int] = set()
    for top in _worker_cgroup_dirs():
        for procs in top.rglob("cgroup.procs"):
            try:
                pids.update(int(line) for line in procs.read_text().split())
            except (OSError, ValueError):
                continue
    return sorted(pids)


def _signal_and_wait(pids: list[int], sig: signal.Signals, timeout: float) -> None:
    me = os.getpid()
    for pid in pids:
        if pid == me:
            continue
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(_alive(p) for p in pids if p != me):
        time.sleep(0.1)


def _kill_worker_processes() -> None:
    # Graceful first: a live dockerd stops its containers and its containerd, which leaves nothing mounted.
    daemons = _worker_daemon_pids(("dockerd",))
    if WORKER_PIDFILE.exists():
        try:
            pid = int(WORKER_PIDFILE.read_text().strip())
            if pid not in daemons and any(str(WORKER_EXEC_ROOT) in a for a in _cmdline(pid)):
                daemons.append(pid)
        except (OSError, ValueError):
            pass
    _signal_and_wait(daemons, signal.SIGTERM, ENGINE_STOP_TIMEOUT_S)
    # Then whatever is left: a crashed run's containerd, shims and their containers.
    for _ in range(3):
        leftovers = sorted(set(_worker_daemon_pids()) | set(_netns_pids()) | set(_cgroup_pids()))
        if not leftovers:
            return
        _signal_and_wait(leftovers, signal.SIGKILL, 10.0)


def _mounts_under(roots: list[Path]) -> list[str]:
    prefixes = [str(r).rstrip("/") for r in roots]
    mounts: list[str] = []
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return mounts
    for line in lines:
        # Field 5 is the mount point, with spaces and the like escaped as octal.
        point = line.split()[4].encode().decode("unicode_escape")
        if any(point == p or point.startswith(p + "/") for p in prefixes):
            mounts.append(point)
    return mounts


def _unmount_under(roots: list[Path]) -> None:
    # Deepest first; lazily, since a mount can still be busy for a moment after its process died.
    for point in sorted(set(_mounts_under(roots)), key=lambda p: p.count("/"), reverse=True):
        _run("umount", "-l", point, check=False)


def _remove_tree(path: Path) -> None:
    if path.exists():
        # --one-file-system: never follow into something still mounted (a container's bind mount of the host).
        _run("rm", "-rf", "--one-file-system", str(path), check=False)


def _cleanup_worker() -> None:
    """Remove node 2 entirely, from whatever state it is in (running, crashed, half set up, absent)."""
    state = _read_state()
    data_root = Path(str(state["data_root"])) if state.get("data_root") else None
    _best_effort(_kill_worker_processes)
    roots = [WORKER_EXEC_ROOT] + ([data_root] if data_root else [])
    _best_effort(lambda: _unmount_under(roots))
    for top in _worker_cgroup_dirs():
        for d in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
            _best_effort(d.rmdir)
        _best_effort(top.rmdir)
    # Deleting the namespace destroys the veth end inside it and with it the pair; the explicit delete covers
    # a veth that was created but never moved.
    if NETNS_PATH.exists():
        _run("ip", "netns", "delete", NETNS, check=False)
    if Path(f"/sys/class/net/{VETH_HOST}").exists():
        _run("ip", "link", "delete", VETH_HOST, check=False)
    if Path(f"/sys/class/net/{VETH_WORKER}").exists():
        _run("ip", "link", "delete", VETH_WORKER, check=False)
    if data_root is not None:
        _remove_tree(data_root)
    _remove_tree(WORKER_EXEC_ROOT)
    for path in (WORKER_PIDFILE, WORKER_CONFIG, STATE_FILE):
        path.unlink(missing_ok=True)
    # Keep the run dir only if something unexpected is in it, which is then worth a look.
    _best_effort(RUN_DIR.rmdir)


def _best_effort(step: Callable[[], object]) -> None:
    try:
        step()
    except Exception:
        pass
