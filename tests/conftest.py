from __future__ import annotations

import shutil
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from tests.registry_server import Registry

REPO = Path(__file__).resolve().parent.parent
# The contract suite runs in its own venv with vLLM installed (`make contract`, scripts/contract.sh).
collect_ignore = ["contract"]

# `make test` (scripts/run-tests.sh) runs the suite as parallel pytest processes, one per group below, then the
# engine-restart test alone. The groups share no lanes and no state (each test module builds its own project under
# a unique recipe id, its own state folder and engine-lock folder), so they can run at once on one engine; most of
# their time is spent waiting on containers and on the stub's paced tokens, so two cores carry them. The groups are
# cut to take about as long as each other, since the run lasts as long as its longest. What each holds:
#   gate      the A/B/A gate's brackets on lanes, the endpoint probes, alerts, builds and registry pushes, and
#             the watchdog's hostile state files
#   switches  switches on lanes: up, rollback, down, recreates, foreign containers, interrupts, the installed
#             wheel, and the guides run as written
#   watchdog  the watchdog and standbys on lanes
#   fleet     the two-node Swarm (its module is the suite's second longest), a real cron, the load generator,
#             the health gate against stub processes, and the switch's findings shown on the real engine
#   traffic   drains of lanes with requests in flight, the stub replaying the real vLLM's records, and the gate's
#             rounds (calibration, --until-decided)
#   side      every pure test, the stub engine's own tests, and the downloads of pinned sources
#   solo      the test that restarts the Docker engine every other test uses, and the switch's fuzzer: alone, last
# The stateful fuzzers are pure but CPU-bound: they run beside groups that mostly wait on containers, not in side.
FLEET_FILES = {"test_fleet_swarm.py", "test_watchdog_install.py", "test_loadgen_stub.py", "test_health_gate_stub.py",
               "test_fleet_fuzz.py", "test_switch_findings_docker.py"}
SWITCH_FILES = {"test_lanes_docker.py", "test_switch_docker.py", "test_installed_wheel.py", "test_guides.py"}
WATCHDOG_FILES = {"test_watchdog_docker.py", "test_standby_docker.py", "test_standby_check_docker.py"}
TRAFFIC_FILES = {"test_drain_docker.py", "test_gpu_record_replay.py", "test_gate_rounds_docker.py",
                 "test_standby_check_driver.py"}
GATE_FILES = {"test_endpoint_probe.py", "test_alerts.py", "test_registry_push.py", "test_build_docker.py",
              "test_watchdog_hostile_state.py"}
# It stops and starts the one dockerd every other test uses. The switch's fuzzer runs alone too: its search is
# bounded by moves, and beside six groups on two cores its 15-20 s became 49-79 s, past the minute it is allowed.
SOLO_FILES = {"test_lanes_engine_restart.py", "test_switch_fuzz.py"}


@pytest.hookimpl(tryfirst=True)  # before -m deselects by these markers
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        path = Path(str(item.path))
        if path.name in SOLO_FILES:
            item.add_marker(pytest.mark.solo)
        elif path.name in SWITCH_FILES:
            item.add_marker(pytest.mark.switches)
        elif path.name in WATCHDOG_FILES:
            item.add_marker(pytest.mark.watchdog)
        elif path.name in FLEET_FILES:
            item.add_marker(pytest.mark.fleet)
        elif path.name in TRAFFIC_FILES:
            item.add_marker(pytest.mark.traffic)
        elif item.get_closest_marker("docker") is None and path.name not in GATE_FILES:
            item.add_marker(pytest.mark.side)
        else:
            item.add_marker(pytest.mark.gate)


@pytest.fixture(autouse=True)
def engine_lock_dir(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test its own engine lock folder: the suite's runs share one engine, and a test must not wait on (or
    take) the lock of another run's switch; tests of the lock itself name the folder they share."""
    monkeypatch.setenv("LANECTL_LOCK_DIR", str(tmp_path_factory.mktemp("engine-lock")))


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A throwaway project: the repo's images, kernels and patches, and an empty recipes folder.

    The working directory is the project, so messages show paths relative to it, as a user sees them.
    """
    root = tmp_path / "project"
    for part in ("images", "kernels", "patches"):
        shutil.copytree(REPO / part, root / part, ignore=shutil.ignore_patterns("__pycache__"))
    (root / "recipes").mkdir()
    monkeypatch.chdir(root)
    monkeypatch.delenv("LANECTL_RECIPES", raising=False)
    return root


@pytest.fixture
def write_recipe(project: Path) -> Callable[[str, str], Path]:
    def write(text: str, name: str = "r.yaml") -> Path:
        path = project / "recipes" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip("\n"))
        return path

    return write


@pytest.fixture(scope="session")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    """A real registry (scripts/registry.sh) on a free loopback port, for the whole test session."""
    from tests.registry_server import session_registry

    yield from session_registry(tmp_path_factory)
