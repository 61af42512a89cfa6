"""`lanectl report DIR` on a folder someone else may have edited: every wrong shape of results.json is a
clear error (exit 2) with nothing written, and the plot never goes through a link. Through the real CLI."""

from __future__ import annotations

import copy
import json
import os
import subprocess
from pathlib import Path

import pytest

from lanectl.bench.stats import POINT_PRIOR_MODEL
from tests.cli_in_process import run_cli
from tests.test_plot_extra import REPORT
from tests.test_release_note import DATA, promoted_bracket


def lanectl_report(run_dir: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    """`lanectl report RUN_DIR` in this process (tests/cli_in_process.py: a traceback fails the test)."""
    return run_cli("report", str(run_dir), *extra, cwd=Path.cwd(), env={**os.environ, "COLUMNS": "200"}, timeout=120)


def report(run_dir: Path) -> subprocess.CompletedProcess[str]:
    return lanectl_report(run_dir)


def gate_with(change) -> bytes:
    gate = copy.deepcopy(REPORT)
    change(gate)
    return json.dumps({"gate": gate}).encode()


SHAPES: dict[str, bytes] = {
    "empty": b"",
    "not-json": b"{\"gate\": ",
    "not-utf8": b"\xff\xfe{}",
    "a-list": b"[]",
    "a-number": b"42",
    "gate-is-a-list": b'{"gate": []}',
    "gate-is-null": b'{"gate": null}',
    "gate-without-fields": b'{"gate": {}}',
    "cells-is-a-list": gate_with(lambda g: g.update(cells=[])),
    "cell-is-a-string": gate_with(lambda g: g["cells"].update({"x": "fast"})),
    "cell-without-ratio": gate_with(lambda g: g["cells"]["coding@1"].pop("ratio")),
    "arm-rate-is-text": gate_with(lambda g: g["cells"]["coding@1"]["arms"].update({"candidate": "fast"})),
    "unknown-verdict": gate_with(lambda g: g.update(verdict="maybe")),
    "bar-is-nan": json.dumps({"gate": {**REPORT, "bar": float("nan")}}).encode(),
    "ratio-is-infinite": gate_with(lambda g: g["cells"]["coding@1"].update(ratio=1e999)),
    "reasons-is-a-string": gate_with(lambda g: g.update(reasons="all good")),
    "fidelity-is-a-list": gate_with(lambda g: g.update(fidelity=[1])),
    "probes-wrong-shape": gate_with(lambda g: g.update(probes={"p": {"candidate": 3}})),
    "nested-past-the-recursion-limit": b"[" * 100_000,
    # Strict types: a number written as text is not a number, whatever it spells.
    "bar-is-text": gate_with(lambda g: g.update(bar="1.025")),
    "verdict-is-a-number": gate_with(lambda g: g.update(verdict=1)),
    "promoted-names-no-candidate": gate_with(lambda g: g.update(promoted="someone-else")),
    "concurrency-is-text": json.dumps({"gate": REPORT, "concurrency": "1, , 8"}).encode(),
    "concurrency-holds-text": json.dumps({"gate": REPORT, "concurrency": [1, "8"]}).encode(),
    "from-a-newer-lanectl": json.dumps({"version": 3, "gate": REPORT}).encode(),
    "format-2-without-rates": json.dumps({"version": 2, "gate": REPORT}).encode(),
}


@pytest.mark.parametrize("content", SHAPES.values(), ids=SHAPES.keys())
def test_a_malformed_results_json_is_a_clear_error_and_nothing_is_drawn(tmp_path: Path, content: bytes):
    (tmp_path / "results.json").write_bytes(content)

    result = report(tmp_path)

    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.startswith(f"lanectl: {tmp_path / 'results.json'} "), result.stderr
    assert not (tmp_path / "ratios.png").exists()


def test_a_fifo_as_results_json_is_refused_without_waiting(tmp_path: Path):
    os.mkfifo(tmp_path / "results.json")

    result = report(tmp_path)

    assert result.returncode == 2
    assert "is not a regular file" in result.stderr


def test_the_plot_replaces_a_planted_link_instead_of_writing_through_it(tmp_path: Path):
    pytest.importorskip("matplotlib")
    run = tmp_path / "run"
    run.mkdir()
    (run / "results.json").write_text(json.dumps({"gate": REPORT}))
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me\n")
    (run / "ratios.png").symlink_to(victim)

    result = report(run)

    assert result.returncode == 0, result.stderr
    assert victim.read_text() == "keep me\n"
    assert not (run / "ratios.png").is_symlink()
    assert (run / "ratios.png").read_bytes().startswith(b"\x89PNG")
    assert [p.name for p in run.iterdir() if p.name.endswith(".tmp")] == []


def test_a_plot_that_cannot_be_written_is_an_error_not_a_traceback(tmp_path: Path):
    pytest.importorskip("matplotlib")
    (tmp_path / "results.json").write_text(json.dumps({"gate": REPORT}))
    (tmp_path / "ratios.png").mkdir()

    result = report(tmp_path)

    assert result.returncode != 0
    assert f"could not write {tmp_path / 'ratios.png'}" in result.stderr


def bracket_with(change) -> bytes:
    results = promoted_bracket()
    change(results["gate"])
    return json.dumps(results).encode()


BRACKET_SHAPES: dict[str, bytes] = {
    "best-names-no-candidate": bracket_with(lambda g: g.update(best="demo-h3")),
    "promoted-names-no-candidate": bracket_with(lambda g: g.update(promoted="demo-h3")),
    "a-candidate-twice": bracket_with(lambda g: g["candidates"].append(g["candidates"][0])),
    "a-rate-below-zero": bracket_with(lambda g: g["candidates"][0]["arms"][1]["cells"]["prose@1"]["rates"]
                                      .__setitem__(0, -1.0)),
    "an-arm-without-its-rates": bracket_with(lambda g: g["candidates"][0]["arms"][1]["cells"]["prose@1"]
                                             .pop("rates")),
}


@pytest.mark.parametrize("content", BRACKET_SHAPES.values(), ids=BRACKET_SHAPES.keys())
def test_a_bracket_that_contradicts_itself_is_a_clear_error(tmp_path: Path, content: bytes):
    (tmp_path / "results.json").write_bytes(content)

    result = report(tmp_path)

    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.startswith(f"lanectl: {tmp_path / 'results.json'} is not a gate's results (gate"), \
        result.stderr


def report_json(run_dir: Path) -> tuple[subprocess.CompletedProcess[str], dict]:
    result = lanectl_report(run_dir, "--json")
    assert result.returncode == 0, result.stderr
    return result, json.loads(result.stdout)["data"]


def test_report_json_recomputes_every_verdict_from_the_rates_and_finds_the_record_agrees(tmp_path: Path):
    results = promoted_bracket()
    (tmp_path / "results.json").write_text(json.dumps(results))

    _, data = report_json(tmp_path)

    assert (data["recomputed"], data["results_version"], data["differences"]) == (True, 2, [])
    for recorded, again in zip(results["gate"]["candidates"], data["candidates"], strict=True):
        assert again["verdict"] == recorded["verdict"]
        assert {k: (c["ratio"], c["low"], c["high"], c["verdict"]) for k, c in again["cells"].items()} == \
            {k: (c["ratio"], c["low"], c["high"], c["verdict"]) for k, c in recorded["cells"].items()}
    assert (data["verdict"], data["best"]) == ("pass", "demo-h2")


# Real demo runs recorded in format 2 (`lanectl gate demo-h1 --calibrate --arms 8 --workload demo --no-gpu`, then
# `lanectl gate demo-h2 demo-h2-8 --control demo-h1 --workload demo --no-gpu --until-decided 3`, on this machine).
RECORDED = {"bracket": DATA / "20261203T102911Z-gate-demo-h2+demo-h2-8",
            "calibration": DATA / "20261203T102747Z-calibrate-demo-h1"}


@pytest.mark.parametrize("run", RECORDED.values(), ids=RECORDED.keys())
def test_report_json_recomputes_the_recorded_runs_exactly(run: Path):
    recorded = json.loads((run / "results.json").read_text())["gate"]

    _, data = report_json(run)

    assert (data["recomputed"], data["differences"]) == (True, [])
    assert (data["verdict"], data.get("best")) == (recorded["verdict"], recorded.get("best"))
    for was, again in zip(recorded.get("candidates", [recorded]), data.get("candidates", [data]), strict=True):
        assert again["verdict"] == was["verdict"]
        assert {k: (c["ratio"], c["low"], c["high"], c["verdict"]) for k, c in again["cells"].items()} == \
            {k: (c["ratio"], c["low"], c["high"], c["verdict"]) for k, c in was["cells"].items()}
    if recorded.get("calibration"):
        # Written before a calibration recorded its interval model (and each cell its coverage as a share): it is
        # recomputed under the model of its day, and every figure it recorded comes out the same.
        again, was = data["calibration"], recorded["calibration"]
        assert again["model"] == POINT_PRIOR_MODEL
        assert {k: v for k, v in again.items() if k in was and k != "cells"} == \
            {k: v for k, v in was.items() if k != "cells"}
        cells = again["cells"].items()
        assert {key: {k: v for k, v in cell.items() if k in was["cells"][key]} for key, cell in cells} == was["cells"]


def test_one_edited_sample_changes_the_recomputed_cell_and_the_report_says_where(tmp_path: Path):
    results = json.loads((RECORDED["bracket"] / "results.json").read_text())
    demo_h2 = results["gate"]["candidates"][0]
    candidate_arm = demo_h2["arms"][1]
    assert (demo_h2["candidate"], candidate_arm["arm"]) == ("demo-h2", "candidate:demo-h2")
    rates = candidate_arm["cells"]["code@1"]["rates"]
    rates[0] *= 0.5  # one of the arm's requests, at half its rate
    (tmp_path / "results.json").write_text(json.dumps(results))

    result, data = report_json(tmp_path)

    cell = data["candidates"][0]["cells"]["code@1"]
    recorded = demo_h2["cells"]["code@1"]
    assert cell["ratio"] < recorded["ratio"] and cell["verdict"] != "pass" == recorded["verdict"]
    assert f"demo-h2 code@1 ratio: recorded {recorded['ratio']!r}, recomputed {cell['ratio']!r}" in data["differences"]
    assert f"demo-h2 code@1 verdict: recorded pass, recomputed {cell['verdict']}" in data["differences"]
    # The other cells were not touched: they recompute as recorded.
    assert not [d for d in data["differences"] if d.startswith("demo-h2 prose@")]
    text = lanectl_report(tmp_path)
    assert f"recomputed from the per-request rates: {len(data['differences'])} figure(s) differ from the record:" \
        in text.stdout.splitlines()
    assert "the recorded figures differ from its per-request rates" in text.stderr


def test_a_format_1_run_is_shown_as_recorded_and_says_it_cannot_be_recomputed(tmp_path: Path):
    (tmp_path / "results.json").write_text(json.dumps({"gate": REPORT}))

    _, data = report_json(tmp_path)

    assert (data["recomputed"], data["results_version"], data["differences"]) == (False, 1, [])
    assert data["cells"] == REPORT["cells"]


FORMAT_1_CALIBRATION = {"max_false_promotion": 0.05, "false_promotion_rate": 0.0123, "cells": 3, "cells_passed": 0,
                        "detectable_ratio": 1.041, "detectable_gain": 0.012}


def test_a_format_1_calibration_is_shown_in_the_text_view(tmp_path: Path):
    (tmp_path / "results.json").write_text(json.dumps({"gate": {**REPORT, "calibration": FORMAT_1_CALIBRATION}}))
    result = report(tmp_path)
    assert result.returncode == 0, result.stderr
    assert ("calibration (ABA of one lane): false-promotion rate 0.0123 (allowed 0.05), 0 of 3 cells passed the "
            "bar; smallest detectable effect 1.041x to pass, +1.2% to tell from no change") in result.stdout


@pytest.mark.parametrize("missing", ["false_promotion_rate", "cells_passed", "detectable_ratio", "detectable_gain"])
def test_a_format_1_calibration_without_its_figures_is_refused_not_a_traceback(tmp_path: Path, missing: str):
    """`report`'s text view raised KeyError: 'false_promotion_rate' on such a block."""
    calibration = {key: value for key, value in FORMAT_1_CALIBRATION.items() if key != missing}
    (tmp_path / "results.json").write_text(json.dumps({"gate": {**REPORT, "calibration": calibration}}))
    result = report(tmp_path)
    assert (result.returncode, result.stdout) == (2, "")
    assert (f"gate.calibration: a format-1 calibration (cells: 3) holds its figures, and this one has no {missing}"
            in result.stderr)
    assert not (tmp_path / "ratios.png").exists()
