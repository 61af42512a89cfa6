"""Every file lanectl writes on the user's word (`report --out/--html`, `render --out`, `import jm --out`,
`bench/gate --out`) follows one rule (lanectl.state.out_paths): a device node, a FIFO, a socket or a folder is
never replaced, the run folder's evidence is never written over, and the check comes before any work, with
exit 2, one line and nothing changed. The special files are real ones, made in the test's folder."""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.test_cli import GOOD, lanectl
from tests.test_jm_import import FIXTURE
from tests.test_release_note import RUN

ROOT = os.geteuid() == 0
TOO_LONG = "n" * 300  # past NAME_MAX (255) on every Linux file system


@pytest.fixture
def run(tmp_path: Path) -> Path:
    copy = tmp_path / RUN.name
    shutil.copytree(RUN, copy)
    return copy


def null_device(folder: Path) -> Path:
    """A character device like /dev/null (major 1, minor 3), made here: root only."""
    path = folder / "null"
    os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    return path


def fifo(folder: Path) -> Path:
    path = folder / "pipe"
    os.mkfifo(path)
    return path


def note(run: Path, *args: str) -> tuple[int, str, str]:
    result = lanectl("--recipes", str(REPO / "recipes"), "report", str(run), "--release-note", *args,
                     cwd=run.parent)
    return result.returncode, result.stdout, result.stderr


def one_line(stderr: str) -> str:
    lines = stderr.splitlines()
    assert len(lines) == 1, stderr
    return lines[0]


@pytest.mark.skipif(not ROOT, reason="mknod of a character device needs root")
@pytest.mark.parametrize("option", ["--out", "--html"])
def test_a_device_node_is_refused_and_stays_a_device(run, tmp_path, option):
    device = null_device(tmp_path)
    code, stdout, stderr = note(run, option, str(device))
    assert (code, stdout) == (2, "")
    assert "is a character device, which lanectl never replaces" in one_line(stderr)
    assert stat.S_ISCHR(device.lstat().st_mode)


@pytest.mark.parametrize("option", ["--out", "--html"])
def test_a_fifo_is_refused_and_stays_a_fifo(run, tmp_path, option):
    pipe = fifo(tmp_path)
    code, _, stderr = note(run, option, str(pipe))
    assert code == 2 and "is a FIFO" in one_line(stderr)
    assert stat.S_ISFIFO(pipe.lstat().st_mode)


def test_a_socket_and_a_folder_are_refused(run, tmp_path):
    import socket

    path = tmp_path / "s"
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(str(path))
        code, _, stderr = note(run, "--out", str(path))
    assert code == 2 and "is a socket" in one_line(stderr)
    code, _, stderr = note(run, "--html", str(tmp_path))
    assert code == 2 and "is a folder" in one_line(stderr)


@pytest.mark.parametrize("name", ["results.json", "ratios.png", "note.md"])
@pytest.mark.parametrize("option", ["--out", "--html"])
def test_nothing_is_written_inside_the_run_folder(run, option, name):
    before = {path.name: path.read_bytes() for path in run.iterdir()}
    code, _, stderr = note(run, option, str(run / name))
    assert code == 2 and "is inside the run folder" in one_line(stderr)
    assert {path.name: path.read_bytes() for path in run.iterdir()} == before


def test_the_run_folder_reached_through_a_link_is_refused_too(run, tmp_path):
    (tmp_path / "alias").symlink_to(run)
    evidence = (run / "results.json").read_bytes()
    code, _, stderr = note(run, "--out", str(tmp_path / "alias" / "results.json"))
    assert code == 2 and "is inside the run folder" in one_line(stderr)
    assert (run / "results.json").read_bytes() == evidence


def test_the_same_file_for_both_is_refused(run, tmp_path):
    code, _, stderr = note(run, "--out", str(tmp_path / "n"), "--html", str(tmp_path / "." / "n"))
    assert code == 2 and "name the same file" in one_line(stderr)
    assert not (tmp_path / "n").exists()


