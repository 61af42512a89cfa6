"""The text view of each command: from a `Result` to the lines people read.

Each view reads only the result (its data, and `text_only` where a view shows more than `--json` carries);
`render_text` adds the result's messages on stderr. Styles are rich style names; with no terminal they vanish
and what is left is the text the tests compare.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from lanectl.output import Line, Result, Span, aligned, line, text_lines

View = Callable[[Result], list[Line]]


def render_text(result: Result) -> list[Line]:
    """The view of the result's command, then its messages (stderr)."""
    return VIEWS[result.command](result) + [line(m.text, err=True) for m in result.messages]


def validate(result: Result) -> list[Line]:
    lanes, recipes = result.data["lanes"], result.data["recipes"]
    return [line(f"ok: {len(lanes)} lanes in {len(recipes)} recipes ({', '.join(lanes)})")]


def lanes(result: Result) -> list[Line]:
    built = {True: "yes", False: "no", None: "?"}
    rows = [("LANE", "RECIPE", "IMAGE", "BUILT", "COMPANIONS")] + [
        (row["lane"], row["recipe"], row["image"], built[row["built"]], ",".join(row["companions"]) or "-")
        for row in result.data["lanes"]
    ]
    note = result.data["note"]
    return [line(text) for text in aligned(rows)] + ([line(note, err=True)] if note else [])


def render(result: Result) -> list[Line]:
    data = result.data
    lines = [line(f"# lane {data['lane']}  image {data['image']}  inputs {data['input_hash']}"),
             line("# ---- Dockerfile ----"), *text_lines(data["dockerfile"]),
             line("# ---- build context ----")]
    lines += [line(f"{item['size']:>9}  {item['sha256'][:12]}  {item['path']}") for item in data["context"]]
    for tree in data["kernel_sources"]:
        where = f"fetched: {tree['fetched']}" if tree["fetched"] else "not fetched yet: `lanectl build` fetches it"
        lines.append(line(f"{'tree':>9}  {'':12}  {tree['context']}  <- {tree['origin']} ({where})"))
    lines += [line("# ---- containers (start order) ----"), *text_lines(json.dumps(data["containers"], indent=2))]
    if data["services"]:
        lines += [line("# ---- Swarm services (ServiceSpec, one per role and node) ----"),
                  *text_lines(json.dumps(data["services"], indent=2))]
    return lines


def schema(result: Result) -> list[Line]:
    return text_lines(json.dumps(result.data, indent=2))


PATCH_COLOURS = {"applies": "green", "already-upstream": "yellow", "conflicts": "red"}


def patches_check(result: Result) -> list[Line]:
    lines = []
    for patch in result.text_only["patches"]:
        status = patch["status"]
        lines.append(line((f"{status:<17}", PATCH_COLOURS[status]), f"{patch['summary']}  {patch['subject']}"))
        lines += [line(detail) for detail in patch["details"]]
    return lines


VERDICT_COLOURS = {"breaks": "red", "note": "yellow", "ok": "green"}


def pin_check(result: Result) -> list[Line]:
    data = result.data
    lines = [line(f"vLLM {data['version']} (flashinfer {data['flashinfer']}), from its released source")]

    def findings(items: list[Any]) -> list[Line]:
        return [line("  ", (f"{f['verdict']:<6}", VERDICT_COLOURS[f["verdict"]]), f" {f['topic']}: {f['text']}"
                     + (f"  [{f['where']}]" if f["where"] else "")) for f in items]

    if data["release"]:
        lines += [line("the release"), *findings(data["release"])]
    for lane in data["lanes"]:
        lines += [line(f"{lane['lane']} ({lane['recipe']}, pinned to {lane['pinned']})"), *findings(lane["findings"])]
    lines += [line(f"not checked: {name}", err=True) for name in data["not_checked"]]
    count = data["breaks"]
    lines.append(line((f"{count} thing{'s' if count != 1 else ''} break{'' if count != 1 else 's'}", "red")
                      if count else ("nothing breaks", "green"), f" moving to vLLM {data['version']}"))
    return lines


