"""bench and gate on stub-engine lanes on the real engine: the A/B/A bracket end to end."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import docker
import httpx
import pytest

from lanectl.bench.probes import load_probe, run_probe
from tests.conftest import REPO
from tests.lane_fixtures import LaneProject, make_lane_project, remove_containers, remove_everything
from tests.test_plot_extra import without_matplotlib

pytestmark = pytest.mark.docker

CANDIDATES = """
  t-fast:
    description: decodes 50% faster than demo-h1 (a margin that a busy machine's noise cannot close)
    engine:
      env: {STUB_DECODE_TOKENS_PER_S: "150"}
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
LANES = ["demo-h1", "t-fast", "t-same", "t-fatal", "t-flip", "t-late", "t-leak", "t-crash"]
# The demo's probes, and the output fault of the stub that fails each.
DEMO_PROBES = ["gauntlet", "thinking", "soak-demo", "needle-4k"]
FAULT_FAILS = {"broken_tool_json": "gauntlet", "leak_reasoning": "thinking", "loop": "soak-demo",
               "miss_needle": "needle-4k"}


@pytest.fixture(scope="module")
def lanes(tmp_path_factory: pytest.TempPathFactory):
    project = make_lane_project(tmp_path_factory.mktemp("gate"))
    recipe = project.root / "recipes" / "lanes.yaml"
    recipe.write_text(recipe.read_text().rstrip() + "\n" + CANDIDATES)
    workloads = project.root / "recipes" / "workloads"
    workloads.mkdir()
    (workloads / "gate-test.yaml").write_text((Path(__file__).parent / "data" / "gate-workload.yaml").read_text())
    shutil.copytree(REPO / "recipes" / "workloads" / "probes", workloads / "probes")
    (workloads / "gate-probes.yaml").write_text(
        (workloads / "gate-test.yaml").read_text().replace("name: gate-test", "name: gate-probes")
        + "probes: [thinking, needle-4k]\n")
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
    figures = {k: (c["verdict"], c["ratio"], c["low"], c["high"], c["arms"]) for k, c in report["cells"].items()}
    # The stub decodes 1.5x faster, but how close a measured ratio comes to 1.25, and how wide its interval
    # is, depend on how busy this shared machine was (CI failed on a loaded box with a cell outside
    # 1.15-1.35, and with one cell's interval reaching below the bar). So the test checks what PASS means
    # rather than the figures: no cell fell below the bar, and at least one cell's whole 95% interval lies
    # at or above it (a bar > 1). A candidate no faster than its control cannot do that (t-same below is
    # inconclusive, and a slower one fails).
    passed = {k: c for k, c in report["cells"].items() if c["verdict"] == "pass"}
    assert passed and "fail" not in {c["verdict"] for c in report["cells"].values()}, figures
    assert report["bar"] > 1.0
    assert all(report["bar"] <= c["low"] <= c["ratio"] <= c["high"] for c in passed.values()), figures
    assert all(c["low"] < report["bar"] for c in report["cells"].values() if c["verdict"] != "pass"), figures
    fid = report["fidelity"]
    assert (fid["method"], fid["confident_flips"], fid["confident_flips_bar"]) == ("teacher-forced", 0, 0)
    assert fid["positions"] == 4 * 32 and fid["unscored"] == 0  # every position of every prompt scored
    assert report["promoted"] == "t-fast" and active(lanes, state) == "t-fast"
    run_dir = Path(report["run_dir"])
    assert (run_dir / "ratios.png").stat().st_size > 1000
    again = lanes.cli("report", str(run_dir), state=state, check=True)
    assert "verdict: PASS" in again.stdout
    # The text shows the per-cell intervals and the teacher-forced fidelity, per class.
    shown = again.stdout.splitlines()
    for key, cell in report["cells"].items():
        assert any(row.startswith(f"{key} ") and f"{cell['low']:.3f}-{cell['high']:.3f}" in row
                   and row.endswith(cell["verdict"]) for row in shown), shown
    assert ("fidelity (teacher-forced on control-1's outputs, every position): pass: 0 confident flips (bar 0), "
            "weighted divergence 0.000 (bar 0.000) over 128 positions of 4 prompts") in shown
    assert "  code: 0 confident flips (bar 0), weighted 0.000 (bar 0.000)" in shown
    history = lanes.cli("history", "--json", state=state, check=True)
    gates = [r for r in json.loads(history.stdout)["data"]["records"] if r["kind"] == "gate"]
    assert gates and gates[-1]["verdict"] == "pass" and gates[-1]["promoted"] == "t-fast"


def test_two_candidates_share_one_bracket_and_promote_picks_the_one_that_passed(lanes, state, tmp_path):
    lanes.cli("up", "demo-h1", "--no-gpu", state=state, check=True)
    result = lanes.cli("gate", "t-flip", "t-fast", "--control", "demo-h1", "--workload", "gate-test",
                       "--concurrency", "1", "--no-gpu", "--json", "--promote", "--out", str(tmp_path / "results"),
                       state=state, timeout=600, extra_env={"LANECTL_KERNEL_LOG": f"file:{state.parent / 'kern.log'}"})
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)["data"]
    assert [a["arm"] for a in report["arms"]] == ["control-1", "candidate:t-flip", "candidate:t-fast", "control-2"]
    verdicts = {c["candidate"]: c["verdict"] for c in report["candidates"]}
    # Both decode faster (t-fast 1.5x, t-flip 1.25x); t-flip drifts from the controls' outputs, so only t-fast
    # may be promoted.
    assert verdicts == {"t-flip": "fail", "t-fast": "pass"}, [c["reasons"] for c in report["candidates"]]
    assert (report["best"], report["promoted"], report["order"]) == ("t-fast", "t-fast", "ABCA")
    assert active(lanes, state) == "t-fast"
    run_dir = Path(report["run_dir"])
    assert run_dir.name.endswith("gate-t-flip+t-fast") and (run_dir / "ratios.png").stat().st_size > 1000
    shown = lanes.cli("report", str(run_dir), state=state, check=True).stdout.splitlines()
    assert "bracket: PASS (order ABCA, 2 candidates; best that passed: t-fast); promoted t-fast" in shown


