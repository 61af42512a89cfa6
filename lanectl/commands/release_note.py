"""`lanectl report RUN --release-note [--out FILE] [--html FILE]`: the release note of a gate run."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path
from typing import Any

from lanectl.bench.calibration_file import kept_calibration
from lanectl.bench.release_note import NoteInputs, release_note
from lanectl.bench.verdict import KeptCalibration, Rechecked, candidates_of
from lanectl.errors import BadInput
from lanectl.output import Message, Result, info, warning
from lanectl.recipe.catalog import Catalog
from lanectl.recipe.model import as_data


def note_inputs(catalog: Catalog | None, results: dict[str, Any], run_name: str,
                earlier_gates: list[dict[str, Any]] | None, image_ids: dict[str, str] | None = None) -> NoteInputs:
    """What the note needs from the recipes: each candidate's diff from the control, each lane's containers
    and standby. A lane the recipes no longer define is left out, and the note says so."""
    from lanectl.commands.diff import inputs_of
    from lanectl.lanes.diff import diff_lanes

    gate = results["gate"]
    control = gate["control"]
    known = catalog.lanes if catalog is not None else {}
    shipped: dict[str, dict[str, Any] | None] = {}
    for candidate in candidates_of(gate):
        name = candidate["candidate"]
        shipped[name] = (diff_lanes(inputs_of(known[control]), inputs_of(known[name])).as_dict()
                         if control in known and name in known else None)
    lanes = {}
    for name in [control, *shipped]:
        if name in known:
            lane = known[name]
            lanes[name] = {"containers": [lane.container_name(role) for role in lane.roles],
                           "standby": as_data(lane.spec.standby) if lane.spec.standby else None}
    return NoteInputs(run_name=run_name, shipped=shipped, lanes=lanes, earlier_gates=earlier_gates,
                      image_ids=image_ids or {})


def earlier_gate_records(started: str | None) -> list[dict[str, Any]] | None:
    """The journal's gate records written before the run started; None when the journal cannot be read."""
    from lanectl.state.journal import Journal
    from lanectl.state.paths import StateFiles, state_dir

    try:
        path = StateFiles(state_dir()).journal
        if not path.is_file():
            return None
        records = Journal(path).read().records
    except (OSError, ValueError):
        return None
    # Journal times end in "Z" with milliseconds, arm times in "+00:00": compare to the second.
    return [r for r in records
            if r.get("kind") == "gate" and (started is None or str(r.get("ts", ""))[:19] < started[:19])]


# What Docker accepts as an image reference (name[:tag][@digest], lowercase name): results.json may name
# anything, and only a reference like this is worth asking the engine about.
IMAGE_REFERENCE = re.compile(r"[a-z0-9][a-z0-9._/-]*(?::[0-9]+/[a-z0-9._/-]+)?(?::[\w][\w.-]{0,127})?"
                             r"(?:@sha256:[0-9a-f]{64})?")


def local_image_ids(references: set[str]) -> dict[str, str]:
    """Each image reference's ID on the local engine; nothing for one it lacks, or when it does not answer."""
    from lanectl.dockerapi.containers import ContainerEngine
    from lanectl.dockerapi.engine_api import EngineError
    from lanectl.errors import LanectlError

    wanted = sorted(ref for ref in references if IMAGE_REFERENCE.fullmatch(ref))
    try:
        engine = ContainerEngine()
        found = {ref: engine.image_id(ref) for ref in wanted}
    except (LanectlError, EngineError, OSError):
        return {}
    return {ref: image for ref, image in found.items() if image}


def written_note(catalog: Catalog | None, results: dict[str, Any], run_name: str,
                 earlier_gates: list[dict[str, Any]] | None,
                 image_ids: dict[str, str] | None = None, *,
                 kept: KeptCalibration | None = None) -> tuple[str, Rechecked]:
    """The note's Markdown, written from the figures recomputed from the run's per-request rates (format 2),
    saying where the recorded ones differ and where the evidence does not hold together (its priors held to
    `kept`, this host's calibration of the workload); and that recomputation."""
    from lanectl.bench.verdict import recheck

    rechecked = recheck(results, kept)
    results = {**results, "gate": rechecked.gate}
    inputs = note_inputs(catalog, results, run_name, earlier_gates, image_ids)
    inputs = replace(inputs, recomputed=rechecked.recomputed, differences=rechecked.differences,
                     not_reproduced=rechecked.not_reproduced, priors_checked=rechecked.priors_checked)
    return release_note(results, inputs), rechecked


