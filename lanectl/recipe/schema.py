"""The JSON Schema of the recipe format, for editors (yaml-language-server)."""

from __future__ import annotations

import dataclasses
from typing import Any

from pydantic import TypeAdapter
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaValue
from pydantic_core import core_schema

from lanectl.recipe.model import LaneSpec, RecipeFile

SCHEMA_ID = "https://lanectl.invalid/schema/lanectl-v1.json"


def recipe_json_schema() -> dict[str, Any]:
    """RecipeFile's schema, with `defaults` and each lane typed as a (partial) lane.

    Keys are all optional at that level: a lane may override one field and inherit the rest,
    so "required" is checked by `lanectl validate` after the merge, not by the editor.
    """
    schema = TypeAdapter(RecipeFile).json_schema(by_alias=True, schema_generator=_ModelDefaults)
    lane = _without_required(TypeAdapter(LaneSpec).json_schema(by_alias=True, ref_template="#/$defs/{model}",
                                                               schema_generator=_ModelDefaults))
    definitions = {**schema.pop("$defs", {}), **lane.pop("$defs", {})}
    definitions["LanePartial"] = lane
    schema["properties"]["defaults"] = {"$ref": "#/$defs/LanePartial", "description": "Inherited by every lane."}
    schema["properties"]["lanes"]["additionalProperties"] = {"anyOf": [{"$ref": "#/$defs/LanePartial"},
                                                                      {"type": "null"}]}
    schema["$defs"] = definitions
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["$id"] = SCHEMA_ID
    return schema


class _ModelDefaults(GenerateJsonSchema):
    """Shows a section's defaults (`health.generation_probe: {prompt: "Say OK.", ...}`) to the editor.

    The models build such defaults with `default_factory` (an instance made at import would build the
    validators at import, which every command would pay for), and pydantic leaves factories out.
    """

    def default_schema(self, schema: core_schema.WithDefaultSchema) -> JsonSchemaValue:
        factory = schema.get("default_factory")
        if isinstance(factory, type) and dataclasses.is_dataclass(factory):
            default = TypeAdapter(factory).dump_python(factory(), mode="json")  # floats as floats
            schema = {**schema, "default": default}  # type: ignore[typeddict-item]
            del schema["default_factory"]  # type: ignore[misc]
        return super().default_schema(schema)


def _without_required(node: Any) -> Any:
    if isinstance(node, dict):
        return {key: _without_required(value) for key, value in node.items() if key != "required"}
    if isinstance(node, list):
        return [_without_required(item) for item in node]
    return node
