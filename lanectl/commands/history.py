from __future__ import annotations

from lanectl.output import Result
from lanectl.state.journal import Journal
from lanectl.state.paths import state_dir


def journal_tail(count: int, *, fleet: bool = False) -> Result:
    """The last `count` records as written, and what could not be read (a torn last line)."""
    from lanectl.commands.fleet import FLEET_JOURNAL

    contents = Journal(state_dir() / (FLEET_JOURNAL if fleet else "journal.jsonl")).tail(count)
    return Result("history", {"records": contents.records, "problems": contents.problems})
