from __future__ import annotations

from lanectl.output import Result


def recipe_schema() -> Result:
    """The JSON Schema of the recipe format; its data is the schema itself (printed bare, for editors)."""
    from lanectl.recipe.schema import recipe_json_schema

    return Result("schema", recipe_json_schema())


# The command's page in the docs (docs/reference/commands/, written by scripts/docs_reference.py from the
# command-line app): an example, and what each exit code means.
COMMAND_DOCS = {
    "schema": {
        "example": """\
$ lanectl schema > lanectl.schema.json
# then, at the top of a recipe, for editors that run yaml-language-server:
# yaml-language-server: $schema=../lanectl.schema.json
""",
        "exit": {
            0: "the schema was printed",
        },
    },
}