BUILD_COLOURS = {"built": "green", "unchanged": "cyan", "skipped": "cyan", "failed": "red"}


def build(result: Result) -> list[Line]:
    lines = []
    for outcome in result.data["builds"]:
        lines.append(line((f"{outcome['status']:<9}", BUILD_COLOURS[outcome["status"]]),
                          f" {outcome['lane']}: {outcome['message']}"))
        if outcome["reference"] is not None:
            lines.append(line(f"          {outcome['lane']}: {outcome['reference']}"))
        if outcome["status"] == "failed":
            lines.append(line(("last lines of the failing step:", "bold"), err=True))
            lines += [line(f"  {text}", err=True) for text in outcome["log_tail"]]
    return lines


def plan(result: Result) -> list[Line]:
    return [line(step) for step in result.data["steps"]]


def switch(result: Result) -> list[Line]:
    return _outcome(result.data, "the failed lane")


def fleet_switch(result: Result) -> list[Line]:
    rows = [line(f"  {node['node']:<24} {node['result']:<22} {node['detail']}") for node in result.data["nodes"]]
    return rows + _outcome(result.data, "the failed node's service")


def _outcome(data: Mapping[str, Any], failed: str) -> list[Line]:
    """The result line; the failed engine's last log lines on stderr."""
    colour = "green" if data["result"] in ("ok", "noop", "finished", "undone") else "red"
    lines = [line((data["result"], colour), ": ", data["message"])]
    tail = data["diagnostics"].get("log_tail")
    if tail:
        lines.append(line((f"last log lines of {failed}:", "bold"), err=True))
        lines += [line(f"  {text}", err=True) for text in tail[-15:]]
    return lines


def status(result: Result) -> list[Line]:
    data = result.data
    lines = []
    for lane in data["lanes"]:
        health = f"  health: {lane['health']}" if lane["health"] else ""
        active: list[str | Span] = [("active", "bold green"), " "] if lane["active"] else []
        standby = lane.get("standby")
        if standby:
            resident = f", {standby['resident_gib']:g} GiB resident" if standby["resident_gib"] is not None else ""
            gone = "" if standby["alive"] else ", container gone"
            # vLLM queues a request to a sleeping engine: say so, or an operator reads a silent port as a hang.
            queued = "" if gone else ", requests to it wait unanswered until a wake"
            active.append((f"standby {standby['seconds']} s{resident}{gone}{queued} ", "bold cyan"))
        restarted = f"  restarted {lane['watchdog_restarts']}x by the watchdog" if lane.get("watchdog_restarts") else ""
        lines.append(line((lane["lane"], "bold"), "  ", *active, "known-good " if lane["known_good"] else "",
                          f"{_status_image(lane)}{health}{restarted}"))
        if lane["recipe_problem"] and not lane["from_labels"]:
            lines.append(line("    recipe   ", (lane["recipe_problem"], "yellow")))
        if lane.get("dead"):
            lines.append(line(("    dead     ", "bold red"), (lane["dead"], "red")))
        if lane["pushed"]:
            lines.append(line(f"    pushed   {lane['pushed']['reference']}"))
        if lane.get("without_gpus"):
            lines.append(line("    runs without GPUs (started with --no-gpu), though its recipe asks for some"))
        for c in lane["containers"]:
            detail = f"up {c['uptime_seconds']} s" if c["uptime_seconds"] is not None else c["status"]
            if c["exit_code"] not in (None, 0):
                detail += f" (exit {c['exit_code']})"
            stale: list[Span] = [(f"  older build {c['image']}", "yellow")] if c["current_build"] is False else []
            lines.append(line(f"    {c['role']:<8} {c['name']:<40} {detail:<14} restarts {c['restarts']}", *stale))
            if c.get("drift"):
                lines.append(line(("      differs from the recipe: ", "yellow"), ", ".join(c["drift"]),
                                  f" (`lanectl up {lane['lane']}` recreates it)"))
    watchdog = data["watchdog"]
    lease = watchdog["lease"]
    lease_text = (f"; lease until {lease['until']} ({lease['reason']}){' expired' if lease['expired'] else ''}"
                  if lease else "")
    lines.append(line(f"watchdog: {'armed' if watchdog['armed'] else 'disarmed'}{lease_text}"))
    lines.append(line(f"known-good: {', '.join(data['known_good']) or '-'}"))
    if data["unfinished_switch"]:
        u = data["unfinished_switch"]
        lines.append(line((f"unfinished {u['action']}", "red"),
                          f" {u['from'] or '-'} -> {u['to'] or '-'} since {u['ts']} "
                          f"({len(u['done_steps'])}/{len(u['steps'])} steps); the next up/rollback finishes "
                          f"or undoes it"))
    lines += [line(f"journal: {problem}", err=True) for problem in data["journal_problems"]]
    lines += [line(("foreign container ", "red"), f"{f['name']} ({f['what']}; in the way of "
                   f"{', '.join(f['lanes'])}): lanectl will not stop or adopt it; clear it with `{f['clear_with']}`")
              for f in data.get("foreign_containers", [])]
    lines += [line(("orphan container ", "red"), f"{o['name']} ({o['status']}): made for {o['lane']}'s role "
                   f"{o['role']}, which its recipe no longer has; the next `lanectl up` or `down` stops and removes it")
              for o in data.get("orphan_containers", [])]
    lines += [line(f"container {name} has lanectl labels but its lane is not in the recipes", err=True)
              for name in data["unknown_containers"]]
    return lines


