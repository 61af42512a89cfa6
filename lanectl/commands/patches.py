from __future__ import annotations

from typing import Any

from rich.console import Console

from lanectl.errors import BadInput
from lanectl.image.in_image.patching import PatchFormatError, format_report, parse_patch_file
from lanectl.image.patch_check import check_patch_files
from lanectl.project import Project, cache_dir, leaves


def check_project_patches(project: Project, progress: Console | None = None) -> list[dict[str, Any]]:
    """Every patch under patches/ against the source its `Base:` names; never writes to the project."""
    files = sorted(project.patches_dir.rglob("*.patch"))
    if not files:
        raise BadInput(f"no *.patch files under {project.display(project.patches_dir)}")
    for path in files:
        if leaves(path, project.patches_dir):
            shown = path.relative_to(project.root).as_posix()
            raise BadInput(f"{shown} leads out of patches/ (a symlink to {path.resolve()}); "
                           "keep patch files inside patches/")
    show = _DownloadProgress(progress)
    try:
        reports = check_patch_files(files, project.root, cache_dir(), progress=show)
    except PatchFormatError as exc:
        raise BadInput(str(exc)) from None
    result = []
    for path, report in zip(files, reports, strict=True):
        patch = parse_patch_file(path)
        result.append({
            "patch": report.patch,
            "status": str(report.status),
            "subject": patch.subject,
            "upstream": patch.upstream,
            "base": patch.base,
            "targets": list(patch.targets),
            # Per file: applies | creates | already-upstream | conflicts (the patch's status sums them up).
            "files": [{"path": f.path, "status": str(f.status)} for f in report.files],
            "lines": format_report(report),
        })
    return result


class _DownloadProgress:
    """Prints the one-time download of a pinned source (vLLM's sdist is ~43 MB) in 10% steps."""

    def __init__(self, console: Console | None):
        self.console = console
        self.shown = -1

    def __call__(self, done: int, total: int) -> None:
        if self.console is None or not total:
            return
        tenth = done * 10 // total
        if tenth != self.shown:
            self.shown = tenth
            self.console.print(f"downloading pinned upstream source: {done / 1e6:.1f}/{total / 1e6:.1f} MB")
