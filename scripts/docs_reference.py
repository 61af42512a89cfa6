"""The docs site's generated pages: the recipe field reference, a page per command, the environment variables,
the measurements and the changelog.

All are written each time the site is built (an MkDocs hook: mkdocs.yml `hooks:`), never kept as files, so none
can drift: the recipe reference from the JSON Schema `lanectl schema` prints and the validators' own messages,
with an example of each field taken from the shipped recipes where they set it, else its default; the command
pages from the typer app and each command's COMMAND_DOCS (lanectl/commands/); the variables from
lanectl/environment.py. `python scripts/docs_reference.py recipe|commands` prints one of them.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import yaml

REPO = Path(__file__).resolve().parent.parent
RECIPE_PAGE = "reference/recipe-fields.md"
COMMANDS_PAGE = "reference/commands.md"
ENVIRONMENT_PAGE = "reference/environment.md"
CHANGELOG_PAGE = "changelog.md"
CHANGELOG = REPO / "CHANGELOG.md"
MEASUREMENTS_PAGE = "measurements.md"
RESULTS = REPO / "benchmarks" / "RESULTS.md"
# Where the examples come from, first match wins: the production recipe, the demo's, then the docs' own example of
# the fields both leave to their defaults (tests/test_docs.py validates it).
EXAMPLE_RECIPES = [
    "recipes/dgx-station-gb300/deepseek-v4.1-flash-vllm-uva-dspark-sidecar.yaml",
    "recipes/demo/stub.yaml",
    "docs/examples/every-field.yaml",
]
LANE_MODEL = "LanePartial"
LANE_PATH = "LANE"  # where a lane's own fields start: `defaults`, and each entry of `lanes`
ROOT = "RecipeFile"

Schema = dict[str, Any]


# ---------------------------------------------------------------------------------------------------- recipe fields

def recipe_schema() -> Schema:
    from lanectl.recipe.schema import recipe_json_schema

    return recipe_json_schema()


def ref_name(node: Schema) -> str | None:
    ref = node.get("$ref")
    return ref.rsplit("/", 1)[-1] if isinstance(ref, str) else None


def models_of(node: Schema) -> Iterator[str]:
    """The models a field holds, directly or in a list, map or union."""
    if name := ref_name(node):
        yield name
    for key in ("anyOf", "oneOf", "allOf"):
        for option in node.get(key, []):
            yield from models_of(option)
    if isinstance(node.get("items"), dict):
        yield from models_of(node["items"])
    if isinstance(node.get("additionalProperties"), dict):
        yield from models_of(node["additionalProperties"])


def model_properties(schema: Schema, model: str) -> Schema:
    node = schema if model == ROOT else schema["$defs"][model]
    return dict(node.get("properties", {}))


def sections(schema: Schema) -> list[tuple[str, str]]:
    """(model, path where it first appears), the recipe file first, then each model in the order a reader meets it."""
    order: list[tuple[str, str]] = [(ROOT, "")]
    seen = {ROOT}
    index = 0
    while index < len(order):
        model, path = order[index]
        index += 1
        for field, node in model_properties(schema, model).items():
            for child in models_of(node):
                if child not in seen:
                    seen.add(child)
                    child_path = LANE_PATH if child == LANE_MODEL else f"{path}.{field}".lstrip(".")
                    if child != LANE_MODEL and (node.get("additionalProperties") or {}).get("$ref"):
                        child_path += ".NAME"
                    order.append((child, child_path))
    return order


def type_text(node: Schema) -> str:
    if name := ref_name(node):
        return f"[{'Lane' if name == LANE_MODEL else name}](#{anchor(name)})"
    options = node.get("anyOf") or node.get("oneOf")
    if options:
        texts = [type_text(option) for option in options if option.get("type") != "null"]
        nullable = any(option.get("type") == "null" for option in options)
        return " or ".join(texts) + (" or null" if nullable else "")
    if "const" in node:
        return f"the constant `{json.dumps(node['const'])}`"
    if "enum" in node:
        return "one of " + ", ".join(f"`{json.dumps(value)}`" for value in node["enum"])
    kind = node.get("type")
    if kind == "array":
        return f"list of {type_text(node.get('items', {}))}"
    if kind == "object":
        values = node.get("additionalProperties")
        return f"map of name to {type_text(values)}" if isinstance(values, dict) else "object"
    text = {"string": "string", "integer": "integer", "number": "number", "boolean": "true or false"}.get(kind, "any")
    limits = constraints(node)
    return f"{text} ({limits})" if limits else text


def constraints(node: Schema) -> str:
    parts = []
    for key, words in (("minimum", "at least"), ("exclusiveMinimum", "more than"), ("maximum", "at most"),
                       ("exclusiveMaximum", "less than"), ("minLength", "at least {} characters"),
                       ("maxLength", "at most {} characters"), ("minItems", "at least {} items"),
                       ("maxItems", "at most {} items"), ("minProperties", "at least {} entries")):
        if key in node:
            parts.append(words.format(node[key]) if "{}" in words else f"{words} {node[key]}")
    if "pattern" in node:
        parts.append(f"matching `{node['pattern']}`")
    return ", ".join(parts)


def anchor(model: str) -> str:
    return f"model-{model.lower()}"


def collect_examples(schema: Schema) -> dict[tuple[str, str], tuple[Any, str]]:
    """(model, field) -> (the value an example recipe gives that field, the first one found; that recipe)."""
    found: dict[tuple[str, str], tuple[Any, str]] = {}

    def walk(model: str, data: Any, source: str) -> None:
        if not isinstance(data, dict):
            return
        properties = model_properties(schema, model)
        for field, value in data.items():
            node = properties.get(field)
            if node is None:
                continue
            found.setdefault((model, field), (value, source))
            for child in models_of(node):
                for item in _values_for(node, value):
                    walk(child, item, source)

    for source in EXAMPLE_RECIPES:
        walk(ROOT, yaml.safe_load((REPO / source).read_text()), source)
    return found


def _values_for(node: Schema, value: Any) -> Iterator[Any]:
    """The values a nested model is filled from: the value itself, a list's items, or a map's values."""
    if isinstance(value, list):
        yield from value
    elif isinstance(value, dict) and isinstance(node.get("additionalProperties"), dict):
        yield from value.values()
        yield value  # a union of a model and a map: the value may be the model itself
    else:
        yield value


def shortened(value: Any, depth: int = 0) -> Any:
    """An example small enough to read: lists and maps cut to their first entries, the more the deeper."""
    items, keys = (4, 8) if depth == 0 else (2, 4)
    if isinstance(value, list):
        return [shortened(item, depth + 1) for item in value[:items]]
    if isinstance(value, dict):
        return {key: shortened(item, depth + 1) for key, item in list(value.items())[:keys]}
    return value


def _flat(value: Any) -> bool:
    return not isinstance(value, dict | list) or all(not isinstance(item, dict | list)
                                                     for item in (value.values() if isinstance(value, dict) else value))


def example_text(field: str, value: Any) -> str:
    """The example as YAML, cut to its first entries; a cut one ends with a comment that says so."""
    cut = shortened(value) != value
    text = _example_yaml(field, shortened(value))
    return f"{text}\n# … (cut: more entries follow)" if cut else text


def _example_yaml(field: str, value: Any) -> str:
    dump = {"sort_keys": False, "width": 10_000, "allow_unicode": True}
    if _flat(value):
        return yaml.safe_dump({field: value}, default_flow_style=None, **dump).rstrip("\n") if isinstance(
            value, dict | list) and value else yaml.safe_dump({field: value}, default_flow_style=False, **dump).rstrip(
            "\n").removesuffix("\n...")
    body = yaml.safe_dump(value, default_flow_style=None, **dump).rstrip("\n")
    return f"{field}:\n" + "\n".join(f"  {line}" for line in body.splitlines())


def placeholder(node: Schema) -> Any:
    """A value of the field's type, where neither a shipped recipe nor a default gives one."""
    if "const" in node:
        return node["const"]
    if "enum" in node:
        return node["enum"][0]
    for option in node.get("anyOf", []):
        if option.get("type") != "null":
            return placeholder(option)
    kind = node.get("type")
    return {"string": "TEXT", "integer": node.get("minimum", 1), "number": node.get("minimum", 1.0),
            "boolean": True, "array": [], "object": {}}.get(kind, "VALUE")


