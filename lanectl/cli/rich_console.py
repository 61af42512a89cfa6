"""The console for a terminal: rich, with `lanectl.cli.terminal`'s rule applied to everything it prints.

Imported only where styles show (`lanectl.cli.terminal.console`) and for the build's progress bars.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from rich.console import Console
from rich.text import Text

from lanectl.output import Span, has_controls, shown


class TerminalConsole(Console):
    """A rich console that prints every string and `Text` with its control characters escaped (newlines
    kept: a printed object may be several lines)."""

    def print(self, *objects: Any, **kwargs: Any) -> None:
        super().print(*(self._escaped(obj) for obj in objects), **kwargs)

    def lines(self, lines: Iterable[Sequence[str | Span]]) -> None:
        text = Text("\n").join(Text.assemble(*((shown(part), "") if isinstance(part, str) else
                                               (shown(part[0]), part[1]) for part in parts))
                               for parts in lines)
        self.print(text, highlight=False)

    def _escaped(self, obj: Any) -> Any:
        if isinstance(obj, str):
            return shown(obj, keep_newlines=True)
        if isinstance(obj, Text) and has_controls(obj.plain):
            # Escaping changes lengths, so the styled runs are rebuilt one by one rather than re-offset.
            return Text.assemble(*((shown(seg.text, keep_newlines=True), seg.style or "")
                                   for seg in obj.render(self, end="")),
                                 end=obj.end, no_wrap=obj.no_wrap, overflow=obj.overflow)
        return obj
