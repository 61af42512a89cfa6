"""What every command returns, and the one JSON form scripts parse.

A command returns a `Result`: the answer as plain data, notes for the person reading, and the exit code.
The CLI renders it: `render_json` for `--json`, a text view per command for people (`lanectl.cli.views`).
Text views are built from `Line`s: plain text with optional style names, so they can be compared exactly in
tests and drawn in colour on a terminal; nothing here knows about the terminal.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import field
from typing import Any, Literal

from lanectl.errors import EXIT_OK
from lanectl.records import frozen

# Bump only on an incompatible change of the envelope or of a command's data: scripts check it.
ENVELOPE_VERSION = 1

Level = Literal["info", "warning", "error"]


@frozen
class Message:
    """A note for the person reading the text view (on stderr), beside the data; `--json` leaves it out."""

    level: Level
    text: str


@frozen
class Result:
    """What a command returns: the `--json` envelope's command and data, and the messages shown beside them."""

    command: str
    """The envelope's `command`, and the name of the text view."""
    data: Mapping[str, Any]
    """The envelope's `data`: JSON-ready values, exactly what `--json` prints."""
    messages: tuple[Message, ...] = ()
    exit_code: int = EXIT_OK
    text_only: Mapping[str, Any] = field(default_factory=dict)
    """Parts only the text view shows, kept out of `data` so the envelope stays as scripts know it."""


def info(text: str) -> Message:
    return Message("info", text)


def warning(text: str) -> Message:
    return Message("warning", text)


def render_json(result: Result) -> str:
    """The stable envelope: `{"lanectl": 1, "command": …, "data": …}`, keys sorted, one trailing newline."""
    envelope = {"lanectl": ENVELOPE_VERSION, "command": result.command, "data": result.data}
    return json.dumps(envelope, indent=2, sort_keys=True) + "\n"


Span = tuple[str, str]
"""A run of text and its style name (`""` for none): what the terminal makes of the name is the CLI's business."""


@frozen
class Line:
    """One line of a text view; `err` lines go to stderr (notes beside the answer), the rest to stdout."""

    spans: tuple[Span, ...]
    err: bool = False

    @property
    def text(self) -> str:
        return "".join(text for text, _ in self.spans)


def line(*parts: str | Span, err: bool = False) -> Line:
    """`line("ok", (" passed", "green"))`: plain strings have no style."""
    return Line(tuple((part, "") if isinstance(part, str) else part for part in parts), err=err)


def text_lines(text: str, *, err: bool = False) -> list[Line]:
    """A block of text (a Dockerfile, a JSON document) as lines; a final newline ends the last line."""
    return [line(part, err=err) for part in text.removesuffix("\n").split("\n")] if text else []


def aligned(rows: Sequence[Sequence[str]]) -> list[str]:
    """Plain columns padded to the widest cell, never truncated whatever the terminal width (tags are long)."""
    if not rows:
        return []
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows]


# -- text from outside lanectl: control characters shown escaped, never obeyed ---------------------------
#
# Engine logs, state files, results and path arguments can hold control characters that a terminal obeys and
# that a Markdown or HTML reader carries along unseen. Every place lanectl shows such text (the terminal,
# `lanectl.cli.terminal`; the release note, `lanectl.bench.release_note`) escapes them with this one rule.

# C0 but tab and newline, DEL, C1; the bidirectional embeddings, overrides and isolates; the Unicode line
# and paragraph separators (a terminal may break the line there); lone surrogates (bytes of an argument or
# file name that were not UTF-8: printed raw, 0x9b is a C1 CSI again).
_OTHERS = "\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff"
_CONTROL = re.compile(f"[\x00-\x08\x0a{_OTHERS}]")
_CONTROL_BUT_NEWLINE = re.compile(f"[\x00-\x08{_OTHERS}]")


def _escaped(match: re.Match[str]) -> str:
    code = ord(match.group())
    if 0xDC80 <= code <= 0xDCFF:  # a byte that was not UTF-8, as surrogateescape kept it
        return f"\\x{code - 0xDC00:02x}"
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def shown(text: str, *, keep_newlines: bool = False) -> str:
    """`text` with every control character escaped, tab kept; newline kept only when `keep_newlines` (a
    block of lines, a log), else escaped too, so that a field cannot start a line that looks like lanectl's."""
    return (_CONTROL_BUT_NEWLINE if keep_newlines else _CONTROL).sub(_escaped, text)


def has_controls(text: str) -> bool:
    return _CONTROL_BUT_NEWLINE.search(text) is not None
