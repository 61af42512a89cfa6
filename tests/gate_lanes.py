"""The gate's lanes on the real engine, shared by its test modules (tests/test_gate_docker.py, the bracket's
verdicts, fidelity and probes; tests/test_gate_rounds_docker.py, calibration and --until-decided's rounds), which
run in different groups of `make test` so that neither waits on the other."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.lane_fixtures import LaneProject, make_lane_project, remove_everything

CANDIDATES = """
  t-fast:
    description: decodes twice as fast as demo-h1 (a margin no noise closes, even on one control pair's 1 df)
    engine:
      env: {STUB_DECODE_TOKENS_PER_S: "200"}
  t-4pct:
    description: decodes 4% faster than demo-h1 (the release note's effect)
    engine:
      env: {STUB_DECODE_TOKENS_PER_S: "104"}
  t-same:
    description: as fast as demo-h1
    engine:
      env: {STUB_TOKEN_SEED: "0"}
  t-fatal:
    description: fast, but logs a fatal engine line 2 s after it is ready
    engine:
      env: {STUB_DECODE_TOKENS_PER_S: "125", STUB_FAULT: fatal_log, STUB_FAULT_AFTER_S: "2"}
  t-flip:
    description: fast, but changes a confident token every 5 positions
    engine:
      env: {STUB_DECODE_TOKENS_PER_S: "125", STUB_FLIP_EVERY: "5"}
  t-late:
    description: fast, but its prefill flips every confident token from position 24 of a text on
    engine:
      env: {STUB_DECODE_TOKENS_PER_S: "125", STUB_PREFILL_FLIP_FROM: "24"}
  t-leak:
    description: fast, but returns its reasoning inside the answer
    engine:
      env: {STUB_DECODE_TOKENS_PER_S: "125", STUB_FAULT: leak_reasoning}
  t-short:
    description: caps the context at 2048 tokens, too short for the demo needle (never built, refused first)
    engine:
      args: [/model, --served-model-name, demo-model, --max-model-len, "2048", --host, 0.0.0.0, --port, "8000"]
"""


def gate_project(tmp_path_factory: pytest.TempPathFactory, lanes: list[str]) -> Iterator[LaneProject]:
    """A lane project with the gate's candidate lanes, workloads and probes; `lanes` built."""
    # Primaries alone: the gate's arms are switches, and no claim here is about companions (a companion failing
    # its gate is tests/test_switch_docker.py's).
    project = make_lane_project(tmp_path_factory.mktemp("gate"), companions=False)
    recipe = project.root / "recipes" / "lanes.yaml"
    recipe.write_text(recipe.read_text().rstrip() + "\n" + CANDIDATES)
    workloads = project.root / "recipes" / "workloads"
    workloads.mkdir()
    (workloads / "gate-test.yaml").write_text((Path(__file__).parent / "data" / "gate-workload.yaml").read_text())
    shutil.copytree(REPO / "recipes" / "workloads" / "probes", workloads / "probes")
    shutil.copy(Path(__file__).parent / "data" / "probes" / "quick.yaml", workloads / "probes")
    (workloads / "gate-pass.yaml").write_text(
        (workloads / "gate-test.yaml").read_text().replace("name: gate-test", "name: gate-pass") + "probes: [quick]\n")
    one_class = (workloads / "gate-pass.yaml").read_text().replace("name: gate-pass", "name: gate-one")
    (workloads / "gate-one.yaml").write_text(one_class.split("  code:\n")[0] + "probes: [quick]\n")
    (workloads / "gate-probes.yaml").write_text(
        one_class.split("  code:\n")[0].replace("name: gate-one", "name: gate-probes") + "probes: [quick, needle-4k]\n")
    project.invoke("build", *lanes, state=tmp_path_factory.mktemp("build-state"), check=True, timeout=600)
    yield project
    remove_everything(project)


def gate(lanes: LaneProject, state: Path, candidate: str, *extra: str, workload: str = "gate-test",
         env: dict[str, str] | None = None) -> tuple[int, dict]:
    # In this process, but for a run whose PYTHONPATH must hide a package from lanectl's imports.
    run = lanes.cli if env and "PYTHONPATH" in env else lanes.invoke
    result = run("gate", candidate, "--control", "demo-h1", "--workload", workload, "--concurrency", "1",
                 "--no-gpu", "--json", *extra, state=state, timeout=600,
                 extra_env={"LANECTL_KERNEL_LOG": f"file:{state.parent / 'kern.log'}", **(env or {})})
    assert result.returncode in (0, 1), result.stderr
    return result.returncode, json.loads(result.stdout)["data"]


def active(lanes: LaneProject, state: Path) -> str | None:
    return json.loads(lanes.invoke("status", "--json", state=state, check=True).stdout)["data"]["active"]
