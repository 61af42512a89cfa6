"""YAML loading that remembers where every value came from.

PyYAML's `safe_load` forgets positions and silently keeps the last of two duplicate keys;
validation errors must name `file:line:column`, and a duplicated lane is a mistake to report.

Files come from users and checkouts, so reading is bounded: only regular files (a FIFO named
`x.yaml` must not block), at most `MAX_FILE_BYTES`, strict UTF-8, at most `MAX_NODES` nodes after
alias expansion (a few-KB "billion laughs" would otherwise expand to 10^9 values) and `MAX_DEPTH`
levels of nesting; each failure is a located `Problem`, never a traceback.
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from lanectl.errors import Problem

PathKey = tuple[str | int, ...]

# Real recipes, kernels and workloads are a few KB with a few hundred nodes.
MAX_FILE_BYTES = 1 << 20
MAX_NODES = 100_000
MAX_DEPTH = 64


@dataclass
class YamlDocument:
    file: str
    data: Any
    value_at: dict[PathKey, tuple[int, int]] = field(default_factory=dict)
    key_at: dict[PathKey, tuple[int, int]] = field(default_factory=dict)

    def position(self, path: PathKey, *, key: bool = False) -> tuple[int, int]:
        """The 1-based line and column of `path`, or of its nearest ancestor that exists in the file."""
        table = self.key_at if key else self.value_at
        for cut in range(len(path), -1, -1):
            prefix = path[:cut]
            if key and prefix in self.key_at:
                return self.key_at[prefix]
            if prefix in table:
                return table[prefix]
            if prefix in self.value_at:
                return self.value_at[prefix]
        return (1, 1)

    def has(self, path: PathKey) -> bool:
        return path in self.value_at

    def problem(self, path: PathKey, message: str, *, key: bool = False) -> Problem:
        """`message` about the value at `path` (about its key, with `key`), located in this file."""
        line, column = self.position(path, key=key)
        return Problem(self.file, line, column, format_path(path), message)


def format_path(path: PathKey) -> str:
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


class _Located(Exception):
    def __init__(self, problem: Problem):
        self.problem = problem


def read_yaml_file(path: Path, shown: str) -> YamlDocument:
    """Read and parse one YAML file; raise `YamlSyntaxError` with a located `Problem` for anything
    that is not a small, regular, UTF-8 YAML file."""
    return load_yaml(read_text_file(path, shown), shown)


def read_text_file(path: Path, shown: str) -> str:
    """The UTF-8 text of a regular file of at most `MAX_FILE_BYTES`, or `YamlSyntaxError`."""
    try:
        # O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer forever.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except IsADirectoryError:
        raise _unreadable(shown, "is a directory, not a YAML file; rename it or move it away") from None
    except OSError as exc:
        raise _unreadable(shown, f"cannot be read: {exc.strerror or exc}") from None
    try:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            raise _unreadable(shown, "is a directory, not a YAML file; rename it or move it away")
        if not stat.S_ISREG(info.st_mode):
            raise _unreadable(shown, "is not a regular file (a FIFO, socket or device); give a YAML file")
        if info.st_size > MAX_FILE_BYTES:
            raise _unreadable(shown, f"is {info.st_size} bytes; a YAML file here is at most {MAX_FILE_BYTES}")
        with os.fdopen(fd, "rb", closefd=False) as handle:
            data = handle.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise _unreadable(shown, f"cannot be read: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    if len(data) > MAX_FILE_BYTES:
        raise _unreadable(shown, f"is over {MAX_FILE_BYTES} bytes; a YAML file here is at most that")
    if data[:2] in (b"\xff\xfe", b"\xfe\xff") or b"\x00" in data[:4096]:
        # A BOM or NULs between ASCII letters: an editor saved it as UTF-16/32, which YAML here is not.
        raise YamlSyntaxError(Problem(shown, 1, 1, "", "not UTF-8 text (UTF-16 or UTF-32, by its first bytes); "
                                                       "save the file as UTF-8"))
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        column = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        raise YamlSyntaxError(
            Problem(shown, line, column, "",
                    f"not UTF-8 text (byte 0x{data[exc.start]:02x}); save the file as UTF-8")
        ) from None


def _unreadable(shown: str, message: str) -> YamlSyntaxError:
    return YamlSyntaxError(Problem(shown, 0, 0, "", message))


def load_yaml(text: str, file: str) -> YamlDocument:
    """Parse one YAML document; raise `ValueError` carrying a located `Problem` when it is malformed."""
    loader = None
    try:
        loader = _BoundedLoader(text)
        root = loader.get_single_node()
    except _TooLarge as exc:
        raise YamlSyntaxError(Problem(file, exc.mark.line + 1, exc.mark.column + 1, "", exc.message)) from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line, column = (mark.line + 1, mark.column + 1) if mark else (0, 0)
        reason = exc.problem or str(exc)
        raise YamlSyntaxError(
            Problem(file, line, column, "", f"malformed YAML: {reason}; fix the syntax at this spot")
        ) from None
    except yaml.reader.ReaderError as exc:
        # A control character: it has a position but no mark.
        line, column = _line_column(text, exc.position)
        character = f"#x{exc.character:04x}" if isinstance(exc.character, int) else repr(exc.character)
        raise YamlSyntaxError(
            Problem(file, line, column, "", f"malformed YAML: the control character {character} is not "
                                            "allowed; remove it")
        ) from None
    finally:
        if loader is not None:
            loader.dispose()
    doc = YamlDocument(file=file, data=None)
    if root is None:
        return doc
    constructor = yaml.SafeLoader(text)
    try:
        doc.data = _walk(root, (), doc, constructor)
    except _Located as located:
        raise YamlSyntaxError(located.problem) from None
    finally:
        constructor.dispose()
    return doc


def _line_column(text: str, position: int) -> tuple[int, int]:
    line = text.count("\n", 0, position) + 1
    return line, position - (text.rfind("\n", 0, position) + 1) + 1


class _TooLarge(Exception):
    def __init__(self, mark: yaml.Mark, message: str):
        self.mark = mark
        self.message = message


class _BoundedLoader(yaml.SafeLoader):
    """A SafeLoader whose composer counts what each node expands to, aliases included.

    Aliases share one node object, so composing costs nothing; the cost appears when the tree is
    walked, once per path. Counting the expanded size while composing stops a billion laughs
    before anything is walked, located at the value that blows up.
    """

    def __init__(self, stream: str):
        super().__init__(stream)
        self._expanded: dict[int, int] = {}
        self._depth = 0
        self._aliases = 0

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:  # type: ignore[override]
        mark = self.peek_event().start_mark
        is_alias = self.check_event(yaml.AliasEvent)
        self._depth += 1
        if self._depth > MAX_DEPTH:
            raise _TooLarge(mark, f"nested more than {MAX_DEPTH} levels deep; flatten this value")
        try:
            node = super().compose_node(parent, index)
        finally:
            self._depth -= 1
        if is_alias:
            self._aliases += 1
            if id(node) not in self._expanded:
                raise _TooLarge(mark, "this alias refers to a value that contains it (a recursive alias); "
                                      "aliases may only repeat a finished value")
            size = self._expanded[id(node)]
        elif isinstance(node, yaml.MappingNode):
            size = 1 + sum(self._expanded.get(id(k), 1) + self._expanded.get(id(v), 1) for k, v in node.value)
        elif isinstance(node, yaml.SequenceNode):
            size = 1 + sum(self._expanded.get(id(item), 1) for item in node.value)
        else:
            size = 1
        if size > MAX_NODES and self._aliases:
            raise _TooLarge(mark, f"this value expands to more than {MAX_NODES} YAML nodes through aliases "
                                  "(a 'billion laughs'?); write it out or use fewer aliases")
        if size > MAX_NODES:
            # Written out, not expanded: no alias is to blame, only the size (say, tens of thousands of lanes).
            raise _TooLarge(mark, f"this value holds more than {MAX_NODES} YAML nodes, more than lanectl reads "
                                  "from one file; split it into several files")
        self._expanded[id(node)] = size
        return node


class YamlSyntaxError(ValueError):
    def __init__(self, problem: Problem):
        super().__init__(str(problem))
        self.problem = problem


def _walk(node: yaml.Node, path: PathKey, doc: YamlDocument, constructor: yaml.SafeLoader) -> Any:
    doc.value_at[path] = (node.start_mark.line + 1, node.start_mark.column + 1)
    if isinstance(node, yaml.MappingNode):
        own = sum(1 for key_node, _ in node.value if key_node.tag != "tag:yaml.org,2002:merge")
        constructor.flatten_mapping(node)  # resolves YAML merge keys (<<) the way safe_load would
        # flatten_mapping puts the merged pairs first, then the mapping's own: an own key overrides a merged one
        # (YAML's merge rule, `<<: *defaults` then `port: 9000`), and only two own keys are a duplicate.
        merged = len(node.value) - own
        result: dict[Any, Any] = {}
        from_merge: set[Any] = set()
        for index, (key_node, value_node) in enumerate(node.value):
            key = _scalar(key_node, path, doc, constructor)
            if key is None:
                # `null:`, `~:` or an empty key: as text it would be "None" (a lane named None).
                raise _Located(Problem(doc.file, key_node.start_mark.line + 1, key_node.start_mark.column + 1,
                                       format_path(path), "a null key (`null:`, `~:` or nothing before the colon); "
                                       "give it a name, or quote it ('null') if you mean the word"))
            if not isinstance(key, str | int):
                key = str(key)
            child = (*path, key)
            if index < merged:
                from_merge.add(key)
            elif key in from_merge:
                from_merge.discard(key)
                del result[key]
            if key in result and index >= merged:
                line, column = key_node.start_mark.line + 1, key_node.start_mark.column + 1
                raise _Located(
                    Problem(doc.file, line, column, format_path(child),
                            "duplicate key; each key may appear once in a mapping")
                )
            doc.key_at[child] = (key_node.start_mark.line + 1, key_node.start_mark.column + 1)
            result[key] = _walk(value_node, child, doc, constructor)
        return result
    if isinstance(node, yaml.SequenceNode):
        return [_walk(item, (*path, i), doc, constructor) for i, item in enumerate(node.value)]
    return _scalar(node, path, doc, constructor)


_SEXAGESIMAL_TAGS = ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float")


def _scalar(node: yaml.Node, path: PathKey, doc: YamlDocument, constructor: yaml.SafeLoader) -> Any:
    if node.tag in _SEXAGESIMAL_TAGS and isinstance(node.value, str) and ":" in node.value:
        # YAML 1.1's base-60 numbers: `host: 1:30` would be port 90. YAML 1.2 has none; it is the text written.
        return node.value
    try:
        value = constructor.construct_object(node, deep=True)
    except (ValueError, OverflowError, yaml.YAMLError) as exc:
        # e.g. a 5000-digit integer (Python's int() refuses it), `2026-13-45` as a date, bad !!binary.
        reason = getattr(exc, "problem", None) or str(exc)
        if "integer string conversion" in reason:
            reason = "an integer this long is not a number lanectl accepts"
        line, column = node.start_mark.line + 1, node.start_mark.column + 1
        raise _Located(
            Problem(doc.file, line, column, format_path(path),
                    f"cannot read this value: {reason}; quote it to make it a string")
        ) from None
    if isinstance(value, str) and (half := _LONE_SURROGATE.search(value)) is not None:
        # Only a double-quoted "\\udc80" makes one (the file itself is strict UTF-8). It is half a UTF-16 pair, no
        # character: no file, Dockerfile or terminal can hold it, and every command that wrote it would fail.
        line, column = node.start_mark.line + 1, node.start_mark.column + 1
        raise _Located(Problem(doc.file, line, column, format_path(path),
                               f"holds \\u{ord(half.group()):04x}, half of a UTF-16 surrogate pair and no "
                               "character; write the character itself (or its \\U escape)"))
    return value


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")
