"""The host's journal: one JSON record per line, appended, never rewritten (`state_dir/journal.jsonl`).

Every mutating command writes what it intends, each step it completes and how it ended, so a
command killed half-way leaves a trail the next one can read (`unfinished_intent`) and finish or undo.

Records hold what the caller passes, verbatim. Callers must never pass environment values
(an engine's `env`, `secret_env`, webhook URLs): the journal is kept forever and shown by
`lanectl journal`. Name the variables if needed, never their values.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import pwd
import socket
import stat
import uuid
from collections.abc import Callable, Generator, Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, BinaryIO, ClassVar

from lanectl.errors import BadInput, OperationFailed
from lanectl.records import frozen
from lanectl.state.atomic import fsync_directory
from lanectl.state.file_model import describe_invalid
from lanectl.state.paths import check_state_file, create_state_dir
from lanectl.state.strict import Invalid, Key, read_record

RESERVED_FIELDS = ("ts", "who", "pid", "kind")
# lanectl writes records of a few hundred bytes (a log tail at most some KiB): a longer line is not
# one of ours, and is skipped without being parsed.
MAX_RECORD_BYTES = 1024 * 1024


def utc_now() -> datetime:
    return datetime.now(UTC)


def utc_timestamp(moment: datetime) -> str:
    """ISO-8601 in UTC with milliseconds and a `Z`, e.g. `2026-11-30T12:03:11.042Z`: sortable as text."""
    if moment.tzinfo is None:
        raise ValueError(f"a timestamp needs a timezone-aware datetime, got naive {moment!r}")
    return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def current_user_at_host() -> str:
    """`user@host` of the effective user, looked up by uid: `$USER` is whatever the caller's shell says."""
    uid = os.geteuid()
    try:
        user = pwd.getpwuid(uid).pw_name
    except KeyError:  # a uid without a passwd entry, common in containers
        user = str(uid)
    return f"{user}@{socket.gethostname()}"


@frozen
class JournalContents:
    """The journal's records as read, and what was wrong with the lines that could not be read."""

    records: list[dict[str, Any]]
    problems: list[str]


