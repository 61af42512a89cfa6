"""SQL probe items checked in an in-memory SQLite database that can do nothing else.

A probe file's `sql_schema` comes from a workload folder and the answer from a model: neither may make
SQLite touch a file (`ATTACH 'x' AS y` creates one anywhere), change a setting (`PRAGMA`), or run for
long (`CREATE TABLE t AS WITH RECURSIVE …` runs its query). SQLite's authorizer is asked about every
action while a statement is compiled, so each database here allows only what its job needs: the schema
creates tables, indexes and views in `main` (writing their rows of sqlite_master); the answer is compiled
under EXPLAIN, never run, and may read, write and call functions, nothing else. A progress handler
bounds the work of either.
"""

from __future__ import annotations

import sqlite3
from typing import Any

# Virtual-machine steps (in units of PROGRESS_EVERY) a schema or an EXPLAIN may take: creating a dozen
# tables takes a few hundred steps; a recursive query would take for ever.
PROGRESS_EVERY = 1000
MAX_PROGRESS_CALLS = 1000
MAX_SQL_CHARS = 100_000

_SCHEMA_TABLES = ("sqlite_master", "sqlite_schema", "sqlite_sequence")
_SCHEMA_ACTIONS = {sqlite3.SQLITE_CREATE_TABLE, sqlite3.SQLITE_CREATE_INDEX, sqlite3.SQLITE_CREATE_VIEW,
                   sqlite3.SQLITE_REINDEX}
_QUERY_ACTIONS = {sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_FUNCTION, sqlite3.SQLITE_RECURSIVE,
                  sqlite3.SQLITE_INSERT, sqlite3.SQLITE_UPDATE, sqlite3.SQLITE_DELETE}


class SqlRefused(Exception):
    """SQLite refused or could not compile the SQL; the message says why."""


def _schema_authorizer(action: int, arg1: str | None, arg2: str | None, database: str | None,
                       source: str | None) -> int:
    if database not in (None, "main"):
        return sqlite3.SQLITE_DENY
    if action in _SCHEMA_ACTIONS:
        return sqlite3.SQLITE_OK
    # Creating a table writes its row of sqlite_master; an index reads the columns it covers.
    if action in (sqlite3.SQLITE_INSERT, sqlite3.SQLITE_UPDATE) and arg1 in _SCHEMA_TABLES:
        return sqlite3.SQLITE_OK
    if action == sqlite3.SQLITE_READ:
        return sqlite3.SQLITE_OK
    return sqlite3.SQLITE_DENY


def _query_authorizer(action: int, arg1: str | None, arg2: str | None, database: str | None,
                      source: str | None) -> int:
    if database not in (None, "main", "temp"):
        return sqlite3.SQLITE_DENY
    return sqlite3.SQLITE_OK if action in _QUERY_ACTIONS else sqlite3.SQLITE_DENY


def _bounded(db: sqlite3.Connection) -> None:
    calls = [0]

    def progress() -> int:
        calls[0] += 1
        return 1 if calls[0] > MAX_PROGRESS_CALLS else 0  # non-zero interrupts the statement

    db.set_progress_handler(progress, PROGRESS_EVERY)


def schema_database(sql_schema: str) -> sqlite3.Connection:
    """A new in-memory database holding `sql_schema`'s tables; raises SqlRefused. The caller closes it."""
    if len(sql_schema) > MAX_SQL_CHARS:
        raise SqlRefused(f"the schema is {len(sql_schema)} characters, more than {MAX_SQL_CHARS}")
    db = sqlite3.connect(":memory:", isolation_level=None)
    try:
        db.set_authorizer(_schema_authorizer)
        _bounded(db)
        db.executescript(sql_schema)
    except sqlite3.DatabaseError as exc:
        db.close()
        raise SqlRefused(_why(exc, "a schema may only CREATE TABLE, INDEX or VIEW")) from None
    except BaseException:
        db.close()
        raise
    return db


def check_schema(sql_schema: str) -> None:
    """Raises SqlRefused when `sql_schema` is not a schema SQLite builds under the rules above."""
    schema_database(sql_schema).close()


def compile_query(sql_schema: str, query: str) -> None:
    """Compile (EXPLAIN, never run) one statement against the schema; raises SqlRefused."""
    if len(query) > MAX_SQL_CHARS:
        raise SqlRefused(f"the query is {len(query)} characters, more than {MAX_SQL_CHARS}")
    db = schema_database(sql_schema)
    try:
        db.set_authorizer(_query_authorizer)
        _bounded(db)
        db.execute(f"EXPLAIN {query}").fetchall()
    except (sqlite3.DatabaseError, sqlite3.Warning) as exc:  # Warning: more than one statement
        raise SqlRefused(_why(exc, "an answer may only query or change rows")) from None
    finally:
        db.close()


def _why(exc: Any, rule: str) -> str:
    text = str(exc)
    if text == "not authorized":
        return f"not authorized: {rule} (no ATTACH, PRAGMA or other statements)"
    if text == "interrupted":
        return "it took too long to compile or build (a recursive query?)"
    return text
