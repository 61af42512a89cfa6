"""Where the watchdog reads kernel lines from: /dev/kmsg, a log file, or a command's output.

Every source hands out a cursor with each line, so that `watchdog check`, run by cron every minute,
sees each line exactly once: it saves the cursor of its last read and passes it back next time.
A cursor of None means "from now on": a freshly armed watchdog must not act on last week's Xid.
Cursors are opaque strings, meaningful only to the kind of source that made them; a cursor a source
cannot read (say, after the source was changed from a file to /dev/kmsg) counts as None.
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
import select
import shlex
import stat
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

from lanectl.errors import BadInput, OperationFailed
from lanectl.records import frozen

DEFAULT_SPEC = "kmsg"
SPEC_FORMS = ("'kmsg' (read /dev/kmsg, needs root), 'kmsg-file:PATH' (records as read from /dev/kmsg), "
              "'file:/var/log/kern.log' or 'cmd:dmesg --raw'")

# Text of the line a source reports in place of records it could not read in time
# (the kernel's ring buffer overwrote them), so the loss is visible to whoever logs the lines.
LOST_RECORDS_NOTE = "lanectl: kernel log records lost before they were read:"

KMSG_PATH = "/dev/kmsg"
BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"
# The kernel refuses (EINVAL) a read into a buffer smaller than one record; records are at most 8 KiB.
KMSG_READ_SIZE = 16384
FOLLOW_POLL_SECONDS = 0.2
COMMAND_POLL_SECONDS = 0.5
COMMAND_TIMEOUT_SECONDS = 30.0


@frozen
class KernelLogLine:
    """A line of the kernel log, with the cursor that reads on from it."""

    text: str
    cursor: str  # pass back to the same source to read what came after this line
    # The syslog facility the line was logged under (0: the kernel), None when the source cannot tell.
    facility: int | None = None


# A syslog header whose tag is `kernel:`, as rsyslog writes kern.log (traditional or RFC 3339 time).
_SYSLOG_KERNEL = re.compile(r"^(?:[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d|\d{4}-\d\d-\d\dT[\d:.]+(?:Z|[+-]\d\d:?\d\d)) "
                            r"\S+ kernel: ")
_RAW_PRIORITY = re.compile(r"^<(?P<prio>\d{1,3})>")
# Any syslog header, to tell a kern.log (every tag `kernel`) from a log of every facility.
_SYSLOG_TAG = re.compile(r"^(?:[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d|\d{4}-\d\d-\d\dT[\d:.]+(?:Z|[+-]\d\d:?\d\d)) "
                         r"\S+ (?P<tag>[^\s:\[]+)(?:\[\d+\])?: ")
# Files where rsyslog (Debian: syslog, RHEL: messages) writes every facility, rotated copies included:
# there `logger -t kernel 'NVRM: Xid …'`, which any user may run, gives a line the same as the kernel's.
_MIXED_LOG_NAMES = re.compile(r"^(?:syslog|messages|user\.log|daemon\.log|all\.log)(?:\.\d+|-\d{8})?$")
TRUSTED_SOURCES = ("'kmsg' (/dev/kmsg: each record carries its facility, and only the kernel's is `kern`), "
                   "'file:/var/log/kern.log' (rsyslog writes only kern.* there) or 'cmd:dmesg --raw'")


def text_facility(text: str) -> int | None:
    """The facility a text log line shows: dmesg --raw's `<prio>` (facility = prio >> 3), or 0 for a
    syslog line tagged `kernel:` (rsyslog's tag for kernel records; kern.log holds only kern.*);
    None for a line that does not say (plain dmesg, which mixes in lines written to /dev/kmsg)."""
    raw = _RAW_PRIORITY.match(text)
    if raw is not None:
        return int(raw["prio"]) >> 3
    if _SYSLOG_KERNEL.match(text):
        return 0
    return None


class KernelLogSource(Protocol):
    def read_new(self, cursor: str | None) -> tuple[list[KernelLogLine], str]:
        """The lines after `cursor` and the cursor to pass next time; None: no lines, the cursor of now."""
        ...

    def follow(self, cursor: str | None, stop: threading.Event) -> Iterator[KernelLogLine]:
        """The lines after `cursor`, then each new line as it arrives, until `stop` is set (seen within 0.5 s)."""
        ...


def open_kernel_log(spec: str = DEFAULT_SPEC) -> KernelLogSource:
    """The source a `kernel_log` setting names: 'kmsg', 'file:PATH' or 'cmd:COMMAND ARGS'."""
    if spec == "kmsg":
        return DevKmsgSource()
    if spec.startswith("kmsg-file:") and spec[len("kmsg-file:") :].strip():
        return KmsgFileSource(Path(spec[len("kmsg-file:") :].strip()))
    if spec.startswith("file:") and spec[len("file:") :].strip():
        path = Path(spec[len("file:") :].strip())
        if _MIXED_LOG_NAMES.match(path.name):
            raise BadInput(f"kernel log {spec!r}: {path} holds every program's lines, and any user can write one "
                           f"that reads like the kernel's (`logger -t kernel 'NVRM: Xid …'`); use {TRUSTED_SOURCES}")
        return FileLogSource(path)
    if spec.startswith("cmd:"):
        try:
            argv = shlex.split(spec[len("cmd:") :])
        except ValueError as error:
            raise BadInput(f"kernel log {spec!r}: {error}") from None
        if argv and Path(argv[0]).name == "dmesg" and not any(_raw_flag(arg) for arg in argv[1:]):
            raise BadInput(f"kernel log {spec!r}: plain dmesg does not show a line's facility, so a line written "
                           f"to /dev/kmsg from user space cannot be told from the kernel's; add --raw, or use "
                           f"{TRUSTED_SOURCES}")
        if argv:
            return CommandLogSource(argv)
    raise BadInput(f"kernel log {spec!r} is not one of {SPEC_FORMS}")


def _raw_flag(arg: str) -> bool:
    """dmesg's `--raw`/`-r`, also in a cluster of short options (`-rT`)."""
    return arg == "--raw" or (arg.startswith("-") and not arg.startswith("--") and "r" in arg[1:])


def write_kmsg(text: str, path: str = KMSG_PATH) -> None:
    """Log one line to the kernel log, as root (for tests and demonstrations).

    Opened afresh each time because the kernel rate-limits writes per open file (printk_devkmsg=ratelimit).
    """
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.rstrip("\n").encode() + b"\n")
    finally:
        os.close(fd)