# ---------------------------------------------------------------------------------------------------- validators

def record_classes() -> dict[str, type]:
    """The model classes by the names the schema gives them (a lane's fields are LaneSpec's)."""
    from lanectl.recipe import model

    classes = {name: value for name, value in vars(model).items() if model.is_record(value)}
    classes[LANE_MODEL] = model.LaneSpec
    return classes


def required_in_a_lane() -> dict[str, set[str]]:
    """The fields a merged lane must have, by model: optional in `defaults` and in each lane, but one of the two
    must set them (the editor's schema leaves `required` out for that reason)."""
    from pydantic import TypeAdapter

    from lanectl.recipe.model import LaneSpec

    schema = TypeAdapter(LaneSpec).json_schema(by_alias=True)
    required = {name: set(node.get("required", [])) for name, node in schema.get("$defs", {}).items()}
    required[LANE_MODEL] = set(schema.get("required", []))
    return required


def factory_defaults(cls: type) -> dict[str, Any]:
    """The defaults a field's factory makes (an empty map, a list from NVIDIA's Xid catalog), which the JSON
    Schema leaves out, as plain data by the field's key."""
    import dataclasses

    from lanectl.recipe.model import as_data, is_record

    found = {}
    for field in dataclasses.fields(cls):
        if field.default_factory is not dataclasses.MISSING:
            value = field.default_factory()
            found[field.metadata.get("alias", field.name)] = as_data(value) if is_record(type(value)) else value
    return found


