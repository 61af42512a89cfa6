from __future__ import annotations

from lanectl.output import Result
from lanectl.state.journal import Journal
from lanectl.state.paths import StateFiles, state_dir


def journal_tail(count: int, *, fleet: bool = False) -> Result:
    """The last `count` records as written, and what could not be read (a torn last line)."""
    files = StateFiles(state_dir())
    contents = Journal(files.fleet_journal if fleet else files.journal).tail(count)
    return Result("history", {"records": contents.records, "problems": contents.problems})


# The command's page in the docs (docs/reference/commands/, written by scripts/docs_reference.py from the
# command-line app): an example, and what each exit code means.
COMMAND_DOCS = {
    "history": {
        "example": """\
$ lanectl history -n 20
$ lanectl history --fleet --json
""",
        "exit": {
            0: "the journal was read (a damaged record is named on stderr)",
            2: "a bad -n",
        },
    },
}