class Journal:
    # Blocks read backwards by `tail`; a typical record is ~200 bytes, so one block covers `tail 50`.
    tail_block_bytes = 64 * 1024

    def __init__(self, path: Path, *, clock: Callable[[], datetime] = utc_now):
        self.path = path
        self.clock = clock
        self.who = current_user_at_host()

    def append(self, kind: str, **fields: Any) -> dict[str, Any]:
        """Write one record (`ts`, `who`, `pid`, `kind`, then `fields`) durably, and return it.

        Raises TypeError for a value JSON cannot hold, ValueError for a field named like a header.
        The caller keeps environment values out of `fields` (see the module docstring).
        """
        clash = [name for name in fields if name in RESERVED_FIELDS]
        if clash:
            raise ValueError(f"journal fields {clash} clash with the record header {list(RESERVED_FIELDS)}")
        record: dict[str, Any] = {
            "ts": utc_timestamp(self.clock()),
            "who": self.who,
            "pid": os.getpid(),
            "kind": kind,
            **fields,
        }
        try:
            line = json.dumps(record, allow_nan=False, separators=(",", ":")).encode() + b"\n"
        except ValueError as exc:  # NaN/infinity or a circular reference: not JSON either
            raise TypeError(f"journal record {kind!r} is not JSON-serialisable: {exc}") from exc
        try:
            self._append_line(line)
        except IsADirectoryError:
            # Something in the state folder is in the journal's place: the operator's to fix (exit 2), and
            # nothing the record was to announce has been done yet.
            raise BadInput(f"the journal {self.path} is a folder, not a file; move it aside "
                           f"(mv {self.path} {self.path}.aside) and run the command again") from None
        except OSError as exc:
            raise OperationFailed(f"could not write the journal {self.path}: {exc.strerror or exc}") from exc
        return record

    def _append_line(self, line: bytes) -> None:
        create_state_dir(self.path.parent)
        check_state_file(self.path)
        created = not self.path.exists()
        # O_NOFOLLOW: a link planted after the check above is refused (ELOOP) rather than written through.
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o600)
        try:
            _require_regular(fd, self.path)
            # The flock makes "look at the last byte, then write" one step among lanectl processes
            # (an `up` and the cron watchdog), so the newline repair below cannot double up.
            fcntl.flock(fd, fcntl.LOCK_EX)
            if not self._ends_with_newline():
                line = b"\n" + line  # a writer was killed mid-line: start ours on a fresh one
            written = os.write(fd, line)
            # A short write happens only on a full disk or a signal; under the flock nobody can
            # interleave, so finishing the line is safe.
            while written < len(line):
                written += os.write(fd, line[written:])
            os.fsync(fd)
        finally:
            os.close(fd)
        if created:
            fsync_directory(self.path.parent)

    def _ends_with_newline(self) -> bool:
        with self.path.open("rb") as existing:
            size = existing.seek(0, os.SEEK_END)
            if size == 0:
                return True
            existing.seek(size - 1)
            return existing.read(1) == b"\n"

    def read(self) -> JournalContents:
        """Every readable record, in order; each unreadable line is skipped and named in `problems`."""
        records: list[dict[str, Any]] = []
        problems: list[str] = []
        check_state_file(self.path)
        try:
            journal = os.fdopen(os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK), "rb")
        except FileNotFoundError:
            return JournalContents(records=[], problems=[])
        except OSError as exc:
            raise OperationFailed(f"could not read the journal {self.path}: {exc.strerror or exc}") from exc
        _require_regular(journal.fileno(), self.path)
        with journal:
            for number, (line, size) in enumerate(_bounded_lines(journal), start=1):
                if not line.strip():
                    continue
                record = _parse_record(line) if size <= MAX_RECORD_BYTES else f"longer than {MAX_RECORD_BYTES} bytes"
                if isinstance(record, str):
                    problems.append(self._unreadable(f"line {number}", size, record))
                else:
                    records.append(record)
        return JournalContents(records=records, problems=problems)

    def tail(self, count: int) -> JournalContents:
        """The last `count` readable records, reading the file backwards block by block.

        Unreadable lines among them are reported by their position from the end
        (`line 3 from the end` is the first line `tail -n 3 journal.jsonl` shows): numbering them from
        the start would mean reading the whole file, which is what `tail` exists to avoid.
        """
        records: list[dict[str, Any]] = []
        problems: list[str] = []
        if count <= 0:
            return JournalContents(records=[], problems=[])
        with contextlib.closing(self._lines_from_end()) as lines:
            for from_end, (line, size) in enumerate(lines, start=1):
                if not line.strip():
                    continue
                record = _parse_record(line) if size <= MAX_RECORD_BYTES else f"longer than {MAX_RECORD_BYTES} bytes"
                if isinstance(record, str):
                    problems.append(self._unreadable(f"line {from_end} from the end", size, record))
                    continue
                records.append(record)
                if len(records) == count:
                    break
        records.reverse()
        problems.reverse()
        return JournalContents(records=records, problems=problems)

    def _unreadable(self, where: str, size: int, why: str) -> str:
        return f"{self.path.name} {where}: unreadable record ({why}, {size} bytes); ignored"

    # Switch bookkeeping: `up` and `rollback` write an intent before touching anything, a step after
    # each one completes, and an outcome at the end. An intent without an outcome is a switch that
    # was interrupted; its done steps say how far it got.

    def record_intent(
        self, *, action: str, from_lane: str | None, to_lane: str | None, why: str, steps: Sequence[str]
    ) -> dict[str, Any]:
        """Start a switch: returns the record, whose `switch` id the steps and the outcome refer to."""
        fields = {"switch": uuid.uuid4().hex, "action": action, "from": from_lane, "to": to_lane,
                  "why": why, "steps": list(steps)}
        return self.append("intent", **fields)

    def record_step(self, switch: str, step: str, detail: str = "", **facts: Any) -> dict[str, Any]:
        """A step that ran; `facts` are what it measured (a stop's `in_flight` and `cut` requests)."""
        return self.append("step", switch=switch, step=step, detail=detail, **facts)

    def record_outcome(self, switch: str, result: str, message: str = "") -> dict[str, Any]:
        """`result` is e.g. "ok", "failed", "rolled-back", "undone", "finished"."""
        return self.append("outcome", switch=switch, result=result, message=message)

    def last_switch_open(self) -> bool:
        """Whether the journal's last switch record (an intent, a step or an outcome) is not an outcome: a switch
        was killed before it wrote one. Reads backwards only as far as that record, so a caller may ask on every
        pass; `unfinished_intent` then reads the switch whole."""
        with contextlib.closing(self._lines_from_end()) as lines:
            for line, size in lines:
                record = _parse_record(line) if line.strip() and size <= MAX_RECORD_BYTES else None
                if isinstance(record, dict) and isinstance(record.get("switch"), str):
                    return record.get("kind") != "outcome"
        return False

    def _lines_from_end(self) -> Generator[tuple[bytes, int]]:
        """The journal's lines, last first, each with its length (`_lines_backwards`); none when there is no
        journal yet. Close it (`contextlib.closing`) to release the file when stopping early."""
        check_state_file(self.path)
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except FileNotFoundError:
            return
        except OSError as exc:
            raise OperationFailed(f"could not read the journal {self.path}: {exc.strerror or exc}") from exc
        try:
            _require_regular(fd, self.path)
            yield from _lines_backwards(fd, self.tail_block_bytes)
        finally:
            os.close(fd)

    def unfinished_intent(self) -> dict[str, Any] | None:
        """The last switch's intent when no outcome closes it, with `done_steps`: its recorded steps, in order.

        Every switch begins by finishing or undoing the one before it (`LaneSwitcher._reconciled`; a fleet run
        closes it as "continued"), so only the last intent can be open: one that a later switch followed was
        planned over, from a fresh look at the engine, and is never continued. Reads backwards only as far as
        that intent, so a journal years long costs a command no more than its last switch does.
        """
        closed: set[str] = set()
        steps: list[tuple[str, str]] = []  # (switch, step), last first
        with contextlib.closing(self._lines_from_end()) as lines:
            for line, size in lines:
                if b'"switch"' not in line:
                    continue  # a watchdog event, a note: no switch record, and not worth parsing
                record = _parse_record(line) if size <= MAX_RECORD_BYTES else None
                if not isinstance(record, dict) or not isinstance(record.get("switch"), str):
                    continue
                switch, kind = record["switch"], record.get("kind")
                if kind == "outcome":
                    closed.add(switch)
                elif kind == "step":
                    steps.append((switch, str(record.get("step"))))
                elif kind == "intent":
                    if switch in closed:
                        return None
                    return {**record, "done_steps": [step for of, step in reversed(steps) if of == switch]}
        return None


