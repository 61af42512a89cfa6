"""Kernel log sources, against the real things: /dev/kmsg, files on disk, a real command."""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from lanectl.errors import BadInput, OperationFailed
from lanectl.host.kernel_log import (
    LOST_RECORDS_NOTE,
    CommandLogSource,
    DevKmsgSource,
    FileLogSource,
    KernelLogLine,
    KernelLogSource,
    open_kernel_log,
    write_kmsg,
)
from lanectl.host.xid import parse_xid

KMSG = "/dev/kmsg"
needs_kmsg = pytest.mark.skipif(
    not (os.path.exists(KMSG) and os.access(KMSG, os.R_OK | os.W_OK)),
    reason="injecting test Xid lines needs write access to /dev/kmsg (root, with the device present)",
)


def xid_line(tag: str) -> str:
    # Xid 13 with a unique tag: recognisable among whatever else the kernel logs meanwhile.
    return f"NVRM: Xid (PCI:0000:01:00): 13, pid=4242, name=lanectl-test, {tag}"


def seq(cursor: str) -> int:
    return int(cursor.rpartition(":")[2])


def tagged(lines: list[KernelLogLine], tag: str) -> list[KernelLogLine]:
    return [line for line in lines if tag in line.text]


def follow_until(
    source: KernelLogSource, cursor: str | None, tag: str, write: Callable[[], None] = lambda: None
) -> KernelLogLine | None:
    """Follows `source` from `cursor` until a line carrying `tag` arrives (20 s at most), calling `write` 0.2 s in."""
    stop = threading.Event()
    # The bound only ends a broken follow; a working one returns at the line, loaded machine or not.
    timers = [threading.Timer(20.0, stop.set), threading.Timer(0.2, write)]
    for timer in timers:
        timer.start()
    try:
        for line in source.follow(cursor, stop):
            if tag in line.text:
                return line
        return None
    finally:
        for timer in timers:
            timer.cancel()


# --- /dev/kmsg --------------------------------------------------------------------------------------


@needs_kmsg
def test_kmsg_read_new_returns_a_new_line_once() -> None:
    source = DevKmsgSource()
    tag = f"kmsg-once-{uuid.uuid4()}"
    lines, armed = source.read_new(None)
    assert lines == []

    write_kmsg(xid_line(tag))
    lines, cursor = source.read_new(armed)

    [line] = tagged(lines, tag)
    assert line.text == xid_line(tag)
    assert seq(armed) < seq(line.cursor) <= seq(cursor)
    xid = parse_xid(line.text, line.cursor)
    assert xid is not None and (xid.code, xid.pid, xid.message) == (13, 4242, tag)
    assert tagged(source.read_new(cursor)[0], tag) == []
    assert tagged(source.read_new(line.cursor)[0], tag) == [], "a line's own cursor is after it"


@needs_kmsg
def test_kmsg_arming_skips_old_lines() -> None:
    source = DevKmsgSource()
    tag = f"kmsg-old-{uuid.uuid4()}"
    write_kmsg(xid_line(tag))

    lines, armed = source.read_new(None)
    assert lines == []
    later, _ = source.read_new(armed)
    assert tagged(later, tag) == []


@needs_kmsg
def test_kmsg_cursor_from_another_boot_reads_the_whole_buffer() -> None:
    source = DevKmsgSource()
    tag = f"kmsg-boot-{uuid.uuid4()}"
    write_kmsg(xid_line(tag))
    _, now = source.read_new(None)
    boot_id, _, last_seq = now.rpartition(":")

    # seq restarts at 0 on every boot: the same number from another boot says nothing about this one.
    other_boot, _ = source.read_new(f"{uuid.UUID(int=0)}:{last_seq}")
    # A seq beyond the buffer's last one cannot be from this buffer either: start over.
    beyond, _ = source.read_new(f"{boot_id}:{int(last_seq) + 1000}")

    # (The buffer's first records are not compared: other processes' lines push them out meanwhile.)
    assert len(tagged(other_boot, tag)) == 1
    assert len(tagged(beyond, tag)) == 1
    assert not other_boot[0].text.startswith(LOST_RECORDS_NOTE)


