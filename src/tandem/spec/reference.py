"""The recipe and cluster reference, generated from the models themselves (``docs/recipes.md``).

Every field of ``Recipe`` and ``Cluster`` is documented once, where it is declared: its
``description``, its bounds and default, its ``examples``, and what it ``becomes`` on a rank
(a ``vllm serve`` flag, an environment variable; ``becomes`` in the field's JSON Schema,
``engine.serve`` fields by their own name). This module only walks the models and lays that
out; a test fails when a field lacks a description or an example, and when the checked-in
reference differs from a fresh rendering (as ``docs/cli.md`` does for the help).

Where no ``examples`` is declared, the example is the value a shipped file sets (a built-in
recipe, an example recipe or cluster), named with the file, so that it is a value that runs.

Usage:
    print(reference_markdown())
"""

from __future__ import annotations

import json
import types
import typing
from dataclasses import dataclass
from enum import Enum
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from tandem.errors import SpecError
from tandem.spec.cluster import Cluster
from tandem.spec.loading import (
    EXAMPLES,
    builtin_recipe_names,
    builtin_recipe_text,
    example_files,
    parse_yaml,
    shipped_example,
)
from tandem.spec.recipe import Recipe, ServeOptions, serve_flag

ROOTS: dict[str, type[BaseModel]] = {"recipe": Recipe, "cluster": Cluster}
"""The two files a user writes, by what ``tandem recipe schema`` calls them."""


@dataclass(frozen=True)
class FieldDoc:
    """One field as the reference shows it."""

    path: str
    """Dotted path in the file, ``nodes[].address`` for a list of mappings."""
    type: str
    default: str
    becomes: list[str]
    description: str
    examples: list[Any]


@dataclass(frozen=True)
class Section:
    """One mapping of a file (``engine.serve``): its model's docstring and its fields."""

    path: str
    model: type[BaseModel]
    fields: list[FieldDoc]


def sections(root: type[BaseModel], prefix: str = "") -> list[Section]:
    """The model's own fields, then each nested mapping's, depth first, in field order."""
    own: list[FieldDoc] = []
    nested: list[Section] = []
    for name, info in root.model_fields.items():
        path = prefix + name
        sub = _nested_model(info.annotation)
        if sub is not None:
            many = typing.get_origin(info.annotation) is list
            nested += sections(sub, path + ("[]." if many else "."))
            continue
        own.append(_field_doc(root, name, info, path))
    return [Section(prefix.rstrip("."), root, own), *nested]


def all_fields(root: type[BaseModel]) -> list[FieldDoc]:
    return [f for s in sections(root) for f in s.fields]


def _nested_model(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) is list:
        (item,) = typing.get_args(annotation)
        if isinstance(item, type) and issubclass(item, BaseModel):
            return item
    return None


def _field_doc(model: type[BaseModel], name: str, info: FieldInfo, path: str) -> FieldDoc:
    extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
    becomes = [str(b) for b in extra.get("becomes", [])]  # type: ignore[union-attr]
    if model is ServeOptions:
        becomes = [serve_flag(name)]
    return FieldDoc(
        path=path,
        type=type_text(info),
        default=default_text(info),
        becomes=becomes,
        description=info.description or "",
        examples=list(info.examples or []),
    )


def type_text(info: FieldInfo) -> str:
    """The annotation as a reader writes YAML for it: ``int >= 1``, ``mp | ray``, ``text``."""
    text = _annotation_text(info.annotation)
    bounds = [
        f"{op} {getattr(m, key)}"
        for m in info.metadata
        for key, op in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<"))
        if hasattr(m, key)
    ]
    return text + (" " + ", ".join(bounds) if bounds else "")


def _annotation_text(annotation: Any) -> str:
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (types.UnionType, typing.Union):
        return " | ".join(_annotation_text(a) for a in args)
    if origin is typing.Literal:
        return " | ".join(str(a) for a in args)
    if origin is list:
        return f"list of {_annotation_text(args[0])}"
    if origin is dict:
        return f"mapping of {_annotation_text(args[1])}" if args[1] is not Any else "mapping"
    if isinstance(annotation, type) and issubclass(annotation, Enum):
        return " | ".join(str(m.value) for m in annotation)
    names = {str: "text", int: "int", float: "number", bool: "bool", type(None): "null"}
    return names.get(annotation, getattr(annotation, "__name__", str(annotation)))


def default_text(info: FieldInfo) -> str:
    """The default as YAML would write it, or ``required``."""
    if info.is_required():
        return "required"
    value = info.get_default(call_default_factory=True)
    if value is PydanticUndefined:
        return "required"
    return yaml_value(value)