def _status_image(lane: Mapping[str, Any]) -> str:
    if lane["from_labels"]:
        return f"{lane['image'] or '-'} (from its containers' labels: no recipe that loads has it)"
    if lane["image"] is None:
        return "(its image does not render)"
    return f"{lane['image']}{'' if lane['built'] else ' (not built)'}"


def fleet_status(result: Result) -> list[Line]:
    lines = []
    for node in result.data["nodes"]:
        colour = "green" if node["state"] == "ready" else "red"
        gpus = ", ".join(f"{k}={v}" for k, v in node["gpus"].items()) or "no GPUs advertised"
        labels = ", ".join(f"{k}={v}" for k, v in sorted(node["labels"].items())) or "-"
        lines.append(line((node["hostname"], "bold"), " ", (node["state"], colour),
                          f" {node['availability']} {node['role']} {node['addr']}  {gpus}  labels: {labels}"))
        if node.get("lease_left_behind"):
            lines.append(line((f"    lease left behind by {node['lease']}: {node['lease_left_behind']}", "yellow")))
        elif node["lease"]:
            lines.append(line(f"    being changed by {node['lease']}"))
        for lane in node["lanes"]:
            health = f"  health: {lane['health']}" if lane["health"] else ""
            update = f"  last update: {lane['update']}" if lane["update"] else ""
            problem: list[Span] = [(f"  {lane['problem']}", "red")] if lane["problem"] else []
            failed = f"  failed tasks: {lane['failed_tasks']}" if lane["failed_tasks"] else ""
            lines.append(line(f"    {lane['lane']:<20} {lane['role']:<8} task {lane['task']:<9}{health}{update}",
                              *problem, failed))
            if lane.get("drift"):
                lines.append(line(("      differs from the recipe: ", "yellow"), ", ".join(lane["drift"]),
                                  f" (`lanectl up {lane['lane']} --fleet` updates it)"))
        if not node["lanes"]:
            lines.append(line("    no lanectl lanes"))
    lines += [line(("problem:", "red"), " ", problem, err=True) for problem in result.data["problems"]]
    return lines


