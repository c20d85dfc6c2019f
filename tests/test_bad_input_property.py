"""Property: any bad input gets exactly one message naming its file and field, never a traceback.

Hypothesis mutates the built-in recipes and the example clusters in ways that are invalid by
construction — an unknown key in a mapping that is a model, a value of the wrong shape, a
number beyond its field's bound, a secret in ``env``, a repeated key, a byte that is not UTF-8 —
and passes every CLI numeric option a value beyond its declared range. Each case runs ``tandem``
as a user does (``tandem.cli.main``) and must exit nonzero, print one ``error:`` (or click's
one ``Error:``) naming the file and field or option, show no traceback, and take under 5 s.
"""

from __future__ import annotations

import math
import time
import types
import typing
from pathlib import Path
from typing import Any

import click
import pytest
import yaml
from annotated_types import Ge, Gt, Le, Lt
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from tandem.cli import cli, main
from tandem.spec.cluster import Cluster
from tandem.spec.loading import builtin_recipe_names
from tandem.spec.recipe import Recipe

ROOT = Path(__file__).resolve().parents[1]
PAIRS = {
    "deepseek-v4-flash-dspark": "examples/dgx-spark-eks.yaml",
    "deepseek-v4-flash": "examples/dgx-spark-pair.yaml",
    "tiny-local": "examples/local-netns.yaml",
}
"""Each built-in recipe with a cluster it renders on."""
LIMIT_S = 5.0
PROFILE = settings(
    max_examples=60,
    deadline=int(LIMIT_S * 1000),
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def run(args: list[str]) -> tuple[int, str, float]:
    runner = CliRunner()
    started = time.perf_counter()
    with runner.isolation() as streams:
        code = main(args)
    output = (streams[0].getvalue() + streams[1].getvalue()).decode(errors="replace")
    return code, output, time.perf_counter() - started


def assert_one_message(code: int, output: str, seconds: float, *names: str) -> None:
    assert code != 0, output
    assert "Traceback" not in output, output
    assert output.count("error:") + output.count("Error:") == 1, output
    for name in names:
        assert name in output, (name, output)
    assert seconds < LIMIT_S


# --- what a field at a path is -------------------------------------------------------------


def _unwrap(annotation: Any) -> Any:
    """``X | None`` -> X."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return args[0] if len(args) == 1 else annotation
    return annotation


def _is_model(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def fields_of(model: type[BaseModel], data: Any, path: tuple = ()):
    """(path, annotation, field info) of every model field present in ``data``."""
    for key, value in data.items():
        info = model.model_fields.get(key)
        if info is None:
            continue
        annotation = _unwrap(info.annotation)
        yield (*path, key), annotation, info
        if _is_model(annotation) and isinstance(value, dict):
            yield from fields_of(annotation, value, (*path, key))
        elif typing.get_origin(annotation) is list and isinstance(value, list):
            item = typing.get_args(annotation)[0]
            if _is_model(item):
                for i, entry in enumerate(value):
                    yield from fields_of(item, entry, (*path, key, i))


def with_value(data: Any, path: tuple, value: Any) -> Any:
    if not path:
        return value
    head, rest = path[0], path[1:]
    copy = dict(data) if isinstance(data, dict) else list(data)
    copy[head] = with_value(data[head], rest, value)
    return copy


def wrong_shape(annotation: Any) -> Any:
    """A value no field of this annotation accepts."""
    origin = typing.get_origin(annotation)
    if origin is list:
        return {"not": "a list"}
    if origin is dict or annotation is dict:
        return ["not", "a", "mapping"]
    if _is_model(annotation):
        return ["not", "a", "mapping"]
    return {"not": ["a", "scalar"]}


def beyond(info) -> list[Any]:
    """Numbers just past the field's declared bounds."""
    values = []
    for bound in info.metadata:
        if isinstance(bound, Ge):
            values.append(bound.ge - 1)
        elif isinstance(bound, Gt):
            values.append(bound.gt)
        elif isinstance(bound, Le):
            values.append(bound.le + 1)
        elif isinstance(bound, Lt):
            values.append(bound.lt)
    return values


@st.composite
def mutated(draw, model: type[BaseModel], data: dict) -> tuple[str, bytes, str]:
    """(what, file bytes, a name the message must carry)."""
    fields = list(fields_of(model, data))
    bounded = [(p, v) for p, _, info in fields for v in beyond(info)]
    kind = draw(
        st.sampled_from(
            ["unknown key", "wrong shape", "secret", "repeated key", "not utf-8"]
            + (["beyond"] if bounded else [])
        )
    )
    if kind == "unknown key":
        parents = [p for p, a, _ in fields if _is_model(a) and isinstance(_get(data, p), dict)] + [
            ()
        ]
        parent = draw(st.sampled_from(parents))
        key = "zz_" + draw(st.text("abcdefgh_", min_size=1, max_size=8))
        target = _get(data, parent)
        text = yaml.safe_dump(
            with_value(data, parent, {**target, key: 1}) if parent else {**data, key: 1}
        )
        return kind, text.encode(), key
    if kind == "wrong shape":
        path, annotation, _ = draw(st.sampled_from(fields))
        return (
            kind,
            yaml.safe_dump(with_value(data, path, wrong_shape(annotation))).encode(),
            str(path[0]),
        )
    if kind == "beyond":
        path, value = draw(st.sampled_from(bounded))
        return kind, yaml.safe_dump(with_value(data, path, value)).encode(), str(path[0])
    if kind == "secret":
        name = draw(st.sampled_from(["HF_TOKEN", "VLLM_API_KEY", "MY_PASSWORD", "X_SECRET"]))
        if model is Cluster:
            i = draw(st.integers(0, len(data["nodes"]) - 1))
            node = {**data["nodes"][i], "env": {name: "x"}}
            return kind, yaml.safe_dump(with_value(data, ("nodes", i), node)).encode(), name
        return (
            kind,
            yaml.safe_dump({**data, "env": {**data.get("env", {}), name: "x"}}).encode(),
            name,
        )
    text = yaml.safe_dump(data)
    if kind == "repeated key":
        key = draw(st.sampled_from(sorted(data)))
        return kind, (text + yaml.safe_dump({key: data[key]})).encode(), "appears twice"
    raw = text.encode()
    at = draw(st.integers(0, len(raw)))
    return (
        kind,
        raw[:at] + draw(st.sampled_from([b"\xff", b"\xe9", b"\xc3\x28"])) + raw[at:],
        "UTF-8",
    )


def _get(data: Any, path: tuple) -> Any:
    for key in path:
        data = data[key]
    return data


def builtin(name: str) -> dict:
    return yaml.safe_load((ROOT / "src" / "tandem" / "recipes" / f"{name}.yaml").read_text())


RECIPES = {name: builtin(name) for name in builtin_recipe_names()}
CLUSTERS = {str(ROOT / path): yaml.safe_load((ROOT / path).read_text()) for path in PAIRS.values()}


@PROFILE
@given(data=st.data())
def test_every_mutated_recipe_is_one_message(tmp_path_factory, data):
    name = data.draw(st.sampled_from(sorted(PAIRS)))
    _kind, raw, named = data.draw(mutated(Recipe, RECIPES[name]))
    path = tmp_path_factory.mktemp("recipe") / "recipe.yaml"
    path.write_bytes(raw)
    code, output, seconds = run(["render", str(path), "--cluster", str(ROOT / PAIRS[name])])
    assert_one_message(code, output, seconds, str(path), named)


@PROFILE
@given(data=st.data())
def test_every_mutated_cluster_is_one_message(tmp_path_factory, data):
    recipe = data.draw(st.sampled_from(sorted(PAIRS)))
    _kind, raw, named = data.draw(mutated(Cluster, CLUSTERS[str(ROOT / PAIRS[recipe])]))
    path = tmp_path_factory.mktemp("cluster") / "cluster.yaml"
    path.write_bytes(raw)
    code, output, seconds = run(["render", recipe, "--cluster", str(path)])
    assert_one_message(code, output, seconds, str(path), named)


# --- every CLI numeric option --------------------------------------------------------------


def numeric_options() -> list[tuple[tuple[str, ...], click.Option]]:
    """(command path, option) of every option of every command that takes a number."""
    found = []

    def walk(command: click.Command, path: tuple[str, ...]) -> None:
        if isinstance(command, click.Group):
            ctx = click.Context(command)
            for name in command.list_commands(ctx):
                walk(command.get_command(ctx, name), (*path, name))
            return
        for param in command.params:
            if isinstance(param, click.Option) and isinstance(
                param.type, click.types.IntParamType | click.types.FloatParamType
            ):
                found.append((path, param))

    walk(cli, ())
    return found


NUMERIC = numeric_options()


def test_every_numeric_option_declares_its_range():
    bare = [
        f"{' '.join(p)} {o.opts[0]}"
        for p, o in NUMERIC
        if not isinstance(o.type, click.IntRange | click.FloatRange)
    ]
    assert bare == [], "give these a click.IntRange or tandem.cli.options.FloatIn"
    assert len(NUMERIC) >= 40


def out_of_range(option: click.Option) -> st.SearchStrategy[str]:
    kind = option.type
    bad = [st.just("not-a-number"), st.just("")]
    integer = isinstance(kind, click.IntRange)
    if kind.min is not None:
        low = kind.min if kind.min_open else (kind.min - 1 if integer else kind.min - 1e-6)
        bad.append(
            st.integers(-(10**12), math.floor(low)).map(str)
            if integer
            else st.floats(max_value=low, allow_nan=False).map(repr)
        )
    if kind.max is not None:
        high = kind.max if kind.max_open else (kind.max + 1 if integer else kind.max + 1e-6)
        bad.append(
            st.integers(math.ceil(high), 10**12).map(str)
            if integer
            else st.floats(min_value=high, allow_nan=False).map(repr)
        )
    if not integer:
        bad.append(st.just("nan"))
    if integer:
        bad.append(st.just("1.5"))
    return st.one_of(bad)


@PROFILE
@given(data=st.data())
def test_every_numeric_option_out_of_range_is_one_message(data):
    path, option = data.draw(st.sampled_from(NUMERIC), label="option")
    value = data.draw(out_of_range(option), label="value")
    code, output, seconds = run([*path, option.opts[0], value])
    assert code == 2
    assert_one_message(code, output, seconds, f"'{option.opts[0]}'")


@pytest.mark.parametrize(
    "path,option", NUMERIC, ids=[f"{' '.join(p)} {o.opts[0]}" for p, o in NUMERIC]
)
def test_each_numeric_option_refuses_text(path, option):
    code, output, seconds = run([*path, option.opts[0], "lots"])
    assert_one_message(code, output, seconds, f"'{option.opts[0]}'")
