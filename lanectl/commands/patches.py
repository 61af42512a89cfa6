from __future__ import annotations

from collections.abc import Callable

from lanectl.errors import EXIT_FAILED, EXIT_OK, BadInput
from lanectl.image.in_image.patching import PatchFormatError, PatchReport, format_report
from lanectl.image.patch_check import check_patch_files, read_patch_file
from lanectl.output import Result, info
from lanectl.project import Project, cache_dir, leaves


def check_project_patches(project: Project, progress: Callable[[int, int], None] | None = None) -> Result:
    """Every patch under patches/ against the source its `Base:` names; never writes to the project.

    `progress(done, total)` follows the one-time download of a pinned source (bytes). Exit 1 when any
    patch conflicts.
    """
    files = sorted(project.patches_dir.rglob("*.patch"))
    if not files:
        # A project without backports passes: CI runs this step whether or not a project has patches yet.
        note = info(f"no *.patch files under {project.display(project.patches_dir)}: nothing to check")
        return Result("patches.check", {"patches": []}, (note,), text_only={"patches": []})
    for path in files:
        if leaves(path, project.patches_dir):
            shown = path.relative_to(project.root).as_posix()
            raise BadInput(f"{shown} leads out of patches/ (a symlink to {path.resolve()}); "
                           "keep patch files inside patches/")
    try:
        reports = check_patch_files(files, project.root, cache_dir(), progress=progress)
    except PatchFormatError as exc:
        raise BadInput(str(exc)) from None
    data, parts = [], []
    for path, report in zip(files, reports, strict=True):
        patch = read_patch_file(path)
        lines = format_report(report)
        summary, details = _summary(report, lines), lines[1:]
        data.append({
            "patch": report.patch,
            "status": str(report.status),
            "subject": patch.subject,
            "upstream": patch.upstream,
            "base": patch.base,
            "targets": list(patch.targets),
            # Per file: applies | creates | already-upstream | conflicts (the patch's status sums them up).
            "files": [{"path": f.path, "status": str(f.status)} for f in report.files],
            "lines": lines,
        })
        parts.append({"status": str(report.status), "summary": summary, "subject": patch.subject,
                      "details": details})
    conflicts = any(entry["status"] == "conflicts" for entry in data)
    return Result("patches.check", {"patches": data}, exit_code=EXIT_FAILED if conflicts else EXIT_OK,
                  text_only={"patches": parts})


def _summary(report: PatchReport, lines: list[str]) -> str:
    """The report's summary: the patch, and what it does or why it conflicts.

    `format_report` lives in patching.py, which is copied into every image with patches: its bytes are an
    image input (changing them would rebuild every patched lane), so it stays the one formatter, and its
    first line is by construction the status, two spaces, then this summary.
    """
    prefix = f"{report.status}  "
    if not lines[0].startswith(prefix):
        raise AssertionError(f"patching.format_report changed the shape of its first line: {lines[0]!r}")
    return lines[0].removeprefix(prefix)


# The command's page in the docs (docs/reference/commands/, written by scripts/docs_reference.py from the
# command-line app): an example, and what each exit code means.
COMMAND_DOCS = {
    "patches check": {
        "example": """\
$ lanectl patches check
""",
        "exit": {
            0: "every patch applies, or is already upstream; or the project has no patches",
            1: "a patch conflicts with the pinned upstream source",
            2: "an invalid recipe or patch file",
        },
    },
}