# matplotlib writes the gate's plot at well under 1 MiB; anything far larger was not written by lanectl.
MAX_PLOT_BYTES = 8 * 1024 * 1024
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def read_plot(run_dir: Path) -> bytes | None:
    """The run's ratios.png for embedding, None when there is none. Only a regular file, not through a link, that
    starts as a PNG does and is no larger than a gate's plot: anything else in a run folder is refused (exit 2)
    rather than copied into a page that people open."""
    from lanectl.bench.results_file import read_run_file

    path = run_dir / "ratios.png"
    redraw = f"remove it; `lanectl report {run_dir}` draws the plot again"
    try:
        picture = read_run_file(path, MAX_PLOT_BYTES, most="a gate's plot", fix=redraw, follow_links=False)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if path.is_symlink():
            raise BadInput(f"{path} is a symbolic link; --html embeds only the plot `lanectl gate --out` wrote: "
                           f"{redraw}") from None
        raise BadInput(f"{path}: cannot read it ({exc.strerror or exc}); {redraw}") from None
    if not picture.startswith(PNG_SIGNATURE) or len(picture) > MAX_PLOT_BYTES:
        raise BadInput(f"{path} is not a PNG image; {redraw}")
    return picture


def report_release_note(catalog: Catalog | None, run_dir: Path, out: Path | None, html: Path | None, *,
                        print_markdown: bool = True) -> Result:
    """The note as Markdown (on stdout, or in `out`), and with `html` the same note as one HTML file
    with the run's plot inside it. Written from the figures recomputed from the run's per-request rates;
    everything is checked (results.json, the plot) before anything is written."""
    from lanectl.bench.results_file import load_results
    from lanectl.state.out_paths import check_output_file, write_output_file

    if out is not None:
        check_output_file(out, "--out", run_dir=run_dir)
    if html is not None:
        check_output_file(html, "--html", run_dir=run_dir)
    if out is not None and html is not None and _same_name(out, html):
        raise BadInput(f"--out {out} and --html {html} name the same file; give two")
    results = load_results(run_dir)
    gate = results["gate"]
    if gate.get("calibration") and not gate["cells"]:
        raise BadInput(f"{run_dir} is a calibration (`gate --calibrate`), not a release: it has no release note; "
                       f"`lanectl report {run_dir}` shows its figures")
    picture = read_plot(run_dir) if html is not None else None
    arms = results["gate"].get("arms") or []
    started = arms[0]["started"] if arms else None
    markdown, rechecked = written_note(catalog, results, run_dir.name, earlier_gate_records(started),
                                       local_image_ids({arm["image"] for arm in arms}),
                                       kept=kept_calibration(results.get("workload")))
    messages: tuple[Message, ...] = ()
    if out is not None:
        write_output_file(out, markdown.encode(), "--out", run_dir=run_dir)
        messages += (info(f"wrote the release note to {out}"),)
    if html is not None:
        from lanectl.bench.release_note_html import note_html

        plot = run_dir / "ratios.png"
        write_output_file(html, note_html(markdown, picture).encode(), "--html", run_dir=run_dir)
        missing = "" if picture else f" (no plot: {plot} is missing; `lanectl report {run_dir}` draws it)"
        messages += (info(f"wrote the release note as HTML to {html}{missing}"),)
    if rechecked.not_reproduced:
        messages += (warning(f"the verdict is not reproduced: results.json does not hold together in "
                             f"{len(rechecked.not_reproduced)} place(s) (the note lists them)"),)
    if rechecked.differences:
        messages += (warning(f"results.json's recorded figures differ from its per-request rates in "
                             f"{len(rechecked.differences)} place(s); the note is written from the rates and "
                             "lists them"),)
    to_stdout = print_markdown and out is None
    return Result("release-note", {"markdown": markdown, "out": str(out) if out else None,
                                   "html": str(html) if html else None}, messages,
                  text_only={"print": to_stdout})


def _same_name(one: Path, other: Path) -> bool:
    return one.parent.resolve() / one.name == other.parent.resolve() / other.name