# --- /dev/kmsg ---------------------------------------------------------------------------------


@frozen
class _KmsgRecord:
    """A record of /dev/kmsg: its sequence number, text and syslog facility."""

    seq: int
    text: str
    facility: int


_KMSG_ESCAPE = re.compile(rb"\\x([0-9a-fA-F]{2})")
# The boot id is a UUID (empty where /proc does not show it), which keeps a file source's
# `<inode>:<offset>` from being taken for a kmsg cursor of an earlier boot.
_KMSG_CURSOR = re.compile(r"^(?P<boot>[0-9a-f-]{36}|):(?P<seq>-1|\d+)$")


def _parse_kmsg_record(raw: bytes) -> _KmsgRecord | None:
    """One read() of /dev/kmsg: `prio,seq,usec,flags[,...];text\\n` then ` KEY=value\\n` lines, skipped."""
    header, separator, rest = raw.partition(b";")
    fields = header.split(b",")
    if not separator or len(fields) < 2 or not fields[0].isdigit() or not fields[1].isdigit():
        return None
    if len(fields[0]) > 4 or len(fields[1]) > 20:
        return None  # not a record the kernel wrote: prio fits 11 bits, seq 64
    body = rest.split(b"\n", 1)[0]
    # The kernel escapes control characters, backslashes and every non-ASCII byte as \xNN.
    body = _KMSG_ESCAPE.sub(lambda m: bytes([int(m[1], 16)]), body)
    # prio is facility << 3 | level: the kernel's own lines have facility 0 (kern), lines written to
    # /dev/kmsg from user space have 1 (user) unless the writer gave a prefix, which the kernel
    # refuses to be 0 (kern): so facility 0 is the kernel's word.
    return _KmsgRecord(int(fields[1]), body.decode("utf-8", errors="replace"), int(fields[0]) >> 3)


