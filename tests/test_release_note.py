"""`lanectl report RUN --release-note` and `--html`: the release note written from a gate run's results.json.

The golden test renders a fixed results.json (a real demo bracket: `lanectl gate demo-h2 demo-h2-8 --control
demo-h1 --workload demo --no-gpu`) with the repo's recipes to an exact Markdown file. Regenerate it after an
intended change with `UPDATE_GOLDEN=1 pytest tests/test_release_note.py`, then read the diff before committing.
The HTML is loaded in a real headless Chromium (Debian's, installed by scripts/setup-host.sh) and screenshotted.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from lanectl.bench.gate import LaneBench
from lanectl.bench.release_note_html import note_html
from lanectl.commands.release_note import written_note
from lanectl.project import Project
from lanectl.recipe.catalog import load_catalog
from tests.conftest import REPO
from tests.test_cli import lanectl
from tests.test_probes import timed_cell

DATA = REPO / "tests" / "data" / "release-note"
RUN = DATA / "20261201T161346Z-gate-demo-h2+demo-h2-8"  # under load: neither candidate passed
PICKED_RUN = DATA / "20261201T200652Z-gate-demo-h2+demo-h2-8"  # on an idle machine: demo-h2 passed
GOLDEN = REPO / "tests" / "golden" / "release-note-demo.md"
# Format 2, with the per-request rates: `lanectl gate demo-h2 demo-h2-8 --control demo-h1 --workload demo
# --no-gpu --until-decided 3`, after `lanectl gate demo-h1 --calibrate --arms 8 --workload demo --no-gpu`.
RECOMPUTED_RUN = DATA / "20261203T102911Z-gate-demo-h2+demo-h2-8"


@pytest.fixture(scope="module")
def results() -> dict:
    return json.loads((RUN / "results.json").read_text())


@pytest.fixture(scope="module")
def shipped():
    return load_catalog(Project.locate(REPO / "recipes"))


def note(results: dict, catalog, earlier: list | None = None, run: Path = RUN) -> str:
    return written_note(catalog, results, run.name, earlier)[0]


def matches_golden(rendered: str, golden: Path) -> None:
    if os.environ.get("UPDATE_GOLDEN"):
        golden.write_text(rendered)
    assert rendered == golden.read_text()


def test_the_demo_brackets_note_matches_golden(results, shipped):
    """A real run on the shared 2-core machine: neither candidate passed, so nothing shipped."""
    matches_golden(note(results, shipped), GOLDEN)


def test_the_demo_bracket_on_an_idle_machine_picks_demo_h2_and_its_note_matches_golden(shipped):
    """A real run on the same machine while nothing else ran: demo-h2 passed at 1 user, demo-h2-8 failed
    at 8 and 32 users; not promoted (no --promote)."""
    results = json.loads((PICKED_RUN / "results.json").read_text())
    assert results["gate"]["best"] == "demo-h2"
    assert {c["candidate"]: c["verdict"] for c in results["gate"]["candidates"]} == {"demo-h2": "pass",
                                                                                      "demo-h2-8": "fail"}
    matches_golden(note(results, shipped, run=PICKED_RUN), GOLDEN.with_name("release-note-demo-picked.md"))


def test_a_format_2_brackets_note_is_written_from_its_recomputed_figures_and_matches_golden(shipped):
    """The same demo bracket recorded with its rates, on a host calibrated first: demo-h2 passed at 1 user in one
    bracket (the calibration's 7 df pooled with the bracket's own), demo-h2-8 failed at 8 and 32 users."""
    results = json.loads((RECOMPUTED_RUN / "results.json").read_text())
    rendered = note(results, shipped, run=RECOMPUTED_RUN)
    assert ("Every figure and verdict below was recomputed from the per-request rates in results.json, and "
            "matches what the gate recorded.") in rendered
    matches_golden(rendered, GOLDEN.with_name("release-note-demo-recomputed.md"))


def promoted_bracket() -> dict:
    """An in-memory bracket of the demo lanes where demo-h2 passed and was promoted and demo-h2-8 failed."""
    from lanectl.bench.gate import judge_bracket
    from tests.test_gate_bracket import PRIORS, measured

    def arm(name: str, lane: str, at_1: float, at_8: float) -> LaneBench:
        made = measured(name, lane, at_1)
        made.cells["prose@8"] = timed_cell(at_8)
        made.cell_axes["prose@8"] = ("prose", 8, 0)
        made.image = f"lanectl/demo-stub:{lane}-000000000000"
        made.started = "2026-12-01T12:00:00+00:00"
        made.probes = {"gauntlet": {"kind": "gauntlet", "passed": 12, "total": 12, "ok": True, "failures": [],
                                    "seconds": {}}}
        return made

    report = judge_bracket([arm("control-1", "demo-h1", 100, 700), arm("candidate:demo-h2", "demo-h2", 104, 700),
                            arm("candidate:demo-h2-8", "demo-h2-8", 102.5, 660),
                            arm("control-2", "demo-h1", 100, 700)], 1.025, priors=PRIORS)
    report.promoted = "demo-h2"
    for candidate in report.candidates:  # as run_gate records where PRIORS came from: 12 arms give their 7 df
        candidate.noise_prior = {"lane": "demo-h1", "node": "vm", "recorded": "2026-12-01T11:00:00.000Z", "arms": 12}
    return json.loads(json.dumps({"version": 2, "gate": report.as_dict(), "workload": "demo", "concurrency": [1, 8]}))


def test_a_promoted_brackets_note_matches_golden(shipped):
    matches_golden(note(promoted_bracket(), shipped), GOLDEN.with_name("release-note-promoted.md"))


def test_every_headline_figure_is_one_of_results_json(shipped):
    """The title's tok/s is the mean of the winner's single-stream cells over its arms, as the note says."""
    results = promoted_bracket()
    winner = next(c for c in results["gate"]["candidates"] if c["candidate"] == "demo-h2")
    arms = [a for a in winner["arms"] if a["arm"].startswith("candidate")]
    keys = [k for k, c in winner["cells"].items() if c["concurrency"] == 1 and not c["context"]]
    def mean(name: str) -> float:
        return sum(sum(a["cells"][k][name] for a in arms) / len(arms) for k in keys) / len(keys)

    title = note(results, shipped).splitlines()[0]
    assert title == (f"# Shipped: demo-h2, {mean('output_tok_per_s'):,.1f} tok/s at {mean('ms_per_step'):,.2f} ms "
                     "per step (1.040× demo-h1)")


def test_a_note_says_what_it_has_no_evidence_for(shipped):
    results = promoted_bracket()
    results["gate"]["arms"][1]["xid_lines"] = ["NVRM: Xid (PCI:0000:01:00): 31, pid=1, name=python3"]
    without_recipes = note(results, None)
    assert "The recipes no longer define demo-h2 (or demo-h1): its changes cannot be shown." in without_recipes
    assert "The journal was not read: nothing is said about earlier runs of these lanes." in without_recipes
    assert "Zero Xid lines" not in without_recipes
    assert "| candidate:demo-h2 | demo-h2 | 1 | 0 | 0 |" in without_recipes
    assert ("The recipes no longer define demo-h1: what the rollback does cannot be said from them."
            in without_recipes)


def test_first_clean_arms_are_claimed_only_when_the_journal_shows_every_earlier_gate_faulted(shipped):
    results = promoted_bracket()
    faulted = {"kind": "gate", "candidate": "demo-h2", "reasons": ["candidate (demo-h2) logged 1 Xid line(s): x"]}
    passed = {"kind": "gate", "candidate": "demo-h2", "reasons": ["no cell failed"]}
    claim = "demo-h2's arms are the first clean ones in the journal: each of its 2 earlier gate(s) logged an Xid"
    assert claim in note(results, shipped, [faulted, faulted])
    assert "first clean" not in note(results, shipped, [faulted, passed])
    assert "first clean" not in note(results, shipped, [])


def test_report_writes_the_note_whole_to_out_and_never_through_a_symlink(tmp_path):
    run = tmp_path / RUN.name
    shutil.copytree(RUN, run)
    printed = lanectl("--recipes", str(REPO / "recipes"), "report", str(run), "--release-note", cwd=tmp_path)
    assert (printed.returncode, printed.stderr) == (0, "")
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me\n")
    (tmp_path / "note.md").symlink_to(victim)
    written = lanectl("--recipes", str(REPO / "recipes"), "report", str(run), "--release-note", "--out",
                      str(tmp_path / "note.md"), cwd=tmp_path)
    assert (written.returncode, written.stdout) == (0, "")
    assert (tmp_path / "note.md").read_text() == printed.stdout and not (tmp_path / "note.md").is_symlink()
    assert victim.read_text() == "keep me\n"


def test_report_of_a_folder_without_results_exits_2(tmp_path):
    result = lanectl("report", str(tmp_path), "--release-note", cwd=tmp_path)
    assert result.returncode == 2 and "no results.json" in result.stderr


def test_a_results_json_that_is_no_gate_run_exits_2_and_writes_nothing(tmp_path, results):
    broken = copy.deepcopy(results)
    del broken["gate"]["control"]
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "results.json").write_text(json.dumps(broken))
    result = lanectl("--recipes", str(REPO / "recipes"), "report", str(tmp_path / "run"), "--release-note",
                     "--out", str(tmp_path / "note.md"), cwd=tmp_path)
    assert (result.returncode, result.stdout) == (2, "")
    # The one reader of results.json names the field that is wrong, for the report and the note alike.
    assert result.stderr.startswith(f"lanectl: {tmp_path / 'run' / 'results.json'} is not a gate's results "
                                    "(gate.control: Field required)")
    assert not (tmp_path / "note.md").exists()


def test_the_html_escapes_text_and_carries_the_plot_inline():
    page = note_html("# A <b>title</b>\n\n## Measured, this window\n\n| a | b |\n|---|---|\n| `x<y` | 1 \\| 2 |\n",
                     b"\x89PNG fake")
    assert "<h1>A &lt;b&gt;title&lt;/b&gt;</h1>" in page
    assert "<td><code>x&lt;y</code></td><td>1 | 2</td>" in page
    assert 'src="data:image/png;base64,iVBORyBmYWtl"' in page


def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    assert found, "no chromium: scripts/setup-host.sh installs Debian's (apt-get install chromium)"
    return found


def test_the_html_note_renders_in_a_headless_browser_with_its_plot(tmp_path):
    import matplotlib.image

    run = tmp_path / RUN.name
    shutil.copytree(RUN, run)
    page = tmp_path / "note.html"
    result = lanectl("--recipes", str(REPO / "recipes"), "report", str(run), "--html", str(page), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    shot = tmp_path / "shot.png"
    browser = subprocess.run(
        [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--window-size=1100,3000",
         f"--screenshot={shot}", page.as_uri()],
        capture_output=True, text=True, timeout=120, env={**os.environ, "HOME": str(tmp_path)})
    assert shot.is_file() and shot.stat().st_size > 10_000, browser.stderr
    if os.environ.get("RELEASE_NOTE_SCREENSHOT"):  # to look at it
        shutil.copy(shot, os.environ["RELEASE_NOTE_SCREENSHOT"])
    pixels = matplotlib.image.imread(shot)[..., :3]
    # Not blank: many pixels are not the white background. And the plot's bars show (this run has failing
    # cells, drawn in matplotlib's tab:red), so the embedded PNG was decoded and drawn, not just linked.
    assert (pixels.sum(axis=2) < 2.9).mean() > 0.01
    red = (abs(pixels[..., 0] - 214 / 255) < 0.05) & (abs(pixels[..., 1] - 39 / 255) < 0.05) & \
        (abs(pixels[..., 2] - 40 / 255) < 0.05)
    assert red.sum() > 200