def messages_raised(function: Any, *, calls: tuple[str, ...] = ("ValueError",), argument: int = 0) -> list[str]:
    """The messages `function` raises (or, with `calls`, passes to those calls as their `argument`th argument), as
    its source spells them: a module constant's value filled in, any other value shown as `…`."""
    import ast
    import inspect
    import textwrap

    namespace = vars(sys.modules[function.__module__])
    tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    found = []
    for node in ast.walk(tree):
        call = node.exc if isinstance(node, ast.Raise) else node
        if not isinstance(call, ast.Call) or len(call.args) <= argument:
            continue
        name = call.func.attr if isinstance(call.func, ast.Attribute) else getattr(call.func, "id", "")
        if name in calls and (text := _spelled(call.args[argument], namespace)):
            where = _where(call.args[0]) if argument else ""
            text = f"`{where}`: {text}" if where else text
            if text not in found:
                found.append(text)
    return found


def _where(node: Any) -> str:
    """The field a `doc.problem(locate((…)), …)` call names, as a path (`engine.ports[…]`); "" when it cannot tell."""
    import ast

    if isinstance(node, ast.Call) and node.args:
        node = node.args[0]
    if isinstance(node, ast.IfExp):
        node = node.body
    if not isinstance(node, ast.Tuple):
        return ""
    parts = []
    for element in node.elts:
        if isinstance(element, ast.Constant) and isinstance(element.value, str):
            parts.append(f".{element.value}")
        else:
            parts.append("[…]" if parts else "….")
    return "".join(parts).lstrip(".").replace("..", ".")


def _spelled(node: Any, namespace: dict[str, Any]) -> str:
    import ast

    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(_spelled(part, namespace) for part in node.values)
    if isinstance(node, ast.FormattedValue):
        value = namespace.get(node.value.id) if isinstance(node.value, ast.Name) else None
        return str(value) if isinstance(value, str | int | float) and node.format_spec is None else "…"
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _spelled(node.left, namespace) + _spelled(node.right, namespace)
    return ""


