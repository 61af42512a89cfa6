"""Parse, check and apply lanectl's backport patches.

Standard library only: the image build copies this file into the build context and runs
``python3 /lanectl/image/in_image/patching.py apply --root <site-packages> <patch files...>`` with the image's
own Python, so the build applies patches with exactly the code that ``lanectl patches check`` uses.

A patch file is a header, a line ``---`` alone, then a unified diff (paths ``a/…``/``b/…``, -p1)::

    Subject: <one line>
    Upstream: <url of the upstream change>
    Target: <path relative to the root>[, <path>…]   (repeatable; every file the diff touches)
    Base: <what the patch is written against, e.g. pypi:vllm==0.31.0>
    <free text>
    ---
    --- a/<path>
    +++ b/<path>
    @@ -l,s +l,s @@
    ...
    --- /dev/null                                    (a file the patch creates)
    +++ b/<new path>
    @@ -0,0 +1,N @@
    +<N added lines>

Matching is strict: a hunk's context and removed lines must equal the file's lines exactly (no fuzz),
at the stated line or at a small offset, and at one place only within that window, because a fix
applied at the wrong place is worse than a conflict. A created file must not exist yet (or exist
with exactly the patch's content: already upstream). Nothing is written through a symlink below
the root.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

HEADER_FIELDS = ("Subject", "Upstream", "Target", "Base")
# Base pins the exact upstream version, so a correct patch matches at offset 0; the offset search
# only absorbs small local drift (e.g. a re-wrapped import block), never a moved function.
MAX_OFFSET_LINES = 100
NEW_FILE_MODE = 0o644

_HUNK_HEADER = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@(.*)$")
_HEADER_FIELD = re.compile(r"^(" + "|".join(HEADER_FIELDS) + r"):[ \t]*(.*?)\s*$")
# Lines git puts between one file's diff and the next; they carry nothing we apply.
_GIT_EXTENDED_HEADER = ("diff ", "index ", "similarity ", "old mode ", "new mode ")
_NO_NEWLINE_MARKER = "\\"
# Several targets: repeated `Target:` lines, or one line listing them separated by commas or spaces.
_TARGET_SEPARATOR = re.compile(r"[,\s]+")
_DEV_NULL = "/dev/null"


class PatchFormatError(ValueError):
    """The patch file itself is malformed; names the file and, where known, the line."""

    def __init__(self, patch_file: str, line: int | None, message: str) -> None:
        self.patch_file = patch_file
        self.line = line
        self.message = message
        where = f"{patch_file}:{line}" if line is not None else patch_file
        super().__init__(f"{where}: {message}")


class PatchStatus(StrEnum):
    APPLIES = "applies"
    CREATES = "creates"
    """Per file only: the file does not exist yet and the patch creates it; the patch then applies."""
    ALREADY_UPSTREAM = "already-upstream"
    CONFLICTS = "conflicts"


@dataclass(frozen=True)
class Hunk:
    header: str
    """The ``@@ -l,s +l,s @@`` line exactly as written in the patch."""
    old_start: int
    old_count: int
    new_start: int
    new_count: int
    body: tuple[str, ...]
    """The hunk's lines as written in the patch (``' '``/``'-'``/``'+'``/``'\\'`` prefixed), without line ends."""
    old_lines: tuple[str, ...]
    """Context and removed lines, each with its line end, as they must appear in the file."""
    new_lines: tuple[str, ...]
    """Context and added lines, each with its line end, as the file has them after the patch."""
    patch_line: int
    """Line number of the ``@@`` header in the patch file."""

    @property
    def text(self) -> str:
        return "\n".join((self.header, *self.body))


@dataclass(frozen=True)
class FilePatch:
    path: str
    """Path relative to the root, ``a/``/``b/`` prefix stripped."""
    hunks: tuple[Hunk, ...]
    creates: bool = False
    """``--- /dev/null``: the file is new; its one hunk holds only added lines."""


@dataclass(frozen=True)
class Patch:
    name: str
    """How reports name the patch: ``<project dir>/<file name>``, e.g. ``vllm/60945-….patch``."""
    source: str
    subject: str
    upstream: str
    targets: tuple[str, ...]
    base: str
    description: str
    files: tuple[FilePatch, ...]
    field_lines: dict[str, int] = field(default_factory=dict, compare=False, repr=False)
    """Line number of each header field in the patch file, for errors raised by callers."""


