"""`make bench`: runs every benchmark script and writes what each printed to benchmarks/RESULTS.md.

Each section of RESULTS.md is one script's own run: its figures exactly as printed, with the date, the commit, the
machine (cores, CPU model, load average before and after) and the command. `make bench ONLY=name[,name]` runs those
sections again and keeps the others as they were, each still carrying the facts of the run that wrote it.
Nobody edits RESULTS.md by hand: the README and the docs link to it.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "RESULTS.md"

# The one list of benchmarks, in the order `make bench` runs them; a section is named after its script's stem.
BENCHMARKS = [
    "benchmarks/run.py",
    "benchmarks/registry.py",
    "benchmarks/lanes.py",
    "benchmarks/cli_startup.py",
    "benchmarks/watchdog.py",
    "benchmarks/bench_client.py",
    "benchmarks/fleet.py",
    "benchmarks/standby.py",
    "benchmarks/drain.py",
]

# What a benchmark's figures depend on: a change here that is not committed is named beside the commit.
MEASURED = ["lanectl", "benchmarks", "images", "recipes", "kernels", "patches", "tests", "scripts", "pyproject.toml"]

HEADER = """# Benchmark results

Written by `make bench` (`benchmarks/run_all.py`); do not edit by hand. Each section is one benchmark script's own
run: what it printed, the machine it ran on, the date, the commit and the exact command. `make bench ONLY=NAME`
runs one section again and leaves the others as they were. The figures are one run's on one machine: the machines
are shared and noisy, so each script measures its baseline in the same run and prints the load average beside it.
"""

_SECTION = re.compile(r"<!-- bench:(?P<name>[\w.-]+) -->\n.*?<!-- /bench:(?P=name) -->\n", re.DOTALL)


@dataclass(frozen=True)
class Run:
    name: str
    command: str
    started: str
    seconds: float
    status: int
    output: str
    commit: str
    machine: str


def section_name(script: str) -> str:
    return Path(script).stem


def machine() -> str:
    model = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{os.cpu_count()} cores, {model}, {platform.system()} {platform.release()}"


def load_average() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} {five:.2f} {fifteen:.2f}"


def commit() -> str:
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True).stdout.strip()

    head = git("rev-parse", "--short=12", "HEAD") or "unknown"
    # An uncommitted change to what the benchmarks run (not the docs, not RESULTS.md) is named beside the commit.
    dirty = git("status", "--porcelain", "--untracked-files=no", "--", *MEASURED, ":!benchmarks/RESULTS.md")
    return f"{head} (with uncommitted changes)" if dirty else head


def run(script: str) -> Run:
    python = Path(sys.executable)
    command = f"{python.relative_to(REPO) if python.is_relative_to(REPO) else python} {script}"
    print(f"== bench {section_name(script)}: {command}", flush=True)
    load_before = load_average()
    measured_commit = commit()
    started = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    begun = time.monotonic()
    process = subprocess.Popen([sys.executable, script], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, errors="replace")
    assert process.stdout is not None
    lines = []
    for line in process.stdout:  # shown as it comes: some scripts run for minutes
        sys.stdout.write(line)
        sys.stdout.flush()
        lines.append(line)
    status = process.wait()
    seconds = time.monotonic() - begun
    return Run(name=section_name(script), command=command, started=started, seconds=seconds, status=status,
               output="".join(lines).rstrip("\n"), commit=measured_commit,
               machine=f"{machine()}; load average (1, 5, 15 min) {load_before} before, {load_average()} after")


def render_section(result: Run) -> str:
    status = "exit status 0" if result.status == 0 else f"**exit status {result.status}: the script failed**"
    fence = "````" if "```" in result.output else "```"
    return (f"<!-- bench:{result.name} -->\n"
            f"## {result.name}\n\n"
            f"- command: `{result.command}` (`make bench ONLY={result.name}`)\n"
            f"- date: {result.started}, {result.seconds:.0f} s, {status}\n"
            f"- commit: {result.commit}\n"
            f"- machine: {result.machine}\n\n"
            f"{fence}text\n{result.output}\n{fence}\n"
            f"<!-- /bench:{result.name} -->\n")


def not_measured(name: str) -> str:
    return (f"<!-- bench:{name} -->\n## {name}\n\nNot measured yet: `make bench ONLY={name}`.\n"
            f"<!-- /bench:{name} -->\n")


def rewrite(results: dict[str, str], existing: str) -> str:
    kept = {m.group("name"): m.group(0) for m in _SECTION.finditer(existing)}
    sections = [results.get(name) or kept.get(name) or not_measured(name)
                for name in (section_name(script) for script in BENCHMARKS)]
    return HEADER + "\n" + "\n".join(sections)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="comma-separated section names (default: every benchmark)")
    names = [section_name(script) for script in BENCHMARKS]
    only = [name for name in parser.parse_args(argv).only.split(",") if name]
    unknown = [name for name in only if name not in names]
    if unknown:
        print(f"bench: no benchmark named {', '.join(unknown)}; known: {', '.join(names)}", file=sys.stderr)
        return 2
    existing = RESULTS.read_text() if RESULTS.exists() else ""
    results: dict[str, str] = {}
    failed = []
    for script in BENCHMARKS:
        if only and section_name(script) not in only:
            continue
        result = run(script)
        results[result.name] = render_section(result)
        # Written after each section, so a long run stopped part way keeps what it measured.
        RESULTS.write_text(rewrite(results, existing))
        if result.status:
            failed.append(result.name)
    print(f"== bench: wrote {RESULTS.relative_to(REPO)}" + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