@needs_kmsg
def test_kmsg_reports_records_overwritten_before_they_were_read() -> None:
    source = DevKmsgSource()
    _, now = source.read_new(None)
    boot_id = now.rpartition(":")[0]
    first = int(source.read_new(f"{boot_id}:-1")[0][0].cursor.rpartition(":")[2])
    if first < 3:
        pytest.skip("the kernel ring buffer has not wrapped yet: no record is missing to report")

    lines, _ = source.read_new(f"{boot_id}:{first - 3}")

    # Lines logged meanwhile by others may have pushed more records out: the gap ends before the first one left.
    gap_end = seq(lines[1].cursor) - 1
    assert gap_end >= first - 1
    assert lines[0] == KernelLogLine(
        f"{LOST_RECORDS_NOTE} seq {first - 2}-{gap_end} ({gap_end - first + 3} records)", f"{boot_id}:{gap_end}"
    )


@needs_kmsg
def test_kmsg_follow_yields_a_line_as_it_is_written() -> None:
    source = DevKmsgSource()
    tag = f"kmsg-follow-{uuid.uuid4()}"
    # Armed before the follow starts, so the line counts as new however late the follow's own first read of
    # the buffer runs: a follow from None arms at the end of that read, and on a loaded machine the write at
    # 0.2 s fell before it ended (the line was then old, and never yielded). Unloaded, the follow is already
    # polling when the line comes, which is the path this test is for.
    _, armed = source.read_new(None)

    found = follow_until(source, armed, tag, lambda: write_kmsg(xid_line(tag)))

    assert found is not None and found.text == xid_line(tag)


@needs_kmsg
def test_kmsg_follow_starts_after_a_cursor() -> None:
    source = DevKmsgSource()
    tag = f"kmsg-follow-cursor-{uuid.uuid4()}"
    _, armed = source.read_new(None)
    write_kmsg(xid_line(tag))

    found = follow_until(source, armed, tag)

    assert found is not None and found.text == xid_line(tag)


@pytest.mark.parametrize("spec", [pytest.param("kmsg", marks=needs_kmsg), "file:{log}", "cmd:cat {log}"])
def test_follow_ends_soon_after_stop_while_waiting_for_lines(spec: str, tmp_path: Path) -> None:
    (tmp_path / "log").write_text("old\n")
    source = open_kernel_log(spec.format(log=tmp_path / "log"))
    stop = threading.Event()
    stopped_at: list[float] = []

    def set_stop() -> None:
        stopped_at.append(time.monotonic())
        stop.set()

    threading.Timer(0.3, set_stop).start()
    for _ in source.follow(None, stop):
        pass
    ended_at = time.monotonic()

    assert stopped_at, "follow ended before stop was set"
    # It notices at its next poll (0.2 s); the margin is for a loaded CI machine, not for a slower follow.
    assert ended_at - stopped_at[0] < 3.0


def test_kmsg_that_cannot_be_opened_says_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(OperationFailed) as raised:
        DevKmsgSource(str(tmp_path / "kmsg")).read_new(None)
    assert str(raised.value) == (
        f"cannot read the kernel log {tmp_path / 'kmsg'}: No such file or directory; run as root, "
        "or set the kernel log to 'file:/var/log/kern.log' or 'cmd:dmesg --raw'"
    )


@pytest.mark.skipif(
    os.geteuid() != 0 or not os.path.exists(KMSG) or Path("/proc/sys/kernel/dmesg_restrict").read_text().strip() != "1",
    reason="shows a non-root reader refused: needs root (to drop to nobody) and kernel.dmesg_restrict=1",
)
def test_kmsg_refused_to_a_non_root_user() -> None:
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - runs in the child
        os.close(read_end)
        try:
            os.setgid(65534)
            os.setuid(65534)
            DevKmsgSource().read_new(None)
            message = "no error"
        except OperationFailed as error:
            message = str(error)
        os.write(write_end, message.encode())
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        message = pipe.read().decode()
    os.waitpid(child, 0)
    assert message == (
        "cannot read the kernel log /dev/kmsg: Operation not permitted; run as root, "
        "or set the kernel log to 'file:/var/log/kern.log' or 'cmd:dmesg --raw'"
    )