def history(result: Result) -> list[Line]:
    return ([line(describe(record)) for record in result.data["records"]]
            + [line(f"journal: {problem}", err=True) for problem in result.data["problems"]])


def describe(record: Mapping[str, Any]) -> str:
    """One line per journal record; --json gives the records as written."""
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


SEVERITY_COLOURS = {"ok": "green", "warn": "yellow", "error": "red"}


def doctor(result: Result) -> list[Line]:
    lines = []
    for finding in result.data["findings"]:
        severity = finding["severity"]
        lines.append(line((f"{severity:<5}", SEVERITY_COLOURS[severity]), f" {finding['check']}: {finding['detail']}"))
        if finding["fix"]:
            lines.append(line(f"      fix: {finding['fix']}"))
    return lines


def watchdog_check(result: Result) -> list[Line]:
    return [line(pass_line(result.data))]


def pass_line(data: Mapping[str, Any]) -> str:
    """One watchdog pass: the lane, what was done and why, and how it ended."""
    text = f"{data['lane'] or '-'}: {data['action']}: {data['reason']}"
    return text + (f" -> {data['outcome']}" if data["outcome"] else "")


def watchdog_status(result: Result) -> list[Line]:
    data = result.data
    lease = data["lease"]
    age = data["heartbeat_age_seconds"]
    lines = [
        line(f"watchdog: {'armed' if data['armed'] else 'disarmed'}"
             + (f"; lease until {lease['until']} ({lease['reason']}, by {lease['by']})" if lease else "")),
        line(f"active lane: {data['active'] or '-'}"),
        line(f"last pass: {data['last_pass'] or 'never'} ({data['last_pass_result'] or '-'}); heartbeat "
             + (f"{age:.0f} s ago" if age is not None else "never")),
    ]
    if data["last_action"]:
        action = data["last_action"]
        lines.append(line(f"last action: {action['ts']} {action['action']}: {action['reason']} -> {action['outcome']}"))
    lines.append(line(f"restarts: {_counts(data['restarts_total'])}; rollbacks: {data['rollbacks_total']}; "
                      f"Xid: {_counts(data['xid_total'])} (hardware {data['xid_hardware_total']})"))
    return lines + [line(problem, err=True) for problem in data["problems"]]


def _counts(counts: Mapping[str, int] | int | None) -> str:
    """A counter per key as people read it: `3 (31: 2, 94: 1)`, never a Python dict."""
    if not isinstance(counts, Mapping):
        return str(counts or 0)
    total = sum(counts.values())
    ordered = sorted(counts.items(), key=lambda item: (len(str(item[0])), str(item[0])))  # Xid 9 before 31
    return f"{total} ({', '.join(f'{key}: {value}' for key, value in ordered)})" if counts else "0"


def watchdog_arm(result: Result) -> list[Line]:
    return [line("armed" if result.data["armed"] else "disarmed")]


def watchdog_rearm(result: Result) -> list[Line]:
    return [line(result.data["message"])]


def watchdog_disarm(result: Result) -> list[Line]:
    return [line(f"disarmed until {result.data['until'] or '?'} ({result.data['reason']})")]


def watchdog_install(result: Result) -> list[Line]:
    return [line(text) for text in result.data["lines"]]


def nothing(result: Result) -> list[Line]:
    """Commands whose output has already been streamed (`logs`, `watchdog run`)."""
    return []


def bench(result: Result) -> list[Line]:
    bench_data = result.data["bench"]
    lines = [line(f"{'cell':<22} {'tok/s':>9} {'ms/step':>8} {'TTFT p50':>9} {'ITL p99':>8} {'failed':>6}")]
    for key, cell in bench_data["cells"].items():
        lines.append(line(f"{key:<22} {cell['output_tok_per_s']:>9.1f} {cell['ms_per_step'] or 0:>8.2f} "
                          f"{cell['ttft_p50_ms'] or 0:>8.1f}m {cell['itl_p99_ms'] or 0:>7.1f}m {cell['failed']:>6}"))
    return lines + [line(note, err=True) for note in bench_data["notes"]]


