"""bench and gate on stub-engine lanes on the real engine: the A/B/A bracket end to end."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.lane_fixtures import LaneProject, make_lane_project, remove_containers, remove_everything
from tests.test_plot_extra import without_matplotlib

pytestmark = pytest.mark.docker

CANDIDATES = """
  t-fast:
    description: decodes 25% faster than demo-h1
    engine:
      env: {STUB_DECODE_TOKENS_PER_S: "125"}
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
"""
LANES = ["demo-h1", "t-fast", "t-same", "t-fatal", "t-flip"]


@pytest.fixture(scope="module")
def lanes(tmp_path_factory: pytest.TempPathFactory):
    project = make_lane_project(tmp_path_factory.mktemp("gate"))
    recipe = project.root / "recipes" / "lanes.yaml"
    recipe.write_text(recipe.read_text().rstrip() + "\n" + CANDIDATES)
    workloads = project.root / "recipes" / "workloads"
    workloads.mkdir()
    (workloads / "gate-test.yaml").write_text((Path(__file__).parent / "data" / "gate-workload.yaml").read_text())
    project.cli("build", *LANES, state=tmp_path_factory.mktemp("build-state"), check=True, timeout=600)
    yield project
    remove_everything(project)


@pytest.fixture
def state(lanes: LaneProject, tmp_path: Path):
    yield tmp_path / "state"
    remove_containers(lanes)


def gate(lanes: LaneProject, state: Path, candidate: str, *extra: str,
         env: dict[str, str] | None = None) -> tuple[int, dict]:
    result = lanes.cli("gate", candidate, "--control", "demo-h1", "--workload", "gate-test", "--concurrency", "1,4",
                       "--no-gpu", "--json", *extra, state=state, timeout=600,
                       extra_env={"LANECTL_KERNEL_LOG": f"file:{state.parent / 'kern.log'}", **(env or {})})
    assert result.returncode in (0, 1), result.stderr
    return result.returncode, json.loads(result.stdout)["data"]


def active(lanes: LaneProject, state: Path) -> str | None:
    return json.loads(lanes.cli("status", "--json", state=state, check=True).stdout)["data"]["active"]


@pytest.fixture(autouse=True)
def kernel_log(state: Path):
    state.parent.joinpath("kern.log").write_text("")


def test_a_faster_candidate_passes_and_promote_leaves_it_serving(lanes, state, tmp_path):
    lanes.cli("up", "demo-h1", "--no-gpu", state=state, check=True)
    code, report = gate(lanes, state, "t-fast", "--promote", "--out", str(tmp_path / "results"))
    assert code == 0 and report["verdict"] == "pass", report["reasons"]
    assert {c["verdict"] for c in report["cells"].values()} == {"pass"}
    assert all(1.15 < c["ratio"] < 1.35 for c in report["cells"].values()), report["cells"]
    assert report["fidelity"]["confident_flips"] == 0
    assert report["promoted"] == "t-fast" and active(lanes, state) == "t-fast"
    run_dir = Path(report["run_dir"])
    assert (run_dir / "ratios.png").stat().st_size > 1000
    again = lanes.cli("report", str(run_dir), state=state, check=True)
    assert "verdict: PASS" in again.stdout
    history = lanes.cli("history", "--json", state=state, check=True)
    gates = [r for r in json.loads(history.stdout)["data"]["records"] if r["kind"] == "gate"]
    assert gates and gates[-1]["verdict"] == "pass" and gates[-1]["promoted"] == "t-fast"


def test_an_equally_fast_candidate_is_inconclusive_and_the_control_stays(lanes, state, tmp_path):
    lanes.cli("up", "demo-h1", "--no-gpu", state=state, check=True)
    # Without the plot extra: the same verdict and exit code, the results written, no plot.
    no_plot = {"PYTHONPATH": without_matplotlib(tmp_path)["PYTHONPATH"]}
    code, report = gate(lanes, state, "t-same", "--promote", "--out", str(tmp_path / "results"), env=no_plot)
    assert code == 1 and report["verdict"] == "inconclusive", report
    assert report["promoted"] is None and active(lanes, state) == "demo-h1"
    run_dir = Path(report["run_dir"])
    assert json.loads((run_dir / "results.json").read_text())["gate"]["verdict"] == "inconclusive"
    assert not (run_dir / "ratios.png").exists()


def test_a_fatal_engine_line_in_the_candidate_arm_fails_the_gate_whatever_the_speed(lanes, state):
    lanes.cli("up", "demo-h1", "--no-gpu", state=state, check=True)
    code, report = gate(lanes, state, "t-fatal", "--promote")
    assert code == 1 and report["verdict"] == "fail"
    assert any("fatal engine line" in reason and "illegal memory access" in reason for reason in report["reasons"])
    assert active(lanes, state) == "demo-h1"


def test_altered_tokens_show_confident_flips_and_fail_fidelity(lanes, state):
    lanes.cli("up", "demo-h1", "--no-gpu", state=state, check=True)
    code, report = gate(lanes, state, "t-flip")
    assert report["fidelity"]["confident_flips"] > report["fidelity"]["confident_flips_bar"] == 0
    assert code == 1 and report["verdict"] == "fail"


def test_bench_measures_the_serving_lane(lanes, state, tmp_path):
    lanes.cli("up", "demo-h1", "--no-gpu", state=state, check=True)
    result = lanes.cli("bench", "--workload", "gate-test", "--concurrency", "1,4", "--json", "--out",
                       str(tmp_path / "bench"), state=state, check=True, timeout=300,
                       extra_env={"LANECTL_KERNEL_LOG": f"file:{state.parent / 'kern.log'}"})
    data = json.loads(result.stdout)["data"]
    cells = data["bench"]["cells"]
    assert set(cells) == {"prose@1", "prose@4", "code@1", "code@4"}
    assert 80 < cells["code@1"]["output_tok_per_s"] < 110, "stub decodes 100 tok/s per stream"
    assert cells["code@4"]["output_tok_per_s"] > 2.5 * cells["code@1"]["output_tok_per_s"]
    assert (Path(data["run_dir"]) / "results.json").is_file()
    # For people: the table of the measured cells, notes and where the results went on stderr.
    text = lanes.cli("bench", "--workload", "gate-test", "--concurrency", "1", "--out", str(tmp_path / "text"),
                     state=state, check=True, timeout=300,
                     extra_env={"LANECTL_KERNEL_LOG": f"file:{state.parent / 'kern.log'}"})
    [run_dir] = (tmp_path / "text").iterdir()
    measured = json.loads((run_dir / "results.json").read_text())["bench"]
    written = measured["cells"]
    assert text.stdout.splitlines() == [  # in the workload's order; results.json sorts its keys
        "cell                       tok/s  ms/step  TTFT p50  ITL p99 failed",
        *(f"{key:<22} {written[key]['output_tok_per_s']:>9.1f} {written[key]['ms_per_step']:>8.2f} "
          f"{written[key]['ttft_p50_ms']:>8.1f}m {written[key]['itl_p99_ms']:>7.1f}m {written[key]['failed']:>6}"
          for key in ("prose@1", "code@1")),
    ]
    assert text.stderr.splitlines()[-1 - len(measured["notes"]):] == [*measured["notes"], f"results in {run_dir}"]
    other = lanes.cli("bench", "t-fast", "--workload", "gate-test", state=state)
    assert other.returncode == 2 and "is not the serving lane" in other.stderr
