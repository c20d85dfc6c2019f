"""The tools the smoke check offers a model, and the judge of a call's arguments against them.

A parser that mangles a call shows as arguments that are not the JSON the tool's schema asks
for, so the judge says which part is wrong (``traveller.age is str, not integer``), at any depth
of the schema: objects with their required keys, arrays with their items, types and enums. It
covers the subset of JSON Schema that tool definitions use; a keyword it does not know is not
judged, so it never fails a call for the judge's own gap.
"""

from __future__ import annotations

import json
from typing import Any

WEATHER_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city"],
}
TRIP_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "traveller": {
            "type": "object",
            "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
            "required": ["name", "age"],
        },
        "cities": {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 4},
    },
    "required": ["traveller", "cities"],
}
"""Nested arguments: an object inside the object, and an array of strings (at most four: a
small model repeats an open list until ``max_tokens``; the bound makes the server close it)."""


def function_tool(name: str, description: str, parameters: dict[str, Any]) -> dict[str, Any]:
    """A tool as the OpenAI API takes it, ``strict``: the server then promises arguments that
    match the schema, so a call that does not is the server's fault, not the model's. (vLLM's
    ``--tool-strict-level auto`` pins the arguments only for a strict tool; without it the
    real SmolLM2-135M called ``get_weather`` with the string ``"Paris"``.)"""
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": parameters,
            "strict": True,
        },
    }


WEATHER_TOOL = function_tool("get_weather", "The current weather of a city.", WEATHER_PARAMETERS)
TRIP_TOOL = function_tool("book_trip", "Book a trip for one traveller.", TRIP_PARAMETERS)
PARAMETERS_OF = {"get_weather": WEATHER_PARAMETERS, "book_trip": TRIP_PARAMETERS}

_TYPES: dict[str, type | tuple[type, ...]] = {
    "string": str,
    "number": (int, float),
    "integer": int,
    "boolean": bool,
    "object": dict,
    "array": list,
}


def schema_problems(arguments: str, schema: dict[str, Any]) -> list[str]:
    """What is wrong with a call's ``arguments`` text against its tool's JSON schema: not JSON,
    and every place where the value is not what the schema says (empty: nothing wrong)."""
    try:
        value = json.loads(arguments)
    except ValueError as exc:
        return [f"arguments are not JSON ({exc}): {arguments[:120]!r}"]
    if not isinstance(value, dict):
        return [f"arguments are {type(value).__name__}, not an object"]
    return _problems(value, schema, "")


def _problems(value: Any, schema: dict[str, Any], where: str) -> list[str]:
    named = f"'{where}'" if where else "arguments"
    expected = schema.get("type")
    python_type = _TYPES.get(expected) if isinstance(expected, str) else None
    # bool is an int in Python; JSON keeps them apart
    if python_type is not None and (
        not isinstance(value, python_type) or (isinstance(value, bool) and expected != "boolean")
    ):
        return [f"{named} is {type(value).__name__}, not {expected}"]
    if "enum" in schema and value not in schema["enum"]:
        return [f"{named} is {value!r}, not one of {schema['enum']}"]
    found: list[str] = []
    if isinstance(value, dict) and expected == "object":
        properties = schema.get("properties") or {}
        prefix = f"{where}." if where else ""
        found += [
            f"required '{prefix}{k}' missing" for k in schema.get("required", []) if k not in value
        ]
        for key, item in value.items():
            if key not in properties:
                found.append(f"'{prefix}{key}' is not a parameter of the tool")
            else:
                found += _problems(item, properties[key], prefix + key)
    if isinstance(value, list) and expected == "array":
        if len(value) < schema.get("minItems", 0):
            found.append(f"{named} has {len(value)} item(s), fewer than {schema['minItems']}")
        if len(value) > schema.get("maxItems", len(value)):
            found.append(f"{named} has {len(value)} item(s), more than {schema['maxItems']}")
        for i, item in enumerate(value):
            found += _problems(item, schema.get("items") or {}, f"{where}[{i}]")
    return found