def _ratio_text(value: float | None) -> str:
    return f"{value:.3f}" if value is not None else "-"


def gate(result: Result) -> list[Line]:
    """A gate run as the release note tabled it: the verdict's ratio per class at each concurrency and
    context, then per cell the arms, the 95% interval, decode, prompt-processing and first-token ratios
    and the verdict; teacher-forced fidelity per class with agent/tool prompts apart; the calibration."""
    report = result.data
    if "candidates" not in report:
        return [line(text) for text in _gate_lines(report)]
    lines: list[Line] = []
    for candidate in report["candidates"]:
        lines.append(line((f"{candidate['candidate']} against {candidate['control']}:", "bold")))
        lines += [line(text) for text in _gate_lines(candidate)]
    best = f"; best that passed: {report['best']}" if report["best"] else "; none passed"
    lines.append(line(f"bracket: {report['verdict'].upper()} (order {report['order']}, "
                      f"{len(report['candidates'])} candidates{best})"
                      + (f"; promoted {report['promoted']}" if report.get("promoted") else "")))
    return lines + [line(f"  - {reason}") for reason in report["reasons"]]


def _gate_lines(report: Mapping[str, Any]) -> list[str]:
    cells = report["cells"]
    lines: list[str] = []
    classes = list(dict.fromkeys(c["class"] for c in cells.values()))
    rows = list(dict.fromkeys((c["concurrency"], c["context"]) for c in cells.values()))
    if cells:
        lines.append("candidate / control, per-request tok/s:")
        lines.append(f"{'users':>5} {'context':>8}  " + " ".join(f"{k:>10}" for k in classes))
        by_axes = {(c["class"], c["concurrency"], c["context"]): c for c in cells.values()}
        for streams, context in rows:
            figures = [by_axes.get((k, streams, context)) for k in classes]
            lines.append(f"{streams:>5} {context:>8}  "
                         + " ".join(f"{_ratio_text(c['ratio'] if c else None):>10}" for c in figures))
        arms = list(next(iter(cells.values()))["arms"])
        lines.append(f"{'cell':<22} " + " ".join(f"{a:>11}" for a in arms)
                     + f" {'ratio':>6} {'95% interval':>13} {'decode':>6} {'prompt':>6} {'TTFT':>6}  verdict")
        for key, cell in cells.items():
            lines.append(f"{key:<22} " + " ".join(f"{cell['arms'][a]:>11.1f}" for a in arms)
                         + f" {cell['ratio']:>6.3f} {cell['low']:>6.3f}-{cell['high']:<6.3f} "
                         f"{_ratio_text(cell['decode_ratio']):>6} {_ratio_text(cell['prompt_ratio']):>6} "
                         f"{_ratio_text(cell['ttft_ratio']):>6}  {cell['verdict']}")
    fid = report.get("fidelity") or {}
    if fid:
        lines.append(f"fidelity (teacher-forced on {fid['reference']}'s outputs, every position): {fid['verdict']}: "
                     f"{fid['confident_flips']} confident flips (bar {fid['confident_flips_bar']}), weighted "
                     f"divergence {fid['weighted_divergence']:.3f} (bar {fid['weighted_divergence_bar']:.3f}) over "
                     f"{fid['positions']} positions of {fid['prompts']} prompts")
        for name, figures in fid["classes"].items():
            bar_flips = figures["confident_flips_bar"]
            bar_weight = figures["weighted_divergence_bar"]
            lines.append(f"  {name}: {figures['confident_flips']} confident flips (bar {bar_flips}), weighted "
                         f"{figures['weighted_divergence']:.3f}"
                         + (f" (bar {bar_weight:.3f})" if bar_weight is not None else ""))
        agent = fid["agent"]
        if agent["classes"]:
            lines.append(f"  agent/tool prompts ({', '.join(agent['classes'])}): {agent['confident_flips']} "
                         f"confident flips (allowed 0)")
    order = [arm["arm"] for arm in report.get("arms", [])]  # the bracket's order (results.json sorts keys)
    for name, arms in (report.get("probes") or {}).items():
        lines.append(f"probe {name:<16} " + "  ".join(_probe_cell(arm, arms[arm]) for arm in order if arm in arms))
    calibration = report.get("calibration")
    if calibration and isinstance(calibration["cells"], dict):
        lines += _calibration_lines(report, calibration)
    elif calibration:  # results format 1: one A/B/A bracket of the lane against itself
        lines.append(f"calibration ({report['order']} of one lane): false-promotion rate "
                     f"{calibration['false_promotion_rate']:.4f} (allowed {calibration['max_false_promotion']:g}), "
                     f"{calibration['cells_passed']} of {calibration['cells']} cells passed the bar; smallest "
                     f"detectable effect {calibration['detectable_ratio']:.3f}x to pass, "
                     f"+{calibration['detectable_gain']:.1%} to tell from no change")
    lines.append(f"verdict: {report['verdict'].upper()} (bar {report['bar']:.3f}x, order {report.get('order', 'ABA')})"
                 + (f"; promoted {report['promoted']}" if report.get("promoted") else ""))
    lines += [f"  - {reason}" for reason in report["reasons"]]
    return lines