def field_checks(cls: type) -> dict[str, list[str]]:
    """Each field's own checks beyond its type (the `After` validators in its annotation), by the field's key."""
    import typing

    from lanectl.recipe.model import After, record_fields

    def checks(annotation: Any) -> list[Any]:
        found = []
        for argument in typing.get_args(annotation):
            found += checks(argument)
        for extra in getattr(annotation, "__metadata__", ()):
            if isinstance(extra, After):
                found.append(extra.check)
        return found

    return {key: [message for check in checks(annotation) for message in messages_raised(check)]
            for _, key, annotation in record_fields(cls)}


def model_rules(cls: type) -> list[str]:
    """What a model checks across its fields (its `__post_init__`)."""
    post_init = cls.__dict__.get("__post_init__")
    return messages_raised(post_init) if post_init else []


def lane_rules() -> list[str]:
    """What `lanectl validate` checks across a merged lane's fields, and between lanes, as its messages say it."""
    from lanectl.recipe import catalog, shutdown

    checks = (catalog._check_consistency, catalog._check_standby, catalog._check_standby_neighbours,
              catalog._standby_fit, shutdown.check_shutdown)
    return [message for check in checks for message in messages_raised(check, calls=("problem",), argument=1)]


class ModelFacts(NamedTuple):
    """What the validators of one model say beyond its schema."""

    required_in_lane: set[str]  # required once a lane is merged (set in `defaults` or in the lane)
    defaults: dict[str, Any]  # defaults its factories make
    checks: dict[str, list[str]]  # each field's own checks, as their messages say


def field_entry(schema: Schema, model: str, field: str, node: Schema, examples: dict[tuple[str, str], tuple[Any, str]],
                required: set[str], facts_of: ModelFacts | None = None) -> list[str]:
    lines = [f"#### `{field}`", ""]
    facts = [type_text(node)]
    if field in required:
        facts.append("**required**")
    elif facts_of and field in facts_of.required_in_lane:
        facts.append("**required** in every lane (set it in `defaults` or in the lane)" if model == LANE_MODEL
                     else "**required** wherever this section is given (in the merged lane)")
    default = node.get("default", facts_of.defaults.get(field) if facts_of else None)
    has_default = "default" in node or (facts_of is not None and field in facts_of.defaults)
    long_default = has_default and isinstance(default, dict | list) and len(json.dumps(default)) > 60
    if has_default and long_default and ref_name(node):
        facts.append("default: as its fields below say")
    elif has_default and not long_default:
        facts.append(f"default `{json.dumps(default)}`")
    elif not has_default and field not in required and not (facts_of and field in facts_of.required_in_lane):
        facts.append("not set by default")
    summary = "; ".join(facts) + "."
    lines += [summary[:1].upper() + summary[1:], ""]
    if long_default and not ref_name(node):
        lines += ["Default:", "", "```yaml", yaml.safe_dump({field: default}, default_flow_style=None, width=110,
                                                            sort_keys=False).rstrip("\n"), "```", ""]
    if node.get("description"):
        lines += [node["description"], ""]
    checks = facts_of.checks.get(field, []) if facts_of else []
    if checks:
        lines += ["Refused, with these messages: " + "; ".join(f"*{_cell(check)}*" for check in checks) + ".", ""]
    if (model, field) in examples:
        value, recipe = examples[(model, field)]
        source = f"from `{recipe}`"
    elif has_default and default not in (None, [], {}):
        value, source = default, "its default"
    else:
        value, source = placeholder(node), "a value of its type"
    lines += [f"Example ({source}):", "", "```yaml", example_text(field, value), "```", ""]
    return lines


def model_facts() -> dict[str, ModelFacts]:
    required = required_in_a_lane()
    return {name: ModelFacts(required.get(name, set()), factory_defaults(cls), field_checks(cls))
            for name, cls in record_classes().items() if name != "Strict"}