@dataclass(frozen=True)
class Conflict:
    hunk_header: str
    hunk_text: str
    """The failing hunk as written in the patch, header included."""
    file_line: int
    """1-based line of the file where the hunk was expected to start."""
    file_text: tuple[str, ...]
    """The file's lines from ``file_line`` on, as many as the hunk's old side (without line ends)."""
    reason: str


@dataclass(frozen=True)
class FileReport:
    path: str
    status: PatchStatus
    offsets: tuple[int, ...]
    """Per hunk, how far from the stated line it matched (the forward side when it applies, the
    new side when it is already upstream); empty when the file conflicts."""
    conflict: Conflict | None = None
    """Set when the file conflicts and a hunk failed; None when the file itself is missing."""
    message: str = ""


@dataclass(frozen=True)
class PatchReport:
    patch: str
    status: PatchStatus
    files: tuple[FileReport, ...]
    note: str = ""
    written: bool = False

    @property
    def offsets(self) -> tuple[int, ...]:
        return tuple(offset for f in self.files for offset in f.offsets)

    @property
    def conflict(self) -> Conflict | None:
        return next((f.conflict for f in self.files if f.conflict is not None), None)


# ---------------------------------------------------------------------------------------------- parsing


def _split_lines(text: str) -> list[str]:
    # str.splitlines() also splits on \f, \x1c, \u2028 …, which are ordinary characters inside a
    # source line; diff and patch only ever split on \n.
    parts = text.split("\n")
    lines = [part + "\n" for part in parts[:-1]]
    if parts[-1]:
        lines.append(parts[-1])
    return lines


def _read_text(path: Path) -> str:
    # surrogateescape round-trips bytes that are not UTF-8, so a context line can match them and
    # a write never alters bytes outside the hunks.
    return path.read_bytes().decode("utf-8", errors="surrogateescape")


def _strip_line_end(line: str) -> str:
    return line[:-1] if line.endswith("\n") else line


def patch_display_name(path: Path) -> str:
    # Patches live in patches/<project>/; the project directory tells which tree a report is about.
    return f"{path.parent.name}/{path.name}" if path.parent.name else path.name


def parse_patch_file(path: Path, name: str | None = None) -> Patch:
    return parse_patch(_read_text(path), name=name or patch_display_name(path), source=str(path))


def parse_patch(text: str, name: str, source: str | None = None) -> Patch:
    source = source or name
    lines = _split_lines(text)
    separator = next((i for i, line in enumerate(lines) if line.rstrip("\r\n") == "---"), None)
    if separator is None:
        raise PatchFormatError(source, len(lines) or 1, "no line '---' separating the header from the diff")
    fields, field_lines, description = _parse_header(lines[:separator], source, separator + 1)
    files = _parse_diff(lines, separator + 1, source)
    targets = tuple(fields["Target"])
    diff_paths = [f.path for f in files]
    if sorted(diff_paths) != sorted(targets):
        raise PatchFormatError(
            source,
            field_lines["Target"],
            f"Target lists {', '.join(targets)} but the diff touches {', '.join(diff_paths)}; they must agree",
        )
    return Patch(
        name=name,
        source=source,
        subject=fields["Subject"][0],
        upstream=fields["Upstream"][0],
        targets=targets,
        base=fields["Base"][0],
        description=description,
        files=tuple(files),
        field_lines=field_lines,
    )


def _parse_header(
    header: list[str], source: str, separator_line: int
) -> tuple[dict[str, list[str]], dict[str, int], str]:
    fields: dict[str, list[str]] = {}
    field_lines: dict[str, int] = {}
    index = 0
    for index, raw in enumerate(header):
        match = _HEADER_FIELD.match(raw.rstrip("\r\n"))
        if match is None:
            break
        key, value = match.group(1), match.group(2)
        line_number = index + 1
        if not value:
            raise PatchFormatError(source, line_number, f"header field {key}: is empty")
        if key == "Target":
            for target in _TARGET_SEPARATOR.split(value.strip(", \t")):
                _check_relative_path(target, source, line_number)
                if target in fields.get(key, []):
                    raise PatchFormatError(source, line_number, f"Target {target} is listed twice")
                fields.setdefault(key, []).append(target)
        elif key in fields:
            raise PatchFormatError(source, line_number, f"header field {key}: is given twice")
        else:
            fields[key] = [value]
        field_lines.setdefault(key, line_number)
    else:
        index = len(header)
    missing = [key for key in HEADER_FIELDS if key not in fields]
    if missing:
        raise PatchFormatError(
            source,
            separator_line,
            f"header before '---' lacks {', '.join(m + ':' for m in missing)} "
            f"(fields {', '.join(HEADER_FIELDS)} come first, one 'Name: value' per line)",
        )
    description = "".join(header[index:]).strip()
    return fields, field_lines, description