def _calibration_lines(report: Mapping[str, Any], calibration: Mapping[str, Any]) -> list[str]:
    """Per cell: the spread of arm means, how many A/A brackets' intervals held 1.0, and what an A/B/A bracket
    could detect with this noise."""
    lines = [f"calibration ({len(report.get('arms', []))} arms of {report['control']}, back to back): per cell, "
             "the spread of arm means and the A/A brackets of consecutive arms; coverage: the share of their "
             f"{calibration.get('confidence', 0.95):.0%} intervals that held 1.0 (below that share, the gate's "
             "intervals in that cell cannot be trusted on this host)",
             f"{'cell':<22} {'arms':>4} {'arm sd':>7} {'held 1.0':>9} {'coverage':>8} {'passed':>6} {'failed':>6} "
             f"{'false promotion':>15} {'detectable':>10}"]
    for key, cell in calibration["cells"].items():
        coverage = cell["covered"] / cell["brackets"] if cell["brackets"] else None
        lines.append(f"{key:<22} {cell['arms']:>4} {cell['arm_sd']:>7.2%} "
                     f"{str(cell['covered']) + '/' + str(cell['brackets']):>9} "
                     f"{'-' if coverage is None else f'{coverage:.0%}':>8} {cell['passed']:>6} "
                     f"{cell['failed']:>6} {cell['false_promotion']:>15.4f} {cell['detectable_ratio']:>9.3f}x")
    return lines


def report(result: Result) -> list[Line]:
    """A gate run again: its tables as the per-request rates say, then whether the record agreed."""
    data = result.data
    lines = gate(result)
    if not data["recomputed"]:
        return lines + [line(f"results format {data['results_version']}: no per-request rates were kept, so the "
                             "figures are shown as recorded")]
    if not data["differences"]:
        return lines + [line("recomputed from the per-request rates: every figure and verdict matches the record")]
    lines.append(line((f"recomputed from the per-request rates: {len(data['differences'])} figure(s) differ from "
                       "the record:", "bold red")))
    return lines + [line(f"  {difference}") for difference in data["differences"]]


def _probe_cell(arm: str, probe: dict[str, Any]) -> str:
    """`candidate 12/12`, a needle's time after it: `control-1 1/1 in 31.2 s`."""
    seconds = max(probe["seconds"].values()) if probe["kind"] == "needle" and probe["seconds"] else None
    # Three significant figures: the demo's 4k needle answers in milliseconds, the production one in tens of seconds.
    timed = f" in {seconds:.3g} s" if seconds is not None else ""
    return f"{arm} {probe['passed']}/{probe['total']}{timed}{'' if probe['ok'] else ' FAIL'}"