class DevKmsgSource:
    """The kernel's own ring buffer. Cursor: `<boot id>:<seq>` (seq restarts at 0 on every boot).

    Every record is handed out with its facility; lines written to /dev/kmsg from user space carry
    `user`, not `kern`, and `xid.believed_xid` ignores them.
    """

    def __init__(self, path: str = KMSG_PATH, boot_id_path: str = BOOT_ID_PATH):
        self.path = path
        self.boot_id_path = boot_id_path

    def read_new(self, cursor: str | None) -> tuple[list[KernelLogLine], str]:
        fd = self._open()
        try:
            boot_id = self._boot_id()
            after = self._start_seq(cursor, boot_id)
            records = list(self._drain(fd))
        finally:
            os.close(fd)
        if after is None:
            return [], _kmsg_cursor(boot_id, records[-1].seq if records else -1)
        if records and records[-1].seq < after:
            after = -1  # same boot id but an older seq: the cursor is not from this buffer; start over
        lines, last = _kmsg_lines(records, after, boot_id)
        return lines, _kmsg_cursor(boot_id, last)

    def follow(self, cursor: str | None, stop: threading.Event) -> Iterator[KernelLogLine]:
        fd = self._open()
        try:
            boot_id = self._boot_id()
            after = self._start_seq(cursor, boot_id)
            if after is None:
                # Read to the end rather than SEEK_END, to learn the last seq: spotting records
                # overwritten before they were read relies on knowing the seq that came before.
                records = list(self._drain(fd))
                after = records[-1].seq if records else -1
                pending: list[_KmsgRecord] = []
            else:
                pending = list(self._drain(fd))
                if pending and pending[-1].seq < after:
                    after = -1
            poller = select.poll()
            poller.register(fd, select.POLLIN)
            while not stop.is_set():
                lines, after = _kmsg_lines(pending, after, boot_id)
                yield from lines
                if stop.is_set():
                    return
                poller.poll(FOLLOW_POLL_SECONDS * 1000)
                pending = list(self._drain(fd))
        finally:
            os.close(fd)

    def _open(self) -> int:
        try:
            return os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
        except OSError as error:
            raise OperationFailed(
                f"cannot read the kernel log {self.path}: {error.strerror}; run as root, "
                f"or set the kernel log to 'file:/var/log/kern.log' or 'cmd:dmesg --raw'"
            ) from None

    def _boot_id(self) -> str:
        try:
            return Path(self.boot_id_path).read_text().strip()
        except OSError:
            return ""

    @staticmethod
    def _start_seq(cursor: str | None, boot_id: str) -> int | None:
        """The seq to read after; -1 (everything) when the cursor is from an earlier boot."""
        found = _KMSG_CURSOR.match(cursor or "")
        if found is None:
            return None
        if found["boot"] != boot_id:
            return -1
        return int(found["seq"])

    @staticmethod
    def _drain(fd: int) -> Iterator[_KmsgRecord]:
        """Every record from the file position on, until none is left (EAGAIN)."""
        while True:
            try:
                raw = os.read(fd, KMSG_READ_SIZE)
            except BlockingIOError:
                return
            except OSError as error:
                if error.errno == errno.EPIPE:
                    # The record at our position was overwritten; the kernel has moved us to the
                    # oldest one still there, and the gap in seq reports the loss.
                    continue
                raise OperationFailed(f"reading the kernel log: {error.strerror}") from None
            if not raw:
                return
            record = _parse_kmsg_record(raw)
            if record is not None:
                yield record


def _kmsg_lines(records: list[_KmsgRecord], after: int, boot_id: str) -> tuple[list[KernelLogLine], int]:
    lines: list[KernelLogLine] = []
    last = after
    for record in records:
        if record.seq <= last:
            continue
        if last >= 0 and record.seq > last + 1:
            lines.append(
                KernelLogLine(
                    f"{LOST_RECORDS_NOTE} seq {last + 1}-{record.seq - 1} ({record.seq - 1 - last} records)",
                    _kmsg_cursor(boot_id, record.seq - 1),
                )
            )
        lines.append(KernelLogLine(record.text, _kmsg_cursor(boot_id, record.seq), record.facility))
        last = record.seq
    return lines, last