def _check_relative_path(path: str, source: str, line_number: int) -> None:
    # The image build applies patches as root inside site-packages: a path must not escape the root.
    parts = path.split("/")
    if path.startswith("/") or ".." in parts or "" in parts or "\\" in path:
        raise PatchFormatError(source, line_number, f"path {path!r} must be relative and stay inside the root")


def _diff_path(raw: str, prefix: str, source: str, line_number: int) -> str | None:
    """The path of a ``---``/``+++`` line, prefix stripped; None for ``/dev/null``."""
    value = raw[len(prefix) :].rstrip("\r\n")
    # `diff -u` appends a tab and a timestamp after the name.
    value = value.split("\t", 1)[0].strip()
    if value == _DEV_NULL:
        return None
    if "/" not in value:
        raise PatchFormatError(source, line_number, f"path {value!r} lacks the a/ or b/ prefix (-p1)")
    stripped = value.split("/", 1)[1]
    _check_relative_path(stripped, source, line_number)
    return stripped


def _parse_diff(lines: list[str], start: int, source: str) -> list[FilePatch]:
    files: list[FilePatch] = []
    section_lines: dict[str, int] = {}
    i = start
    # Anything before the first file header (e.g. a git diffstat) is commentary.
    while i < len(lines) and not lines[i].startswith("--- "):
        i += 1
    while i < len(lines):
        line = lines[i]
        if line.startswith("--- "):
            section_line = i + 1
            old_path = _diff_path(line, "--- ", source, i + 1)
            if i + 1 >= len(lines) or not lines[i + 1].startswith("+++ "):
                raise PatchFormatError(source, i + 2, "expected '+++ b/…' after '--- a/…'")
            new_path = _diff_path(lines[i + 1], "+++ ", source, i + 2)
            if new_path is None:
                raise PatchFormatError(
                    source, i + 2, "'+++ /dev/null' deletes a file; patches may change or create files, not delete them"
                )
            creates = old_path is None
            if not creates and old_path != new_path:
                raise PatchFormatError(source, i + 2, f"renames are not supported ({old_path} -> {new_path})")
            if new_path in section_lines:
                # Two sections would each be matched against the original file, and the second
                # write would silently drop the first one's change.
                raise PatchFormatError(
                    source,
                    section_line,
                    f"a second section for {new_path} (the first starts at line {section_lines[new_path]}); "
                    "put all of a file's hunks in one section",
                )
            section_lines[new_path] = section_line
            i += 2
            hunks: list[Hunk] = []
            while i < len(lines) and lines[i].startswith("@@"):
                hunk, i = _parse_hunk(lines, i, source)
                if hunks and hunk.old_start < hunks[-1].old_start + hunks[-1].old_count:
                    raise PatchFormatError(source, hunk.patch_line, "hunk overlaps or precedes the one before it")
                hunks.append(hunk)
            if not hunks:
                raise PatchFormatError(source, i + 1, f"no '@@' hunk for {new_path}")
            if creates:
                _check_creation(hunks, new_path, source, section_line)
            files.append(FilePatch(path=new_path, hunks=tuple(hunks), creates=creates))
        elif line.rstrip("\r\n") == "-- ":
            break  # git format-patch signature: the diff is over.
        elif line.startswith(_GIT_EXTENDED_HEADER) or not line.strip():
            i += 1
        else:
            raise PatchFormatError(
                source,
                i + 1,
                f"unexpected line {_strip_line_end(line)!r} after a hunk (is the hunk longer than its @@ line counts?)",
            )
    if not files:
        raise PatchFormatError(source, len(lines), "the diff after '---' changes no file")
    return files


def _check_creation(hunks: list[Hunk], path: str, source: str, section_line: int) -> None:
    first = hunks[0]
    if len(hunks) == 1 and (first.old_start, first.old_count, first.new_start) == (0, 0, 1) and first.new_count:
        return
    line = hunks[1].patch_line if len(hunks) > 1 else first.patch_line
    raise PatchFormatError(
        source,
        line,
        f"{path} is created ('--- /dev/null' at line {section_line}): its diff is one hunk "
        "'@@ -0,0 +1,N @@' of N added lines",
    )