def test_a_candidate_that_cannot_come_up_fails_alone_and_the_others_are_still_judged(lanes, state):
    lanes.cli("up", "demo-h1", "--no-gpu", state=state, check=True)
    result = lanes.cli("gate", "t-crash", "t-fast", "--control", "demo-h1", "--workload", "gate-test",
                       "--concurrency", "1", "--no-gpu", "--json", "--promote", state=state, timeout=600,
                       extra_env={"LANECTL_KERNEL_LOG": f"file:{state.parent / 'kern.log'}"})
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)["data"]
    assert [a["arm"] for a in report["arms"]] == ["control-1", "candidate:t-fast", "control-2"]
    crash, fast = report["candidates"]
    assert (crash["candidate"], crash["verdict"], fast["candidate"], fast["verdict"]) == (
        "t-crash", "fail", "t-fast", "pass"), fast["reasons"]
    assert crash["reasons"][0].startswith("candidate:t-crash: could not bring t-crash up: t-crash failed its health "
                                          "gate"), crash["reasons"]
    assert report["promoted"] == "t-fast" and active(lanes, state) == "t-fast"


def test_a_lane_not_built_is_refused_before_the_bracket_switches_anything(lanes, state):
    lanes.cli("up", "demo-h1", "--no-gpu", state=state, check=True)
    result = lanes.cli("gate", "t-fast", "t-hang", "--control", "demo-h1", "--workload", "gate-test",
                       "--concurrency", "1", "--no-gpu", state=state, timeout=120)
    assert result.returncode == 1
    assert "t-hang: image " in result.stderr and "is not built; run `lanectl build t-hang` first" in result.stderr
    assert active(lanes, state) == "demo-h1"
    history = json.loads(lanes.cli("history", "--json", state=state, check=True).stdout)["data"]["records"]
    assert not [r for r in history if r["kind"] == "intent" and r.get("to") == "t-fast"]