def _kmsg_cursor(boot_id: str, seq: int) -> str:
    return f"{boot_id}:{seq}"


class KmsgFileSource(DevKmsgSource):
    """A file of /dev/kmsg records (`prio,seq,usec,flags;text`, one a line, ` KEY=value` lines after),
    as `cat /dev/kmsg` writes them: the kernel log of another namespace or machine, relayed with its
    facilities and seqs, and what tests feed. Same cursor as /dev/kmsg; the records are read again
    from the file's start each time and those after the cursor handed out. An unfinished last line
    is left for the next read.
    """

    def __init__(self, path: Path | str, boot_id_path: str = BOOT_ID_PATH):
        super().__init__(str(path), boot_id_path)

    def follow(self, cursor: str | None, stop: threading.Event) -> Iterator[KernelLogLine]:
        if cursor is None:
            _, cursor = self.read_new(None)
        while not stop.is_set():
            lines, cursor = self.read_new(cursor)
            yield from lines
            stop.wait(FOLLOW_POLL_SECONDS)

    def _open(self) -> int:
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
        except OSError as error:
            raise OperationFailed(f"cannot read the kernel log records in {self.path}: {error.strerror}") from None
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise OperationFailed(f"kernel log records {self.path}: not a regular file")
        return fd

    @staticmethod
    def _drain(fd: int) -> Iterator[_KmsgRecord]:
        data = b""
        while chunk := os.read(fd, 1024 * 1024):
            data += chunk
        for raw in data[: data.rfind(b"\n") + 1].split(b"\n"):
            if raw and not raw.startswith(b" "):
                record = _parse_kmsg_record(raw)
                if record is not None:
                    yield record


# --- a log file ----------------------------------------------------------------------------------


class FileLogSource:
    """A growing text file, such as /var/log/kern.log. Cursor: `<inode>:<byte offset>`.

    A file replaced (new inode) or truncated (shorter than the offset) is read again from its start.
    Lines appended to the old file after the last read and before it was rotated away are not seen.
    An unfinished last line is left for the next read. Arming (cursor None) on a missing file fails,
    so a mistyped path is reported; a file that goes missing later is taken to be mid-rotation.
    """

    def __init__(self, path: Path | str):
        self.path = Path(path)

    def read_new(self, cursor: str | None) -> tuple[list[KernelLogLine], str]:
        try:
            handle = self.path.open("rb")
        except FileNotFoundError:
            if cursor is None:
                raise OperationFailed(f"kernel log file {self.path} does not exist") from None
            return [], cursor
        except OSError as error:
            raise OperationFailed(f"cannot read kernel log file {self.path}: {error.strerror}") from None
        with handle:
            status = os.fstat(handle.fileno())
            inode, size = status.st_ino, status.st_size
            if cursor is None:
                return [], f"{inode}:{size}"
            offset = _file_offset(cursor, inode)
            if offset is None or size < offset:
                offset = 0
            handle.seek(offset)
            data = handle.read()
        lines: list[KernelLogLine] = []
        position = offset
        complete = data[: data.rfind(b"\n") + 1]
        for raw in complete.split(b"\n")[:-1]:
            position += len(raw) + 1
            text = raw.rstrip(b"\r").decode("utf-8", errors="replace")
            tagged = _SYSLOG_TAG.match(text)
            if tagged is not None and tagged["tag"] != "kernel":
                # kern.log holds the kernel's lines only; a file with other programs' lines is a mixed
                # log, where a user's `logger -t kernel` line reads exactly like the kernel's.
                raise BadInput(f"kernel log file {self.path} holds lines of other programs ({tagged['tag']!r}, "
                               f"byte {position - len(raw) - 1}): a log of every facility, where any user can "
                               f"write a line that reads like the kernel's; use {TRUSTED_SOURCES}")
            lines.append(KernelLogLine(text, f"{inode}:{position}", text_facility(text)))
        return lines, f"{inode}:{position}"

    def follow(self, cursor: str | None, stop: threading.Event) -> Iterator[KernelLogLine]:
        # Polling, not inotify: one stat and read every 0.2 s costs nothing and needs no dependency.
        while not stop.is_set():
            lines, cursor = self.read_new(cursor)
            yield from lines
            stop.wait(FOLLOW_POLL_SECONDS)