def _parse_hunk(lines: list[str], i: int, source: str) -> tuple[Hunk, int]:
    header_line = i + 1
    header = lines[i].rstrip("\r\n")
    match = _HUNK_HEADER.match(header)
    if match is None:
        raise PatchFormatError(source, header_line, f"malformed hunk header {header!r}")
    old_start = int(match.group(1))
    old_count = int(match.group(2)) if match.group(2) is not None else 1
    new_start = int(match.group(3))
    new_count = int(match.group(4)) if match.group(4) is not None else 1
    if (old_start == 0 and old_count) or (new_start == 0 and new_count):
        raise PatchFormatError(source, header_line, f"hunk header {header!r} starts at line 0")
    body: list[str] = []
    old: list[str] = []
    new: list[str] = []
    last_side: tuple[list[str], ...] = ()
    old_left, new_left = old_count, new_count
    i += 1
    while old_left or new_left or (i < len(lines) and lines[i].startswith(_NO_NEWLINE_MARKER)):
        if i >= len(lines):
            raise PatchFormatError(
                source,
                header_line,
                f"hunk {header!r} ends early: {old_left} old and {new_left} new line(s) missing",
            )
        raw = lines[i]
        # An editor may strip the lone space of an empty context line; it can only mean "".
        kind, content = (" ", raw) if raw in ("\n", "\r\n") else (raw[0], raw[1:])
        if kind == _NO_NEWLINE_MARKER:
            if not last_side:
                raise PatchFormatError(source, i + 1, "'\\ No newline at end of file' without a line before it")
            for side in last_side:
                side[-1] = side[-1].removesuffix("\n")
        elif kind == " " and old_left and new_left:
            old.append(content)
            new.append(content)
            old_left, new_left = old_left - 1, new_left - 1
            last_side = (old, new)
        elif kind == "-" and old_left:
            old.append(content)
            old_left -= 1
            last_side = (old,)
        elif kind == "+" and new_left:
            new.append(content)
            new_left -= 1
            last_side = (new,)
        else:
            raise PatchFormatError(
                source,
                i + 1,
                f"line {_strip_line_end(raw)!r} does not fit hunk {header!r} "
                f"({old_left} old and {new_left} new line(s) still expected)",
            )
        body.append(_strip_line_end(raw))
        i += 1
    hunk = Hunk(
        header=header,
        old_start=old_start,
        old_count=old_count,
        new_start=new_start,
        new_count=new_count,
        body=tuple(body),
        old_lines=tuple(old),
        new_lines=tuple(new),
        patch_line=header_line,
    )
    return hunk, i


# --------------------------------------------------------------------------------------------- matching


def _stated_index(start: int, count: int) -> int:
    # In a unified diff an empty range names the line *before* it, so it starts at index `start`.
    return start - 1 if count else start


def _find(lines: list[str], wanted: tuple[str, ...], expected: int, lowest: int) -> tuple[int, ...]:
    """Every index within the offset window where `wanted` matches exactly, nearest to `expected`
    first (later before earlier). More than one means the hunk cannot tell where it belongs."""
    if not wanted:
        # Without any line to compare, only the stated place is trustworthy.
        return (expected,) if lowest <= expected <= len(lines) else ()
    last_start = len(lines) - len(wanted)
    found = []
    for distance in range(MAX_OFFSET_LINES + 1):
        for candidate in (expected + distance, expected - distance) if distance else (expected,):
            if lowest <= candidate <= last_start and tuple(lines[candidate : candidate + len(wanted)]) == wanted:
                found.append(candidate)
    return tuple(found)


@dataclass(frozen=True)
class _SideMatch:
    positions: tuple[int | None, ...]
    """Where each hunk matched; None when it matched nowhere or at several places."""
    offsets: tuple[int | None, ...]
    expected: tuple[int, ...]
    candidates: tuple[tuple[int, ...], ...]

    @property
    def complete(self) -> bool:
        return all(p is not None for p in self.positions)

    def ambiguous(self, hunk: int) -> bool:
        return len(self.candidates[hunk]) > 1