# The shape each kind of record must have, so that a record of the wrong shape (hand-edited, or
# written by something else) is reported and skipped rather than crashing whoever reads it: `status`
# counts an intent's steps, a switch finishes one from its `from` and `to`. Header fields are checked
# when present (readers show '?' for a missing one); the fields of a switch record are required.
# Records stay the dicts they were read as: the models only judge them.
@frozen(kw_only=True)
class _Record:
    """What every journal record carries; a record may hold more than its kind names."""

    ALLOWS_EXTRA: ClassVar[bool] = True

    # The defaults are never used: a missing header field is allowed, a present one must have its type.
    ts: str = ""
    who: str = ""
    pid: int = 0
    kind: str = ""


@frozen(kw_only=True)
class _Intent(_Record):
    """A switch about to run: what it changes, from which lane to which."""

    switch: str
    action: str
    from_: Annotated[str | None, Key("from")]
    to: str | None
    why: str
    steps: list[str]


@frozen(kw_only=True)
class _Step(_Record):
    """One step of a switch, done."""

    switch: str
    step: str


@frozen(kw_only=True)
class _Outcome(_Record):
    """How a switch ended."""

    switch: str
    result: str


_RECORD_SHAPES: dict[str, type[_Record]] = {"intent": _Intent, "step": _Step, "outcome": _Outcome}