def _file_offset(cursor: str, inode: int) -> int | None:
    """The offset in the cursor when it is for this inode, else None (start over)."""
    cursor_inode, _, offset = cursor.partition(":")
    if cursor_inode != str(inode) or not offset.isdigit():
        return None
    return int(offset)


# --- a command's output --------------------------------------------------------------------------


class CommandLogSource:
    """Runs a command (e.g. `dmesg`) on every read and reports the lines it did not report before.

    Cursor: `<lines seen>:<hash of the last line seen>`. When the output no longer starts with what
    was seen (the ring buffer wrapped, or the machine rebooted), the new lines are those after the
    last occurrence of the last line seen, or all lines if it is gone. This relies on lines being
    unique, which dmesg's timestamps make them; with `journalctl -o cat`, repeated identical lines
    after a wrap can hide the lines between them. The whole output is read every time.
    """

    def __init__(self, argv: list[str]):
        self.argv = list(argv)

    def read_new(self, cursor: str | None) -> tuple[list[KernelLogLine], str]:
        output = self._run()
        count = len(output)
        if cursor is None:
            return [], _command_cursor(count, output)
        start = _command_start(output, cursor)
        lines = [KernelLogLine(output[index], _command_cursor(index + 1, output), text_facility(output[index]))
                 for index in range(start, count)]
        return lines, _command_cursor(count, output)

    def follow(self, cursor: str | None, stop: threading.Event) -> Iterator[KernelLogLine]:
        while not stop.is_set():
            lines, cursor = self.read_new(cursor)
            yield from lines
            stop.wait(COMMAND_POLL_SECONDS)

    def _run(self) -> list[str]:
        command = shlex.join(self.argv)
        try:
            done = subprocess.run(self.argv, capture_output=True, timeout=COMMAND_TIMEOUT_SECONDS, check=False)
        except (OSError, subprocess.TimeoutExpired) as error:
            raise OperationFailed(f"kernel log command `{command}` failed: {error}") from None
        if done.returncode != 0:
            detail = done.stderr.decode(errors="replace").strip() or f"exit code {done.returncode}"
            raise OperationFailed(f"kernel log command `{command}` failed: {detail}")
        return command_records(done.stdout)


def command_records(output: bytes) -> list[str]:
    """A command's output as records, each ended by "\\n" and by nothing else. `dmesg --raw` prints a record's
    \\r raw, and U+2028 under a UTF-8 locale (journalctl -a as well): str.splitlines() would start a record there,
    and `<12>c\\r<4>NVRM: Xid …`, a user's line, would become a kernel one whose facility its forged `<4>` says."""
    text = output.decode("utf-8", errors="replace")
    records = text.split("\n")
    if records[-1] == "":
        records.pop()  # the newline that ends the last record starts none
    return [record.removesuffix("\r") for record in records]


def _line_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _command_cursor(count: int, output: list[str]) -> str:
    return f"{count}:{_line_hash(output[count - 1]) if count else ''}"


def _command_start(output: list[str], cursor: str) -> int:
    """Index of the first line of `output` not reported under `cursor`."""
    seen, _, last_hash = cursor.partition(":")
    if not seen.isdigit():
        return len(output)  # not a cursor of this source: treat as "from now"
    count = int(seen)
    if count == 0:
        return 0
    if count <= len(output) and _line_hash(output[count - 1]) == last_hash:
        return count
    for index in range(len(output) - 1, -1, -1):
        if _line_hash(output[index]) == last_hash:
            return index + 1
    return 0