def _match_side(lines: list[str], hunks: Sequence[Hunk], *, forward: bool) -> _SideMatch:
    positions: list[int | None] = []
    offsets: list[int | None] = []
    expected_positions: list[int] = []
    all_candidates: list[tuple[int, ...]] = []
    last_offset = 0
    lowest = 0
    for hunk in hunks:
        wanted = hunk.old_lines if forward else hunk.new_lines
        stated = (
            _stated_index(hunk.old_start, hunk.old_count) if forward else _stated_index(hunk.new_start, hunk.new_count)
        )
        # Like patch(1): a hunk usually drifts by the same amount as the one before it.
        expected = max(stated + last_offset, 0)
        candidates = _find(lines, wanted, expected, lowest)
        position = candidates[0] if len(candidates) == 1 else None
        all_candidates.append(candidates)
        expected_positions.append(expected)
        positions.append(position)
        if position is None:
            offsets.append(None)
        else:
            last_offset = position - stated
            offsets.append(last_offset)
            lowest = position + len(wanted)
    return _SideMatch(tuple(positions), tuple(offsets), tuple(expected_positions), tuple(all_candidates))


def _conflict(lines: list[str], hunk: Hunk, expected: int, reason: str) -> Conflict:
    shown = lines[expected : expected + max(len(hunk.old_lines), 1)]
    return Conflict(
        hunk_header=hunk.header,
        hunk_text=hunk.text,
        file_line=expected + 1,
        file_text=tuple(_strip_line_end(line) for line in shown),
        reason=reason,
    )


@dataclass(frozen=True)
class _FileOutcome:
    report: FileReport
    patched_text: str | None
    """The whole new content when the file's forward side matched."""


def _missing(file_patch: FilePatch, message: str) -> _FileOutcome:
    return _FileOutcome(
        FileReport(path=file_patch.path, status=PatchStatus.CONFLICTS, offsets=(), message=message), None
    )


def _symlink_on_the_way(root: Path, relpath: str) -> str | None:
    """Why `relpath` cannot be written safely: a symlink at or above it below `root`, or None."""
    current = root
    parts = relpath.split("/")
    for depth, part in enumerate(parts):
        current = current / part
        if current.is_symlink():
            shown = "/".join(parts[: depth + 1])
            kind = "is" if depth == len(parts) - 1 else "goes through"
            return (
                f"{relpath} {kind} the symlink {shown} -> {os.readlink(current)}; refusing to write "
                f"through a symlink (it may lead out of {root}); patch the real file instead"
            )
        if not current.exists():
            return None
    return None


def _check_file(file_patch: FilePatch, root: Path) -> _FileOutcome:
    target = root / file_patch.path
    unsafe = _symlink_on_the_way(root, file_patch.path)
    if unsafe is not None:
        return _missing(file_patch, unsafe)
    if file_patch.creates:
        return _check_creation_target(file_patch, target)
    if not target.is_file():
        return _missing(file_patch, f"target file not found: {target}")
    lines = _split_lines(_read_text(target))
    forward = _match_side(lines, file_patch.hunks, forward=True)
    if forward.complete:
        result: list[str] = []
        cursor = 0
        for hunk, position in zip(file_patch.hunks, forward.positions, strict=True):
            assert position is not None
            result.extend(lines[cursor:position])
            result.extend(hunk.new_lines)
            cursor = position + len(hunk.old_lines)
        result.extend(lines[cursor:])
        offsets = tuple(o for o in forward.offsets if o is not None)
        return _FileOutcome(
            FileReport(path=file_patch.path, status=PatchStatus.APPLIES, offsets=offsets), "".join(result)
        )
    failing = next(n for n, position in enumerate(forward.positions) if position is None)
    total = len(file_patch.hunks)
    if forward.ambiguous(failing):
        return _ambiguous(file_patch, lines, failing, forward, "its context and removed lines match")
    reverse = _match_side(lines, file_patch.hunks, forward=False)
    if reverse.complete:
        offsets = tuple(o for o in reverse.offsets if o is not None)
        return _FileOutcome(
            FileReport(path=file_patch.path, status=PatchStatus.ALREADY_UPSTREAM, offsets=offsets), None
        )
    reverse_failing = next(n for n, position in enumerate(reverse.positions) if position is None)
    if reverse.ambiguous(reverse_failing):
        return _ambiguous(file_patch, lines, reverse_failing, reverse, "its new side matches")
    hunk = file_patch.hunks[failing]
    reason = f"hunk {failing + 1} of {total} does not match"
    reason += f" within {MAX_OFFSET_LINES} lines of line {forward.expected[failing] + 1}"
    if reverse.positions[failing] is not None:
        reason += "; its new side is already there, so the file has only part of this patch"
    return _FileOutcome(
        FileReport(
            path=file_patch.path,
            status=PatchStatus.CONFLICTS,
            offsets=(),
            conflict=_conflict(lines, hunk, forward.expected[failing], reason),
        ),
        None,
    )


