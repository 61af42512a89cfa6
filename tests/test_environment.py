"""The registry of the environment variables lanectl reads (lanectl.environment) against the code's own reads:
every `os.environ` / `getenv` read of a fixed name in lanectl/ is listed, and nothing listed is unread."""

from __future__ import annotations

import ast
from pathlib import Path

from lanectl.environment import GROUPS, VARIABLES, carried
from lanectl.recipe.schema import recipe_json_schema

LANECTL = Path(__file__).resolve().parent.parent / "lanectl"
# How the code names the process environment: os.environ itself, or a mapping handed down as `environ`.
PROCESS_ENVIRONMENT = {"os.environ", "environ", "self.environ", "self._environ"}


def reads(source: str) -> set[str]:
    """The variable names a module reads from the process environment, given as a literal or a module constant."""
    tree = ast.parse(source)
    constants = {target.id: node.value.value for node in tree.body
                 if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
                 and isinstance(node.value.value, str) for target in node.targets if isinstance(target, ast.Name)}
    # A copy of the environment (`env = dict(os.environ)`) is read as the environment itself.
    copies = {target.id for node in ast.walk(tree)
              if isinstance(node, ast.Assign) and "os.environ" in ast.unparse(node.value)
              for target in node.targets if isinstance(target, ast.Name)}

    def is_environment(node: ast.expr) -> bool:
        return ast.unparse(node) in PROCESS_ENVIRONMENT | copies

    def name_of(node: ast.expr) -> str | None:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value
        return constants.get(node.id) if isinstance(node, ast.Name) else None

    found = set()
    for node in ast.walk(tree):
        key: ast.expr | None = None
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args:
            if node.func.attr == "getenv" or (node.func.attr == "get" and is_environment(node.func.value)):
                key = node.args[0]
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) and is_environment(node.value):
            key = node.slice
        elif (isinstance(node, ast.Compare) and isinstance(node.ops[0], ast.In | ast.NotIn)
              and is_environment(node.comparators[0])):
            key = node.left
        if key is not None and (name := name_of(key)):
            found.add(name)
    return found


def code_reads() -> dict[str, set[str]]:
    """Each variable read by name, with the modules that read it."""
    found: dict[str, set[str]] = {}
    for path in sorted(LANECTL.rglob("*.py")):
        module = ".".join(path.relative_to(LANECTL.parent).with_suffix("").parts)
        for name in reads(path.read_text()):
            found.setdefault(name, set()).add(module)
    return found


def test_every_variable_the_code_reads_is_in_the_registry_and_nothing_else() -> None:
    found = code_reads()
    assert {"LANECTL_STATE_DIR", "LANECTL_LOCK_DIR", "DOCKER_HOST"} <= set(found)  # the scan sees the code
    named = {v.name for v in VARIABLES if not v.name.startswith("(")}
    # The webhook's variable is read by the name a recipe gives it; this is the name it has by default.
    webhook = recipe_json_schema()["$defs"]["Alert"]["properties"]["webhook_url_env"]["default"]
    assert named - {webhook} == set(found), f"read but not listed: {set(found) - named}; " \
                                            f"listed but not read: {named - {webhook} - set(found)}"
    for variable in VARIABLES:
        if variable.name in found:
            assert variable.reader in found[variable.name], f"{variable.name}: read in {found[variable.name]}"


def test_the_scan_finds_each_form_of_a_read() -> None:
    source = '''import os
NAME = "LANECTL_BY_CONSTANT"
a = os.environ.get("LANECTL_GET")
b = os.getenv("LANECTL_GETENV")
c = os.environ[NAME]
d = "LANECTL_IN" in os.environ
def f(environ):
    env = dict(os.environ)
    return environ.get("LANECTL_HANDED_DOWN"), env.get("LANECTL_COPY"), lane.env.get("NOT_LANECTLS")
'''
    assert reads(source) == {"LANECTL_BY_CONSTANT", "LANECTL_GET", "LANECTL_GETENV", "LANECTL_IN",
                             "LANECTL_HANDED_DOWN", "LANECTL_COPY"}


def test_each_variable_has_a_group_a_meaning_and_a_default() -> None:
    assert len({v.name for v in VARIABLES}) == len(VARIABLES)
    for variable in VARIABLES:
        assert variable.group in GROUPS and variable.meaning.endswith(".") and variable.default, variable.name
        assert not variable.path or variable.carried, f"{variable.name}: only carried paths are checked"


def test_the_watchdog_carries_every_setting_of_where_lanectl_keeps_things() -> None:
    where = {v.name for v in VARIABLES if v.group == "Where lanectl keeps things" and v.name.startswith("LANECTL_")}
    assert where <= set(carried())
    assert "LANECTL_ALERT_WEBHOOK" not in carried()  # a secret: the env file, never the world-readable files
