"""Unit tests of the patch parser and applier (lanectl/image/in_image/patching.py), on real files in tmp_path."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from lanectl.image.in_image import patching
from lanectl.image.in_image.patching import (
    PatchFormatError,
    PatchStatus,
    apply,
    check,
    main,
    parse_patch,
    parse_patch_file,
)

REPO = Path(__file__).resolve().parents[1]
REAL_PATCH = REPO / "patches" / "vllm" / "60945-rejection-sampler-guard.patch"
TWENTY_LINES = "".join(f"line {n}\n" for n in range(1, 21))

HEADER = """\
Subject: Rename line 10
Upstream: https://example.invalid/change/1
Target: {targets}
Base: path:tree
Free text explaining the change.
---
"""

LINE_10_DIFF = """\
--- a/pkg/mod.py
+++ b/pkg/mod.py
@@ -7,7 +7,7 @@
 line 7
 line 8
 line 9
-line 10
+line ten
 line 11
 line 12
 line 13
"""
TWENTY_LINES_PATCHED = TWENTY_LINES.replace("line 10\n", "line ten\n")


def write_tree(root: Path, files: dict[str, str]) -> Path:
    for relpath, text in files.items():
        target = root / relpath
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(text.encode())
    return root


def write_patch(tmp_path: Path, diff: str, targets: str = "pkg/mod.py", header: str = HEADER) -> Path:
    path = tmp_path / "patches" / "demo" / "change.patch"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes((header.format(targets=targets) + diff).encode())
    return path


def tree_snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


# ------------------------------------------------------------------------------------------ parsing


def test_parses_header_fields_description_and_hunks(tmp_path: Path) -> None:
    patch = parse_patch_file(write_patch(tmp_path, LINE_10_DIFF))

    assert patch.name == "demo/change.patch"
    assert (patch.subject, patch.upstream, patch.targets, patch.base) == (
        "Rename line 10",
        "https://example.invalid/change/1",
        ("pkg/mod.py",),
        "path:tree",
    )
    assert patch.description == "Free text explaining the change."
    assert patch.field_lines == {"Subject": 1, "Upstream": 2, "Target": 3, "Base": 4}
    [file_patch] = patch.files
    [hunk] = file_patch.hunks
    assert file_patch.path == "pkg/mod.py"
    assert (hunk.header, hunk.old_start, hunk.old_count, hunk.new_start, hunk.new_count) == (
        "@@ -7,7 +7,7 @@",
        7,
        7,
        7,
        7,
    )
    assert hunk.old_lines[3] == "line 10\n" and hunk.new_lines[3] == "line ten\n"
    assert hunk.patch_line == 9


def test_the_real_60945_patch_parses_with_its_pinned_base() -> None:
    patch = parse_patch_file(REAL_PATCH)

    assert patch.name == "vllm/60945-rejection-sampler-guard.patch"
    assert patch.upstream == "https://github.com/vllm-project/vllm/pull/60945 (merged 2026-10-12)"
    assert patch.targets == ("vllm/v1/worker/gpu/spec_decode/rejection_sampler_utils.py",)
    assert patch.base == "pypi:vllm==0.31.0"
    [hunk] = patch.files[0].hunks
    added = [line for line in hunk.body if line.startswith("+")]
    assert added == [
        "+    # Adaptive verification can end before num_speculative_steps.",
        "+    if logit_idx + 1 >= tl.num_programs(0):",
        "+        return",
    ]
    assert not any(line.startswith("-") for line in hunk.body)


@pytest.mark.parametrize(
    ("header", "diff", "line", "message"),
    [
        (
            HEADER.replace("Subject: Rename line 10\n", ""),
            LINE_10_DIFF,
            5,
            "header before '---' lacks Subject: (fields Subject, Upstream, Target, Base come first",
        ),
        (HEADER.replace("Base: path:tree", "Base:"), LINE_10_DIFF, 4, "header field Base: is empty"),
        (HEADER.replace("---\n", ""), LINE_10_DIFF, None, "no line '---' separating the header from the diff"),
        (HEADER, LINE_10_DIFF.replace("@@ -7,7 +7,7 @@", "@@ -7,7 +7 @"), 9, "malformed hunk header '@@ -7,7 +7 @'"),
        (
            HEADER,
            LINE_10_DIFF.replace(" line 13\n", ""),
            9,
            "hunk '@@ -7,7 +7,7 @@' ends early: 1 old and 1 new line(s) missing",
        ),
        (
            HEADER,
            LINE_10_DIFF + " line 14\n",
            18,
            "unexpected line ' line 14' after a hunk (is the hunk longer than its @@ line counts?)",
        ),
        (HEADER, LINE_10_DIFF.replace("-line 10\n", "*line 10\n"), 13, "line '*line 10' does not fit hunk"),
        (HEADER, LINE_10_DIFF.replace("+++ b/pkg/mod.py", "+++ b/pkg/other.py"), 8, "renames are not supported"),
        (
            HEADER,
            LINE_10_DIFF.replace("a/pkg/mod.py", "a/../mod.py").replace("b/pkg/mod.py", "b/../mod.py"),
            7,
            "path '../mod.py' must be relative and stay inside the root",
        ),
        (
            HEADER,
            LINE_10_DIFF.replace("--- a/pkg/mod.py", "--- /dev/null"),
            9,
            "pkg/mod.py is created ('--- /dev/null' at line 7): its diff is one hunk '@@ -0,0 +1,N @@' "
            "of N added lines",
        ),
        (
            HEADER,
            LINE_10_DIFF.replace("+++ b/pkg/mod.py", "+++ /dev/null"),
            8,
            "'+++ /dev/null' deletes a file; patches may change or create files, not delete them",
        ),
        (
            HEADER,
            LINE_10_DIFF + "--- a/pkg/mod.py\n+++ b/pkg/mod.py\n@@ -15,1 +15,1 @@\n-line 15\n+line fifteen\n",
            18,
            "a second section for pkg/mod.py (the first starts at line 7); put all of a file's hunks in one section",
        ),
        (
            HEADER,
            "--- /dev/null\n+++ b/pkg/new.py\n@@ -0,0 +1,1 @@\n+one\n@@ -0,0 +2,1 @@\n+two\n",
            11,
            "pkg/new.py is created ('--- /dev/null' at line 7): its diff is one hunk",
        ),
        (
            HEADER.replace("Target: {targets}", "Target: {targets}, {targets}"),
            LINE_10_DIFF,
            3,
            "Target pkg/mod.py is listed twice",
        ),
    ],
    ids=[
        "missing-subject",
        "empty-base",
        "no-separator",
        "bad-hunk-header",
        "hunk-too-short",
        "hunk-too-long",
        "bad-line-prefix",
        "rename",
        "path-escapes-root",
        "new-file-with-context",
        "delete-file",
        "two-sections-one-file",
        "new-file-two-hunks",
        "target-twice",
    ],
)
def test_malformed_patch_names_file_and_line(
    tmp_path: Path, header: str, diff: str, line: int | None, message: str
) -> None:
    path = write_patch(tmp_path, diff, header=header)

    with pytest.raises(PatchFormatError) as raised:
        parse_patch_file(path)

    assert raised.value.patch_file == str(path)
    if line is None:
        assert raised.value.line is not None
    else:
        assert raised.value.line == line
        assert str(raised.value).startswith(f"{path}:{line}: ")
    assert message in str(raised.value)


def test_target_header_must_agree_with_the_files_the_diff_changes(tmp_path: Path) -> None:
    path = write_patch(tmp_path, LINE_10_DIFF, targets="pkg/other.py")

    with pytest.raises(PatchFormatError, match=r":3: Target lists pkg/other.py but the diff touches pkg/mod.py"):
        parse_patch_file(path)


# ----------------------------------------------------------------------------------- check and apply


def test_applies_at_the_stated_line_and_check_writes_nothing(tmp_path: Path) -> None:
    root = write_tree(tmp_path / "tree", {"pkg/mod.py": TWENTY_LINES})
    patch = parse_patch_file(write_patch(tmp_path, LINE_10_DIFF))

    report = check(patch, root)

    assert report.status == PatchStatus.APPLIES == "applies"
    assert report.offsets == (0,)
    assert report.written is False
    assert (root / "pkg/mod.py").read_text() == TWENTY_LINES

    applied = apply(patch, root)

    assert (applied.status, applied.written, applied.note) == (PatchStatus.APPLIES, True, "applied")
    assert (root / "pkg/mod.py").read_text() == TWENTY_LINES_PATCHED


def test_applies_at_an_offset_and_reports_it(tmp_path: Path) -> None:
    root = write_tree(tmp_path / "tree", {"pkg/mod.py": "new 1\nnew 2\nnew 3\n" + TWENTY_LINES})
    patch = parse_patch_file(write_patch(tmp_path, LINE_10_DIFF))

    report = apply(patch, root)

    assert report.status == PatchStatus.APPLIES
    assert report.offsets == (3,)
    assert (root / "pkg/mod.py").read_text() == "new 1\nnew 2\nnew 3\n" + TWENTY_LINES_PATCHED


def test_a_hunk_matching_two_places_in_the_window_conflicts_naming_both(tmp_path: Path) -> None:
    lines = [f"x{n}\n" for n in range(1, 21)]
    lines[2:5] = ["a\n", "b\n", "c\n"]  # lines 3-5: 6 lines before the stated line 9
    lines[11:14] = ["a\n", "b\n", "c\n"]  # lines 12-14: 3 lines after it
    root = write_tree(tmp_path / "tree", {"pkg/mod.py": "".join(lines)})
    before = tree_snapshot(root)
    diff = "--- a/pkg/mod.py\n+++ b/pkg/mod.py\n@@ -9,3 +9,3 @@\n a\n-b\n+B\n c\n"
    patch = parse_patch_file(write_patch(tmp_path, diff))

    report = apply(patch, root)

    assert report.status == PatchStatus.CONFLICTS
    assert patching.format_report(report) == [
        "conflicts  demo/change.patch",
        "  pkg/mod.py: hunk 1 of 1 is ambiguous: its context and removed lines match at lines 3, 12 "
        "(within 100 lines of line 9); add context lines so the hunk matches one place only",
        "  patch hunk:",
        "    @@ -9,3 +9,3 @@",
        "     a",
        "    -b",
        "    +B",
        "     c",
        "  file has at line 12:",
        "       12 | a",
        "       13 | b",
        "       14 | c",
    ]
    assert tree_snapshot(root) == before


def test_an_already_applied_hunk_whose_new_side_matches_twice_conflicts(tmp_path: Path) -> None:
    lines = [f"x{n}\n" for n in range(1, 21)]
    lines[7:10] = ["a\n", "B\n", "c\n"]
    lines[15:18] = ["a\n", "B\n", "c\n"]
    root = write_tree(tmp_path / "tree", {"pkg/mod.py": "".join(lines)})
    diff = "--- a/pkg/mod.py\n+++ b/pkg/mod.py\n@@ -8,3 +8,3 @@\n a\n-b\n+B\n c\n"

    report = check(parse_patch_file(write_patch(tmp_path, diff)), root)

    assert report.status == PatchStatus.CONFLICTS
    assert report.conflict is not None
    assert report.conflict.reason == (
        "hunk 1 of 1 is ambiguous: its new side matches at lines 8, 16 (within 100 lines of line 8); "
        "add context lines so the hunk matches one place only"
    )


def test_a_second_match_beyond_the_window_is_not_ambiguous(tmp_path: Path) -> None:
    padding = "".join(f"pad {n}\n" for n in range(patching.MAX_OFFSET_LINES + 5))
    root = write_tree(tmp_path / "tree", {"pkg/mod.py": TWENTY_LINES + padding + TWENTY_LINES})
    patch = parse_patch_file(write_patch(tmp_path, LINE_10_DIFF))

    report = apply(patch, root)

    assert (report.status, report.offsets) == (PatchStatus.APPLIES, (0,))
    assert (root / "pkg/mod.py").read_text() == TWENTY_LINES_PATCHED + padding + TWENTY_LINES


def test_a_hunk_beyond_the_offset_limit_conflicts(tmp_path: Path) -> None:
    padding = "".join(f"pad {n}\n" for n in range(patching.MAX_OFFSET_LINES + 1))
    root = write_tree(tmp_path / "tree", {"pkg/mod.py": padding + TWENTY_LINES})
    patch = parse_patch_file(write_patch(tmp_path, LINE_10_DIFF))

    assert check(patch, root).status == PatchStatus.CONFLICTS


def test_context_must_match_exactly_no_fuzz(tmp_path: Path) -> None:
    # Only trailing whitespace differs on one context line: a real `patch -F2` would take it.
    root = write_tree(tmp_path / "tree", {"pkg/mod.py": TWENTY_LINES.replace("line 12\n", "line 12 \n")})
    patch = parse_patch_file(write_patch(tmp_path, LINE_10_DIFF))

    report = apply(patch, root)

    assert report.status == PatchStatus.CONFLICTS
    assert (root / "pkg/mod.py").read_text() == TWENTY_LINES.replace("line 12\n", "line 12 \n")


def test_already_upstream_is_a_no_op_success(tmp_path: Path) -> None:
    root = write_tree(tmp_path / "tree", {"pkg/mod.py": TWENTY_LINES_PATCHED})
    before = os.stat(root / "pkg/mod.py").st_mtime_ns
    patch = parse_patch_file(write_patch(tmp_path, LINE_10_DIFF))

    assert check(patch, root).status == PatchStatus.ALREADY_UPSTREAM
    report = apply(patch, root)

    assert report.status == PatchStatus.ALREADY_UPSTREAM == "already-upstream"
    assert report.written is False
    assert report.note == "already upstream: every hunk's new side is present"
    assert report.offsets == (0,)
    assert (root / "pkg/mod.py").read_text() == TWENTY_LINES_PATCHED
    assert os.stat(root / "pkg/mod.py").st_mtime_ns == before


def test_conflict_reports_the_failing_hunk_and_what_the_file_has_there(tmp_path: Path) -> None:
    changed = TWENTY_LINES.replace("line 10\n", "line TEN\n")
    root = write_tree(tmp_path / "tree", {"pkg/mod.py": changed})
    patch = parse_patch_file(write_patch(tmp_path, LINE_10_DIFF))

    report = apply(patch, root)

    assert report.status == PatchStatus.CONFLICTS == "conflicts"
    assert report.written is False
    assert (root / "pkg/mod.py").read_text() == changed
    [file_report] = report.files
    assert file_report.status == PatchStatus.CONFLICTS
    assert report.conflict == file_report.conflict
    conflict = file_report.conflict
    assert conflict is not None
    assert conflict.hunk_header == "@@ -7,7 +7,7 @@"
    assert conflict.hunk_text == LINE_10_DIFF.split("\n", 2)[2].rstrip("\n")
    assert conflict.file_line == 7
    assert conflict.file_text == ("line 7", "line 8", "line 9", "line TEN", "line 11", "line 12", "line 13")
    assert conflict.reason == "hunk 1 of 1 does not match within 100 lines of line 7"


def test_partly_applied_file_conflicts_and_says_so(tmp_path: Path) -> None:
    diff = (
        "--- a/pkg/mod.py\n+++ b/pkg/mod.py\n"
        "@@ -2,3 +2,3 @@\n line 2\n-line 3\n+line three\n line 4\n"
        "@@ -15,3 +15,3 @@\n line 15\n-line 16\n+line sixteen\n line 17\n"
    )
    only_second = TWENTY_LINES.replace("line 16\n", "line sixteen\n")
    root = write_tree(tmp_path / "tree", {"pkg/mod.py": only_second})
    patch = parse_patch_file(write_patch(tmp_path, diff))

    report = apply(patch, root)

    assert report.status == PatchStatus.CONFLICTS
    assert report.conflict is not None
    assert report.conflict.hunk_header == "@@ -15,3 +15,3 @@"
    assert report.conflict.reason == (
        "hunk 2 of 2 does not match within 100 lines of line 15; "
        "its new side is already there, so the file has only part of this patch"
    )
    assert (root / "pkg/mod.py").read_text() == only_second


def test_missing_target_file_conflicts(tmp_path: Path) -> None:
    root = write_tree(tmp_path / "tree", {"pkg/other.py": TWENTY_LINES})
    patch = parse_patch_file(write_patch(tmp_path, LINE_10_DIFF))

    report = apply(patch, root)

    assert report.status == PatchStatus.CONFLICTS
    [file_report] = report.files
    assert file_report.conflict is None
    assert file_report.message == f"target file not found: {root / 'pkg/mod.py'}"
    assert not (root / "pkg/mod.py").exists()


SECOND_FILE_DIFF = """\
--- a/pkg/second.py
+++ b/pkg/second.py
@@ -1,3 +1,3 @@
 first
