"""Domain errors. Each carries the exit code the CLI turns it into: 2 bad input, 1 the operation failed."""

from __future__ import annotations

import re
from dataclasses import dataclass

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


class LanectlError(Exception):
    exit_code = EXIT_FAILED


class BadInput(LanectlError):
    """The user asked for something that cannot be done as asked (unknown lane, bad flag value)."""

    exit_code = EXIT_BAD_INPUT


class OperationFailed(LanectlError):
    exit_code = EXIT_FAILED


@dataclass(frozen=True, order=True)
class Problem:
    """One thing wrong with a recipe or kernel file, located as precisely as the YAML allows."""

    file: str
    line: int
    column: int
    path: str
    message: str

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}:{self.column}" if self.line else self.file
        text = f"{where}: {self.path}: {self.message}" if self.path else f"{where}: {self.message}"
        # A hostile key (`"X\nRUN evil"`) is part of the path: one problem stays one line, and a terminal
        # control sequence in a recipe is shown, not obeyed.
        return _CONTROL.sub(lambda m: repr(m.group())[1:-1], text)


class RecipeInvalid(BadInput):
    """Every problem found in the recipes at once, so one run shows the user all there is to fix."""

    def __init__(self, problems: list[Problem]):
        self.problems = sorted(set(problems))
        super().__init__("\n".join(str(p) for p in self.problems))
