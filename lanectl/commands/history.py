from __future__ import annotations

from typing import Any

from lanectl.state.journal import Journal
from lanectl.state.paths import StateFiles, state_dir


def journal_tail(count: int, *, fleet: bool = False) -> dict[str, Any]:
    files = StateFiles(state_dir())
    contents = Journal(files.fleet_journal if fleet else files.journal).tail(count)
    return {"records": contents.records, "problems": contents.problems}


def describe(record: dict[str, Any]) -> str:
    """One line per record for people; --json gives the records as written."""
    kind = record.get("kind", "?")
    if kind == "intent":
        text = f"{record.get('action')} {record.get('from') or '-'} -> {record.get('to') or '-'} ({record.get('why')})"
    elif kind == "step":
        text = f"  {record.get('step')}  {record.get('detail', '')}"
        if record.get("node") and not str(record.get("step", "")).startswith(str(record["node"])):
            text = f"  [{record['node']}]{text}"
    elif kind == "outcome":
        text = f"{record.get('result')}: {record.get('message', '')}"
    elif kind == "watchdog" and record.get("event") == "alert":
        text = (f"alert ({record.get('severity')}): {record.get('title')}; "
                f"{'delivered' if record.get('delivered') else 'not delivered'}: {record.get('detail')}")
    elif kind == "watchdog":
        action = record.get("action")
        text = f"{record.get('event')}: " + (f"{action}: {record.get('reason')}" if action else
                                             str(record.get("message", "")))
    elif kind == "diagnostics":
        text = f"  diagnostics: {record.get('failed')} (exit code {record.get('exit_code')})"
    else:
        text = str(record.get("message", ""))
    return f"{record.get('ts', '?')}  {record.get('who', '?'):<20} {kind:<11} {text}"