-second
+SECOND
 third
"""


def test_multi_file_patch_with_a_conflicting_second_file_writes_nothing(tmp_path: Path) -> None:
    root = write_tree(tmp_path / "tree", {"pkg/mod.py": TWENTY_LINES, "pkg/second.py": "first\nsecond!\nthird\n"})
    before = tree_snapshot(root)
    patch = parse_patch_file(write_patch(tmp_path, LINE_10_DIFF + SECOND_FILE_DIFF, targets="pkg/mod.py pkg/second.py"))

    report = apply(patch, root)

    assert report.status == PatchStatus.CONFLICTS
    assert [(f.path, f.status) for f in report.files] == [
        ("pkg/mod.py", PatchStatus.APPLIES),
        ("pkg/second.py", PatchStatus.CONFLICTS),
    ]
    assert tree_snapshot(root) == before


def test_multi_file_patch_applies_to_every_file(tmp_path: Path) -> None:
    root = write_tree(tmp_path / "tree", {"pkg/mod.py": TWENTY_LINES, "pkg/second.py": "first\nsecond\nthird\n"})
    patch = parse_patch_file(write_patch(tmp_path, LINE_10_DIFF + SECOND_FILE_DIFF, targets="pkg/mod.py pkg/second.py"))

    report = apply(patch, root)

    assert report.status == PatchStatus.APPLIES
    assert report.offsets == (0, 0)
    assert tree_snapshot(root) == {
        "pkg/mod.py": TWENTY_LINES_PATCHED.encode(),
        "pkg/second.py": b"first\nSECOND\nthird\n",
    }


def test_multi_file_patch_with_one_file_already_upstream_is_partly_applied(tmp_path: Path) -> None:
    root = write_tree(
        tmp_path / "tree", {"pkg/mod.py": TWENTY_LINES_PATCHED, "pkg/second.py": "first\nsecond\nthird\n"}
    )
    before = tree_snapshot(root)
    patch = parse_patch_file(write_patch(tmp_path, LINE_10_DIFF + SECOND_FILE_DIFF, targets="pkg/mod.py pkg/second.py"))

    report = apply(patch, root)

    assert report.status == PatchStatus.CONFLICTS
    assert report.note == "partly applied: pkg/mod.py already has the change but pkg/second.py does not"
    assert tree_snapshot(root) == before


def test_apply_keeps_the_file_mode_and_leaves_no_temp_files(tmp_path: Path) -> None:
    root = write_tree(tmp_path / "tree", {"pkg/mod.py": TWENTY_LINES})
    os.chmod(root / "pkg/mod.py", 0o751)
    patch = parse_patch_file(write_patch(tmp_path, LINE_10_DIFF))

    apply(patch, root)

    assert stat.S_IMODE(os.stat(root / "pkg/mod.py").st_mode) == 0o751
    assert sorted(p.name for p in (root / "pkg").iterdir()) == ["mod.py"]


def test_no_newline_at_end_of_file_on_both_sides(tmp_path: Path) -> None:
    root = write_tree(tmp_path / "tree", {"pkg/mod.py": "one\ntwo\nthree"})
    diff = (
        "--- a/pkg/mod.py\n+++ b/pkg/mod.py\n@@ -2,2 +2,2 @@\n two\n-three\n"
        "\\ No newline at end of file\n+THREE\n\\ No newline at end of file\n"
    )
    patch = parse_patch_file(write_patch(tmp_path, diff))

    assert apply(patch, root).status == PatchStatus.APPLIES
    assert (root / "pkg/mod.py").read_bytes() == b"one\ntwo\nTHREE"
    assert check(patch, root).status == PatchStatus.ALREADY_UPSTREAM


def test_a_patch_that_adds_the_missing_final_newline(tmp_path: Path) -> None:
    root = write_tree(tmp_path / "tree", {"pkg/mod.py": "one\ntwo"})
    diff = "--- a/pkg/mod.py\n+++ b/pkg/mod.py\n@@ -1,2 +1,2 @@\n one\n-two\n\\ No newline at end of file\n+two\n"
    patch = parse_patch_file(write_patch(tmp_path, diff))

    assert apply(patch, root).status == PatchStatus.APPLIES
    assert (root / "pkg/mod.py").read_bytes() == b"one\ntwo\n"
    # With the newline present, the old side (no newline) no longer matches: it is upstream now.
    assert check(patch, root).status == PatchStatus.ALREADY_UPSTREAM


def test_crlf_files_keep_their_line_ends(tmp_path: Path) -> None:
    root = write_tree(tmp_path / "tree", {"pkg/mod.py": "one\r\ntwo\r\nthree\r\n"})
    diff = "--- a/pkg/mod.py\n+++ b/pkg/mod.py\n@@ -1,3 +1,3 @@\n one\r\n-two\r\n+TWO\r\n three\r\n"
    patch = parse_patch_file(write_patch(tmp_path, diff))

    assert apply(patch, root).status == PatchStatus.APPLIES
    assert (root / "pkg/mod.py").read_bytes() == b"one\r\nTWO\r\nthree\r\n"


def test_parse_patch_from_text_matches_parse_from_file(tmp_path: Path) -> None:
    path = write_patch(tmp_path, LINE_10_DIFF)

    assert parse_patch(path.read_text(), name="demo/change.patch", source=str(path)) == parse_patch_file(path)


# ---------------------------------------------------------------------------------------------- CLI


def test_main_check_prints_one_line_per_patch_and_exits_0(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lines = TWENTY_LINES.splitlines(keepends=True)
    text = "".join(
        ["new 1\n", "new 2\n", "new 3\n", *lines[:15], "inserted A\n", "inserted B\n", "inserted C\n", *lines[15:]]
    )
    root = write_tree(tmp_path / "tree", {"pkg/mod.py": text})
    diff = (
        "--- a/pkg/mod.py\n+++ b/pkg/mod.py\n"
        "@@ -2,3 +2,3 @@\n line 2\n-line 3\n+line three\n line 4\n"
        "@@ -17,3 +17,3 @@\n line 17\n-line 18\n+line eighteen\n line 19\n"
    )
    path = write_patch(tmp_path, diff)

    assert main(["check", "--root", str(root), str(path)]) == 0

    assert capsys.readouterr().out == "applies  demo/change.patch  (2 hunks, offsets +3/+6)\n"
    assert (root / "pkg/mod.py").read_text() == text


def test_main_apply_writes_then_reports_already_upstream(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = write_tree(tmp_path / "tree", {"pkg/mod.py": TWENTY_LINES})
    path = write_patch(tmp_path, LINE_10_DIFF)

    assert main(["apply", "--root", str(root), str(path)]) == 0
    assert main(["apply", "--root", str(root), str(path)]) == 0

    assert capsys.readouterr().out == (
        "applies  demo/change.patch  (1 hunk, offset 0; written)\n"
        "already-upstream  demo/change.patch  (1 hunk, offset 0; nothing to do)\n"
    )
    assert (root / "pkg/mod.py").read_text() == TWENTY_LINES_PATCHED


def test_main_conflict_prints_hunk_and_file_lines_and_exits_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = write_tree(tmp_path / "tree", {"pkg/mod.py": TWENTY_LINES.replace("line 10\n", "line TEN\n")})
    path = write_patch(tmp_path, LINE_10_DIFF)

    assert main(["apply", "--root", str(root), str(path)]) == 1

    assert capsys.readouterr().out == (
        "conflicts  demo/change.patch\n"
        "  pkg/mod.py: hunk 1 of 1 does not match within 100 lines of line 7\n"
        "  patch hunk:\n"
        "    @@ -7,7 +7,7 @@\n"
        "     line 7\n"
        "     line 8\n"
        "     line 9\n"
        "    -line 10\n"
        "    +line ten\n"
        "     line 11\n"
        "     line 12\n"
        "     line 13\n"
        "  file has at line 7:\n"
        "        7 | line 7\n"
        "        8 | line 8\n"
        "        9 | line 9\n"
        "       10 | line TEN\n"
        "       11 | line 11\n"
        "       12 | line 12\n"
        "       13 | line 13\n"
    )


def test_main_missing_target_and_malformed_patch(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "tree"
    root.mkdir()
    good = write_patch(tmp_path, LINE_10_DIFF)

    assert main(["check", "--root", str(root), str(good)]) == 1
    assert capsys.readouterr().out == (
        f"conflicts  demo/change.patch\n  pkg/mod.py: target file not found: {root / 'pkg/mod.py'}\n"
    )

    bad = write_patch(tmp_path, LINE_10_DIFF.replace("@@ -7,7 +7,7 @@", "@@ nonsense @@"))
    assert main(["check", "--root", str(root), str(bad)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == f"error: {bad}:9: malformed hunk header '@@ nonsense @@'\n"


def test_runs_as_a_standalone_script_outside_the_package(tmp_path: Path) -> None:
    # The image build runs a lone copy with the image's python3: no lanectl package, no venv.
    script = tmp_path / "lanectl-in-image" / "patching.py"
    script.parent.mkdir()
    shutil.copy(REPO / "lanectl" / "image" / "in_image" / "patching.py", script)
    root = write_tree(tmp_path / "tree", {"pkg/mod.py": TWENTY_LINES})
    path = write_patch(tmp_path, LINE_10_DIFF)
    python = shutil.which("python3", path="/usr/bin:/usr/local/bin") or sys.executable

    result = subprocess.run(
        [python, "-I", str(script), "apply", "--root", str(root), str(path)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        check=False,
    )

    assert (result.returncode, result.stdout, result.stderr) == (
        0,
        "applies  demo/change.patch  (1 hunk, offset 0; written)\n",
        "",
    )
    assert (root / "pkg/mod.py").read_text() == TWENTY_LINES_PATCHED


# ------------------------------------------------------------------------------------ created files

NEW_FILE_DIFF = """\
--- /dev/null
+++ b/pkg/ops/new/_probe.py
@@ -0,0 +1,3 @@
+\"\"\"Probe.\"\"\"
+
+VALUE = 1
"""
NEW_FILE_TEXT = '"""Probe."""\n\nVALUE = 1\n'
BOTH_TARGETS = "pkg/mod.py, pkg/ops/new/_probe.py"


def test_a_patch_creates_a_file_and_changes_another_all_at_once(tmp_path: Path) -> None:
    root = write_tree(tmp_path / "tree", {"pkg/mod.py": TWENTY_LINES})
    patch = parse_patch_file(write_patch(tmp_path, LINE_10_DIFF + NEW_FILE_DIFF, targets=BOTH_TARGETS))

    assert [(f.path, f.creates) for f in patch.files] == [("pkg/mod.py", False), ("pkg/ops/new/_probe.py", True)]
    checked = check(patch, root)
    assert [(f.path, f.status) for f in checked.files] == [
        ("pkg/mod.py", PatchStatus.APPLIES),
        ("pkg/ops/new/_probe.py", PatchStatus.CREATES),
    ]
    assert patching.format_report(checked) == [
        "applies  demo/change.patch  (1 hunk, offset 0; creates pkg/ops/new/_probe.py)"
    ]
    assert not (root / "pkg/ops").exists()

    applied = apply(patch, root)

    assert patching.format_report(applied) == [
        "applies  demo/change.patch  (1 hunk, offset 0; creates pkg/ops/new/_probe.py; written)"
    ]
    assert tree_snapshot(root) == {
        "pkg/mod.py": TWENTY_LINES_PATCHED.encode(),
        "pkg/ops/new/_probe.py": NEW_FILE_TEXT.encode(),
    }
    assert stat.S_IMODE((root / "pkg/ops/new/_probe.py").stat().st_mode) == 0o644
    again = apply(patch, root)
    assert patching.format_report(again) == [
        "already-upstream  demo/change.patch  "
        "(1 hunk, offset 0; pkg/ops/new/_probe.py exists with this content; nothing to do)"
    ]
    assert [f.status for f in again.files] == [PatchStatus.ALREADY_UPSTREAM, PatchStatus.ALREADY_UPSTREAM]


def test_a_file_the_patch_creates_that_exists_with_other_content_conflicts(tmp_path: Path) -> None:
    root = write_tree(
        tmp_path / "tree", {"pkg/mod.py": TWENTY_LINES, "pkg/ops/new/_probe.py": '"""Probe."""\n\nVALUE = 2\n'}
    )
    before = tree_snapshot(root)
    patch = parse_patch_file(write_patch(tmp_path, LINE_10_DIFF + NEW_FILE_DIFF, targets=BOTH_TARGETS))

    report = apply(patch, root)

    assert patching.format_report(report) == [
        "conflicts  demo/change.patch",
        "  pkg/ops/new/_probe.py: the patch creates this file, but it already exists with other content "
        "(3 lines; first difference at line 3); rebase the patch on what is there, or rename the new file",
    ]
    assert tree_snapshot(root) == before


def test_a_created_file_is_not_written_when_another_file_conflicts(tmp_path: Path) -> None:
    root = write_tree(tmp_path / "tree", {"pkg/mod.py": TWENTY_LINES.replace("line 9\n", "line nine\n")})
    patch = parse_patch_file(write_patch(tmp_path, LINE_10_DIFF + NEW_FILE_DIFF, targets=BOTH_TARGETS))

    report = apply(patch, root)

    assert [(f.path, f.status) for f in report.files] == [
        ("pkg/mod.py", PatchStatus.CONFLICTS),
        ("pkg/ops/new/_probe.py", PatchStatus.CREATES),
    ]
    assert report.status == PatchStatus.CONFLICTS
    assert not (root / "pkg/ops").exists()


def test_a_failed_write_removes_the_folders_it_made(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = write_tree(tmp_path / "tree", {"pkg/mod.py": TWENTY_LINES})
    before = tree_snapshot(root)
    patch = parse_patch_file(write_patch(tmp_path, NEW_FILE_DIFF + LINE_10_DIFF, targets=BOTH_TARGETS))
    real_mkstemp = patching.tempfile.mkstemp
    calls = []

    def mkstemp_then_disk_full(**kwargs: str) -> tuple[int, str]:
        calls.append(kwargs["dir"])
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        return real_mkstemp(**kwargs)

    monkeypatch.setattr(patching.tempfile, "mkstemp", mkstemp_then_disk_full)

    with pytest.raises(OSError, match="No space left"):
        apply(patch, root)

    assert tree_snapshot(root) == before
    assert sorted(p.relative_to(root).as_posix() for p in root.rglob("*")) == ["pkg", "pkg/mod.py"]


def test_a_created_file_without_a_final_newline(tmp_path: Path) -> None:
    root = write_tree(tmp_path / "tree", {})
    diff = "--- /dev/null\n+++ b/new.txt\n@@ -0,0 +1,2 @@\n+one\n+two\n\\ No newline at end of file\n"

    apply(parse_patch_file(write_patch(tmp_path, diff, targets="new.txt")), root)

    assert (root / "new.txt").read_bytes() == b"one\ntwo"


@pytest.mark.parametrize(
    "target_lines",
    [
        "Target: pkg/mod.py, pkg/ops/new/_probe.py",
        "Target: pkg/mod.py pkg/ops/new/_probe.py",
        "Target: pkg/mod.py,pkg/ops/new/_probe.py,",
        "Target: pkg/mod.py\nTarget: pkg/ops/new/_probe.py",
    ],
    ids=["comma-space", "space", "comma-trailing", "repeated-lines"],
)
def test_several_targets_in_any_of_the_accepted_forms(tmp_path: Path, target_lines: str) -> None:
    header = HEADER.replace("Target: {targets}", target_lines)

    patch = parse_patch_file(write_patch(tmp_path, LINE_10_DIFF + NEW_FILE_DIFF, header=header))

    assert patch.targets == ("pkg/mod.py", "pkg/ops/new/_probe.py")


def test_a_created_file_must_be_declared_as_a_target(tmp_path: Path) -> None:
    path = write_patch(tmp_path, LINE_10_DIFF + NEW_FILE_DIFF, targets="pkg/mod.py")

    with pytest.raises(PatchFormatError) as raised:
        parse_patch_file(path)

    assert str(raised.value) == (
        f"{path}:3: Target lists pkg/mod.py but the diff touches pkg/mod.py, pkg/ops/new/_probe.py; they must agree"
    )


def test_main_apply_creates_the_file_in_a_standalone_copy(tmp_path: Path) -> None:
    script = tmp_path / "lanectl-in-image" / "patching.py"
    script.parent.mkdir()
    shutil.copy(REPO / "lanectl" / "image" / "in_image" / "patching.py", script)
    root = write_tree(tmp_path / "tree", {"pkg/mod.py": TWENTY_LINES})
    path = write_patch(tmp_path, LINE_10_DIFF + NEW_FILE_DIFF, targets=BOTH_TARGETS)
    python = shutil.which("python3", path="/usr/bin:/usr/local/bin") or sys.executable

    result = subprocess.run(
        [python, "-I", str(script), "apply", "--root", str(root), str(path)],
        capture_output=True, text=True, cwd=tmp_path, check=False,
    )

    assert (result.returncode, result.stdout, result.stderr) == (
        0,
        "applies  demo/change.patch  (1 hunk, offset 0; creates pkg/ops/new/_probe.py; written)\n",
        "",
    )
    assert (root / "pkg/ops/new/_probe.py").read_text() == NEW_FILE_TEXT


# ------------------------------------------------------------------------------------------ symlinks


@pytest.mark.parametrize(
    ("link", "points_to", "diff", "targets", "message"),
    [
        (
            "pkg", "outside/pkg", LINE_10_DIFF, "pkg/mod.py",
            "pkg/mod.py goes through the symlink pkg -> {points_to}",
        ),
        (
            "pkg/mod.py", "outside/pkg/mod.py", LINE_10_DIFF, "pkg/mod.py",
            "pkg/mod.py is the symlink pkg/mod.py -> {points_to}",
        ),
        (
            "pkg/ops", "outside/ops", NEW_FILE_DIFF, "pkg/ops/new/_probe.py",
            "pkg/ops/new/_probe.py goes through the symlink pkg/ops -> {points_to}",
        ),
    ],
    ids=["symlinked-dir", "symlinked-file", "created-file-under-symlinked-dir"],
)
def test_a_patch_never_writes_through_a_symlink_under_the_root(
    tmp_path: Path, link: str, points_to: str, diff: str, targets: str, message: str
) -> None:
    outside = write_tree(tmp_path / "outside", {"pkg/mod.py": TWENTY_LINES})
    (outside / "ops").mkdir()
    root = tmp_path / "tree"
    (root / link).parent.mkdir(parents=True, exist_ok=True)
    (root / link).symlink_to(tmp_path / points_to)
    before = tree_snapshot(outside)
    patch = parse_patch_file(write_patch(tmp_path, diff, targets=targets))

    report = apply(patch, root)

    assert report.status == PatchStatus.CONFLICTS
    [file_report] = report.files
    assert file_report.message == (
        message.format(points_to=tmp_path / points_to)
        + f"; refusing to write through a symlink (it may lead out of {root}); patch the real file instead"
    )
    assert tree_snapshot(outside) == before
    assert not (outside / "ops" / "new").exists()


# --- `lanectl patches check` over whatever a checkout holds under patches/ ----------------------------------


def _check(project: Path) -> subprocess.CompletedProcess[str]:
    from tests.test_cli import lanectl

    return lanectl("patches", "check", cwd=project, env={"LANECTL_CACHE_DIR": str(project / "cache")})


def test_a_fifo_named_patch_is_refused_without_waiting(project: Path) -> None:
    os.mkfifo(project / "patches" / "vllm" / "zz.patch")
    result = _check(project)
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == (f"lanectl: {project}/patches/vllm/zz.patch: is not a regular file (a FIFO, socket or "
                             "device), not a patch; rename it or move it out of patches/\n")


def test_a_folder_named_patch_is_refused(project: Path) -> None:
    (project / "patches" / "vllm" / "zz.patch").mkdir()
    result = _check(project)
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == (f"lanectl: {project}/patches/vllm/zz.patch: is a folder, not a patch; rename it or "
                             "move it out of patches/\n")


def test_a_hunk_count_of_thousands_of_digits_is_a_located_problem(project: Path) -> None:
    patch = project / "patches" / "stub-engine" / "0001-rejection-sampler-guard.patch"
    text = patch.read_text()
    header = next(line for line in text.splitlines() if line.startswith("@@ "))
    patch.write_text(text.replace(header, "@@ -1," + "5" * 5000 + " +1,3 @@", 1))
    result = _check(project)
    assert (result.returncode, result.stdout) == (2, "")
    line = text.splitlines().index(header) + 1
    assert result.stderr == (f"lanectl: {patch}:{line}: a line number of this hunk header is far past any source "
                             "file's length; fix the header\n")