def yaml_value(value: Any) -> str:
    """A value in YAML's flow style: ``null``, ``true``, ``8000``, ``[a, b]``, ``{k: v}``."""
    if isinstance(value, Enum):
        value = value.value
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json")
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "[" + ", ".join(yaml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {yaml_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, str) and (not value or value[0] in "[{&*!|>'\"%@`#" or ": " in value):
        return json.dumps(value)
    return str(value)


ShippedValues = dict[str, list[tuple[Any, str]]]
"""Field path -> each value a shipped file sets, with the file's name."""


def values_in(data: Any, prefix: str = "") -> dict[str, Any]:
    """The leaf values of a parsed recipe or cluster by field path (``nodes[].address``: the
    first node's), stopping at a field's own value (a mapping such as ``env`` stays whole)."""
    found: dict[str, Any] = {}
    if isinstance(data, list):
        if data and isinstance(data[0], dict):
            return values_in(data[0], prefix.rstrip(".") + "[].")
        return found
    if not isinstance(data, dict):
        return found
    for key, value in data.items():
        path = prefix + str(key)
        nested = values_in(value, path + ".")
        if nested and path not in _LEAVES:
            found |= nested
        else:
            found[path] = value
    return found


_LEAVES = {
    "env",
    "nodes[].env",
    "engine.serve.speculative_config",
    "kubernetes.service.annotations",
    "engine.extra_args",
}
"""Fields whose value is a mapping or list of its own, not nested fields."""


def shipped_values() -> dict[str, ShippedValues]:
    """The values the shipped files set, for ``recipe`` (built-in and example recipes) and
    ``cluster`` (the example inventories)."""
    found: dict[str, ShippedValues] = {"recipe": {}, "cluster": {}}
    texts = [("recipe", name, builtin_recipe_text(name)) for name in builtin_recipe_names()]
    for path in example_files():
        shipped = shipped_example(path)
        kind = "recipe" if path.startswith(f"{EXAMPLES}/recipes/") else "cluster"
        if shipped is not None:
            texts.append((kind, path, shipped.read_text()))
    for kind, source, text in texts:
        for field, value in values_in(parse_yaml(text, source, SpecError)).items():
            found[kind].setdefault(field, []).append((value, source))
    return found


def example_of(field: FieldDoc, shipped: ShippedValues) -> str | None:
    """The field's example as YAML, and where it comes from: its declared example, else the
    value a shipped file sets (not the default: an example shows what one writes)."""
    leaf = field.path.rsplit(".", 1)[-1]
    if field.examples:
        return f"`{leaf}: {yaml_value(field.examples[0])}`"
    for value, source in shipped.get(field.path, []):
        if isinstance(value, dict):  # a few entries of a long mapping show its shape
            value = dict(list(value.items())[:2])
        if yaml_value(value) != field.default:
            return f"`{leaf}: {yaml_value(value)}` ({source})"
    return None


def reference_markdown() -> str:
    """``docs/recipes.md``: every section of the recipe, then of the cluster inventory."""
    shipped = shipped_values()
    out = [HEADER]
    for kind, root in ROOTS.items():
        out.append(f"## The {kind} file\n\n{_doc(root)}\n")
        for section in sections(root):
            if section.path:
                out.append(f"### `{section.path}:`\n\n{_doc(section.model)}\n")
            out += [_field_markdown(f, shipped[kind]) for f in section.fields]
            out.append("")
    return "\n".join(out).rstrip() + "\n"


HEADER = """# Recipe and cluster reference

Generated from the models (`tandem.spec.recipe`, `tandem.spec.cluster`) by
`python -m tandem.cli.helpdoc`; do not edit by hand. A **recipe** says what to serve and how
(`tandem recipe show NAME` prints a built-in one to copy); a **cluster inventory** says where
(`--cluster FILE`; without one, this machine). `tandem init` writes both for your model and
nodes, and `tandem recipe schema` prints the JSON Schema for an editor.

Each field: its type and default, what it becomes on a rank (a `vllm serve` flag or an
environment variable; fields without one are read by tandem itself), what it means, and an
example (a value one of the shipped recipes or example inventories sets, named in brackets,
or one written here). A field left out takes its default; a field the models do not know is
an error that names it.
"""


def _doc(model: type[BaseModel]) -> str:
    return " ".join((model.__doc__ or "").split()).replace("``", "`")


def _field_markdown(field: FieldDoc, shipped: ShippedValues) -> str:
    leaf = field.path.rsplit(".", 1)[-1]
    becomes = f" → {', '.join(f'`{b}`' for b in field.becomes)}" if field.becomes else ""
    example = example_of(field, shipped)
    default = "required" if field.default == "required" else f"default `{field.default}`"
    text = f"- **`{leaf}`** ({field.type}; {default}){becomes}  \n"
    text += f"  {field.description}"
    if example:
        text += f"  \n  Example: {example}"
    return text
