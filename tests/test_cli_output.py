"""What people and scripts read: the exact text lines of each view and the JSON envelope.

Views are pure (a Result in, lines out), so fixed data gives exact lines; the end-to-end runs check that
the CLI prints the view of what the command found, on the right stream, with the right exit code.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from lanectl.cli.views import render_text
from lanectl.output import Line, Message, Result, aligned, info, line, render_json, text_lines
from tests.lane_fixtures import free_port
from tests.test_cli import lanectl
from tests.test_recipe_validation import GOOD


def streams(lines: list[Line]) -> tuple[list[str], list[str]]:
    """The plain text a terminal-less run prints: (stdout lines, stderr lines)."""
    return [x.text for x in lines if not x.err], [x.text for x in lines if x.err]


# ------------------------------------------------------------------------------------------- commands


def test_commands_return_results_and_never_print():
    """Presentation is the CLI's: no rich, no print, no writing to stdout or stderr in commands/."""
    import ast

    import lanectl.commands

    wrong = []
    for path in sorted(Path(lanectl.commands.__file__).parent.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import | ast.ImportFrom):
                names = [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
                wrong += [f"{path.name}:{node.lineno} imports {n}" for n in names if n.split(".")[0] == "rich"]
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print":
                wrong.append(f"{path.name}:{node.lineno} prints")
            elif (isinstance(node, ast.Attribute) and node.attr in ("stdout", "stderr")
                  and isinstance(node.value, ast.Name) and node.value.id == "sys"):
                wrong.append(f"{path.name}:{node.lineno} uses sys.{node.attr}")
    assert not wrong, "\n".join(wrong)


# ------------------------------------------------------------------------------------------- envelope


def test_the_json_envelope_is_versioned_sorted_and_carries_only_the_data():
    result = Result("status", {"b": [1, None], "a": {"z": True, "y": "é"}}, (info("not in the envelope"),), 1)
    assert render_json(result) == (
        '{\n'
        '  "command": "status",\n'
        '  "data": {\n'
        '    "a": {\n'
        '      "y": "\\u00e9",\n'
        '      "z": true\n'
        '    },\n'
        '    "b": [\n'
        '      1,\n'
        '      null\n'
        '    ]\n'
        '  },\n'
        '  "lanectl": 1\n'
        '}\n'
    )


def test_line_helpers():
    assert line("a", ("b", "red")).spans == (("a", ""), ("b", "red"))
    assert line("a", ("b", "red")).text == "ab"
    assert [x.text for x in text_lines("one\ntwo\n")] == ["one", "two"]
    assert [x.text for x in text_lines("one\n\ntwo")] == ["one", "", "two"]
    assert text_lines("") == []
    assert aligned([("LANE", "BUILT"), ("demo-h1", "yes")]) == ["LANE     BUILT", "demo-h1  yes"]


def test_messages_follow_the_view_on_stderr():
    result = Result("validate", {"recipes": ["recipes/r.yaml"], "lanes": ["a", "b"]},
                    (Message("warning", "a note"), info("another")))
    assert streams(render_text(result)) == (["ok: 2 lanes in 1 recipes (a, b)"], ["a note", "another"])


# --------------------------------------------------------------------------------------------- status

STATUS = {
    "state_dir": "/var/lib/lanectl",
    "active": "h2-REF",
    "known_good": ["h1-REF", "h2-REF"],
    "watchdog": {"armed": False, "lease": {"until": "2026-03-01T12:00:00.000Z", "reason": "kernel swap",
                                           "by": "ops@box", "expired": True}},
    "unfinished_switch": {"switch": "5f1", "action": "up", "from": "h1-REF", "to": "h2-REF",
                          "ts": "2026-03-01T10:00:00.000Z", "who": "ops@box",
                          "steps": ["stop:h1", "create:h2", "start:h2"], "done_steps": ["stop:h1"]},
    "journal_problems": ["journal.jsonl line 1 from the end: unreadable record (not JSON, 12 bytes); ignored"],
    "lanes": [
        {"lane": "h1-REF", "recipe": "dsv41", "from_labels": False, "recipe_problem": None, "active": False,
         "known_good": True, "image": "lanectl/dsv41:h1-REF-aaa", "built": True, "health": None, "provenance": {},
         "pushed": None,
         "containers": [
             {"name": "dsv41-h1-REF", "role": "primary", "status": "exited", "exit_code": 137,
              "image": "lanectl/dsv41:h1-REF-aaa", "current_build": True, "uptime_seconds": None, "restarts": 0},
         ]},
        {"lane": "h2-REF", "recipe": "dsv41", "from_labels": False, "recipe_problem": None, "active": True,
         "known_good": True, "image": "lanectl/dsv41:h2-REF-bbb", "built": True, "health": "ok",
         "provenance": {"inputs": "bbb"},
         "pushed": {"reference": "127.0.0.1:5000/lanectl/dsv41@sha256:" + "d" * 64},
         "containers": [
             {"name": "dsv41-h2-REF", "role": "primary", "status": "running", "exit_code": None,
              "image": "lanectl/dsv41:h2-REF-old", "current_build": False, "uptime_seconds": 3600, "restarts": 2},
             {"name": "dsv41-h2-REF-rtx", "role": "rtx", "status": "running", "exit_code": None,
              "image": "lanectl/dsv41:h2-REF-bbb", "current_build": True, "uptime_seconds": 3590, "restarts": 0},
         ]},
        {"lane": "h3", "recipe": "dsv41", "from_labels": False, "recipe_problem": None, "active": False,
         "known_good": False, "image": "lanectl/dsv41:h3-ccc", "built": False, "health": None, "provenance": {},
         "pushed": None, "containers": []},
    ],
    "unknown_containers": ["old-lane-1"],
    "recipe_problems": [],
}


def test_status_text():
    out, err = streams(render_text(Result("status", STATUS)))
    assert out == [
        "h1-REF  known-good lanectl/dsv41:h1-REF-aaa",
        "    primary  dsv41-h1-REF                             exited (exit 137) restarts 0",
        "h2-REF  active known-good lanectl/dsv41:h2-REF-bbb  health: ok",
        "    pushed   127.0.0.1:5000/lanectl/dsv41@sha256:" + "d" * 64,
        "    primary  dsv41-h2-REF                             up 3600 s      restarts 2  older build "
        "lanectl/dsv41:h2-REF-old",
        "    rtx      dsv41-h2-REF-rtx                         up 3590 s      restarts 0",
        "h3  lanectl/dsv41:h3-ccc (not built)",
        "watchdog: disarmed; lease until 2026-03-01T12:00:00.000Z (kernel swap) expired",
        "known-good: h1-REF, h2-REF",
        "unfinished up h1-REF -> h2-REF since 2026-03-01T10:00:00.000Z (1/3 steps); the next up/rollback "
        "finishes or undoes it",
    ]
    assert err == [
        "journal: journal.jsonl line 1 from the end: unreadable record (not JSON, 12 bytes); ignored",
        "container old-lane-1 has lanectl labels but its lane is not in the recipes",
    ]


def test_status_text_of_a_quiet_host():
    quiet = {**STATUS, "active": None, "known_good": [], "unfinished_switch": None, "journal_problems": [],
             "unknown_containers": [], "watchdog": {"armed": True, "lease": None}, "lanes": []}
    assert streams(render_text(Result("status", quiet))) == (["watchdog: armed", "known-good: -"], [])


def test_status_names_an_active_lane_whose_engine_exited_0_as_dead():
    lane = {"lane": "h2-REF", "recipe": "dsv41", "from_labels": False, "recipe_problem": None, "active": True,
            "known_good": True, "image": "lanectl/dsv41:h2-REF-b",
            "built": True, "health": None, "provenance": {}, "pushed": None, "standby": None,
            "dead": "primary exited with code 0 (vLLM exits 0 when its engine core dies)",
            "containers": [{"name": "dsv41-h2-REF", "role": "primary", "status": "exited", "exit_code": 0,
                            "image": "lanectl/dsv41:h2-REF-b", "current_build": True, "uptime_seconds": None,
                            "restarts": 0}]}
    quiet = {**STATUS, "unfinished_switch": None, "journal_problems": [], "unknown_containers": [], "lanes": [lane]}
    out, _ = streams(render_text(Result("status", quiet)))
    assert out[:3] == [
        "h2-REF  active known-good lanectl/dsv41:h2-REF-b",
        "    dead     primary exited with code 0 (vLLM exits 0 when its engine core dies)",
        "    primary  dsv41-h2-REF                             exited         restarts 0",
    ]


def test_status_styles_what_needs_attention():
    lines = render_text(Result("status", STATUS))
    assert lines[2].spans[:3] == (("h2-REF", "bold"), ("  ", ""), ("active", "bold green"))
    assert lines[4].spans[-1] == ("  older build lanectl/dsv41:h2-REF-old", "yellow")
    assert lines[9].spans[0] == ("unfinished up", "red")


def test_status_json_is_the_data_as_is():
    assert json.loads(render_json(Result("status", STATUS))) == {"lanectl": 1, "command": "status", "data": STATUS}


# -------------------------------------------------------------------------------------------- history

RECORDS = [
    {"ts": "2026-03-01T10:00:00.000Z", "who": "ops@box", "pid": 7, "kind": "intent", "switch": "s1",
     "action": "up", "from": None, "to": "h2-REF", "why": "up", "steps": ["create:h2"]},
    {"ts": "2026-03-01T10:00:01.000Z", "who": "ops@box", "pid": 7, "kind": "step", "switch": "s1",
     "step": "create:h2", "detail": "0.02 s"},
    {"ts": "2026-03-01T10:00:02.000Z", "who": "ops@box", "pid": 7, "kind": "step", "switch": "s1",
     "step": "update:primary", "detail": "0.5 s", "node": "gpu-2"},
    {"ts": "2026-03-01T10:00:03.000Z", "who": "ops@box", "pid": 7, "kind": "diagnostics", "switch": "s1",
     "failed": "dsv41-h2-REF", "exit_code": 1},
    {"ts": "2026-03-01T10:00:04.000Z", "who": "ops@box", "pid": 7, "kind": "outcome", "switch": "s1",
     "result": "rolled-back", "message": "h2-REF failed its gate; h1-REF is serving again"},
    {"ts": "2026-03-01T10:01:00.000Z", "who": "root@box", "pid": 9, "kind": "watchdog", "event": "pass",
     "action": "restart", "reason": "primary exited (exit code 137)"},
    {"ts": "2026-03-01T10:01:01.000Z", "who": "root@box", "pid": 9, "kind": "watchdog", "event": "disarmed",
     "message": "disarmed for 7200 s: kernel swap"},
    {"ts": "2026-03-01T10:01:02.000Z", "who": "root@box", "pid": 9, "kind": "watchdog", "event": "alert",
     "severity": "critical", "title": "rollback of h2-REF", "delivered": False, "detail": "HTTP 500"},
    {"ts": "2026-03-01T10:02:00.000Z", "who": "ops@box", "pid": 11, "kind": "note",
     "message": "took over the lock of pid 7"},
]
HISTORY_LINES = [
    "2026-03-01T10:00:00.000Z  ops@box              intent      up - -> h2-REF (up)",
    "2026-03-01T10:00:01.000Z  ops@box              step          create:h2  0.02 s",
    "2026-03-01T10:00:02.000Z  ops@box              step          [gpu-2]  update:primary  0.5 s",
    "2026-03-01T10:00:03.000Z  ops@box              diagnostics   diagnostics: dsv41-h2-REF (exit code 1)",
    "2026-03-01T10:00:04.000Z  ops@box              outcome     rolled-back: h2-REF failed its gate; h1-REF is "
    "serving again",
    "2026-03-01T10:01:00.000Z  root@box             watchdog    pass: restart: primary exited (exit code 137)",
    "2026-03-01T10:01:01.000Z  root@box             watchdog    disarmed: disarmed for 7200 s: kernel swap",
    "2026-03-01T10:01:02.000Z  root@box             watchdog    alert (critical): rollback of h2-REF; not delivered: "
    "HTTP 500",
    "2026-03-01T10:02:00.000Z  ops@box              note        took over the lock of pid 7",
]


def test_history_text():
    result = Result("history", {"records": RECORDS, "problems": ["journal.jsonl line 3: unreadable record"]})
    assert streams(render_text(result)) == (HISTORY_LINES, ["journal: journal.jsonl line 3: unreadable record"])


def test_history_from_the_journal_through_the_cli(tmp_path: Path):
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    torn = '{"ts": "2026-03-01T10:03:00.000Z", "who": "ops@b'
    (state / "journal.jsonl").write_text("".join(json.dumps(r) + "\n" for r in RECORDS) + torn)
    env = {"LANECTL_STATE_DIR": str(state)}

    text = lanectl("history", cwd=tmp_path, env=env)
    as_json = lanectl("history", "--json", cwd=tmp_path, env=env)
    last_three = lanectl("history", "-n", "3", cwd=tmp_path, env=env)

    envelope = json.loads(as_json.stdout)
    assert (envelope["lanectl"], envelope["command"], envelope["data"]["records"]) == (1, "history", RECORDS)
    [problem] = envelope["data"]["problems"]
    assert "unreadable record" in problem
    assert (text.returncode, text.stdout.splitlines(), text.stderr) == (0, HISTORY_LINES, f"journal: {problem}\n")
    assert last_three.stdout.splitlines() == HISTORY_LINES[-3:]


# --------------------------------------------------------------------------------------------- doctor

FINDINGS = [
    {"check": "docker engine", "severity": "ok", "detail": "reachable, Docker 27.1.1", "fix": ""},
    {"check": "nvidia runtime", "severity": "warn", "detail": "Docker knows only these runtimes: ['runc']",
     "fix": "install the NVIDIA Container Toolkit"},
    {"check": "state dir", "severity": "error", "detail": "/var/lib/lanectl: [Errno 13] Permission denied",
     "fix": "make it writable, or set LANECTL_STATE_DIR to a writable folder"},
]


def test_doctor_text():
    out, err = streams(render_text(Result("doctor", {"findings": FINDINGS}, exit_code=1)))
    assert out == [
        "ok    docker engine: reachable, Docker 27.1.1",
        "warn  nvidia runtime: Docker knows only these runtimes: ['runc']",
        "      fix: install the NVIDIA Container Toolkit",
        "error state dir: /var/lib/lanectl: [Errno 13] Permission denied",
        "      fix: make it writable, or set LANECTL_STATE_DIR to a writable folder",
    ]
    assert err == []
    lines = render_text(Result("doctor", {"findings": FINDINGS}))
    assert [lines[i].spans[0] for i in (0, 1, 3)] == [("ok   ", "green"), ("warn ", "yellow"), ("error", "red")]


@pytest.mark.docker
def test_doctor_through_the_cli_says_what_is_wrong_and_exits_1(tmp_path: Path):
    not_a_folder = tmp_path / "state"
    not_a_folder.write_text("")
    env = {"LANECTL_STATE_DIR": str(not_a_folder)}

    text = lanectl("doctor", cwd=tmp_path, env=env)
    as_json = lanectl("doctor", "--json", cwd=tmp_path, env=env)

    findings = json.loads(as_json.stdout)["data"]["findings"]
    state_dir = next(f for f in findings if f["check"] == "state dir")
    assert state_dir["severity"] == "error" and state_dir["detail"].startswith(f"{not_a_folder}: ")
    assert (text.returncode, as_json.returncode) == (1, 1)
    lines = text.stdout.splitlines()
    at = lines.index(f"error state dir: {state_dir['detail']}")
    assert lines[at + 1] == "      fix: make it writable, or set LANECTL_STATE_DIR to a writable folder"
    # Both runs saw the same host: every finding, in order, one line each (and its fix under it). The details are
    # compared up to what the host changes between the two runs (the free disk, while other tests build images).
    shown = [x for x in lines if not x.startswith("      fix: ")]
    assert [x.split(": ", 1)[0] for x in shown] == [f"{f['severity']:<5} {f['check']}" for f in findings], shown
    assert all(x.endswith(f["detail"]) for x, f in zip(shown, findings, strict=True) if f["check"] != "image disk")


# ---------------------------------------------------------------------------------------------- bench

BENCH = {
    "bench": {
        "arm": "bench",
        "cells": {
            "prose@1": {"output_tok_per_s": 103.64, "ms_per_step": 9.6049, "ttft_p50_ms": 12.14, "itl_p99_ms": 24.44,
                        "failed": 0},
            "code@32": {"output_tok_per_s": 2890.0, "ms_per_step": None, "ttft_p50_ms": None, "itl_p99_ms": None,
                        "failed": 3},
        },
        "notes": ["no kernel log: Xid lines were not read"],
    },
    "workload": "coding",
    "concurrency": [1, 32],
    "run_dir": "results/20260301T100000Z-bench-h2-REF",
}


def test_bench_text():
    result = Result("bench", BENCH, (info("results in results/20260301T100000Z-bench-h2-REF"),))
    assert streams(render_text(result)) == (
        [
            "cell                       tok/s  ms/step  TTFT p50  ITL p99 failed",
            "prose@1                    103.6     9.60     12.1m    24.4m      0",
            "code@32                   2890.0     0.00      0.0m     0.0m      3",
        ],
        ["no kernel log: Xid lines were not read", "results in results/20260301T100000Z-bench-h2-REF"],
    )


def test_bench_json_leaves_the_messages_out():
    result = Result("bench", BENCH, (info("results in results/20260301T100000Z-bench-h2-REF"),))
    assert json.loads(render_json(result)) == {"lanectl": 1, "command": "bench", "data": BENCH}


# ------------------------------------------------------------------------------------- status, for real


@pytest.mark.docker
def test_status_through_the_cli(project: Path, write_recipe, tmp_path: Path):
    from datetime import UTC, datetime

    from lanectl.image.render import plan_image
    from lanectl.project import Project
    from lanectl.recipe.catalog import load_catalog
    from lanectl.state.journal import Journal

    recipe_id = f"out-{uuid.uuid4().hex[:8]}"  # no container of any other test carries it
    # Nor holds its port: GOOD's 18000 is the demo's, and a demo lane left up on the machine held it.
    write_recipe(GOOD.replace("id: t", f"id: {recipe_id}").replace("host: 18000", f"host: {free_port()}"))
    tags = {name: plan_image(lane).tag for name, lane in load_catalog(Project.locate()).lanes.items()}
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    (state / "state.json").write_text(json.dumps({"version": 1, "active": "b", "known_good": ["a", "b"],
                                                  "watchdog_armed": True}))
    journal = Journal(state / "journal.jsonl", clock=lambda: datetime(2026, 3, 1, 10, tzinfo=UTC))
    journal.record_intent(action="up", from_lane="b", to_lane="a", why="up", steps=["stop:b", "start:a"])
    env = {"LANECTL_STATE_DIR": str(state)}

    text = lanectl("status", cwd=project, env=env)
    as_json = lanectl("status", "--json", cwd=project, env=env)

    assert (text.returncode, text.stdout.splitlines()) == (0, [
        f"a  known-good {tags['a']} (not built)",
        f"b  active known-good {tags['b']} (not built)",
        "watchdog: armed",
        "known-good: a, b",
        "unfinished up b -> a since 2026-03-01T10:00:00.000Z (0/2 steps); the next up/rollback finishes or "
        "undoes it",
    ])
    data = json.loads(as_json.stdout)
    assert (data["lanectl"], data["command"]) == (1, "status")
    assert [(lane["lane"], lane["active"], lane["built"], lane["containers"]) for lane in data["data"]["lanes"]] == [
        ("a", False, False, []), ("b", True, False, [])]
    assert data["data"]["unfinished_switch"]["done_steps"] == []
    # Containers of other recipes on this engine are named on stderr, never on stdout.
    assert all(x.startswith("container ") for x in text.stderr.splitlines())


# ------------------------------------------------------------------ the other views, on fixed data


def test_switch_text_shows_the_failed_engines_last_lines_on_stderr():
    tail = [f"line {n}" for n in range(20)]
    result = Result("switch", {"result": "rolled-back", "message": "h2 failed its gate; h1 is serving again",
                               "lane": "h1", "steps": [], "diagnostics": {"log_tail": tail}}, exit_code=1)
    lines = render_text(result)
    assert streams(lines) == (["rolled-back: h2 failed its gate; h1 is serving again"],
                              ["last log lines of the failed lane:", *(f"  line {n}" for n in range(5, 20))])
    assert lines[0].spans[0] == ("rolled-back", "red") and lines[1].spans == (
        ("last log lines of the failed lane:", "bold"),)


def test_fleet_switch_text_has_a_row_per_node():
    data = {"result": "ok", "message": "h2 serves on 2 node(s)", "lane": "h2", "diagnostics": {},
            "nodes": [{"node": "gpu-1", "result": "ok", "detail": "canary, gated"},
                      {"node": "gpu-2", "result": "unchanged", "detail": "already h2"}]}
    assert streams(render_text(Result("fleet-switch", data))) == ([
        "  gpu-1                    ok                     canary, gated",
        "  gpu-2                    unchanged              already h2",
        "ok: h2 serves on 2 node(s)",
    ], [])


def test_a_plan_is_its_steps_one_a_line():
    result = Result("plan", {"lane": "h2", "steps": ["would stop h1", "would start h2"]})
    assert streams(render_text(result)) == (["would stop h1", "would start h2"], [])
    assert json.loads(render_json(result))["data"] == {"lane": "h2", "steps": ["would stop h1", "would start h2"]}


def test_patches_text_aligns_the_status_and_shows_conflict_details_under_it():
    parts = [{"status": "applies", "summary": "vllm/a.patch  (1 hunk, offset 0)", "subject": "Fix a",
              "details": []},
             {"status": "conflicts", "summary": "vllm/b.patch", "subject": "Fix b",
              "details": ["  vllm/b.py: hunk 1 does not match", "  patch hunk:"]}]
    result = Result("patches.check", {"patches": []}, exit_code=1, text_only={"patches": parts})
    lines = render_text(result)
    assert streams(lines) == ([
        "applies          vllm/a.patch  (1 hunk, offset 0)  Fix a",
        "conflicts        vllm/b.patch  Fix b",
        "  vllm/b.py: hunk 1 does not match",
        "  patch hunk:",
    ], [])
    assert [lines[0].spans[0], lines[1].spans[0]] == [("applies          ", "green"), ("conflicts        ", "red")]


def test_build_text_and_the_failing_steps_last_lines():
    reference = "127.0.0.1:5000/lanectl/r@sha256:" + "e" * 64
    builds = [
        {"lane": "h1", "tag": "lanectl/r:h1-aaa", "status": "unchanged", "message": "up to date", "push": None,
         "reference": None, "log_tail": []},
        {"lane": "h3", "tag": "lanectl/r:h3-ccc", "status": "skipped", "message": "already in the registry",
         "push": "skipped", "reference": reference, "log_tail": []},
        {"lane": "h2", "tag": "lanectl/r:h2-bbb", "status": "failed", "message": "step 3 (RUN make) failed",
         "push": None, "reference": None, "log_tail": ["make: *** [all] Error 1"]},
    ]
    assert streams(render_text(Result("build", {"builds": builds}, exit_code=1))) == (
        ["unchanged h1: up to date", "skipped   h3: already in the registry", f"          h3: {reference}",
         "failed    h2: step 3 (RUN make) failed"],
        ["last lines of the failing step:", "  make: *** [all] Error 1"],
    )


def test_status_names_a_container_made_for_a_role_the_recipe_no_longer_has():
    orphan = {"name": "dsv41-h1-REF-rtx", "lane": "h1-REF", "role": "rtx", "status": "Up 2 hours"}
    quiet = {**STATUS, "unfinished_switch": None, "journal_problems": [], "unknown_containers": [],
             "orphan_containers": [orphan]}
    out, _ = streams(render_text(Result("status", quiet)))
    assert out[-1] == ("orphan container dsv41-h1-REF-rtx (Up 2 hours): made for h1-REF's role rtx, which its "
                       "recipe no longer has; the next `lanectl up` or `down` stops and removes it")
