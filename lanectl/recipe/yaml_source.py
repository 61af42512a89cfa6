"""YAML loading that remembers where every value came from.

PyYAML's `safe_load` forgets positions and silently keeps the last of two duplicate keys;
validation errors must name `file:line:column`, and a duplicated lane is a mistake to report.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import yaml

from lanectl.errors import Problem

PathKey = tuple[str | int, ...]


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


def format_path(path: PathKey) -> str:
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


class _DuplicateKey(Exception):
    def __init__(self, problem: Problem):
        self.problem = problem


def load_yaml(text: str, file: str) -> YamlDocument:
    """Parse one YAML document; raise `ValueError` carrying a located `Problem` when it is malformed."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line, column = (mark.line + 1, mark.column + 1) if mark else (0, 0)
        reason = exc.problem or str(exc)
        raise YamlSyntaxError(
            Problem(file, line, column, "", f"malformed YAML: {reason}; fix the syntax at this spot")
        ) from None
    doc = YamlDocument(file=file, data=None)
    if root is None:
        return doc
    constructor = yaml.SafeLoader(text)
    try:
        doc.data = _walk(root, (), doc, constructor)
    except _DuplicateKey as dup:
        raise YamlSyntaxError(dup.problem) from None
    finally:
        constructor.dispose()
    return doc


class YamlSyntaxError(ValueError):
    def __init__(self, problem: Problem):
        super().__init__(str(problem))
        self.problem = problem


def _walk(node: yaml.Node, path: PathKey, doc: YamlDocument, constructor: yaml.SafeLoader) -> Any:
    doc.value_at[path] = (node.start_mark.line + 1, node.start_mark.column + 1)
    if isinstance(node, yaml.MappingNode):
        constructor.flatten_mapping(node)  # resolves YAML merge keys (<<) the way safe_load would
        result: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            key = constructor.construct_object(key_node, deep=True)
            if not isinstance(key, str | int):
                key = str(key)
            child = (*path, key)
            if key in result:
                line, column = key_node.start_mark.line + 1, key_node.start_mark.column + 1
                raise _DuplicateKey(
                    Problem(doc.file, line, column, format_path(child),
                            "duplicate key; each key may appear once in a mapping")
                )
            doc.key_at[child] = (key_node.start_mark.line + 1, key_node.start_mark.column + 1)
            result[key] = _walk(value_node, child, doc, constructor)
        return result
    if isinstance(node, yaml.SequenceNode):
        return [_walk(item, (*path, i), doc, constructor) for i, item in enumerate(node.value)]
    return constructor.construct_object(node, deep=True)
