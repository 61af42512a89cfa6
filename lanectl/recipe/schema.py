"""The JSON Schema of the recipe format, for editors (yaml-language-server)."""

from __future__ import annotations

from typing import Any

from lanectl.recipe.model import LaneSpec, RecipeFile

SCHEMA_ID = "https://lanectl.invalid/schema/lanectl-v1.json"


def recipe_json_schema() -> dict[str, Any]:
    """RecipeFile's schema, with `defaults` and each lane typed as a (partial) lane.

    Keys are all optional at that level: a lane may override one field and inherit the rest,
    so "required" is checked by `lanectl validate` after the merge, not by the editor.
    """
    schema = RecipeFile.model_json_schema(by_alias=True)
    lane = _without_required(LaneSpec.model_json_schema(by_alias=True, ref_template="#/$defs/{model}"))
    definitions = {**schema.pop("$defs", {}), **lane.pop("$defs", {})}
    definitions["LanePartial"] = lane
    schema["properties"]["defaults"] = {"$ref": "#/$defs/LanePartial", "description": "Inherited by every lane."}
    schema["properties"]["lanes"]["additionalProperties"] = {"anyOf": [{"$ref": "#/$defs/LanePartial"},
                                                                      {"type": "null"}]}
    schema["$defs"] = definitions
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["$id"] = SCHEMA_ID
    return schema


def _without_required(node: Any) -> Any:
    if isinstance(node, dict):
        return {key: _without_required(value) for key, value in node.items() if key != "required"}
    if isinstance(node, list):
        return [_without_required(item) for item in node]
    return node
