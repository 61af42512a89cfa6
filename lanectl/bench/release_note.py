"""The release note of a gate run, in Markdown, written from its results.json and the recipes.

Pure: the run's data, the lanes' differences (`lanectl.lanes.diff`), the rollback facts and the journal's
earlier gate records in; text out. Every figure is one of results.json's, or a mean or ratio of them that
the text says how it was taken; where the run holds no evidence for a section, the note says so rather
than filling it in. The sections follow the note the operator used to write by hand
(`release-note-h2-REF`): headline, short version, what shipped, measured, fidelity and safety, why each
losing candidate lost, reproduce, rollback.
"""

from __future__ import annotations

import json
import math
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import field
from typing import Any

from lanectl.bench.verdict import candidates_of
from lanectl.output import shown
from lanectl.records import frozen

VERDICT_WORDS = {"pass": "PASS", "fail": "FAIL", "inconclusive": "INCONCLUSIVE"}
# Markdown punctuation that starts a construct anywhere in a line: code, emphasis, links and images, raw HTML
# and entities, table cells, headings inside list items, strikethrough; and the backslash itself. An
# underscore between two letters or digits starts nothing (CommonMark), so `tool_json` is left as it reads.
INLINE_MARKUP = re.compile(r"([\\`*\[\]<#|~&])|(?<![^\W_])_|_(?![^\W_])")
# What starts a block when it opens a line (as a list item's text does): a bullet, a quote, an ordered item.
BLOCK_START = re.compile(r"^(?:([-+*])(?=\s|$)|(>)|(\d{1,9})([.)])(?=\s|$))")


def _escape_inline(found: re.Match[str]) -> str:
    return "\\" + found.group()


def _escape_block_start(found: re.Match[str]) -> str:
    if found.group(3) is not None:
        return found.group(3) + "\\" + found.group(4)
    return "\\" + found.group()


def _text(value: object) -> str:
    """Text from results.json, a folder name or the recipes, as Markdown that shows it and does nothing else.

    One line: control characters and newlines are written escaped, as Python writes them. Every character
    that could start a construct is backslash-escaped, so a lane named "x", newline, "## Rollback" stays
    inside its sentence, and "<script>" or "[link](…)" are shown as typed.
    """
    escaped = INLINE_MARKUP.sub(_escape_inline, shown(str(value)))
    return BLOCK_START.sub(_escape_block_start, escaped)


def _code(value: object, *, in_table: bool = False) -> str:
    """A code span that holds `value` literally: its fence is longer than any run of backticks inside it."""
    text = shown(str(value))
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * (longest + 1)
    padded = f" {text} " if text.startswith("`") or text.endswith("`") or not text.strip() else text
    # In a table, GFM splits cells on every unescaped pipe, code spans included.
    return fence + (padded.replace("|", "\\|") if in_table else padded) + fence


def _shell(value: object) -> str:
    """One word of a command line, quoted for a POSIX shell, on one line."""
    return shlex.quote(shown(str(value)))


@frozen
class NoteInputs:
    """Everything the note is written from, besides results.json."""

    run_name: str
    # candidate lane -> `lanectl diff CONTROL CANDIDATE` data; None when the recipes no longer define the lane.
    shipped: Mapping[str, Mapping[str, Any] | None] = field(default_factory=dict)
    # lane -> {"containers": [names], "standby": standby settings or None}; absent when not in the recipes.
    lanes: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    # The journal's gate records before this run (oldest first); None when the journal was not read.
    earlier_gates: Sequence[Mapping[str, Any]] | None = None
    # image reference an arm ran -> the local engine's image ID for it, looked up when the note is written.
    image_ids: Mapping[str, str] = field(default_factory=dict)
    # Whether the figures were recomputed from the per-request rates (format 2), and where the record differed.
    recomputed: bool = False
    differences: Sequence[str] = ()
    # Where the evidence itself does not hold together (`Rechecked.not_reproduced`): no verdict is claimed.
    not_reproduced: Sequence[str] = ()
    priors_checked: str | None = None  # how the run's priors were held to this host's calibration


