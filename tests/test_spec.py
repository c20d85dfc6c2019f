"""Recipe and cluster loading: good files load, every kind of bad input gets one clear message."""

from __future__ import annotations

from pathlib import Path

import pytest

from tandem.errors import ClusterError, RecipeError
from tandem.spec.loading import builtin_recipe_names, load_cluster, load_recipe

GOOD_RECIPE = """\
name: demo
model: {repo_id: org/model}
engine:
  serve: {tensor_parallel_size: 2}
"""


def write(tmp_path: Path, text: str, name: str = "recipe.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_builtin_recipes_all_load():
    names = builtin_recipe_names()
    assert {"deepseek-v4-flash-dspark", "deepseek-v4-flash", "tiny-local", "smollm2-local"} <= set(
        names
    )
    for name in names:
        assert load_recipe(name).model.repo_id


def test_good_recipe_file_loads_with_defaults(tmp_path):
    recipe = load_recipe(write(tmp_path, GOOD_RECIPE))
    assert recipe.engine.serve.tensor_parallel_size == 2
    assert recipe.engine.executor == "mp"
    assert recipe.ports.api == 8000 and recipe.model.offline is True


def test_env_values_become_strings(tmp_path):
    recipe = load_recipe(write(tmp_path, GOOD_RECIPE + "env: {A: 1, B: true, C: 0.5}\n"))
    assert recipe.env == {"A": "1", "B": "1", "C": "0.5"}


def test_shm_size_in_bytes(tmp_path):
    recipe = load_recipe(write(tmp_path, GOOD_RECIPE + "shm_size: 64g\n"))
    assert recipe.shm_bytes == 64 * 1024**3


# Each case: (id, yaml text, expected field path of the first problem, text in the message)
BAD_RECIPES = [
    ("typo in a top-level key", GOOD_RECIPE + "enviroment: {}\n", "enviroment", "unknown field"),
    (
        "typo in a serve option",
        GOOD_RECIPE.replace("tensor_parallel_size", "tensor_paralel_size"),
        "engine.serve.tensor_paralel_size",
        "unknown field",
    ),
    ("missing model", "name: demo\n", "model", "required"),
    ("repo id without org", GOOD_RECIPE.replace("org/model", "model"), "model.repo_id", "ORG/NAME"),
    (
        "zero tensor parallel",
        GOOD_RECIPE.replace("2}", "0}"),
        "engine.serve.tensor_parallel_size",
        "greater than or equal to 1",
    ),
    (
        "utilization above one",
        GOOD_RECIPE.replace("2}", "2, gpu_memory_utilization: 1.5}"),
        "engine.serve.gpu_memory_utilization",
        "less than or equal to 1",
    ),
    (
        "text where a number goes",
        GOOD_RECIPE.replace("2}", "two}"),
        "engine.serve.tensor_parallel_size",
        "integer",
    ),
    (
        "unknown executor",
        GOOD_RECIPE.replace("engine:\n", "engine:\n  executor: slurm\n"),
        "engine.executor",
        "'mp' or 'ray'",
    ),
    (
        "reserved flag in extra_args",
        GOOD_RECIPE.replace("engine:\n", "engine:\n  extra_args: [--nnodes, '4']\n"),
        "engine.extra_args",
        "set by tandem",
    ),
    (
        "same api and master port",
        GOOD_RECIPE + "ports: {api: 9000, master: 9000}\n",
        "ports",
        "own port",
    ),
    (
        "bad deployment name",
        GOOD_RECIPE.replace("name: demo", "name: Demo_1"),
        "name",
        "lower case",
    ),
    ("bad shm size", GOOD_RECIPE + "shm_size: lots\n", "shm_size", "not a size"),
    (
        "speculative config without method",
        GOOD_RECIPE.replace(
            "{tensor_parallel_size: 2}", "{speculative_config: {num_speculative_tokens: 2}}"
        ),
        "engine.serve.speculative_config",
        "'method'",
    ),
    (
        "hcas with socket transport",
        GOOD_RECIPE + "network: {data_plane: {hcas: [mlx5_0]}}\n",
        "network.data_plane",
        "transport: ib",
    ),
    (
        "gid index neither number nor auto",
        GOOD_RECIPE + "network: {data_plane: {transport: ib, gid_index: three}}\n",
        "network.data_plane.gid_index",
        "nor auto",
    ),
]


@pytest.mark.parametrize(
    "text,field,message", [c[1:] for c in BAD_RECIPES], ids=[c[0] for c in BAD_RECIPES]
)
def test_bad_recipe_names_file_field_and_fix(tmp_path, text, field, message):
    path = write(tmp_path, text)
    with pytest.raises(RecipeError) as info:
        load_recipe(path)
    error = info.value
    assert error.file == str(path)
    fields = [p.field for p in error.problems]
    assert field in fields, fields
    problem = error.problems[fields.index(field)]
    assert message in problem.message
    assert str(path) in str(error) and field in str(error)


def test_invalid_yaml_names_line(tmp_path):
    path = write(tmp_path, "name: demo\nmodel: {repo_id: org/model\n")
    with pytest.raises(RecipeError) as info:
        load_recipe(path)
    assert "line" in info.value.message and info.value.hint


def test_yaml_that_is_not_a_mapping(tmp_path):
    with pytest.raises(RecipeError) as info:
        load_recipe(write(tmp_path, "- just\n- a list\n"))
    assert "mapping" in info.value.message


def test_unknown_recipe_name_lists_builtins():
    with pytest.raises(RecipeError) as info:
        load_recipe("no-such-recipe")
    assert "tiny-local" in info.value.hint


def test_all_problems_reported_at_once(tmp_path):
    text = GOOD_RECIPE.replace("2}", "0, max_num_seqs: -1}") + "colour: blue\n"
    with pytest.raises(RecipeError) as info:
        load_recipe(write(tmp_path, text))
    assert {p.field for p in info.value.problems} == {
        "engine.serve.tensor_parallel_size",
        "engine.serve.max_num_seqs",
        "colour",
    }


GOOD_CLUSTER = """\
name: pair
transport: ssh
nodes:
  - {name: a, address: 10.0.0.1}
  - {name: b, address: 10.0.0.2}
"""


def test_example_inventories_load():
    root = Path(__file__).resolve().parents[1] / "examples"
    for path in root.glob("*.yaml"):
        assert load_cluster(path).nodes


@pytest.mark.parametrize(
    "text,field,message",
    [
        (
            GOOD_CLUSTER.replace("address: 10.0.0.2", "address: 10.0.0.1"),
            "nodes.1.address",
            "also nodes[0]'s address",
        ),
        (GOOD_CLUSTER.replace("name: b", "name: a"), "nodes.1.name", "also nodes[0]'s name"),
        (GOOD_CLUSTER.replace("transport: ssh", "transport: slurm"), "transport", "'local'"),
        ("name: pair\nnodes: []\n", "nodes", "at least 1"),
        (GOOD_CLUSTER.replace("{name: a,", "{name: a, gpu: 1,"), "nodes.0.gpu", "unknown field"),
        (GOOD_CLUSTER.replace("name: a", "name: 'a b'"), "nodes.0.name", "host name"),
    ],
    ids=[
        "duplicate address",
        "duplicate node",
        "unknown transport",
        "no nodes",
        "typo in node field",
        "bad node name",
    ],
)
def test_bad_cluster(tmp_path, text, field, message):
    path = write(tmp_path, text, "cluster.yaml")
    with pytest.raises(ClusterError) as info:
        load_cluster(path)
    problems = {p.field: p.message for p in info.value.problems}
    assert field in problems, problems
    assert message in problems[field]


def test_missing_cluster_file(tmp_path):
    with pytest.raises(ClusterError) as info:
        load_cluster(tmp_path / "nope.yaml")
    assert "tandem init" in info.value.hint and "tandem recipes" in info.value.hint