def _diff_value(what: str, key: str, value: Any) -> str:
    """A changed thing in one line: a kernel's source and module, a patch's sha256 and upstream link."""
    if what == "kernel":
        text = f"{key}: {value['source']}, installed as {value['module']} beside {value['beside']}"
        return text + (f"; upstream {value['upstream']}" if value["upstream"] else "")
    if what == "patch":
        upstream = value["upstream"] or "no Upstream: header"
        return f"{key} (sha256 {value['sha256'][:12]}): {value['subject'] or 'no Subject: header'}; upstream {upstream}"
    if what.startswith("engine arg"):
        return key if value is None else f"{key} {value}"
    if what.startswith(("port", "volume", "secret env", "companion")):
        return key
    return f"{key}={_plain(value)}"


def diff(result: Result) -> list[Line]:
    """`- A`, `+ B` and `~ A -> B` per difference, grouped by what it is; then what is the same."""
    data = result.data
    a, b = data["a"], data["b"]
    lines = [line((f"{a['lane']} -> {b['lane']}", "bold")),
             line(f"  image  {a['image']} -> {b['image']}")]
    for change in data["changes"]:
        what, key = change["what"], change["key"]
        if change["change"] == "added":
            lines.append(line(f"  {what}  ", ("+ ", "green"), _diff_value(what, key, change["b"])))
        elif change["change"] == "removed":
            lines.append(line(f"  {what}  ", ("- ", "red"), _diff_value(what, key, change["a"])))
        elif what in ("kernel", "patch"):
            lines.append(line(f"  {what}  ", ("~ ", "yellow"), _diff_value(what, key, change["a"]), " -> ",
                              _diff_value(what, key, change["b"])))
        else:
            lines.append(line(f"  {what}  ", ("~ ", "yellow"),
                              f"{key}: {_plain(change['a'])} -> {_plain(change['b'])}"))
    if not data["changes"]:
        lines.append(line("  no differences in the rendered inputs"))
    lines += [line(f"  {item}") for item in data["same"]]
    return lines


def _plain(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def release_note(result: Result) -> list[Line]:
    """The Markdown as written, on stdout; nothing when it went to a file."""
    return text_lines(result.data["markdown"]) if result.text_only.get("print") else []


def init(result: Result) -> list[Line]:
    return [line(f"wrote {path}") for path in result.data["written"]] + [line(f"next: {result.data['next']}")]


def import_jm(result: Result) -> list[Line]:
    data = result.data
    lines = text_lines(data["recipe"]) if data["out"] is None else [line(f"wrote {data['out']}", err=True)]
    return lines + [line(text, err=True) for text in data["unmapped"]]


def standby_check(result: Result) -> list[Line]:
    from lanectl.commands.standby import report_lines

    return [line(text) for text in report_lines(result.data)]


VIEWS: dict[str, View] = {
    "validate": validate,
    "lanes": lanes,
    "render": render,
    "diff": diff,
    "schema": schema,
    "patches.check": patches_check,
    "pin.check": pin_check,
    "build": build,
    "plan": plan,
    "switch": switch,
    "fleet-switch": fleet_switch,
    "status": status,
    "fleet-status": fleet_status,
    "logs": nothing,
    "history": history,
    "doctor": doctor,
    "watchdog.check": watchdog_check,
    "watchdog.run": nothing,
    "watchdog.status": watchdog_status,
    "watchdog.arm": watchdog_arm,
    "watchdog.rearm": watchdog_rearm,
    "watchdog.disarm": watchdog_disarm,
    "watchdog.install": watchdog_install,
    "bench": bench,
    "gate": gate,
    "report": report,
    "release-note": release_note,
    "init": init,
    "import.jm": import_jm,
    "standby.check": standby_check,
}
