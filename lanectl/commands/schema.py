from __future__ import annotations

from lanectl.output import Result


def recipe_schema() -> Result:
    """The JSON Schema of the recipe format; its data is the schema itself (printed bare, for editors)."""
    from lanectl.recipe.schema import recipe_json_schema

    return Result("schema", recipe_json_schema())