def recipe_reference(schema: Schema | None = None) -> str:
    schema = schema or recipe_schema()
    examples = collect_examples(schema)
    facts = model_facts()
    lines = [
        "# Recipe field reference",
        "",
        "Every field of a `lanectl/v1` recipe, generated from lanectl's recipe model (the JSON Schema that "
        "`lanectl schema` prints) each time this site is built, so it always says what the code accepts. "
        "Examples come from the shipped recipes (`recipes/`) where they set the field, else from its default. "
        "How recipes are written, merged and validated: [Recipes](../recipes.md).",
        "",
        "Unknown keys are errors. In `defaults` and in each lane every field is optional: a lane inherits what it "
        "does not set (maps merge key by key, lists and scalars replace), and `lanectl validate` checks the merged "
        "lane.",
        "",
        "A field of type integer, number or true or false takes a YAML number or boolean, written without quotes: "
        "`\"30\"` and `\"no\"` are text, and refused. An integer is also a number.",
        "",
    ]
    for model, path in sections(schema):
        node = schema if model == ROOT else schema["$defs"][model]
        if model == ROOT:
            title, where = "The recipe file", "the top level of a recipe file"
        elif model == LANE_MODEL:
            title, where = "Lane fields", "`defaults`, and each entry of `lanes`"
        elif path.startswith(f"{LANE_PATH}."):
            title, where = model, f"`{path.removeprefix(f'{LANE_PATH}.')}` of a lane (in `defaults` or `lanes.NAME`)"
        else:
            title, where = model, f"`{path}`"
        lines += [f"## {title} {{#{anchor(model)}}}", "", f"Where: {where}.", ""]
        if node.get("description") and model != ROOT:
            lines += [node["description"], ""]
        rules = model_rules(record_classes()[model]) if model in record_classes() else []
        if model == LANE_MODEL:
            lines += ["Checked across a lane's fields once it is merged, and between lanes, by `lanectl validate` "
                      "(as its messages say them; `…` stands for a value from the recipe):", ""]
            lines += [f"- {rule}" for rule in lane_rules()] + [""]
        elif rules:
            lines += ["Checked across its fields (as `lanectl validate` says it; `…` stands for a value from the "
                      "recipe):", ""]
            lines += [f"- {rule}" for rule in rules] + [""]
        required = set(node.get("required", []))
        for field, field_node in model_properties(schema, model).items():
            lines += field_entry(schema, model, field, field_node, examples, required, facts.get(model))
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------- commands

# The modules whose COMMAND_DOCS hold each command's example and exit codes, beside the command's own code.
COMMAND_MODULES = ("validate", "lanes", "render", "diff", "schema", "build", "switch", "status", "logs", "history",
                   "doctor", "gate", "init", "patches", "watchdog", "fleet", "pin", "import_jm", "standby")
GENERAL_EXIT_CODES = {0: "success", 1: "the operation failed", 2: "bad input or usage (nothing was changed)"}


def command_docs() -> dict[str, dict[str, Any]]:
    """Each command's hand-written example and exit codes, by its name as typed (`watchdog check`)."""
    found: dict[str, dict[str, Any]] = {}
    for module in COMMAND_MODULES:
        for name, entry in importlib.import_module(f"lanectl.commands.{module}").COMMAND_DOCS.items():
            if name in found:
                raise ValueError(f"lanectl {name}: documented twice (lanectl.commands.{module})")
            found[name] = entry
    return found


def leaf_commands() -> list[tuple[list[str], Any, Any]]:
    """(words after `lanectl`, click command, its context) of every command that runs something, in --help order;
    the groups (`watchdog`, `fleet`, …) are not in the list, their commands are."""
    import typer

    from lanectl.cli.app import app

    # Recent typer releases carry their own copy of click: its objects are used through typer and their interface.
    root = typer.main.get_command(app)
    found: list[tuple[list[str], Any, Any]] = []

    def walk(command: Any, names: list[str], parent: Any) -> None:
        context = typer.Context(command, info_name=names[-1] if names else "lanectl", parent=parent)
        if not hasattr(command, "list_commands"):
            found.append((names, command, context))
            return
        for name in command.list_commands(context):
            child = command.get_command(context, name)
            if child is not None and not child.hidden:
                walk(child, [*names, name], context)

    walk(root, [], None)
    return found


def command_slug(names: list[str]) -> str:
    return "-".join(names)