@pytest.mark.parametrize("where", ["too-long", "under-a-file", "missing-folder", "loop"])
def test_a_path_the_os_refuses_is_bad_input(run, tmp_path, where):
    (tmp_path / "file").write_text("x")
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    path = {"too-long": tmp_path / TOO_LONG, "under-a-file": tmp_path / "file" / "note.md",
            "missing-folder": tmp_path / "nope" / "note.md", "loop": tmp_path / "loop" / "note.md"}[where]
    for option in ("--out", "--html"):
        code, _, stderr = note(run, option, str(path))
        assert code == 2, stderr
        assert one_line(stderr).startswith(f"lanectl: {option} {path}")
    assert (tmp_path / "file").read_text() == "x"


def test_a_regular_file_and_a_link_are_still_replaced(run, tmp_path):
    (tmp_path / "old.md").write_text("old")
    (tmp_path / "link.html").symlink_to(tmp_path / "victim")
    code, _, stderr = note(run, "--out", str(tmp_path / "old.md"), "--html", str(tmp_path / "link.html"))
    assert code == 0 and stderr.startswith("wrote the release note to ")
    assert (tmp_path / "old.md").read_text().startswith("# ")
    assert not (tmp_path / "link.html").is_symlink() and not (tmp_path / "victim").exists()


@pytest.mark.parametrize("kind", ["fifo", "file", "non-empty", "too-long", "under-a-file"])
def test_render_checks_its_folder_before_rendering(project, write_recipe, kind):
    write_recipe(GOOD)
    (project / "file").write_text("x")
    (project / "full").mkdir()
    (project / "full" / "kept").write_text("x")
    target = {"fifo": lambda: fifo(project), "file": lambda: project / "file", "non-empty": lambda: project / "full",
              "too-long": lambda: project / TOO_LONG, "under-a-file": lambda: project / "file" / "ctx"}[kind]()
    result = lanectl("render", "b", "--out", str(target), cwd=project)
    assert (result.returncode, result.stdout) == (2, "")
    assert one_line(result.stderr).startswith(f"lanectl: --out {target}")
    assert sorted(path.name for path in (project / "full").iterdir()) == ["kept"]


@pytest.mark.parametrize("kind", ["fifo", "folder", "too-long", "under-a-file"])
def test_import_jm_checks_its_file_before_reading_the_recipe(tmp_path, kind):
    (tmp_path / "file").write_text("x")
    target = {"fifo": lambda: fifo(tmp_path), "folder": lambda: tmp_path, "too-long": lambda: tmp_path / TOO_LONG,
              "under-a-file": lambda: tmp_path / "file" / "r.yaml"}[kind]()
    result = lanectl("import", "jm", str(FIXTURE), "--out", str(target), cwd=tmp_path)
    assert (result.returncode, result.stdout) == (2, "")
    assert one_line(result.stderr).startswith("lanectl: ")
    assert (tmp_path / "file").read_text() == "x"


@pytest.mark.parametrize("command", [["bench"], ["gate", "b", "--control", "a"]])
@pytest.mark.parametrize("kind", ["fifo", "file", "under-a-file", "too-long"])
def test_bench_and_gate_check_out_before_the_run(project, write_recipe, command, kind):
    """No lane serves and no Docker is asked: the --out refusal comes first, before anything would run."""
    write_recipe(GOOD)
    (project / "file").write_text("x")
    target = {"fifo": lambda: fifo(project), "file": lambda: project / "file",
              "under-a-file": lambda: project / "file" / "runs", "too-long": lambda: project / TOO_LONG}[kind]()
    result = lanectl(*command, "--out", str(target), cwd=project,
                     env={"DOCKER_HOST": "unix:///nonexistent/docker.sock"})
    assert (result.returncode, result.stdout) == (2, "")
    assert one_line(result.stderr).startswith(f"lanectl: --out {target}")