def _shape_problem(record: dict[str, Any]) -> str | None:
    """What is wrong with a record's shape, or None."""
    kind = record.get("kind")
    shape = _RECORD_SHAPES.get(kind, _Record) if isinstance(kind, str) else _Record  # a list kind is unhashable
    try:
        read_record(shape, record)
    except Invalid as exc:
        return describe_invalid(exc)
    return None


def _parse_record(line: bytes) -> dict[str, Any] | str:
    """The record on `line`, or why it cannot be used."""
    if len(line) > MAX_RECORD_BYTES:
        return f"longer than {MAX_RECORD_BYTES} bytes"
    try:
        record = json.loads(line)
    except (ValueError, RecursionError):  # also UnicodeDecodeError, and [[[[…]]]] nested past the limit
        return "truncated or corrupt"
    if not isinstance(record, dict):
        return "truncated or corrupt"
    return _shape_problem(record) or record


def _require_regular(fd: int, path: Path) -> None:
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        raise BadInput(f"the journal {path} is not a regular file ({stat.filemode(mode)}); move it aside "
                       f"(mv {path} {path}.aside) and run the command again")


def _bounded_lines(handle: BinaryIO) -> Iterator[tuple[bytes, int]]:
    """Each line without its newline, and its length; a line longer than MAX_RECORD_BYTES comes cut
    short (with its full length), so a journal that is one endless line costs one bounded buffer."""
    while True:
        line = handle.readline(MAX_RECORD_BYTES + 1)
        if not line:
            return
        if line.endswith(b"\n"):
            yield line[:-1], len(line) - 1
            continue
        size = len(line)
        while len(line) > MAX_RECORD_BYTES:  # an oversized line: count the rest of it, keep none of it
            rest = handle.readline(MAX_RECORD_BYTES + 1)
            if not rest:
                break
            if rest.endswith(b"\n"):
                size += len(rest) - 1
                break
            size += len(rest)
        yield line, size


def _lines_backwards(fd: int, block_bytes: int) -> Iterator[tuple[bytes, int]]:
    """The file's lines, last first, without their newlines, each with its length; reads only as far
    back as it is asked to. A line longer than MAX_RECORD_BYTES comes back as b"x" with its length:
    its bytes are counted, not kept.

    A final newline ends the last line rather than starting an empty one, as for `tail -n`.
    """
    position = os.fstat(fd).st_size
    carried: list[bytes] = []  # the start of the earliest line seen so far, its blocks last-read first
    carried_size = 0
    at_end = True
    while position > 0:
        size = min(block_bytes, position)
        position -= size
        block = os.pread(fd, size, position)
        if at_end:
            at_end = False
            if block.endswith(b"\n"):
                block = block[:-1]
        if b"\n" not in block:
            carried_size += len(block)
            if carried_size <= MAX_RECORD_BYTES:
                carried.append(block)
            continue
        # The block's last line break ends the earliest line seen so far: its start is after that break.
        earlier, _, start = block.rpartition(b"\n")
        line_size = len(start) + carried_size
        yield (start + b"".join(reversed(carried)) if line_size <= MAX_RECORD_BYTES else b"x"), line_size
        inner = earlier.split(b"\n")
        carried = [inner[0]]
        carried_size = len(inner[0])
        for line in reversed(inner[1:]):
            yield line, len(line)
    if carried:
        yield (b"".join(reversed(carried)) if carried_size <= MAX_RECORD_BYTES else b"x"), carried_size
