"""Figures for the CLI's start (issue 40), each against a baseline measured in the same run.

  `lanectl --help`, `lanectl --version`: wall time over `python -c pass` (the same interpreter)
  `lanectl status` (one lane serving, the catalog cached): wall time over `python -c pass`
  `lanectl watchdog check` on a healthy lane: CPU time of the process (`python -c pass` shown beside it)
  `lanectl up` and `lanectl rollback` between two lanes with kept containers: wall time over the raw Docker
          sequence (stop, start, poll /health at the recipe's poll interval), as benchmarks/lanes.py does it
Then where `status` and `watchdog check` spend their imports, by package (`python -X importtime`, self times
summed, median of 5 runs; a standard library module counts for the package that imported it; the option adds its
own overhead, so the sum is above the start-up it explains).
Medians of interleaved runs: a noisy moment slows the command and its baseline alike. The CLI is run as
`python -m lanectl` from this checkout, with bytecode written as an installed package has it.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
# benchmarks/lanes.py puts this checkout first, for this process and the CLI it starts, and lets the CLI write
# its bytecode as an installed package has it.
import docker  # noqa: E402
from lanes import Timed, raw_switch  # noqa: E402

from lanectl.lanes.standby import role_base_url  # noqa: E402
from lanectl.project import Project  # noqa: E402
from lanectl.recipe.catalog import load_catalog  # noqa: E402
from lanectl.state.lanes import LaneStateStore  # noqa: E402
from lanectl.state.paths import StateFiles  # noqa: E402
from tests.lane_fixtures import make_lane_project, remove_everything  # noqa: E402

RUNS = 15
SWITCH_REPEAT = 3
HELP_OVERHEAD_TARGET_MS = 80
STATUS_OVERHEAD_TARGET_MS = 150
CHECK_CPU_TARGET_S = 0.15
SWITCH_OVERHEAD_TARGET_MS = 250


class Runs(Timed):
    """The wall and CPU time of each run of one command."""

    def __init__(self, label: str, run: Callable[[], object]) -> None:
        super().__init__()
        self.label, self.run = label, run

    def once(self) -> None:
        with self:
            self.run()

    def wall_ms(self) -> float:
        return statistics.median(self.wall) * 1000

    def cpu_s(self) -> float:
        return statistics.median(self.cpu)


def interleaved(*runs: Runs, times: int = RUNS) -> None:
    for run in runs:
        run.once()  # warm: bytecode written, catalog cached, files in the page cache
        run.wall.clear()
        run.cpu.clear()
    for _ in range(times):
        for run in runs:
            run.once()


def verdict(met: bool) -> str:
    return "met" if met else "MISSED"


def overhead_line(run: Runs, baseline: Runs, target_ms: int) -> str:
    overhead = run.wall_ms() - baseline.wall_ms()
    return (f"{run.label:<30} {run.wall_ms():6.0f} ms   baseline `python -c pass` {baseline.wall_ms():5.0f} ms   "
            f"overhead {overhead:+5.0f} ms   target +{target_ms} ms: {verdict(overhead <= target_ms)}   "
            f"(CPU {run.cpu_s() * 1000:.0f} ms, baseline {baseline.cpu_s() * 1000:.0f} ms)")


# Packages by what they are to lanectl; the first prefix that matches names a module's group.
IMPORT_GROUPS = (
    ("pydantic (the models' base)", ("pydantic", "pydantic_core", "annotated_types", "typing_inspection",
                                     "typing_extensions")),
    ("lanectl's recipe and state models", ("lanectl.recipe.model", "lanectl.recipe.kernel", "lanectl.state",
                                   "lanectl.watchdog.state")),
    ("lanectl, the rest", ("lanectl",)),
    ("typer and click", ("typer", "click", "shellingham")),
    ("rich", ("rich", "markdown_it", "pygments", "mdurl")),
    ("the rest: Python's own start", ("",)),
)


def import_groups(stderr: str) -> dict[str, float]:
    """Milliseconds of import (self times) per IMPORT_GROUPS group in one `-X importtime` report. A standard
    library module counts for the package that first imported it (`http.client` for lanectl's engine client,
    `inspect` for click): the time that would go if that package were not imported."""
    rows = []
    for row in stderr.splitlines():
        if not row.startswith("import time:") or row.endswith("| imported package"):
            continue
        self_us, _, module = row.removeprefix("import time:").split("|")
        rows.append((int(self_us) / 1000, len(module) - len(module.lstrip()), module.strip()))

    def group_of(module: str) -> str:
        return next(name for name, prefixes in IMPORT_GROUPS
                    if any(p == "" or module == p or module.startswith(p + ".") for p in prefixes))

    totals = dict.fromkeys((name for name, _ in IMPORT_GROUPS), 0.0)
    # The report lists a module's imports before it, one level deeper: the importer is the next row less deep.
    for i, (ms, depth, module) in enumerate(rows):
        group = group_of(module)
        for _, outer_depth, outer in rows[i + 1:]:
            if group != IMPORT_GROUPS[-1][0]:
                break
            if outer_depth < depth:
                group, depth = group_of(outer), outer_depth
        totals[group] += ms
    return totals


def import_breakdown(label: str, run: Callable[[], str]) -> None:
    reports = [import_groups(run()) for _ in range(5)]
    medians = {name: statistics.median(report[name] for report in reports) for name, _ in IMPORT_GROUPS}
    print(f"{label} imports by package (-X importtime self times, median of 5): " + "; ".join(
        f"{name} {ms:.0f} ms" for name, ms in medians.items()) + f"; in all {sum(medians.values()):.0f} ms")


def main() -> int:
    def python_pass() -> None:
        subprocess.run([sys.executable, "-c", "pass"], check=True)

    baseline = Runs("python -c pass", python_pass)

    def plain_cli(*args: str) -> Callable[[], None]:
        return lambda: subprocess.run([sys.executable, "-m", "lanectl", *args], check=True, capture_output=True)

    help_runs, version_runs = Runs("`lanectl --help`", plain_cli("--help")), Runs("`lanectl --version`",
                                                                                  plain_cli("--version"))
    interleaved(baseline, help_runs, version_runs)
    print(f"CLI start-up, medians of {RUNS} interleaved runs "
          f"(load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs):")
    print(overhead_line(help_runs, baseline, HELP_OVERHEAD_TARGET_MS))
    print(overhead_line(version_runs, baseline, HELP_OVERHEAD_TARGET_MS))

    client = docker.from_env()
    with tempfile.TemporaryDirectory(prefix="lanectl-bench-startup-") as tmp:
        lanes = make_lane_project(Path(tmp))
        state = Path(tmp) / "state"
        try:
            lanes.cli("build", "demo-h1", "demo-h2", state=state, check=True, timeout=600)
            lanes.cli("up", "demo-h2", "--no-gpu", state=state, check=True)
            lanes.cli("up", "demo-h1", "--no-gpu", state=state, check=True)  # a healthy lane serving
            kernel_log = Path(tmp) / "kern.log"
            kernel_log.write_text("")

            status_runs = Runs("`lanectl status`", lambda: lanes.cli("status", state=state, check=True))
            check_runs = Runs("`lanectl watchdog check`", lambda: lanes.cli(
                "watchdog", "check", "--kernel-log", f"file:{kernel_log}", state=state, check=True))
            interleaved(baseline, status_runs, check_runs)
            print(overhead_line(status_runs, baseline, STATUS_OVERHEAD_TARGET_MS))
            print(f"{check_runs.label:<30} {check_runs.cpu_s():6.3f} CPU-s   baseline `python -c pass` "
                  f"{baseline.cpu_s():5.3f} CPU-s   ({check_runs.wall_ms():.0f} ms wall)   "
                  f"target {CHECK_CPU_TARGET_S} CPU-s: {verdict(check_runs.cpu_s() <= CHECK_CPU_TARGET_S)}")
            importtime = {"PYTHONPROFILEIMPORTTIME": "1"}  # -X importtime
            import_breakdown(status_runs.label, lambda: lanes.cli("status", state=state, check=True,
                                                                   extra_env=importtime).stderr)
            import_breakdown(check_runs.label, lambda: lanes.cli(
                "watchdog", "check", "--kernel-log", f"file:{kernel_log}", state=state, check=True,
                extra_env=importtime).stderr)

            catalog = load_catalog(Project.locate(lanes.root / "recipes"))
            a, b = catalog.lane("demo-h1"), catalog.lane("demo-h2")
            interval = b.spec.health.poll_interval_seconds
            states = LaneStateStore(StateFiles(state).lanes)

            def names(lane):
                return [lane.container_name(role) for role in lane.roles]

            def urls(lane):
                return [role_base_url(lane, role) + "/health" for role in lane.roles]

            up, rollback = Runs("`lanectl up`", lambda: None), Runs("`lanectl rollback`", lambda: None)
            raw_up, raw_back = [], []
            lanes.cli("up", "demo-h2", "--no-gpu", state=state, check=True)
            for _ in range(SWITCH_REPEAT):
                # B serves: the CLI to A and back, then the same two switches by hand.
                up.run = lambda: lanes.cli("up", "demo-h1", "--no-gpu", state=state, check=True)
                up.once()
                rollback.run = lambda: lanes.cli("rollback", "--no-gpu", state=state, check=True)
                rollback.once()
                raw_up.append(raw_switch(client, names(b)[::-1], names(a), urls(a), interval))
                raw_back.append(raw_switch(client, names(a)[::-1], names(b), urls(b), interval))
                states.update(lambda s: s.with_active("demo-h2"))
            for run, raw in ((up, raw_up), (rollback, raw_back)):
                raw_ms = statistics.median(raw) * 1000
                overhead = run.wall_ms() - raw_ms
                print(f"{run.label:<30} {run.wall_ms():6.0f} ms   raw Docker sequence {raw_ms:6.0f} ms   "
                      f"overhead {overhead:+5.0f} ms   target +{SWITCH_OVERHEAD_TARGET_MS} ms: "
                      f"{verdict(overhead <= SWITCH_OVERHEAD_TARGET_MS)}   (median of {SWITCH_REPEAT}, poll "
                      f"interval {interval} s)")
        finally:
            remove_everything(lanes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
