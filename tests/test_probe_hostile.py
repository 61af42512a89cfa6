"""Probes run nothing at load and survive any answer: a probe file's SQL schema is built in an in-memory
database that may only create tables, and a model's answer is parsed within depth and size limits. Every
failure is a failed probe item, never a traceback. Through the real CLI and a real HTTP server on 127.0.0.1."""

from __future__ import annotations

import json
import textwrap
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from lanectl.bench.probes import ProbeInvalid, load_probe, run_probe
from tests.test_cli import lanectl


def probe_file(folder: Path, schema_sql: str, name: str = "evil") -> Path:
    path = folder / f"{name}.yaml"
    path.write_text(textwrap.dedent(f"""\
        schema: lanectl-probe/v1
        name: {name}
        kind: gauntlet
        max_tokens: 64
        items:
          - name: q
            prompt: query it
            expect: sql
            sql_schema: {json.dumps(schema_sql)}
    """))
    return path


ESCAPES = {
    "attach": "ATTACH DATABASE '{target}' AS e; CREATE TABLE e.t (a);",
    "attach-after-a-table": "CREATE TABLE t (a); ATTACH '{target}' AS e;",
    "vacuum-into": "CREATE TABLE t (a); VACUUM INTO '{target}';",
    "pragma-write": "PRAGMA journal_mode = WAL; CREATE TABLE t (a);",
    "create-table-as-a-recursive-query": ("CREATE TABLE t AS WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL "
                                          "SELECT i + 1 FROM n) SELECT i FROM n;"),
    "rows": "CREATE TABLE t (a); INSERT INTO t VALUES (1);",
}


@pytest.mark.parametrize("sql", ESCAPES.values(), ids=ESCAPES.keys())
def test_a_schema_that_does_more_than_create_tables_is_refused_at_load_and_writes_nothing(tmp_path: Path, sql: str):
    target = tmp_path / "written-by-the-probe.db"
    path = probe_file(tmp_path, sql.format(target=target))

    started = time.monotonic()
    with pytest.raises(ProbeInvalid) as caught:
        load_probe(path, "evil.yaml")

    assert time.monotonic() - started < 30
    (problem,) = [str(p) for p in caught.value.problems]
    assert problem.startswith("evil.yaml:9:17: items[0].sql_schema: SQLite refuses the schema: ")
    assert not target.exists()


def test_a_schema_of_tables_indexes_and_views_loads():
    from lanectl.bench.sql_check import compile_query

    schema = ("CREATE TABLE a (id INTEGER PRIMARY KEY, name TEXT DEFAULT 'x', b INTEGER REFERENCES a(id));"
              "CREATE INDEX a_name ON a (name); CREATE VIEW v AS SELECT id FROM a;")
    compile_query(schema, "SELECT count(*) FROM v JOIN a USING (id) WHERE name LIKE 'a%'")
    compile_query(schema, "UPDATE a SET name = 'y' WHERE id = 1")


def test_gate_refuses_the_probe_before_anything_runs_and_no_file_appears(tmp_path: Path):
    assert lanectl("init", "p", cwd=tmp_path).returncode == 0
    workloads = tmp_path / "p" / "recipes" / "workloads"
    target = tmp_path / "attached.db"
    probe_file(workloads / "probes", ESCAPES["attach"].format(target=target))
    smoke = workloads / "smoke.yaml"
    assert "probes: [quick]" in smoke.read_text()  # the starter's own probe, in place of which the hostile one runs
    smoke.write_text(smoke.read_text().replace("probes: [quick]", "probes: [evil]"))

    result = lanectl("gate", "stub-b", "--control", "stub-a", "--workload", "smoke", "--no-gpu",
                     cwd=tmp_path / "p", env={"LANECTL_STATE_DIR": str(tmp_path / "state")})

    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    assert "items[0].sql_schema: SQLite refuses the schema: not authorized" in result.stderr
    assert not target.exists()


# --- answers from a real server on loopback -------------------------------------------------------------

BOMB = "a: &a [x, x]\n" + "".join(f"{chr(98 + i)}: &{chr(98 + i)} [*{chr(97 + i)}, *{chr(97 + i)}]\n"
                                     for i in range(20))
ANSWERS = {
    "json-deep": ("json", "[" * 100_000),
    "json-deep-object": ("json", '{"a":' * 50_000 + "1" + "}" * 50_000),
    "json-huge": ("json", "[" + "1," * 600_000 + "1]"),
    "yaml-deep-flow": ("yaml", "[" * 100_000),
    "yaml-deep-block": ("yaml", "".join("  " * i + "- \n" for i in range(200))),
    "yaml-alias-bomb": ("yaml", BOMB),
    "sql-attach": ("sql", "ATTACH DATABASE '/tmp/lanectl-probe-answer.db' AS x"),
    "sql-pragma": ("sql", "PRAGMA writable_schema = 1"),
    "sql-recursive": ("sql", "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n) SELECT i FROM n"),
    "sql-deep": ("sql", "SELECT " + "(" * 100_000 + "1" + ")" * 100_000),
    "tool-args-deep": ("tool_call", "[" * 100_000),
}


class Answers(BaseHTTPRequestHandler):
    """An OpenAI-style chat server that answers each probe item with the hostile text it asks for."""

    def do_POST(self) -> None:  # noqa: N802 - the http.server name
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        item = body["messages"][-1]["content"].split("\n", 1)[0]
        expect, text = ANSWERS[item]
        message: dict = {"role": "assistant", "content": text}
        if expect == "tool_call":
            message = {"role": "assistant", "content": None,
                       "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": text}}]}
        payload = json.dumps({"choices": [{"message": message}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Answers)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def test_hostile_answers_fail_their_items_and_never_raise(tmp_path: Path, server: str):
    items = []
    for name, (expect, _) in ANSWERS.items():
        item = {"name": name, "prompt": name, "expect": expect}
        if expect == "sql":
            item["sql_schema"] = "CREATE TABLE t (a);"
        if expect == "tool_call":
            item["tools"] = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
        items.append(item)
    path = tmp_path / "hostile.yaml"
    path.write_text(json.dumps({"schema": "lanectl-probe/v1", "name": "hostile", "kind": "gauntlet",
                                "max_tokens": 64, "timeout_seconds": 60, "items": items}))
    probe = load_probe(path, "hostile.yaml").probe

    started = time.monotonic()
    report = run_probe(server, "m", probe)

    assert time.monotonic() - started < 60, "a bounded parse, not minutes of CPU"
    failures = {check.item: check.failure for check in report.checks}
    assert set(failures) == set(ANSWERS)
    # Every one failed, with a reason; but an endless recursive SELECT is a query that compiles, and EXPLAIN
    # never runs it (it passed, and at once).
    assert [name for name, why in failures.items() if not why] == ["sql-recursive"], failures
    assert "nests deeper than 64 levels" in failures["json-deep"]
    assert "more than 1000000 to parse" in failures["json-huge"]
    assert "aliases" in failures["yaml-alias-bomb"]
    assert "nests deeper than 64 levels" in failures["yaml-deep-block"]
    assert "not authorized" in failures["sql-attach"] and "not authorized" in failures["sql-pragma"]
    assert not Path("/tmp/lanectl-probe-answer.db").exists()