# --- a log file ----------------------------------------------------------------------------------------


def append(path: Path, text: str) -> None:
    with path.open("a") as handle:
        handle.write(text)


def texts(lines: list[KernelLogLine]) -> list[str]:
    return [line.text for line in lines]


def test_file_reads_appended_lines_once(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text("old line\n")
    source = FileLogSource(log)
    inode = log.stat().st_ino

    lines, armed = source.read_new(None)
    assert (lines, armed) == ([], f"{inode}:9")

    append(log, "one\ntwo\n")
    lines, cursor = source.read_new(armed)
    assert lines == [KernelLogLine("one", f"{inode}:13"), KernelLogLine("two", f"{inode}:17")]
    assert cursor == f"{inode}:17"
    assert source.read_new(cursor) == ([], cursor)


def test_file_leaves_an_unfinished_line_for_later(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text("")
    source = FileLogSource(log)
    _, cursor = source.read_new(None)

    append(log, "whole\r\npart")
    lines, cursor = source.read_new(cursor)
    assert texts(lines) == ["whole"]
    append(log, "ial\nbad \xff\x0c byte\n")
    lines, cursor = source.read_new(cursor)
    assert texts(lines) == ["partial", "bad \xff\x0c byte"]


def test_file_replaced_by_rotation_is_read_from_its_start(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text("old\n")
    source = FileLogSource(log)
    _, cursor = source.read_new(None)

    log.rename(tmp_path / "kern.log.1")
    lines, same = source.read_new(cursor)
    assert (lines, same) == ([], cursor), "a file missing mid-rotation is waited for"
    log.write_text("after rotation\n")  # longer than the old offset: only the inode tells
    lines, cursor = source.read_new(cursor)

    assert lines == [KernelLogLine("after rotation", f"{log.stat().st_ino}:15")]


def test_file_truncated_is_read_from_its_start(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text("a line long enough to be longer than what follows\n")
    source = FileLogSource(log)
    inode = log.stat().st_ino
    _, cursor = source.read_new(None)

    with log.open("r+") as handle:
        handle.truncate(0)
        handle.write("short\n")
    lines, cursor = source.read_new(cursor)

    assert lines == [KernelLogLine("short", f"{inode}:6")]


def test_file_missing_when_armed(tmp_path: Path) -> None:
    with pytest.raises(OperationFailed, match=r"^kernel log file .*/nope.log does not exist$"):
        FileLogSource(tmp_path / "nope.log").read_new(None)


def test_file_follow_yields_an_appended_line(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text("old\n")
    tag = "file-follow"

    source = FileLogSource(log)
    _, armed = source.read_new(None)  # armed first, for the reason the /dev/kmsg follow test gives

    found = follow_until(source, armed, tag, lambda: append(log, xid_line(tag) + "\n"))

    assert found == KernelLogLine(xid_line(tag), f"{log.stat().st_ino}:{log.stat().st_size}")


# --- a command's output ---------------------------------------------------------------------------------


def test_command_reports_new_output_lines_once(tmp_path: Path) -> None:
    log = tmp_path / "dmesg.txt"
    log.write_text("[1.0] boot\n[2.0] old\n")
    source = CommandLogSource(["cat", str(log)])

    lines, armed = source.read_new(None)
    assert lines == []
    append(log, "[3.0] new\n[4.0] newer\n")
    lines, cursor = source.read_new(armed)

    assert texts(lines) == ["[3.0] new", "[4.0] newer"]
    assert source.read_new(lines[0].cursor)[0] == [lines[1]]
    assert source.read_new(cursor) == ([], cursor)


def test_command_output_that_wrapped_keeps_the_lines_after_the_last_seen(tmp_path: Path) -> None:
    log = tmp_path / "dmesg.txt"
    log.write_text("[1.0] a\n[2.0] b\n[3.0] c\n")
    source = CommandLogSource(["cat", str(log)])
    _, cursor = source.read_new(None)

    log.write_text("[2.0] b\n[3.0] c\n[4.0] d\n")  # the ring buffer dropped its oldest line
    lines, cursor = source.read_new(cursor)
    assert texts(lines) == ["[4.0] d"]

    log.write_text("[0.5] rebooted\n")  # the last line seen is gone: all of it is new
    lines, _ = source.read_new(cursor)
    assert texts(lines) == ["[0.5] rebooted"]


def test_command_that_fails(tmp_path: Path) -> None:
    with pytest.raises(OperationFailed) as raised:
        CommandLogSource(["cat", str(tmp_path / "nope")]).read_new(None)
    assert str(raised.value) == (
        f"kernel log command `cat {tmp_path / 'nope'}` failed: cat: {tmp_path / 'nope'}: No such file or directory"
    )
    with pytest.raises(OperationFailed, match="No such file or directory"):
        CommandLogSource(["/nonexistent/dmesg"]).read_new(None)


# --- choosing a source --------------------------------------------------------------------------------


def test_open_kernel_log_forms() -> None:
    assert isinstance(open_kernel_log("kmsg"), DevKmsgSource)
    assert isinstance(open_kernel_log(), DevKmsgSource)
    file_source = open_kernel_log("file:/var/log/kern.log")
    assert isinstance(file_source, FileLogSource) and file_source.path == Path("/var/log/kern.log")
    command = open_kernel_log("cmd:dmesg --raw --since 'last boot'")
    assert isinstance(command, CommandLogSource) and command.argv == ["dmesg", "--raw", "--since", "last boot"]


@pytest.mark.parametrize("spec", ["", "dmesg", "file:", "cmd:", "cmd:  ", "kmsg:/dev/kmsg", "journal"])
def test_open_kernel_log_rejects_other_forms(spec: str) -> None:
    with pytest.raises(BadInput) as raised:
        open_kernel_log(spec)
    assert str(raised.value) == (
        f"kernel log {spec!r} is not one of 'kmsg' (read /dev/kmsg, needs root), "
        "'kmsg-file:PATH' (records as read from /dev/kmsg), 'file:/var/log/kern.log' or 'cmd:dmesg --raw'"
    )


def test_open_kernel_log_bad_quoting() -> None:
    with pytest.raises(BadInput, match=r"^kernel log \"cmd:dmesg 'x\": No closing quotation$"):
        open_kernel_log("cmd:dmesg 'x")


# --- facilities ------------------------------------------------------------------------------------

from lanectl.host.kernel_log import KmsgFileSource, text_facility  # noqa: E402


def test_a_kmsg_record_file_hands_out_each_records_facility(tmp_path: Path) -> None:
    log = tmp_path / "kmsg"
    log.write_text("6,1,100,-;boot line\n")
    source = open_kernel_log(f"kmsg-file:{log}")
    assert isinstance(source, KmsgFileSource)
    _, cursor = source.read_new(None)
    with log.open("a") as records:
        records.write("3,2,200,-;NVRM: Xid (PCI:0000:01:00): 79, pid=1, name=x, y\n SUBSYSTEM=pci\n")
        records.write("11,3,300,-;NVRM: Xid (PCI:0000:01:00): 79, pid=1, name=x, y\n")
        records.write("3,4,400,-;unfinished")
    lines, cursor = source.read_new(cursor)
    assert [(line.facility, seq(line.cursor)) for line in lines] == [(0, 2), (1, 3)]
    assert source.read_new(cursor)[0] == []


@pytest.mark.parametrize(("text", "facility"), [
    ("<3>[ 12.345] NVRM: Xid", 0), ("<11>[ 12.345] NVRM: Xid", 1), ("[ 12.345] NVRM: Xid", None),
    ("Nov 30 12:00:00 gpu-1 kernel: NVRM: Xid", 0), ("2026-11-30T12:00:00.1+00:00 gpu-1 kernel: x", 0),
    ("Nov 30 12:00:00 gpu-1 docker/abc[1]: kernel: NVRM: Xid", None), ("NVRM: Xid", None),
])
def test_text_lines_show_their_facility_only_where_the_log_says_it(text: str, facility: int | None) -> None:
    assert text_facility(text) == facility


# --- sources that cannot tell the kernel from users are refused, naming the ones that can ----------------

LOGGER_FORGERY = "Dec  1 10:00:01 box kernel: NVRM: Xid (PCI:0000:01:00): 79, pid=1, name=x, GPU has fallen off."


@pytest.mark.parametrize("name", ["syslog", "messages", "syslog.1", "messages-20261201", "user.log"])
def test_a_mixed_syslog_file_is_refused_by_name_through_the_cli(tmp_path: Path, name: str) -> None:
    import subprocess
    import sys

    from tests.conftest import REPO

    log = tmp_path / name
    log.write_text(LOGGER_FORGERY + "\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("LANECTL_")}
    env.update({"LANECTL_STATE_DIR": str(tmp_path / "state"), "LANECTL_RECIPES": str(REPO / "recipes")})

    result = subprocess.run([sys.executable, "-m", "lanectl", "watchdog", "check", "--kernel-log", f"file:{log}"],
                            capture_output=True, text=True, env=env, timeout=120)

    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.startswith(f"lanectl: kernel log 'file:{log}': {log} holds every program's lines")
    assert "'kmsg' (/dev/kmsg: each record carries its facility" in result.stderr
    assert "'file:/var/log/kern.log' (rsyslog writes only kern.* there)" in result.stderr


def test_a_file_with_other_programs_lines_is_refused_when_read(tmp_path: Path) -> None:
    log = tmp_path / "combined.log"
    log.write_text("")
    source = open_kernel_log(f"file:{log}")
    _, cursor = source.read_new(None)
    append(log, "Dec  1 10:00:00 box CRON[12]: (root) CMD (run-parts)\n" + LOGGER_FORGERY + "\n")

    with pytest.raises(BadInput) as raised:
        source.read_new(cursor)

    assert str(raised.value).startswith(f"kernel log file {log} holds lines of other programs ('CRON', byte 0)")
    assert "'kmsg' (/dev/kmsg" in str(raised.value)


def test_kern_log_with_kernel_lines_only_is_read_and_believed(tmp_path: Path) -> None:
    from lanectl.host.xid import believed_xid

    log = tmp_path / "kern.log"
    log.write_text("")
    source = open_kernel_log(f"file:{log}")
    _, cursor = source.read_new(None)
    append(log, "Dec  1 10:00:00 box kernel: [   12.3] usb 1-1: new device\n" + LOGGER_FORGERY + "\n")

    lines, _ = source.read_new(cursor)

    assert [believed_xid(line) is not None for line in lines] == [False, True]


@pytest.mark.parametrize("spec", ["cmd:dmesg", "cmd:dmesg -T", "cmd:/usr/bin/dmesg --since 'last boot'"])
def test_plain_dmesg_is_refused_for_it_cannot_show_the_facility(spec: str) -> None:
    with pytest.raises(BadInput) as raised:
        open_kernel_log(spec)
    assert "plain dmesg does not show a line's facility" in str(raised.value)
    assert "add --raw" in str(raised.value) and "'kmsg' (/dev/kmsg" in str(raised.value)


@pytest.mark.parametrize("spec", ["cmd:dmesg --raw", "cmd:dmesg -r", "cmd:dmesg -rT", "cmd:dmesg -T --raw"])
def test_dmesg_with_raw_priorities_is_accepted(spec: str) -> None:
    assert isinstance(open_kernel_log(spec), CommandLogSource)