def _ambiguous(file_patch: FilePatch, lines: list[str], index: int, side: _SideMatch, what: str) -> _FileOutcome:
    hunk = file_patch.hunks[index]
    places = sorted(side.candidates[index])
    reason = (
        f"hunk {index + 1} of {len(file_patch.hunks)} is ambiguous: {what} at lines "
        f"{', '.join(str(p + 1) for p in places)} (within {MAX_OFFSET_LINES} lines of line "
        f"{side.expected[index] + 1}); add context lines so the hunk matches one place only"
    )
    return _FileOutcome(
        FileReport(
            path=file_patch.path,
            status=PatchStatus.CONFLICTS,
            offsets=(),
            conflict=_conflict(lines, hunk, side.candidates[index][0], reason),
        ),
        None,
    )


def _check_creation_target(file_patch: FilePatch, target: Path) -> _FileOutcome:
    content = "".join(file_patch.hunks[0].new_lines)
    if not os.path.lexists(target):
        return _FileOutcome(FileReport(path=file_patch.path, status=PatchStatus.CREATES, offsets=()), content)
    if not target.is_file():
        return _missing(file_patch, f"the patch creates this file, but {target} exists and is not a file")
    existing = _read_text(target)
    if existing == content:
        return _FileOutcome(FileReport(path=file_patch.path, status=PatchStatus.ALREADY_UPSTREAM, offsets=()), None)
    old_lines, new_lines = _split_lines(existing), _split_lines(content)
    same = min(len(old_lines), len(new_lines))
    differs_at = next((n for n in range(same) if old_lines[n] != new_lines[n]), same)
    return _missing(
        file_patch,
        "the patch creates this file, but it already exists with other content "
        f"({len(old_lines)} lines; first difference at line {differs_at + 1}); "
        "rebase the patch on what is there, or rename the new file",
    )


def _evaluate(patch: Patch, root: Path) -> tuple[PatchReport, dict[Path, str]]:
    outcomes = [_check_file(file_patch, root) for file_patch in patch.files]
    reports = tuple(outcome.report for outcome in outcomes)
    statuses = {report.status for report in reports}
    if statuses <= {PatchStatus.APPLIES, PatchStatus.CREATES}:
        writes = {
            root / outcome.report.path: outcome.patched_text for outcome in outcomes if outcome.patched_text is not None
        }
        return PatchReport(patch=patch.name, status=PatchStatus.APPLIES, files=reports), writes
    if statuses == {PatchStatus.ALREADY_UPSTREAM}:
        note = "already upstream: every hunk's new side is present"
        return PatchReport(patch=patch.name, status=PatchStatus.ALREADY_UPSTREAM, files=reports, note=note), {}
    note = ""
    if PatchStatus.CONFLICTS not in statuses:
        upstream = [r.path for r in reports if r.status == PatchStatus.ALREADY_UPSTREAM]
        pending = [r.path for r in reports if r.status in (PatchStatus.APPLIES, PatchStatus.CREATES)]
        note = f"partly applied: {', '.join(upstream)} already has the change but {', '.join(pending)} does not"
    # Per-file results stay in the report, but a partial patch must not look appliable per file.
    return PatchReport(patch=patch.name, status=PatchStatus.CONFLICTS, files=reports, note=note), {}


def check(patch: Patch, root: Path) -> PatchReport:
    """Say whether `patch` applies to the tree at `root`, is already upstream there, or conflicts.

    Reads only; never writes.
    """
    report, _ = _evaluate(patch, root)
    return report


def apply(patch: Patch, root: Path) -> PatchReport:
    """Apply `patch` to the tree at `root` when, and only when, every hunk of every file matches.

    Already upstream: nothing is written. Conflicts: nothing is written and the report says why;
    the caller decides whether that is fatal (the CLI exits 1).
    """
    report, writes = _evaluate(patch, root)
    if report.status != PatchStatus.APPLIES:
        return report
    created = {root / f.path for f in report.files if f.status == PatchStatus.CREATES}
    _write_all_atomically(writes, created)
    return PatchReport(patch=report.patch, status=report.status, files=report.files, note="applied", written=True)


