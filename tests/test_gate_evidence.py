"""A results.json edited as a hostile user would: its note must not say "Passed", and it must say where the file
fails to hold together.

The run is the demo bracket of tests/data/release-note (format 2, judged with the host's calibration: 8 arms of
demo-h1, kept by the calibration run beside it). Each forgery is written back as a forger would: the gate section
recomputed from the edited file (`recompute_gate`, as lanectl did before it checked the evidence), so the recorded
figures and the recomputed ones agree, and only the checks of the evidence itself can tell.
"""

from __future__ import annotations

import copy
import json
import os
import platform
from typing import Any

import pytest

from lanectl.bench.calibration_file import CalibrationStore, CellNoise, WorkloadNoise
from lanectl.bench.stats import ArmNoise
from lanectl.bench.verdict import KeptCalibration, candidates_of, recompute_gate
from lanectl.commands.release_note import written_note
from tests.cli_in_process import run_cli
from tests.conftest import REPO

DATA = REPO / "tests" / "data" / "release-note"
RUN = DATA / "20261203T102911Z-gate-demo-h2+demo-h2-8"
CALIBRATION_RUN = DATA / "20261203T102747Z-calibrate-demo-h1"
XID = "NVRM: Xid (PCI:0000:01:00): 79, pid=1234, name=python3, GPU has fallen off the bus."


@pytest.fixture
def results() -> dict[str, Any]:
    return json.loads((RUN / "results.json").read_text())


def kept_here() -> KeptCalibration:
    """This host's calibration of the workload, as `gate --calibrate` kept it after the calibration run."""
    gate = json.loads((CALIBRATION_RUN / "results.json").read_text())["gate"]
    cells = {key: ArmNoise(variance=cell["variance"], df=cell["df"])
             for key, cell in gate["calibration"]["cells"].items()}
    return KeptCalibration(node="vm", recorded="2026-12-03T10:27:47.437Z", cells=cells)


def written_back(results: dict[str, Any]) -> dict[str, Any]:
    """The forger's last step: the gate section recomputed from the edited evidence, so the figures agree with it."""
    return {**results, "gate": recompute_gate(results["gate"])}


def note(results: dict[str, Any], kept: KeptCalibration | None) -> tuple[str, list[str]]:
    markdown, rechecked = written_note(None, results, RUN.name, None, kept=kept)
    return markdown, rechecked.differences


def test_the_unforged_run_passes_and_is_reproduced_with_this_hosts_calibration(results):
    markdown, differences = note(results, kept_here())
    assert markdown.startswith("# Passed, not promoted: demo-h2")
    assert differences == []
    assert "was checked against this host's calibration" in markdown


def forge_priors(results: dict[str, Any]) -> dict[str, Any]:
    forged = copy.deepcopy(results)
    for candidate in candidates_of(forged["gate"]):
        for cell in candidate["cells"].values():
            cell["interval"]["prior"] = {"variance": 1e-10, "df": 1000}
    return written_back(forged)


@pytest.mark.parametrize("kept", [kept_here(), None], ids=["calibrated-host", "no-calibration-here"])
def test_a_forged_prior_is_listed_and_the_note_does_not_say_passed(results, kept):
    forged = forge_priors(results)
    assert forged["gate"]["verdict"] == "pass"  # what the forger wrote back
    markdown, differences = note(forged, kept)
    assert not markdown.startswith("# Passed") and "Passed" not in markdown.splitlines()[0]
    assert markdown.startswith("# Not reproduced:")
    assert ("demo-h2 code@1 prior: 1000 degrees of freedom, more than the 8 arms of its calibration allow (4)"
            in differences)
    assert "The verdict is not reproduced" in markdown
    assert "1001 degrees" not in markdown and "1004 degrees" not in markdown


def test_a_prior_whose_variance_is_not_this_hosts_calibration_is_listed(results):
    forged = copy.deepcopy(results)
    for candidate in candidates_of(forged["gate"]):
        for cell in candidate["cells"].values():
            cell["interval"]["prior"]["variance"] = 1e-10  # the df still within what 8 arms allow
    forged = written_back(forged)
    markdown, differences = note(forged, kept_here())
    assert markdown.startswith("# Not reproduced:")
    assert any(line.startswith("demo-h2 prose@1 prior: variance 1e-10 on 4 df where this host's calibration of "
                               "2026-12-03T10:27:47.437Z has 5.5457") for line in differences), differences
    # Without a calibration here to hold it to, the note says it could not check the priors.
    markdown, differences = note(forged, None)
    assert "could not be checked against a calibration of this host" in markdown


