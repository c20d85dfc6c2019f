"""A recipe or cluster as an older tandem saved it: read even where today's checks refuse it.

A deployment's state keeps the resolved recipe and cluster it was launched from. A later tandem
may check more (a secret-shaped ``env`` value, a stricter name, a flag it now owns) and must
still stop, watch and bundle what runs. ``as_saved`` keeps every part that still validates
(typed: enums, nested models) and the rest as it was saved, without the checks that refuse it,
and says what was refused. Only for commands that act on what already runs; a launch validates.
"""

from __future__ import annotations

from typing import Any, TypeVar, get_args, get_origin

from pydantic import BaseModel, TypeAdapter, ValidationError

from tandem.jsonfiles import validation_text

M = TypeVar("M", bound=BaseModel)


def as_saved(model: type[M], data: dict[str, Any]) -> tuple[M, str | None]:
    """``data`` as ``model`` and None; or, where today's validators refuse it, the model built
    part by part (each part validated where it passes, kept as saved where not) and the first
    refusal in words (``engine.env: ...``).

    Usage:
        recipe, refused = as_saved(Recipe, state.recipe)
        if refused: warn(f"the saved recipe fails today's checks ({refused})")
    """
    try:
        return model.model_validate(data), None
    except ValidationError as exc:
        return _lenient(model, data), validation_text(exc)


def _lenient(annotation: Any, value: Any) -> Any:
    """``value`` validated as ``annotation``; where that fails, a model built from its fields
    (each lenient in turn), a list or dict item by item, and any other value as it is."""
    try:
        return TypeAdapter(annotation).validate_python(value)
    except ValidationError:
        pass
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        if not isinstance(value, dict):
            return value
        fields = {
            name: _lenient(info.annotation, value[name])
            for name, info in annotation.model_fields.items()
            if name in value
        }
        return annotation.model_construct(**fields)
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is list and isinstance(value, list):
        return [_lenient(args[0], item) for item in value]
    if origin is dict and isinstance(value, dict):
        return {key: _lenient(args[1], item) for key, item in value.items()}
    models = [a for a in args if isinstance(a, type) and issubclass(a, BaseModel)]
    if models and isinstance(value, dict):  # a union such as `SSHOptions | None`
        return _lenient(models[0], value)
    return value
