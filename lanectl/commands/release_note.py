"""`lanectl report RUN --release-note [--out FILE] [--html FILE]`: the release note of a gate run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lanectl.bench.release_note import NoteInputs, candidates_of, release_note
from lanectl.errors import BadInput
from lanectl.output import Message, Result, info
from lanectl.recipe.catalog import Catalog


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
                           "standby": lane.spec.standby.model_dump(mode="json") if lane.spec.standby else None}
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


def local_image_ids(references: set[str]) -> dict[str, str]:
    """Each image reference's ID on the local engine; nothing for one it lacks, or when it does not answer."""
    from lanectl.dockerapi.containers import ContainerEngine
    from lanectl.errors import LanectlError

    try:
        engine = ContainerEngine()
        found = {ref: engine.image_id(ref) for ref in sorted(r for r in references if r)}
    except (LanectlError, OSError):
        return {}
    return {ref: image for ref, image in found.items() if image}


def write_note(path: Path, text: str) -> None:
    from lanectl.state.atomic import write_atomically

    if path.is_dir():
        raise BadInput(f"--out {path} is a folder; give a file name")
    if not path.parent.is_dir():
        raise BadInput(f"--out {path}: the folder {path.parent} does not exist")
    # Replaced whole: a symlink at the path is replaced too, never written through.
    write_atomically(path, text.encode(), mode=0o644)


def report_release_note(catalog: Catalog | None, run_dir: Path, out: Path | None, html: Path | None, *,
                        print_markdown: bool = True) -> Result:
    """The note as Markdown (on stdout, or in `out`), and with `html` the same note as one HTML file
    with the run's plot inside it."""
    from lanectl.bench.results_file import load_results

    results = load_results(run_dir)
    try:
        arms = [arm for arm in results["gate"].get("arms") or [] if isinstance(arm, dict)]
        started = arms[0].get("started") if arms else None
        inputs = note_inputs(catalog, results, run_dir.name,
                             earlier_gate_records(started if isinstance(started, str) else None),
                             local_image_ids({str(arm.get("image", "")) for arm in arms}))
    except (KeyError, TypeError, AttributeError) as exc:
        raise BadInput(f"{run_dir / 'results.json'}: not a gate run as `lanectl gate --out` writes it "
                       f"({type(exc).__name__}: {exc}); nothing was written") from None
    try:
        markdown = release_note(results, inputs)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
        raise BadInput(f"{run_dir / 'results.json'}: not a gate run as `lanectl gate --out` writes it "
                       f"({type(exc).__name__}: {exc}); nothing was written") from None
    messages: tuple[Message, ...] = ()
    if out is not None:
        write_note(out, markdown)
        messages += (info(f"wrote the release note to {out}"),)
    if html is not None:
        from lanectl.bench.release_note_html import note_html

        plot = run_dir / "ratios.png"
        picture = plot.read_bytes() if plot.is_file() else None
        write_note(html, note_html(markdown, picture))
        missing = "" if picture else f" (no plot: {plot} is missing; `lanectl report {run_dir}` draws it)"
        messages += (info(f"wrote the release note as HTML to {html}{missing}"),)
    shown = print_markdown and out is None
    return Result("release-note", {"markdown": markdown, "out": str(out) if out else None,
                                   "html": str(html) if html else None}, messages,
                  text_only={"print": shown})