def test_an_xid_line_in_only_one_copy_of_an_arm_is_listed_and_refused_pass(results):
    forged = copy.deepcopy(results)
    arm = next(a for a in forged["gate"]["arms"] if a["arm"] == "candidate:demo-h2")
    arm["xid_lines"] = [XID]
    forged = written_back(forged)
    markdown, differences = note(forged, kept_here())
    assert not markdown.startswith("# Passed")
    assert markdown.startswith("# Not reproduced:")
    assert ("demo-h2's copy of arm candidate:demo-h2 differs from gate.arms in xid_lines" in differences), differences
    assert "The verdict is not reproduced" in markdown


def test_an_arm_left_out_of_a_candidates_copy_is_listed(results):
    forged = copy.deepcopy(results)
    demo_h2 = forged["gate"]["candidates"][0]
    demo_h2["arms"] = [a for a in demo_h2["arms"] if a["arm"] != "control-2"]
    markdown, differences = note(written_back(forged), kept_here())
    assert "demo-h2's copy of the arms lacks control-2, which gate.arms holds" in differences, differences
    assert markdown.startswith("# Not reproduced:")


def test_report_holds_the_runs_priors_to_the_calibration_this_host_keeps(results, tmp_path, monkeypatch):
    """`lanectl report RUN` and `--release-note`, end to end: the kept calibration read from the state folder."""
    state = tmp_path / "state"
    state.mkdir()
    monkeypatch.setenv("LANECTL_STATE_DIR", str(state))
    kept = kept_here()
    CalibrationStore(state / "calibration.json").save("demo", WorkloadNoise(
        lane="demo-h1", node=platform.node(), recorded=kept.recorded, arms=8, cells_digest="d",
        cells={key: CellNoise(variance=noise.variance, df=noise.df) for key, noise in kept.cells.items()}))
    forged = copy.deepcopy(results)
    for candidate in candidates_of(forged["gate"]):
        candidate["noise_prior"]["node"] = platform.node()  # a run of this host
        candidate["cells"]["code@8"]["interval"]["prior"]["variance"] /= 100
    run = tmp_path / RUN.name
    run.mkdir()
    (run / "results.json").write_text(json.dumps(written_back(forged)))

    shown = run_cli("report", str(run), "--json", cwd=tmp_path, env=dict(os.environ), timeout=120)
    data = json.loads(shown.stdout)["data"]
    variances = [c["cells"]["code@8"]["interval"]["prior"]["variance"] for c in forged["gate"]["candidates"]]
    assert [line.split(" where ")[0] for line in data["not_reproduced"]] == [
        f"{name} code@8 prior: variance {variance!r} on 4 df" for name, variance in zip(
            ("demo-h2", "demo-h2-8"), variances, strict=True)]
    assert data["verdict"] != "pass" and data["best"] is None
    text = run_cli("report", str(run), cwd=tmp_path, env=dict(os.environ), timeout=120)
    assert "the verdict is not reproduced" in text.stderr
    note_text = run_cli("report", str(run), "--release-note", cwd=tmp_path, env=dict(os.environ), timeout=120)
    assert note_text.stdout.startswith("# Not reproduced:"), note_text.stdout[:300]


def test_a_prior_whose_calibration_claims_more_arms_than_a_calibration_runs_is_listed(results):
    """Raising noise_prior.arms with the df, on a host that keeps no calibration to hold the variance to."""
    forged = copy.deepcopy(results)
    for candidate in candidates_of(forged["gate"]):
        candidate["noise_prior"]["arms"] = 2000
        for cell in candidate["cells"].values():
            cell["interval"]["prior"] = {"variance": 1e-10, "df": 1000}
    markdown, differences = note(written_back(forged), None)
    assert "demo-h2 code@1 prior: its calibration claims 2000 arms, where `gate --calibrate` runs 100 at most" \
        in differences
    assert markdown.startswith("# Not reproduced:")