def _mean(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return math.fsum(known) / len(known) if known and len(known) == len(values) else None


def cell_order(candidates: Sequence[Mapping[str, Any]]) -> list[str]:
    """Cells by class, then users, then context (results.json sorts keys as text: code@32 before code@8)."""
    cells = {k: c for candidate in candidates for k, c in candidate["cells"].items()}
    return sorted(cells, key=lambda k: (cells[k]["class"], cells[k]["concurrency"], cells[k]["context"]))


def _ratio(x: float | None, y: float | None) -> float | None:
    return x / y if x is not None and y else None


def _num(value: float | None, digits: int) -> str:
    return "n/a" if value is None else f"{value:,.{digits}f}"


def _users(levels: Sequence[int]) -> str:
    """`1, 8 and 32 concurrent users`."""
    if not levels:
        return "an unrecorded concurrency"
    named = [str(n) for n in levels]
    text = named[0] if len(named) == 1 else ", ".join(named[:-1]) + " and " + named[-1]
    return f"{text} concurrent user{'' if named == ['1'] else 's'}"


def _count(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _x(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}×"


def _span(values: Sequence[float | None]) -> str:
    known = sorted(v for v in values if v is not None)
    if not known:
        return "not measured"
    return _x(known[0]) if known[0] == known[-1] or len(known) == 1 else f"{known[0]:.3f}–{known[-1]:.3f}×"


@frozen
class Headline:
    """Mean tok/s and ms/step over the single-stream cells: the candidate's arms against the controls'."""

    cells: list[str]
    control_tok_s: float | None
    control_ms: float | None
    candidate_tok_s: float | None
    candidate_ms: float | None

    @property
    def ratio(self) -> float | None:
        return _ratio(self.candidate_tok_s, self.control_tok_s)

    @property
    def step_ratio(self) -> float | None:
        """Controls' ms/step over the candidate's: > 1 means each step got shorter."""
        return _ratio(self.control_ms, self.candidate_ms)


def headline(candidate: Mapping[str, Any]) -> Headline:
    cells = candidate["cells"]
    unpadded = {k: c for k, c in cells.items() if not c.get("context")}
    lowest = min((c["concurrency"] for c in unpadded.values()), default=None)
    keys = [k for k, c in unpadded.items() if c["concurrency"] == lowest]
    arms = candidate["arms"]
    controls = [a for a in arms if a["arm"].startswith("control")]
    ours = [a for a in arms if a["arm"].startswith("candidate")]

    def figure(group: list[Mapping[str, Any]], name: str) -> float | None:
        return _mean([_mean([a["cells"][k][name] for a in group if k in a["cells"]] or [None]) for k in keys]
                     or [None])

    return Headline(keys, figure(controls, "output_tok_per_s"), figure(controls, "ms_per_step"),
                    figure(ours, "output_tok_per_s"), figure(ours, "ms_per_step"))


def _headline_text(h: Headline, control: str) -> str:
    return (f"{_num(h.candidate_tok_s, 1)} tok/s at {_num(h.candidate_ms, 2)} ms per step, against "
            f"{_num(h.control_tok_s, 1)} tok/s at {_num(h.control_ms, 2)} ms for {_text(control)}: "
            f"{_x(h.ratio)} tok/s")


def _winner(gate: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The candidate that shipped (promoted), else the best that passed, else None."""
    candidates = candidates_of(gate)
    named = gate.get("promoted") or gate.get("best")
    if named:
        return next((c for c in candidates if c["candidate"] == named), None)
    passed = [c for c in candidates if c["verdict"] == "pass"]
    return passed[0] if len(passed) == 1 else None


def release_note(results: Mapping[str, Any], inputs: NoteInputs) -> str:
    gate = results["gate"]
    candidates = candidates_of(gate)
    control = gate["control"]
    winner = _winner(gate)
    lines: list[str] = []
    lines += _title(gate, winner, control, inputs)
    lines += _short_version(results, gate, candidates, winner, control)
    lines += _what_shipped(winner, candidates, control, inputs)
    lines += _measured(gate, candidates, control, inputs)
    lines += _fidelity_and_safety(gate, candidates, inputs)
    lines += _why_lost(gate, candidates, winner)
    lines += _reproduce(results, gate, candidates, inputs)
    lines += _rollback(gate, winner, control, inputs)
    return "\n".join(lines).rstrip("\n") + "\n"


def _title(gate: Mapping[str, Any], winner: Mapping[str, Any] | None, control: str,
           inputs: NoteInputs) -> list[str]:
    if inputs.not_reproduced:
        names = ", ".join(_text(c["candidate"]) for c in candidates_of(gate))
        return [f"# Not reproduced: the evidence in this run's results.json does not hold together, so no candidate "
                f"is shown as passed against {_text(control)} ({names})", ""]
    if winner is None:
        names = ", ".join(_text(c["candidate"]) for c in candidates_of(gate))
        return [f"# Not shipped: no candidate passed the gate against {_text(control)} ({names})", ""]
    h = headline(winner)
    state = "Shipped" if gate.get("promoted") == winner["candidate"] else "Passed, not promoted"
    return [f"# {state}: {_text(winner['candidate'])}, {_num(h.candidate_tok_s, 1)} tok/s at "
            f"{_num(h.candidate_ms, 2)} ms per step ({_x(h.ratio)} {_text(control)})", ""]


def _short_version(results: Mapping[str, Any], gate: Mapping[str, Any], candidates: list[Mapping[str, Any]],
                   winner: Mapping[str, Any] | None, control: str) -> list[str]:
    lines = ["## The short version", ""]
    arms = gate.get("arms", [])
    started = _text(arms[0]["started"]) if arms else "an unknown time"
    lines.append(f"One bracket of {len(arms)} arms (order {_text(gate.get('order', '?'))}), started {started}: "
                 f"{_text(control)} ran first and last as the control, "
                 + ", ".join(_text(c["candidate"]) for c in candidates) + " in between, on the "
                 f"{_code(results.get('workload', '?'))} workload at {_users(results.get('concurrency', []))}; bar "
                 f"{gate['bar']:.3f}×.")
    lines.append("")
    for candidate in candidates:
        lines.append(f"- {_text(candidate['candidate'])}: {VERDICT_WORDS[candidate['verdict']]}"
                     f"{_arms_taken(candidate)}.")
    if winner is not None:
        h = headline(winner)
        faster = f", {(h.step_ratio - 1) * 100:.1f}% faster per step" if h.step_ratio is not None else ""
        lines += ["", f"Net effect, single stream (mean of {', '.join(_text(k) for k in h.cells)}): "
                      f"{_headline_text(h, control)}{faster}."]
    lines.append("")
    return lines


def _arms_taken(candidate: Mapping[str, Any]) -> str:
    """`, on 3 arms against 4 control arms`, when `--until-decided` added any; else nothing."""
    arms = candidate.get("arms") or []
    own = sum(1 for a in arms if str(a["arm"]).startswith("candidate"))
    controls = sum(1 for a in arms if str(a["arm"]).startswith("control"))
    if not own:
        return ", without an arm of its own (it was never measured)"
    return f", on {_count(own, 'arm')} against {_count(controls, 'control arm')}"


def _what_shipped(winner: Mapping[str, Any] | None, candidates: list[Mapping[str, Any]], control: str,
                  inputs: NoteInputs) -> list[str]:
    lines = ["## What shipped", ""]
    subject = winner or (candidates[0] if len(candidates) == 1 else None)
    if subject is None:
        command = f"lanectl diff {_shell(control)} CANDIDATE"
        return lines + [f"Nothing shipped. Each candidate's differences from the control: {_code(command)}.", ""]
    name = subject["candidate"]
    if winner is None:
        lines += [f"Nothing shipped. What {_text(name)} would have changed:", ""]
    diff = inputs.shipped.get(name)
    if diff is None:
        return lines + [f"The recipes no longer define {_text(name)} (or {_text(control)}): its changes cannot be "
                        "shown.", ""]
    lines += ["| Change | Detail |", "|---|---|"]
    for change in diff["changes"]:
        lines.append(f"| {_text(_change_name(change))} | {_change_detail(change)} |")
    if diff["same"]:
        lines.append("| Unchanged | " + _text("; ".join(item.removeprefix("same ") for item in diff["same"])) + " |")
    command = f"lanectl diff {_shell(control)} {_shell(name)}"
    return lines + ["", f"From {_code(command)}, on the recipes as they are now.", ""]


def _change_name(change: Mapping[str, Any]) -> str:
    words = {"added": "added", "removed": "removed", "changed": "changed"}[change["change"]]
    return f"{change['what'].capitalize()} {words}"


def _change_detail(change: Mapping[str, Any]) -> str:
    """A table cell of `lanectl diff`'s data: prose escaped as text, values from the recipes as code."""
    value = change["b"] if change["change"] != "removed" else change["a"]
    key = _text(change["key"])
    if change["what"] == "kernel":
        text = (f"{key}: {_text(value['source'])}, built as {_text(value['module'])} beside the untouched "
                f"{_text(value['beside'])}")
        return text + (f"; upstream {_text(value['upstream'])}" if value["upstream"] else "")
    if change["what"] == "patch":
        return (f"{key} (sha256 {_text(value['sha256'][:12])}): {_text(value['subject'] or 'no subject')}; "
                f"upstream {_text(value['upstream'] or 'not named in the patch')}")
    if change["change"] == "changed":
        return f"{key}: {_value(change['a'])} → {_value(change['b'])}"
    if change["what"].startswith("engine arg"):
        return key if value is None else f"{key} {_value(value)}"
    if change["what"].startswith(("port", "volume", "secret env", "companion")):
        return key
    return f"{key}={_value(value)}"


def _value(value: Any) -> str:
    """A setting's value as a code span: shown exactly as the recipe has it (JSON for what is not text)."""
    return _code(value if isinstance(value, str) else json.dumps(value), in_table=True)


def _interval_words(candidates: Sequence[Mapping[str, Any]]) -> str:
    """How the cells' intervals were built, in the note's words."""
    intervals = [cell.get("interval") for c in candidates for cell in c["cells"].values()]
    if not intervals or any(i is None for i in intervals):
        return "bootstrap interval"
    dfs = sorted({i["df"] for i in intervals if i and i["df"] is not None})
    calibrated = any(i and i["prior"] for i in intervals)
    df_text = f"{dfs[0]}" if len(dfs) == 1 else f"{dfs[0]}–{dfs[-1]}" if dfs else "no"
    source = candidates[0].get("noise_prior")
    when = (f" ({source['arms']} arms of {_text(source['lane'])}, {_text(source['recorded'])})"
            if calibrated and source else "")
    prior = (f"pooled with this host's calibration of the workload{when}" if calibrated else
             "from the bracket's own arms alone (no calibration of the workload on this host)")
    freedom = "degree" if dfs == [1] else "degrees"
    return (f"interval, a t-interval on the arms' mean rates: each arm is one observation, and the arm-to-arm "
            f"noise is {prior}, on {df_text} {freedom} of freedom")


def _listed(lines: Sequence[str]) -> list[str]:
    """At most 20 of `lines` as a Markdown list, and how many more there are."""
    shown_lines = [f"- {_text(line)}" for line in lines[:20]]
    more = len(lines) - len(shown_lines)
    return [*shown_lines, *([f"- and {more} more"] if more > 0 else []), ""]


def _evidence_lines(inputs: NoteInputs) -> list[str]:
    """Whether the figures below were recomputed from the per-request rates, whether the evidence holds together,
    how the priors were checked, and where the record differed."""
    if not inputs.recomputed:
        return ["These figures are as recorded: this run's results.json (format 1) kept no per-request rates to "
                "recompute them from.", ""]
    lines = []
    if inputs.not_reproduced:
        lines += ["The verdict is not reproduced: results.json does not hold together in "
                  f"{_count(len(inputs.not_reproduced), 'place')}, so no candidate passes on it (a cell whose prior "
                  "no calibration could have given is judged with this host's calibration of it, or without one):",
                  "", *_listed(inputs.not_reproduced)]
    if inputs.priors_checked:
        lines += [inputs.priors_checked, ""]
    others = [line for line in inputs.differences if line not in inputs.not_reproduced]
    if not others:
        return [*lines, "Every figure and verdict below was recomputed from the per-request rates in results.json, "
                "and matches what the gate recorded.", ""]
    return [*lines, "Every figure and verdict below was recomputed from the per-request rates in results.json; the "
            f"figures recorded at the run differ from them in {_count(len(others), 'place')}:", "", *_listed(others)]


def _stale_lines(candidates: Sequence[Mapping[str, Any]]) -> list[str]:
    """The cells whose own arms spread further than the calibration allows: it was set aside there."""
    stale = []
    for c in candidates:
        for key, cell in c["cells"].items():
            found = (cell.get("interval") or {}).get("prior_stale")
            if found:
                stale.append(f"{_text(c['candidate'])} {_text(key)} (arms {found['spread']:.2%} apart where it allows "
                             f"{found['allowed']:.2%})")
    if not stale:
        return []
    return [f"The calibration was set aside as stale in {', '.join(stale)}: the bracket's own arms spread further "
            "than it allows (an F test at 5%), so those intervals rest on the bracket's own arms.", ""]


def _measured(gate: Mapping[str, Any], candidates: list[Mapping[str, Any]], control: str,
              inputs: NoteInputs) -> list[str]:
    lines = ["## Measured, this window", ""]
    if not any(c["cells"] for c in candidates):
        return lines + ["Nothing was measured: the bracket stopped before its cells ran ("
                        + "; ".join(_text(r) for c in candidates for r in c["reasons"][:1]) + ").", ""]
    lines += [f"The control ({_text(control)}) ran at the start and the end of the bracket; the candidates ran "
              "in between. A cell's ratio is the candidate's per-request tok/s over the controls', with its 95% "
              f"{_interval_words(candidates)}; it passes when the interval's low end clears the bar.", ""]
    lines += _evidence_lines(inputs)
    lines += _stale_lines(candidates)
    names = [_text(c["candidate"]) for c in candidates]
    lines += ["| Measure | " + f"Controls ({_text(control)}) | " + " | ".join(names) + " |",
              "|---|---|" + "---|" * len(names)]
    heads = [headline(c) for c in candidates]
    first = heads[0]
    lines.append(f"| Single stream, mean of {', '.join(_text(k) for k in first.cells)} | "
                 f"{_num(first.control_tok_s, 1)} tok/s · "
                 f"{_num(first.control_ms, 2)} ms/step | "
                 + " | ".join(f"{_num(h.candidate_tok_s, 1)} tok/s · {_num(h.candidate_ms, 2)} ms/step "
                              f"({_x(h.ratio)})" for h in heads) + " |")
    for key in cell_order(candidates):
        row = [f"| {_text(key)} | 1.00×"]
        for c in candidates:
            cell = c["cells"].get(key)
            row.append("not measured" if cell is None else
                       f"{cell['ratio']:.3f}× ({cell['low']:.3f}–{cell['high']:.3f}) {cell['verdict']}")
        lines.append(" | ".join(row) + " |")
    lines.append("| Prompt processing | 1.00× | "
                 + " | ".join(_span([cell["prompt_ratio"] for cell in c["cells"].values()]) for c in candidates)
                 + " |")
    lines.append("| First token (controls' TTFT over the candidate's) | 1.00× | "
                 + " | ".join(_span([cell["ttft_ratio"] for cell in c["cells"].values()]) for c in candidates)
                 + " |")
    return lines + [""]


def _fidelity_and_safety(gate: Mapping[str, Any], candidates: list[Mapping[str, Any]],
                         inputs: NoteInputs) -> list[str]:
    lines = ["## Fidelity and safety", ""]
    for c in candidates:
        fid = c.get("fidelity") or {}
        if not fid:
            lines.append(f"- {_text(c['candidate'])}: no teacher-forced figures (the bracket did not get that far).")
            continue
        agent = fid.get("agent") or {}
        agent_text = (f", {agent['confident_flips']} on agent/tool prompts ({_text(', '.join(agent['classes']))}, "
                      "allowed 0)" if agent.get("classes") else "")
        bar_weight = fid["weighted_divergence_bar"]
        lines.append(f"- {_text(c['candidate'])}: teacher-forced on {_text(fid['reference'])}'s outputs, "
                     f"{_count(fid['positions'], 'position')} of {_count(fid['prompts'], 'prompt')}: weighted "
                     f"divergence {fid['weighted_divergence']:.3f} "
                     f"against a bar of {_num(bar_weight, 3)}, {fid['confident_flips']} confident flips against a "
                     f"bar of {fid['confident_flips_bar']}{agent_text}; "
                     + ("within the controls' own spread." if fid["verdict"] == "pass" else
                        "outside the controls' own spread." if fid["verdict"] == "fail" else
                        f"inconclusive ({fid.get('unscored', 0)} prompt(s) unscored)."))
    lines.append("")
    arms = gate.get("arms", [])
    probes = _probe_rows(candidates, arms)
    if probes:
        lines += probes + [""]
    else:
        lines += ["No correctness probes ran in this bracket.", ""]
    lines += ["| Arm | Lane | Xid lines | Engine errors | Failed requests |", "|---|---|---|---|---|"]
    for arm in arms:
        failed = sum(cell["failed"] for cell in arm["cells"].values())
        lines.append(f"| {_text(arm['arm'])} | {_text(arm['lane'])} | {len(arm['xid_lines'])} | "
                     f"{len(arm['fatal_lines'])} | "
                     f"{failed} |")
    unread = [arm["arm"] for arm in arms if any("kernel log not readable" in note for note in arm["notes"])]
    lines.append("")
    if unread:
        lines.append(f"The kernel log could not be read in {_text(', '.join(unread))}: their Xid counts are not "
                     "evidence.")
    clean = [arm for arm in arms if not arm["xid_lines"] and not arm["fatal_lines"] and arm["arm"] not in unread]
    if arms and len(clean) == len(arms):
        lines.append(f"Zero Xid lines and zero engine errors in all {len(arms)} arms.")
    lines += _first_clean(candidates, clean, inputs)
    return lines + [""]


def _probe_rows(candidates: list[Mapping[str, Any]], arms: list[Mapping[str, Any]]) -> list[str]:
    table: dict[str, dict[str, Mapping[str, Any]]] = {}
    for c in candidates:
        for name, by_arm in (c.get("probes") or {}).items():
            table.setdefault(name, {}).update(by_arm)
    if not table:
        return []
    order = [a["arm"] for a in arms]
    rows = ["| Probe | " + " | ".join(_text(arm) for arm in order) + " |", "|---|" + "---|" * len(order)]
    for name, by_arm in table.items():
        cells = []
        for arm in order:
            probe = by_arm.get(arm)
            cells.append("–" if probe is None else f"{probe['passed']}/{probe['total']}"
                         + ("" if probe["ok"] else " FAIL"))
        rows.append(f"| {_text(name)} | " + " | ".join(cells) + " |")
    return rows


def _first_clean(candidates: list[Mapping[str, Any]], clean: list[Mapping[str, Any]], inputs: NoteInputs) -> list[str]:
    """"The first clean arms" only where the journal shows every earlier gate of that lane logged a fault."""
    if inputs.earlier_gates is None:
        return ["The journal was not read: nothing is said about earlier runs of these lanes."]
    lines = []
    clean_lanes = {arm["lane"] for arm in clean}
    for c in candidates:
        lane = c["candidate"]
        if lane not in clean_lanes:
            continue
        earlier = [g for g in inputs.earlier_gates if g.get("candidate") == lane]
        faulted = [g for g in earlier if any(" Xid line" in r or "fatal engine line" in r
                                             for r in g.get("reasons", []))]
        if earlier and len(faulted) == len(earlier):
            lines.append(f"{_text(lane)}'s arms are the first clean ones in the journal: each of its {len(earlier)} "
                         "earlier gate(s) logged an Xid or a fatal engine line.")
    return lines


def _why_lost(gate: Mapping[str, Any], candidates: list[Mapping[str, Any]],
              winner: Mapping[str, Any] | None) -> list[str]:
    losers = [c for c in candidates if c is not winner and c["verdict"] != "pass"]
    lines: list[str] = []
    for c in losers:
        lines += [f"## Why {_text(c['candidate'])} lost", ""]
        by_streams: dict[int, list[float]] = {}
        for cell in c["cells"].values():
            by_streams.setdefault(cell["concurrency"], []).append(cell["ratio"])
        if by_streams:
            lines.append("Against the controls, per concurrency: "
                         + "; ".join(f"{n} user{'s' if n != 1 else ''} {_span(r)}"
                                     for n, r in sorted(by_streams.items()))
                         + f", against a {c['bar']:.3f}× bar.")
            lowest, highest = min(by_streams), max(by_streams)
            if lowest != highest and min(by_streams[lowest]) > 1 > max(by_streams[highest]):
                lines.append(f"Faster alone, slower in the server: every {lowest}-user cell beat the controls and "
                             f"every {highest}-user cell fell behind them.")
        failed = [(k, c["cells"][k]) for k in cell_order([c]) if c["cells"][k]["verdict"] != "pass"]
        if failed:
            lines.append("Cells that did not pass: " + "; ".join(
                f"{_text(k)} {cell['ratio']:.3f}× ({cell['low']:.3f}–{cell['high']:.3f}, {cell['verdict']})"
                for k, cell in failed) + ".")
        fid = c.get("fidelity") or {}
        if fid and fid["verdict"] != "pass":
            lines.append(f"It drifted more than the controls: {fid['confident_flips']} confident flips against a "
                         f"bar of {fid['confident_flips_bar']}, weighted divergence {fid['weighted_divergence']:.3f} "
                         f"against {_num(fid['weighted_divergence_bar'], 3)}.")
        lines += ["", "The gate's reasons:", ""] + [f"- {_text(reason)}" for reason in c["reasons"]] + [""]
    return lines


def _reproduce(results: Mapping[str, Any], gate: Mapping[str, Any], candidates: list[Mapping[str, Any]],
               inputs: NoteInputs) -> list[str]:
    names = " ".join(_shell(c["candidate"]) for c in candidates)
    control = _shell(gate["control"])
    concurrency = ",".join(str(n) for n in results.get("concurrency", []))
    extra = f" --until-decided {gate['until_decided']}" if gate.get("until_decided") else ""
    workload = _shell(results.get("workload", "?"))
    prior = candidates[0].get("noise_prior")
    calibration = ([f"lanectl gate {_shell(prior['lane'])} --calibrate --arms {prior['arms']} --workload {workload} "
                    f"--concurrency {concurrency}"] if prior else [])
    lines = ["## Reproduce", "", "```",
             *(f"lanectl diff {control} {_shell(c['candidate'])}" for c in candidates),
             f"lanectl build {control} {names}", *calibration,
             f"lanectl gate {names} --control {control} --workload {workload} "
             f"--concurrency {concurrency} --bar {gate['bar']:g} --order {_order_flag(gate)}{extra} --out results/",
             f"lanectl report {_shell('results/' + inputs.run_name)} --release-note", "```", "",
             "Images the arms ran (tags are content-addressed: the suffix hashes every build input):", ""]
    images = dict.fromkeys((arm["lane"], arm["image"]) for arm in gate.get("arms", []))
    for lane, image in images:
        found = inputs.image_ids.get(image)
        lines.append(f"- {_text(lane)}: {_code(image)}" + (f", image ID {_code(found)} on this host when the note "
                                                            "was written" if found else ", image ID not looked up"))
    if not images:
        lines.append("- not recorded")
    return lines + [""]


def _order_flag(gate: Mapping[str, Any]) -> str:
    """The --order that gave this bracket: as recorded, or (format 1) a mirrored order has more candidate arms
    than candidates."""
    if gate.get("requested_order"):
        return str(gate["requested_order"])
    candidates = candidates_of(gate)
    arms = [a for a in gate.get("arms", []) if a["arm"].startswith("candidate")]
    return "ABBA" if len(arms) > len(candidates) else "ABA"


def _rollback(gate: Mapping[str, Any], winner: Mapping[str, Any] | None, control: str,
              inputs: NoteInputs) -> list[str]:
    lines = ["## Rollback", ""]
    promoted = gate.get("promoted")
    if not promoted:
        return lines + [f"Nothing to roll back: the bracket ended with {_text(control)} serving, as it began.", ""]
    back, shipped = inputs.lanes.get(control), inputs.lanes.get(promoted)
    lines += ["```", f"lanectl rollback --to {_shell(control)}", "```", ""]
    if back is None or shipped is None:
        return lines + [f"The recipes no longer define {_text(control if back is None else promoted)}: what the "
                        "rollback does cannot be said from them.", ""]
    stops = ", ".join(_code(n) for n in shipped["containers"])
    starts = ", ".join(_code(n) for n in back["containers"])
    standby = back.get("standby")
    if standby:
        how = (f"wakes {starts} from vLLM sleep mode, where {_text(control)} waits as a standby (level "
               f"{standby['level']}, wake within {standby['wake_timeout_seconds']:g} s); if it is gone or the wake "
               "fails, it starts cold")
    else:
        how = f"starts {starts} cold (no standby in the recipe)"
    return lines + [f"Stops {stops}, then {how}, through the same health gate as `lanectl up`; on a pass "
                    f"{_text(control)} is the active lane again and the watchdog is re-armed.", ""]