def _write_all_atomically(contents: dict[Path, str], created: set[Path]) -> None:
    # Stage every file first so a failure (disk full, permissions) leaves every target untouched
    # and removes any folder made for a new file; the renames at the end are the only step that
    # changes what readers see.
    staged: list[tuple[Path, Path]] = []
    made_dirs: list[Path] = []
    renamed = False
    try:
        for target, text in contents.items():
            if target in created:
                made_dirs.extend(_make_parents(target.parent))
                mode = NEW_FILE_MODE
            else:
                mode = target.stat().st_mode & 0o7777
            fd, temp_name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".patching")
            staged.append((Path(temp_name), target))
            with os.fdopen(fd, "wb") as handle:
                handle.write(text.encode("utf-8", errors="surrogateescape"))
                handle.flush()
                os.fsync(handle.fileno())
            os.chmod(temp_name, mode)
        for temp, target in staged:
            if target in created:
                # link() fails if the file appeared since the check, where replace() would clobber it.
                os.link(temp, target)
            else:
                os.replace(temp, target)
        renamed = True
    finally:
        for temp, _ in staged:
            temp.unlink(missing_ok=True)
        if not renamed:
            for folder in reversed(made_dirs):
                with contextlib.suppress(OSError):
                    folder.rmdir()


def _make_parents(folder: Path) -> list[Path]:
    """Create `folder` and its missing parents; return those created, outermost first."""
    missing = []
    while not folder.exists():
        missing.append(folder)
        folder = folder.parent
    for path in reversed(missing):
        path.mkdir()
    return list(reversed(missing))


# ------------------------------------------------------------------------------------------------- CLI


def _format_offset(offset: int) -> str:
    return f"{offset:+d}" if offset else "0"


def format_report(report: PatchReport) -> list[str]:
    """The lines `main` prints for one patch."""
    if report.status == PatchStatus.CONFLICTS:
        lines = [f"{report.status}  {report.patch}" + (f"  ({report.note})" if report.note else "")]
        for file_report in report.files:
            if file_report.status != PatchStatus.CONFLICTS:
                continue
            if file_report.conflict is None:
                lines.append(f"  {file_report.path}: {file_report.message}")
                continue
            conflict = file_report.conflict
            lines.append(f"  {file_report.path}: {conflict.reason}")
            lines.append("  patch hunk:")
            lines.extend(f"    {line}" for line in conflict.hunk_text.split("\n"))
            if conflict.file_text:
                lines.append(f"  file has at line {conflict.file_line}:")
                lines.extend(f"    {conflict.file_line + n:>5} | {text}" for n, text in enumerate(conflict.file_text))
            else:
                lines.append(f"  file ends before line {conflict.file_line}")
        return lines
    parts = []
    count = len(report.offsets)
    if count:
        offsets = "/".join(_format_offset(o) for o in report.offsets)
        parts.append(f"{count} hunk{'s' if count != 1 else ''}, offset{'s' if count != 1 else ''} {offsets}")
    for file_report in report.files:
        if file_report.status == PatchStatus.CREATES:
            parts.append(f"creates {file_report.path}")
        elif file_report.status == PatchStatus.ALREADY_UPSTREAM and not file_report.offsets:
            parts.append(f"{file_report.path} exists with this content")
    detail = "; ".join(parts)
    if report.status == PatchStatus.ALREADY_UPSTREAM:
        detail += "; nothing to do"
    elif report.written:
        detail += "; written"
    return [f"{report.status}  {report.patch}  ({detail})"]


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="patching.py",
        description="Check or apply lanectl backport patches to a source tree.",
    )
    parser.add_argument("action", choices=("check", "apply"))
    parser.add_argument("--root", required=True, type=Path, help="directory the patch paths are relative to")
    parser.add_argument("patches", nargs="+", type=Path, metavar="PATCH")
    args = parser.parse_args(list(argv))
    if not args.root.is_dir():
        print(f"error: --root {args.root} is not a directory", file=sys.stderr)
        return 2
    try:
        patches = [parse_patch_file(path) for path in args.patches]
    except (PatchFormatError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    run = apply if args.action == "apply" else check
    exit_code = 0
    for patch in patches:
        report = run(patch, args.root)
        for line in format_report(report):
            print(line)
        if report.status == PatchStatus.CONFLICTS:
            exit_code = 1
    return exit_code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