def command_page_path(names: list[str]) -> str:
    return f"reference/commands/{command_slug(names)}.md"


def usage_line(command: Any, context: Any) -> str:
    """The usage line exactly as `--help` prints it (its placeholders included)."""
    return " ".join(["Usage:", context.command_path, *command.collect_usage_pieces(context)])


def help_records(command: Any, context: Any) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(arguments, options) as `--help` lists them: the name with its placeholder, and the help text."""
    arguments, options = [], []
    for param in command.get_params(context):
        record = param.get_help_record(context)
        if param.param_type_name == "argument":
            help_text = " ".join((getattr(param, "help", None) or "").split())
            required = "  [required]" if param.required else ""
            arguments.append((param.make_metavar(context), help_text + required))
        elif record is not None and param.name != "help":
            options.append((record[0], " ".join(record[1].split())))
    return arguments, options


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def command_page(names: list[str], command: Any, context: Any, docs: dict[str, Any]) -> str:
    import inspect

    name = " ".join(names)
    lines = [f"# lanectl {name}", ""]
    if command.help:
        lines += [inspect.cleandoc(command.help), ""]
    lines += ["```text", usage_line(command, context), "```", ""]
    arguments, options = help_records(command, context)
    if arguments:
        lines += ["## Arguments", "", "| Argument | What it is |", "|---|---|"]
        lines += [f"| `{_cell(metavar)}` | {_cell(text)} |" for metavar, text in arguments] + [""]
    if options:
        lines += ["## Options", "", "| Option | What it does |", "|---|---|"]
        lines += [f"| `{_cell(names_)}` | {_cell(text)} |" for names_, text in options] + [""]
    lines += ["## Example", "", "```console", docs["example"].rstrip("\n"), "```", ""]
    lines += ["## Exit codes", "", "| Code | Meaning |", "|---|---|"]
    lines += [f"| {code} | {_cell(text)} |" for code, text in sorted(docs["exit"].items())] + [""]
    return "\n".join(lines)


def command_index(commands: list[tuple[list[str], Any, Any]]) -> str:
    import typer

    from lanectl.cli.app import app

    root = typer.main.get_command(app)
    context = typer.Context(root, info_name="lanectl")
    lines = [
        "# Command reference",
        "",
        "A page per `lanectl` command: what it does, its arguments and options as `lanectl COMMAND --help` prints "
        "them, an example and what its exit codes mean. The pages are written from the command-line app "
        "(`lanectl/cli/app.py`) and each command's `COMMAND_DOCS` (beside its code in `lanectl/commands/`) each "
        "time this site is built.",
        "",
        "| Command | What it does |",
        "|---|---|",
    ]
    for names, command, _ in commands:
        summary = (command.help or "").strip().split("\n\n")[0].replace("\n", " ")
        lines.append(f"| [`lanectl {' '.join(names)}`](commands/{command_slug(names)}.md) | {_cell(summary)} |")
    lines += ["", "## Every command", "", "```text", usage_line(root, context), "```", ""]
    _, options = help_records(root, context)
    lines += ["| Option | What it does |", "|---|---|"]
    lines += [f"| `{_cell(names_)}` | {_cell(text)} |" for names_, text in options] + [""]
    lines += ["Exit codes, unless a command's page says more: "
              + "; ".join(f"**{code}** {text}" for code, text in GENERAL_EXIT_CODES.items())
              + ". A command ended by a signal exits 128 plus its number (130 for Ctrl-C, 143 for SIGTERM).", "",
              "`--json` output is an envelope `{\"lanectl\": 1, \"command\": …, \"data\": …}`.", ""]
    return "\n".join(lines)


def command_pages() -> dict[str, str]:
    """The command reference's pages by their path under docs/: the index, then one per command."""
    commands = leaf_commands()
    docs = command_docs()
    pages = {COMMANDS_PAGE: command_index(commands)}
    for names, command, context in commands:
        pages[command_page_path(names)] = command_page(names, command, context, docs[" ".join(names)])
    return pages