def test_an_equally_fast_candidate_is_inconclusive_and_the_control_stays(lanes, state, tmp_path):
    lanes.cli("up", "demo-h1", "--no-gpu", state=state, check=True)
    # Without the plot extra: the same verdict and exit code, the results written, no plot.
    no_plot = {"PYTHONPATH": without_matplotlib(tmp_path)["PYTHONPATH"]}
    code, report = gate(lanes, state, "t-same", "--promote", "--out", str(tmp_path / "results"), env=no_plot)
    # Inconclusive on a quiet machine; a busy one's noise can push a cell below the bar, which fails it
    # (the calibration test above saw such noise). Either way it is not promoted.
    assert code == 1 and report["verdict"] in ("inconclusive", "fail"), report
    assert report["promoted"] is None and active(lanes, state) == "demo-h1"
    run_dir = Path(report["run_dir"])
    assert json.loads((run_dir / "results.json").read_text())["gate"]["verdict"] == report["verdict"]
    assert not (run_dir / "ratios.png").exists()


def test_a_fatal_engine_line_in_the_candidate_arm_fails_the_gate_whatever_the_speed(lanes, state):
    lanes.cli("up", "demo-h1", "--no-gpu", state=state, check=True)
    code, report = gate(lanes, state, "t-fatal", "--promote", "--concurrency", "1")  # cells do not matter
    assert code == 1 and report["verdict"] == "fail"
    assert any("fatal engine line" in reason and "illegal memory access" in reason for reason in report["reasons"])
    assert active(lanes, state) == "demo-h1"


def test_altered_tokens_show_confident_flips_and_fail_fidelity(lanes, state):
    lanes.cli("up", "demo-h1", "--no-gpu", state=state, check=True)
    code, report = gate(lanes, state, "t-flip", "--concurrency", "1")
    assert report["fidelity"]["confident_flips"] > report["fidelity"]["confident_flips_bar"] == 0
    assert code == 1 and report["verdict"] == "fail"


def first_divergence_passes(control: dict[str, list[str]], candidate: dict[str, list[str]]) -> bool:
    """The rule the gate used before teacher forcing, on the arms' greedy tokens: compare each prompt's outputs
    up to its first difference; with identical controls (a bar of 0 flips) it passes only with none."""
    return all(next((i for i, (a, b) in enumerate(zip(tokens, candidate[key], strict=True)) if a != b), None) is None
               for key, tokens in control.items())


def test_a_late_prefill_fault_fails_teacher_forcing_where_first_divergence_passed_it(lanes, state):
    lanes.cli("up", "demo-h1", "--no-gpu", state=state, check=True)
    code, report = gate(lanes, state, "t-late", "--order", "ABBA", "--concurrency", "1")
    assert [a["arm"] for a in report["arms"]] == ["control-1", "candidate-1", "candidate-2", "control-2"]
    greedy = {a["arm"]: a["greedy"] for a in report["arms"]}
    assert first_divergence_passes(greedy["control-1"], greedy["candidate-1"])  # the old rule: no flip at all
    fid = report["fidelity"]
    assert fid["confident_flips_bar"] == 0 and fid["confident_flips"] > 4 * 4  # several per prompt, not one
    assert code == 1 and report["verdict"] == "fail"
    assert any(r.startswith(f"fidelity: {fid['confident_flips']} confident flips (bar 0)") for r in report["reasons"])
    assert all(c["verdict"] == "pass" for c in report["cells"].values())  # fast, yet not promotable


def test_calibrate_runs_the_control_against_itself(lanes, state):
    lanes.cli("up", "demo-h1", "--no-gpu", state=state, check=True)
    result = lanes.cli("gate", "demo-h1", "--calibrate", "--workload", "gate-test", "--concurrency", "1",
                       "--no-gpu", state=state, timeout=600,
                       extra_env={"LANECTL_KERNEL_LOG": f"file:{state.parent / 'kern.log'}"})
    assert result.returncode in (0, 1), result.stdout + result.stderr
    [line] = [row for row in result.stdout.splitlines() if row.startswith("calibration (ABA of one lane)")]
    found = re.search(r"false-promotion rate (\d\.\d{4}) \(allowed 0.05\), (\d) of 2 cells passed the bar", line)
    assert found, line
    rate, cells_passed = float(found[1]), int(found[2])
    # Whether this machine is quiet enough to gate on is what calibration measures, so the test cannot
    # require that it is: a loaded CI machine measured 0.0503 and exited 1, as it should. The command is
    # held to its own figures here; its verdict on chosen figures is tested pure in test_gate_bracket.py.
    other_reasons = [row for row in result.stdout.splitlines()
                     if row.startswith("  - ") and not row.startswith("  - false-promotion rate")]
    if result.returncode == 0:
        assert rate <= 0.05 and cells_passed == 0 and not other_reasons, result.stdout
        assert "verdict: PASS" in result.stdout
    else:
        assert rate > 0.05 or cells_passed > 0 or other_reasons, result.stdout
        assert "verdict: FAIL" in result.stdout
    assert active(lanes, state) == "demo-h1"


