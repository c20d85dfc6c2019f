"""Reading recipes and clusters from YAML, with errors that name the file, the field and the fix.

A recipe reference is either the name of a built-in recipe (``tandem/recipes/NAME.yaml``) or a
path to a YAML file. Every validation problem is collected and reported at once, each with its
dotted field path, the way pydantic locates it.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from tandem.errors import ClusterError, Problem, RecipeError, SpecError
from tandem.spec.cluster import Cluster, LocalIsolation
from tandem.spec.deployment import Deployment, local_cluster, resolve_isolation
from tandem.spec.recipe import Recipe

M = TypeVar("M", bound=BaseModel)

_BUILTIN = "tandem.recipes"


def builtin_recipe_names() -> list[str]:
    """Names of the recipes that ship with tandem."""
    folder = resources.files(_BUILTIN)
    return sorted(p.name.removesuffix(".yaml") for p in folder.iterdir() if p.name.endswith(".yaml"))


def load_recipe(ref: str | Path) -> Recipe:
    """Load a recipe from a built-in name or a YAML file.

    Raises:
        RecipeError: the name is unknown, the file is missing or not YAML, or a field is invalid.
    """
    ref_text = str(ref)
    if ref_text in builtin_recipe_names():
        text = resources.files(_BUILTIN).joinpath(f"{ref_text}.yaml").read_text()
        return parse_model(Recipe, text, f"built-in recipe '{ref_text}'", RecipeError)
    path = Path(ref_text)
    if not path.exists():
        raise RecipeError(
            f"no built-in recipe or file named '{ref_text}'",
            hint=f"use one of {', '.join(builtin_recipe_names())} or a path to a recipe YAML",
        )
    return parse_model(Recipe, _read(path, RecipeError), str(path), RecipeError)


def load_cluster(path: str | Path) -> Cluster:
    """Load a cluster inventory from a YAML file.

    Raises:
        ClusterError: the file is missing or not YAML, or a field is invalid.
    """
    path = Path(path)
    if not path.exists():
        raise ClusterError(f"cluster file '{path}' does not exist",
                           hint="pass --cluster with a path; examples/ has inventories to copy")
    return parse_model(Cluster, _read(path, ClusterError), str(path), ClusterError)


def _read(path: Path, error: type[SpecError]) -> str:
    try:
        return path.read_text()
    except OSError as exc:
        raise error(f"cannot read: {exc.strerror}", file=str(path)) from exc


def parse_model(model: type[M], text: str, source: str, error: type[SpecError]) -> M:
    """Parse YAML text into ``model``; every problem becomes one line of one ``error``."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "somewhere"
        problem = getattr(exc, "problem", None) or str(exc)
        raise error(f"not valid YAML at {where}: {problem}", file=source,
                    hint="check indentation and quoting around that line") from exc
    if not isinstance(data, dict):
        raise error("must be a YAML mapping of fields, e.g. 'name: ...' on the first line",
                    file=source, hint="see examples/ for the shape")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        problems = [_problem(err) for err in exc.errors(include_url=False)]
        fields = ", ".join(p.field for p in problems if p.field) or "the file"
        raise error(f"{len(problems)} invalid field(s): {fields}", file=source,
                    problems=problems) from exc


def _problem(err: ErrorDetails) -> Problem:
    """Turn one pydantic error into a Problem with a dotted path and a fix."""
    path = ".".join(str(p) for p in err["loc"])
    kind = err["type"]
    if kind == "extra_forbidden":
        return Problem(path, "unknown field", "remove it or check its spelling against the docs")
    if kind == "missing":
        return Problem(path, "required field is missing", "add it")
    message = err["msg"].removeprefix("Value error, ")
    hints = {
        "literal_error": "use one of the values listed",
        "enum": "use one of the values listed",
        "int_parsing": "write a whole number",
        "float_parsing": "write a number",
        "bool_parsing": "write true or false",
        "greater_than_equal": "raise it",
        "greater_than": "raise it",
        "less_than_equal": "lower it",
        "too_short": "add at least one entry",
        "dict_type": "write a mapping (key: value lines)",
        "list_type": "write a list (- item lines)",
        "string_type": "quote the value",
    }
    return Problem(path, message, hints.get(kind))


def load_deployment(
    recipe_ref: str | Path,
    cluster_path: str | Path | None = None,
    *,
    as_root: bool = False,
    cpu_count: int = 1,
    gpu_count: int = 0,
) -> Deployment:
    """Load a recipe and place it on a cluster.

    Without ``cluster_path`` the recipe runs on this machine: one local node per device of the
    world size (TP x PP), as namespaces when ``as_root``, else on loopback. A local cluster's
    ``auto`` isolation is made concrete the same way.
    """
    recipe = load_recipe(recipe_ref)
    if cluster_path is None:
        world = recipe.engine.serve.tensor_parallel_size * recipe.engine.serve.pipeline_parallel_size
        cluster = local_cluster(world, isolation=LocalIsolation.AUTO, cpu_count=cpu_count,
                                gpu_count=gpu_count)
    else:
        cluster = load_cluster(cluster_path)
    return Deployment(recipe=recipe, cluster=resolve_isolation(cluster, as_root=as_root))
