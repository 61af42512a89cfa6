"""Every logger call in a release's Python source, with its format string: what the engine can print.

Read with `ast`, never by running the code. A call counts when its method is a logging one (`info`, `warning_once`,
…) on something named like a logger, and its first argument is a literal: a string, an f-string (its holes become
HOLE), or a concatenation of those. The contract suite reads the installed release with the same code.
"""

from __future__ import annotations

import ast
import re

from lanectl.records import frozen

LOG_METHODS = frozenset({"debug", "info", "warning", "warn", "error", "exception", "critical", "info_once",
                         "warning_once", "debug_once", "error_once"})
LEVEL_OF = {"warn": "WARNING", "exception": "ERROR"}
# What an f-string's hole is written as in a template.
HOLE = "{…}"
# A %-format conversion, as `logging` applies it to the record's arguments.
PERCENT = re.compile(r"%%|%(?:\([^)]*\))?[-#0 +]*(?:\d+|\*)?(?:\.\d+)?(?P<conv>[diouxXeEfFgGcrsa])")
# What a %-conversion prints, as a regex.
_CONVERSION = {"d": r"-?\d+", "i": r"-?\d+", "f": r"-?\d+(?:\.\d+)?", "F": r"-?\d+(?:\.\d+)?", "e": r"\S+",
               "g": r"\S+", "s": ".*?", "r": ".*?", "a": ".*?", "x": r"[0-9a-f]+", "X": r"[0-9A-F]+", "o": r"[0-7]+",
               "u": r"\d+", "c": "."}


@frozen
class LogCall:
    """One logger call in a release's source: where it is, in which function, and the format string it passes."""

    file: str  # relative to the release's top folder: vllm/v1/core/kv_cache_utils.py
    line: int
    level: str  # INFO, WARNING, ...
    template: str  # the format string; an f-string's holes are written HOLE
    style: str  # "%" (lazy %-formatting) or "f" (an f-string, already formatted)
    function: str = ""  # the enclosing function's qualified name (`AutoTuner.load_configs`), "" at module level

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}"

    def pattern(self) -> str:
        """A regex of every message this call can print: its literal text, each hole a value of its conversion."""
        if self.style == "f":
            return ".*?".join(re.escape(part) for part in self.template.split(HOLE))
        out, last = [], 0
        for found in PERCENT.finditer(self.template):
            out.append(re.escape(self.template[last:found.start()]))
            out.append(_CONVERSION.get(found.group("conv"), ".*?") if found.group(0) != "%%" else "%")
            last = found.end()
        out.append(re.escape(self.template[last:]))
        return "".join(out)

    def parts(self) -> list[str | None]:
        """The message as literal text and holes (None) in order: each hole stands for any value."""
        if self.style == "f":
            pieces = self.template.split(HOLE)
            return [part for i, piece in enumerate(pieces) for part in ([None, piece] if i else [piece])]
        out: list[str | None] = []
        last = 0
        for found in PERCENT.finditer(self.template):
            out.append(self.template[last:found.start()])
            out.append("%" if found.group(0) == "%%" else None)
            last = found.end()
        out.append(self.template[last:])
        return out


def _hole(value: ast.AST, constants: dict[str, str]) -> str:
    """An f-string's part: its text when it is a module's string constant (`f"{LOG_PREFIX} on"`), else HOLE."""
    if (isinstance(value, ast.FormattedValue) and value.conversion == -1 and value.format_spec is None
            and isinstance(value.value, ast.Name) and value.value.id in constants):
        return constants[value.value.id]
    return HOLE


def _template(node: ast.AST, constants: dict[str, str]) -> tuple[str, str] | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value, "%"
    if isinstance(node, ast.JoinedStr):
        parts = [v.value if isinstance(v, ast.Constant) else _hole(v, constants) for v in node.values]
        return "".join(str(p) for p in parts), "f"
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _template(node.left, constants), _template(node.right, constants)
        if left or right:
            # A part that is no literal (`"…" + (f" ({n} skipped)" if n else "")`) is a value, as a hole is.
            left, right = left or (HOLE, "f"), right or (HOLE, "f")
            return left[0] + right[0], "f" if "f" in (left[1], right[1]) else "%"
    return None


def _is_logger(node: ast.AST) -> bool:
    name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""
    return name in ("logger", "log", "_logger", "LOGGER") or name.endswith("logger")


def _constants(tree: ast.Module) -> dict[str, str]:
    """The module's `NAME = "text"` constants."""
    return {statement.targets[0].id: statement.value.value for statement in tree.body
            if isinstance(statement, ast.Assign) and len(statement.targets) == 1
            and isinstance(statement.targets[0], ast.Name) and isinstance(statement.value, ast.Constant)
            and isinstance(statement.value.value, str)}


class _Visitor(ast.NodeVisitor):
    def __init__(self, file: str, constants: dict[str, str], every_string: bool = False) -> None:
        self.file = file
        self.constants = constants
        self.every_string = every_string
        self.scope: list[str] = []
        self.calls: list[LogCall] = []

    def _scoped(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) -> None:
        self.scope.append(node.name)
        self.generic_visit(node)
        self.scope.pop()

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _scoped

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        if (isinstance(func, ast.Attribute) and func.attr in LOG_METHODS and _is_logger(func.value) and node.args):
            found = _template(node.args[0], self.constants)
            if found is not None:
                method = func.attr.removesuffix("_once")
                self.calls.append(LogCall(self.file, node.lineno, LEVEL_OF.get(method, method.upper()), found[0],
                                          found[1], ".".join(self.scope)))
        self.generic_visit(node)

    def visit_JoinedStr(self, node: ast.JoinedStr) -> None:
        if self.every_string:
            found = _template(node, self.constants)
            if found is not None and " " in found[0]:
                self.calls.append(LogCall(self.file, node.lineno, "INFO", found[0], "f", ".".join(self.scope)))
        self.generic_visit(node)


# Files without a logging call are not parsed: most of a release's source is kernels and models that never log.
_MAY_LOG = re.compile(r"(?:logger|\blog)\s*\.\s*(?:debug|info|warn|error|exception|critical)")


def log_calls(source: str, file: str) -> list[LogCall]:
    """The logger calls with a literal format string in one file's source; none for a file that does not parse."""
    if not _MAY_LOG.search(source):
        return []
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    visitor = _Visitor(file, _constants(tree))
    visitor.visit(tree)
    return visitor.calls


def messages_of_patched_file(source: str, file: str) -> list[LogCall]:
    """A file a lane's patch writes: its logger calls and, as messages it may log, every f-string with a space in
    it. A patch may build its line first and log it later (`logger.info("%s", route.startup_line)`); its own text
    is small and lanectl's, so every string it formats counts."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    visitor = _Visitor(file, _constants(tree), every_string=True)
    visitor.visit(tree)
    return visitor.calls