def test_a_context_beyond_max_model_len_is_refused_before_any_arm(lanes, state, tmp_path):
    workload = tmp_path / "long.yaml"
    workload.write_text((Path(__file__).parent / "data" / "gate-workload.yaml").read_text()
                        + "context_lengths: [0, 4096]\n")
    result = lanes.cli("gate", "t-short", "--control", "demo-h1", "--workload", str(workload), "--no-gpu",
                       state=state)
    assert result.returncode == 2
    assert f"{workload}:14:22: context_lengths[1]: 4096 tokens + max_tokens 32 exceed t-short's --max-model-len 2048" \
        in result.stderr
    assert not (state / "journal.jsonl").exists() and active(lanes, state) is None


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


def host_url(lanes: LaneProject, lane: str) -> str:
    ports = docker.from_env().containers.get(lanes.container(lane)).ports["8000/tcp"]
    return f"http://127.0.0.1:{ports[0]['HostPort']}"


def test_every_probe_passes_on_the_healthy_stub_lane_and_fails_on_its_fault(lanes, state):
    """The demo probes straight against one running lane; each fault switched on through the stub's admin route."""
    lanes.cli("up", "demo-h1", "--no-gpu", state=state, check=True)
    url = host_url(lanes, "demo-h1")
    probes = {name: load_probe(REPO / "recipes" / "workloads" / "probes" / f"{name}.yaml").probe
              for name in DEMO_PROBES}

    assert [name for name, probe in probes.items() if not run_probe(url, "demo-model", probe).passed] == []
    # Only the faulted probe is run again here (CI time); that a fault fails no other probe is shown on the
    # stub process (tests/stub_engine/test_stub_probes.py).
    for fault, name in FAULT_FAILS.items():
        httpx.post(f"{url}/admin/fault", json={"fault": fault}).raise_for_status()
        report = run_probe(url, "demo-model", probes[name])
        assert not report.passed, (fault, report.summary())
        httpx.post(f"{url}/admin/fault", json={"fault": "clear"}).raise_for_status()


def test_a_candidate_failing_one_probe_fails_the_gate_naming_it(lanes, state, tmp_path):
    lanes.cli("up", "demo-h1", "--no-gpu", state=state, check=True)
    code, report = gate(lanes, state, "t-leak", "--workload", "gate-probes", "--concurrency", "1",
                        "--out", str(tmp_path / "results"))
    assert code == 1 and report["verdict"] == "fail"
    probe_reasons = [r for r in report["reasons"] if "probe" in r]
    assert probe_reasons == ["candidate (t-leak) failed probe thinking: 0/16 passed; prompt-1: reasoning leaked "
                             "into the answer (<think>, </think> in content)"], report["reasons"]
    thinking, needle = report["probes"]["thinking"], report["probes"]["needle-4k"]
    assert {arm: p["ok"] for arm, p in thinking.items()} == {"control-1": True, "candidate": False,
                                                             "control-2": True}
    assert all(p["ok"] and 0 < p["seconds"]["needle"] < 30 for p in needle.values()), needle
    text = lanes.cli("report", report["run_dir"], state=state, check=True).stdout
    assert "probe thinking         control-1 16/16  candidate 0/16 FAIL  control-2 16/16" in text, text
    assert "probe needle-4k        control-1 1/1 in " in text


def test_a_needle_beyond_the_lanes_context_is_refused_before_any_arm(lanes, state):
    result = lanes.cli("gate", "t-short", "--control", "demo-h1", "--workload", "gate-probes", "--no-gpu",
                       state=state)
    assert result.returncode == 2
    assert result.stderr.strip().endswith(
        "recipes/workloads/probes/needle-4k.yaml:10:18: haystack_tokens: the needle prompt (4020 tokens at 4 "
        "characters a token) plus 64 output tokens exceeds lane t-short's --max-model-len 2048"), result.stderr
    assert docker.from_env().containers.list(all=True, filters={"label": f"io.lanectl.recipe={lanes.recipe_id}"}) == []
