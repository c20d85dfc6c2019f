"""Reading recipes and clusters from YAML, with errors that name the file, the field and the fix.

A recipe reference is either the name of a built-in recipe (``tandem/recipes/NAME.yaml``) or a
path to a YAML file. Every problem is collected and reported at once, each with its file and
dotted field path, the way pydantic locates it — across stage borders too:

1. a file is read with a size limit (``MAX_SPEC_BYTES``, checked before parsing), decoded as
   UTF-8 and parsed as YAML that may not repeat a key;
2. it is validated against its model; when fields are invalid, they are dropped and the rest
   is validated again (``repaired``), so checks that need a whole model (nodes that repeat,
   ports that clash) still run and report in the same round;
3. ``load_deployment`` then checks the (repaired) recipe and cluster together as the rank plan
   does, and one error carries the recipe's, the cluster's and the plan's problems.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any, Generic, TypeVar

import yaml
from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from tandem.errors import ClusterError, Problem, RecipeError, SpecError
from tandem.spec.cluster import Cluster, LocalIsolation
from tandem.spec.deployment import (
    Deployment,
    deployment_problems,
    local_cluster,
    resolve_isolation,
)
from tandem.spec.recipe import Recipe

M = TypeVar("M", bound=BaseModel)

_BUILTIN = "tandem.recipes"
EXAMPLES = "examples"
"""The example recipes and inventories (the repository's ``examples/``), shipped in the package
so that a path such as ``examples/dgx-spark-pair.yaml`` in a hint works from any folder."""
MAX_SPEC_BYTES = 1024 * 1024
"""Largest recipe or cluster file read (1 MiB; the seeds' are under 4 KiB)."""
_REPAIR_ROUNDS = 8


def builtin_recipe_names() -> list[str]:
    """Names of the recipes that ship with tandem."""
    folder = resources.files(_BUILTIN)
    return sorted(
        p.name.removesuffix(".yaml") for p in folder.iterdir() if p.name.endswith(".yaml")
    )


def builtin_recipe_text(name: str) -> str:
    """The YAML of a built-in recipe as it ships, comments included."""
    return resources.files(_BUILTIN).joinpath(f"{name}.yaml").read_text()


def shipped_example(path: str | Path) -> Traversable | None:
    """The shipped copy of ``examples/...`` (a relative path that names a file of the
    repository's ``examples/``), or None."""
    parts = Path(path).parts
    if Path(path).is_absolute() or len(parts) < 2 or parts[0] != EXAMPLES or ".." in parts:
        return None
    found = resources.files("tandem").joinpath(*parts)
    return found if found.is_file() else None


def example_files() -> list[str]:
    """Every shipped example as the relative path that names it (``examples/NAME.yaml``)."""
    root = resources.files("tandem").joinpath(EXAMPLES)

    def walk(folder: Traversable, prefix: str) -> list[str]:
        found = []
        for entry in sorted(folder.iterdir(), key=lambda e: e.name):
            if entry.is_dir():
                found += walk(entry, f"{prefix}{entry.name}/")
            elif entry.name.endswith(".yaml"):
                found.append(prefix + entry.name)
        return found

    return walk(root, f"{EXAMPLES}/") if root.is_dir() else []


@dataclass
class Loaded(Generic[M]):
    """One file read and validated: the model, or why not.

    ``model`` is the valid model, or when fields were invalid the model without them (their
    defaults instead), or None when even that fails. ``error`` is set whenever the file is not
    valid; ``dropped`` lists the field paths the repair removed.
    """

    source: str
    model: M | None = None
    error: SpecError | None = None
    dropped: list[str] = field(default_factory=list)


def load_recipe(ref: str | Path) -> Recipe:
    """Load a recipe from a built-in name or a YAML file.

    Raises:
        RecipeError: the name is unknown, the file is missing, too large, not UTF-8 or not
            YAML, repeats a key, or a field is invalid.
    """
    loaded = read_recipe(ref)
    if loaded.error:
        raise loaded.error
    return loaded.model  # type: ignore[return-value]


def load_cluster(path: str | Path) -> Cluster:
    """Load a cluster inventory from a YAML file.

    Raises:
        ClusterError: the file is missing, too large, not UTF-8 or not YAML, repeats a key, or
            a field is invalid.
    """
    loaded = read_cluster(path)
    if loaded.error:
        raise loaded.error
    return loaded.model  # type: ignore[return-value]


def read_recipe(ref: str | Path) -> Loaded[Recipe]:
    """A recipe, repaired where it can be; never raises for what the user wrote."""
    ref_text, names = str(ref), builtin_recipe_names()
    if ref_text in names:
        source = f"built-in recipe '{ref_text}'"
        return validated(Recipe, builtin_recipe_text(ref_text), source, RecipeError)
    missing = RecipeError(
        f"no built-in recipe or file named '{ref_text}'",
        field="RECIPE",
        hint=f"use one of {', '.join(names)} or a path to a recipe YAML",
    )
    return _read_file(Recipe, Path(ref_text), ref_text, missing)


def read_cluster(path: str | Path) -> Loaded[Cluster]:
    """A cluster inventory, repaired where it can be; never raises for what the user wrote."""
    path = Path(path)
    missing = ClusterError(
        f"cluster file '{path}' does not exist",
        field="--cluster",
        hint="pass --cluster with a path, or write one with `tandem init`; "
        "`tandem recipes` lists the example inventories shipped with tandem",
    )
    return _read_file(Cluster, path, str(path), missing)


def _read_file(model: type[M], path: Path, name: str, missing: SpecError) -> Loaded[M]:
    """A recipe or cluster file the user named (as ``name``): the file itself, else the shipped
    copy of an ``examples/...`` path, so that a hint's example path works from any folder;
    ``missing`` when neither exists."""
    error = type(missing)
    shipped = None if path.exists() else shipped_example(path)
    if shipped is not None:
        return validated(model, shipped.read_text(), f"{name} (shipped)", error)
    if not path.exists():
        return Loaded(name, error=missing)
    try:
        text = read_spec_text(path, error)
    except SpecError as exc:
        return Loaded(str(path), error=exc)
    return validated(model, text, str(path), error)


def read_spec_text(path: Path, error: type[SpecError], *, limit: int = MAX_SPEC_BYTES) -> str:
    """The text of a user's file: at most ``limit`` bytes (checked before reading), UTF-8."""
    try:
        size = path.stat().st_size
        if path.is_dir():
            raise error("is a folder, not a file", file=str(path), hint="pass the YAML file")
        if size > limit:
            raise error(
                f"is {size:,} bytes, more than the {limit:,} a recipe or cluster may have",
                file=str(path),
                hint="pass the YAML file itself, not a log or an archive",
            )
        raw = path.read_bytes()
    except OSError as exc:
        raise error(f"cannot read: {exc.strerror}", file=str(path)) from exc
    return decode_utf8(raw, str(path), error)


def decode_utf8(raw: bytes, source: str, error: type[SpecError]) -> str:
    """``raw`` as UTF-8 text (a BOM is dropped), or one error naming the first bad byte."""
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise error(
            f"is not UTF-8 text: byte 0x{raw[exc.start]:02x} at line {line} (offset {exc.start})",
            file=source,
            hint="save the file as UTF-8 (e.g. `iconv -f latin1 -t utf-8`)",
        ) from None


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a mapping that repeats a key (PyYAML lets the last win)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: dict[Any, yaml.Node] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            try:
                hash(key)
            except TypeError:
                continue  # the base class reports an unhashable key
            if key in seen:
                first = seen[key].start_mark.line + 1
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    f"key '{key}' appears twice (first at line {first}); the second "
                    "would silently win",
                    key_node.start_mark,
                )
            seen[key] = key_node
        return super().construct_mapping(node, deep=deep)


def parse_yaml(text: str, source: str, error: type[SpecError]) -> dict[str, Any]:
    """YAML text as a mapping; a syntax error or repeated key names its line and column."""
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "somewhere"
        problem = getattr(exc, "problem", None) or str(exc)
        hint = (
            "remove one of the two"
            if "appears twice" in problem
            else "check indentation and quoting around that line"
        )
        raise error(f"not valid YAML at {where}: {problem}", file=source, hint=hint) from exc
    except RecursionError as exc:
        raise error("nests too deeply to be a recipe or cluster", file=source) from exc
    if not isinstance(data, dict):
        raise error(
            "must be a YAML mapping of fields, e.g. 'name: ...' on the first line",
            file=source,
            hint="`tandem recipe show NAME` prints a recipe to copy, `tandem init` writes a "
            "recipe and a cluster, and docs/recipes.md describes every field",
        )
    return data


def validated(model: type[M], text: str, source: str, error: type[SpecError]) -> Loaded[M]:
    """Validate YAML text against ``model``, collecting every problem, repairing what it can."""
    try:
        data = parse_yaml(text, source, error)
    except SpecError as exc:
        return Loaded(source, error=exc)
    problems: list[Problem] = []
    dropped: list[tuple] = []
    candidate: Any = data
    for _ in range(_REPAIR_ROUNDS):
        try:
            result = model.model_validate(candidate)
        except ValidationError as exc:
            fresh = [
                e
                for e in exc.errors(include_url=False)
                if not (e["type"] == "missing" and tuple(e["loc"]) in dropped)
            ]
            if not fresh:
                result = None
                break
            for err in fresh:
                problem = _problem(err)
                if problem not in problems:
                    problems.append(problem)
            locs = [tuple(e["loc"]) for e in fresh]
            if any(not loc for loc in locs) or all(loc in dropped for loc in locs):
                result = None  # a whole-model fault: nothing left to drop
                break
            for loc in locs:
                candidate = _without(candidate, loc)
                dropped.append(loc)
            continue
        break
    else:
        result = None
    if not problems:
        return Loaded(source, model=result)
    fields = ", ".join(dict.fromkeys(p.field for p in problems if p.field)) or "the file"
    return Loaded(
        source,
        model=result,
        dropped=[_dotted(loc) for loc in dropped],
        error=error(f"{len(problems)} invalid field(s): {fields}", file=source, problems=problems),
    )


def _without(data: Any, loc: tuple) -> Any:
    """A copy of ``data`` without the value at ``loc`` (or its deepest existing parent)."""
    if not loc or not isinstance(data, dict | list):
        return data
    head, rest = loc[0], loc[1:]
    if isinstance(data, dict):
        if head not in data:
            return data
        if not rest or not isinstance(data[head], dict | list):
            return {k: v for k, v in data.items() if k != head}
        return {**data, head: _without(data[head], rest)}
    if not isinstance(head, int) or not 0 <= head < len(data):
        return data
    copy = list(data)
    copy[head] = _without(copy[head], rest) if rest else copy[head]
    return copy


def _dotted(loc: tuple) -> str:
    return ".".join(str(p) for p in loc)


def _problem(err: ErrorDetails) -> Problem:
    """Turn one pydantic error into a Problem with a dotted path and a fix."""
    path = _dotted(tuple(err["loc"]))
    kind = err["type"]
    if kind == "extra_forbidden":
        return Problem(
            path,
            "unknown field",
            "remove it or check its spelling (`tandem recipe schema` and docs/recipes.md list "
            "every field)",
        )
    if kind == "missing":
        return Problem(path, "required field is missing", "add it")
    message = err["msg"].removeprefix("Value error, ")
    if kind == "value_error":  # tandem's own validators: FieldFault carries the fix
        cause = (err.get("ctx") or {}).get("error")
        return Problem(
            path, message, getattr(cause, "hint", None) or (err.get("ctx") or {}).get("hint")
        )
    hints = {
        "literal_error": "use one of the values listed",
        "enum": "use one of the values listed",
        "int_parsing": "write a whole number",
        "int_from_float": "write a whole number",
        "int_type": "write a whole number",
        "float_parsing": "write a number",
        "float_type": "write a number",
        "finite_number": "write a finite number",
        "bool_parsing": "write true or false",
        "bool_type": "write true or false",
        "greater_than_equal": "raise it",
        "greater_than": "raise it",
        "less_than_equal": "lower it",
        "less_than": "lower it",
        "too_short": "add at least one entry",
        "dict_type": "write a mapping (key: value lines)",
        "list_type": "write a list (- item lines)",
        "string_type": "quote the value",
        "string_too_short": "write a value, or leave the field out for its default",
        "string_pattern_mismatch": "use one of the values docs/recipes.md lists for it",
        "model_type": "write a mapping (key: value lines)",
        "model_attributes_type": "write a mapping (key: value lines)",
    }
    return Problem(path, message, hints.get(kind, "see the field's description in docs/recipes.md"))


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
    world size (TP x PP) of each of its replicas, as namespaces when ``as_root``, else on
    loopback. A local cluster's ``auto`` isolation is made concrete the same way.

    Raises:
        SpecError: every problem of the recipe, the cluster and the plan of the two together,
            each with its file; a ``RecipeError`` or ``ClusterError`` when only one file is at
            fault. A valid recipe and cluster that cannot work together are returned: the rank
            plan (``plan_ranks``) refuses them with a ``PlanError`` that names the files.
    """
    recipe = read_recipe(recipe_ref)
    if cluster_path is None:
        cluster: Loaded[Cluster] = Loaded("this machine's cluster")
        if recipe.model is not None:
            serve = recipe.model.engine.serve
            ranks = serve.tensor_parallel_size * serve.pipeline_parallel_size
            ranks *= recipe.model.replicas
            try:
                cluster.model = local_cluster(
                    ranks,
                    isolation=LocalIsolation.AUTO,
                    cpu_count=cpu_count,
                    gpu_count=gpu_count,
                    confine=recipe.model.replicas > 1,
                )
            except SpecError as exc:  # more ranks than this machine has nodes
                cluster.error = RecipeError(
                    exc.message, file=recipe.source, field="engine.serve", hint=exc.hint
                )
    else:
        cluster = read_cluster(cluster_path)
    errors = [e for e in (recipe.error, cluster.error) if e]
    deployment = None
    if recipe.model is not None and cluster.model is not None:
        deployment = Deployment(
            recipe=recipe.model,
            cluster=resolve_isolation(cluster.model, as_root=as_root),
            recipe_file=recipe.source,
            cluster_file=None if cluster_path is None else cluster.source,
        )
    if not errors:
        return deployment  # type: ignore[return-value]
    plan_problems = _plan_problems(deployment, recipe.dropped + cluster.dropped)
    if len(errors) == 1 and not plan_problems:
        raise errors[0]
    problems = [p for e in errors for p in _problems_of(e)] + plan_problems
    kinds = {type(e) for e in errors}
    kind = kinds.pop() if len(kinds) == 1 else SpecError
    files = ", ".join(dict.fromkeys(p.file for p in problems if p.file))
    raise kind(f"{len(problems)} problem(s) in {files}", problems=problems)


def _problems_of(error: SpecError) -> list[Problem]:
    """An error's problems, each naming the error's file; the error itself when it has none."""
    if not error.problems:
        return [Problem(error.field or "", error.message, error.hint, file=error.file)]
    return [replace(p, file=p.file or error.file) for p in error.problems]


def _plan_problems(deployment: Deployment | None, dropped: list[str]) -> list[Problem]:
    """What the rank plan would refuse, less what only follows from a dropped field."""
    if deployment is None:
        return []
    return [
        replace(p, file=deployment.file_of(p.field))
        for p in deployment_problems(deployment)
        if not any(_overlaps(p.field, path) for path in dropped)
    ]


def _overlaps(field_path: str, dropped: str) -> bool:
    """True when one path lies inside the other, list indexes ignored."""
    a, b = (re.sub(r"\[\d*\]|\.\d+(?=\.|$)", "", p) for p in (field_path, dropped))
    return a == b or a.startswith(b + ".") or b.startswith(a + ".")
