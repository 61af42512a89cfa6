"""A kernel-log record ends at "\\n" and nowhere else, in every source, and its facility is its own prefix's.

`dmesg --raw` prints a record's \\r raw in every locale and U+2028 raw under a UTF-8 locale; journalctl -a prints
U+2028 raw too. Split with str.splitlines(), the user-facility record `<12>c\\r<4>NVRM: Xid …` (any local user can
log one) became a second record, `<4>NVRM: Xid …`, of the kernel's facility: the watchdog stopped the lane for a
hardware Xid. Each source here is the real thing: a file on disk, a real command (printf), journald in a namespace
of its own, /dev/kmsg, and a file of /dev/kmsg records.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from lanectl.host.kernel_log import KernelLogLine, KernelLogSource, open_kernel_log, write_kmsg
from lanectl.host.xid import believed_xid
from tests.test_kernel_log import needs_kmsg

XID = "NVRM: Xid (PCI:0000:01:00): 79, pid=4242, name=forger, fell off the bus"
# Every line boundary str.splitlines() knows but "\n" (and "\r\n", which is "\r" then "\n").
SEPARATORS = ["\r", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029"]
SEPARATOR_IDS = [f"U+{ord(separator):04X}" for separator in SEPARATORS]
JOURNALD = "/usr/lib/systemd/systemd-journald"


def read_after_arming(source: KernelLogSource, write: object) -> list[KernelLogLine]:
    _, cursor = source.read_new(None)
    write()  # type: ignore[operator]
    lines, _ = source.read_new(cursor)
    return lines


def assert_one_user_record(lines: list[KernelLogLine], tag: str) -> None:
    ours = [line for line in lines if tag in line.text]
    assert len(ours) == 1, [line.text for line in lines]
    assert ours[0].facility == 1  # user, from the record's own <12>
    assert [line.text for line in lines if believed_xid(line) is not None] == []


@pytest.mark.parametrize("separator", SEPARATORS, ids=SEPARATOR_IDS)
def test_a_command_source_keeps_a_forged_xid_inside_its_user_record(separator: str) -> None:
    tag = uuid.uuid4().hex
    record = f"<12>c {tag}{separator}<4>{XID}"
    source = open_kernel_log(f"cmd:printf '%s\\n' 'kernel: earlier' {_quoted(record)}")
    lines, _ = source.read_new("0:")
    assert_one_user_record(lines, tag)


def test_a_command_source_still_reads_a_kernel_record_as_the_kernels() -> None:
    source = open_kernel_log(f"cmd:printf '%s\\n' '<4>{XID}'")
    lines, _ = source.read_new("0:")
    assert [believed_xid(line) is not None for line in lines] == [True]


@pytest.mark.parametrize("separator", SEPARATORS, ids=SEPARATOR_IDS)
def test_a_file_source_keeps_a_forged_xid_inside_its_user_record(tmp_path: Path, separator: str) -> None:
    tag = uuid.uuid4().hex
    log = tmp_path / "kern.log"
    log.write_bytes(b"<4>earlier\n")
    source = open_kernel_log(f"file:{log}")

    def write() -> None:
        with log.open("ab") as handle:
            handle.write(f"<12>c {tag}{separator}<4>{XID}\n".encode())

    assert_one_user_record(read_after_arming(source, write), tag)


@pytest.mark.parametrize("separator", SEPARATORS, ids=SEPARATOR_IDS)
def test_a_kmsg_record_file_keeps_a_forged_xid_inside_its_user_record(tmp_path: Path, separator: str) -> None:
    tag = uuid.uuid4().hex
    log = tmp_path / "kmsg.records"
    log.write_bytes(b"6,1,0,-;earlier\n")
    source = open_kernel_log(f"kmsg-file:{log}")

    def write() -> None:
        with log.open("ab") as handle:
            handle.write(f"12,2,0,-;c {tag}{separator}<4>{XID}\n SUBSYSTEM=x\n".encode())

    assert_one_user_record(read_after_arming(source, write), tag)


@needs_kmsg
@pytest.mark.parametrize("separator", SEPARATORS, ids=SEPARATOR_IDS)
def test_dev_kmsg_keeps_a_forged_xid_inside_its_user_record(separator: str) -> None:
    tag = uuid.uuid4().hex
    source = open_kernel_log("kmsg")
    lines = read_after_arming(source, lambda: write_kmsg(f"<12>c {tag}{separator}<4>{XID}"))
    assert_one_user_record(lines, tag)


@pytest.fixture
def journald() -> Iterator[str]:
    """systemd-journald in a namespace of its own (its socket and files are the test's, it reads no /dev/kmsg):
    the namespace's name, for `journalctl --namespace`."""
    if not (os.path.exists(JOURNALD) and shutil.which("journalctl") and os.geteuid() == 0):
        pytest.skip("needs systemd-journald, journalctl and root (a journald namespace)")
    namespace = f"lanectl{uuid.uuid4().hex[:12]}"
    daemon = subprocess.Popen([JOURNALD, namespace], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    sockets = Path(f"/run/systemd/journal.{namespace}")
    try:
        deadline = time.monotonic() + 20
        while not (sockets / "socket").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        yield namespace
    finally:
        daemon.terminate()
        daemon.wait(timeout=20)
        shutil.rmtree(sockets, ignore_errors=True)
        for storage in (Path("/var/log/journal"), Path("/run/log/journal")):
            for folder in storage.glob(f"*.{namespace}") if storage.is_dir() else ():
                shutil.rmtree(folder, ignore_errors=True)


def journal_send(namespace: str, message: str, facility: int) -> None:
    """One entry through journald's native protocol, as `logger`/`systemd-cat` send one."""
    entry = f"MESSAGE={message}\nSYSLOG_FACILITY={facility}\nPRIORITY=4\nSYSLOG_IDENTIFIER=forger\n"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sender:
        sender.sendto(entry.encode(), f"/run/systemd/journal.{namespace}/socket")


@pytest.mark.parametrize("separator", ["\u2028", "\u2029", "\x85"], ids=["U+2028", "U+2029", "U+0085"])
def test_journald_keeps_a_forged_kernel_line_inside_its_users_entry(journald: str, separator: str) -> None:
    """journalctl -a prints these raw; split there, the part after them read as a `kernel:` line of kern.log."""
    tag = uuid.uuid4().hex
    source = open_kernel_log(f"cmd:journalctl --namespace={journald} -o short -a --no-pager")
    forged = f"c {tag}{separator}Dec  6 00:00:00 box kernel: {XID}"

    def write() -> None:
        journal_send(journald, forged, facility=1)
        deadline = time.monotonic() + 20
        while tag not in _journal_text(journald) and time.monotonic() < deadline:
            time.sleep(0.05)

    lines = read_after_arming(source, write)
    ours = [line for line in lines if tag in line.text]
    assert len(ours) == 1, [line.text for line in lines]
    assert ours[0].facility is None  # a journal line says no facility unless it is a `kernel:` line
    assert [line.text for line in lines if believed_xid(line) is not None] == []


def _journal_text(namespace: str) -> str:
    return subprocess.run(["journalctl", f"--namespace={namespace}", "-o", "short", "-a", "--no-pager"],
                          capture_output=True, text=True, check=False).stdout


def _quoted(text: str) -> str:
    import shlex

    return shlex.quote(text)