def command_reference() -> str:
    """Every page of the command reference, one after the other (`python scripts/docs_reference.py commands`)."""
    return "\n".join(command_pages().values())


# ---------------------------------------------------------------------------------------------------- variables

def environment_reference() -> str:
    from lanectl.environment import GROUPS, VARIABLES

    lines = [
        "# Environment variables",
        "",
        "Every environment variable lanectl reads, written from its registry (`lanectl/environment.py`) each time "
        "this site is built; a test holds the registry to the code's reads. A command-line option, where there is "
        "one, wins over its variable.",
        "",
        "**Carried** variables are written into the cron file and the systemd unit that "
        "[`watchdog install`](commands/watchdog-install.md) writes, with the values they have when it runs, so "
        "the watchdog uses the same state, lock, recipes and engine as the commands you type. Paths among them "
        "must be absolute. Secrets (the alert webhook, a lane's `secret_env`) are never carried: keep them in the "
        "env file the units read (`/etc/lanectl/watchdog.env`, mode 0600).",
        "",
    ]
    for group in GROUPS:
        members = [v for v in VARIABLES if v.group == group]
        lines += [f"## {group}", "", "| Variable | What it does | Default | Carried |", "|---|---|---|---|"]
        for v in members:
            name = v.name if v.name.startswith("(") else f"`{v.name}`"
            lines.append(f"| {name} | {_cell(v.meaning)} | {_cell(v.default)} | {'yes' if v.carried else ''} |")
        lines.append("")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------- MkDocs hook

def measurements() -> str:
    """benchmarks/RESULTS.md as a page of the site, as `make bench` last wrote it; a benchmark it has no section
    for yet (a script just added to the list) is shown as not measured, so every link to a section holds."""
    spec = importlib.util.spec_from_file_location("run_all", REPO / "benchmarks" / "run_all.py")
    assert spec and spec.loader
    runner = sys.modules[spec.name] = importlib.util.module_from_spec(spec)  # dataclasses look their module up
    spec.loader.exec_module(runner)
    text = runner.rewrite({}, RESULTS.read_text() if RESULTS.exists() else "")
    intro = ("The figures below are `benchmarks/RESULTS.md`, written by `make bench` from the benchmark scripts' own "
             "output (see [Development](development.md#benchmarks)); nothing here is copied by hand.\n\n")
    _, _, rest = text.partition("\n")  # its own title names the file; the site's nav calls it Measurements
    return f"# Measurements\n\n{intro}{rest.lstrip()}"


def generated_pages() -> dict[str, str]:
    return {RECIPE_PAGE: recipe_reference(), **command_pages(), ENVIRONMENT_PAGE: environment_reference(),
            MEASUREMENTS_PAGE: measurements(), CHANGELOG_PAGE: CHANGELOG.read_text()}


def on_config(config: Any) -> Any:
    """The site is named with the version it documents; the command pages join the nav under the command
    reference, in the order `--help` lists the commands."""
    from lanectl import __version__

    config["site_name"] = f"lanectl {__version__}"
    pages = [{f"lanectl {' '.join(names)}": command_page_path(names)} for names, _, _ in leaf_commands()]
    config["nav"] = _with_command_pages(config["nav"], pages)
    return config


def _with_command_pages(nav: Any, pages: list[dict[str, str]]) -> Any:
    if isinstance(nav, list):
        return [_with_command_pages(item, pages) for item in nav]
    if isinstance(nav, dict):
        return {title: ([{"Overview": COMMANDS_PAGE}, *pages] if target == COMMANDS_PAGE
                        else _with_command_pages(target, pages)) for title, target in nav.items()}
    return nav


def on_files(files: Any, config: Any) -> Any:
    from mkdocs.structure.files import File

    for page, content in generated_pages().items():
        files.append(File.generated(config, page, content=content))
    return files


if __name__ == "__main__":
    which = sys.argv[1] if len(sys.argv) > 1 else ""
    if which not in ("recipe", "commands"):
        sys.exit("usage: docs_reference.py recipe|commands")
    print(recipe_reference() if which == "recipe" else command_reference())
