"""Values checked where they are read, flags checked against each other (issue 46, class 4).

A value that passes where it should be refused runs as something the user did not ask for:
``replicas: true`` as one group, a repo id with ``..`` as a path on every node, a bench limit
that ``--no-bench`` drops, a TPOT limit of 25 (+2,500 %, no gate), ``--rates`` that
``--search-slo`` drops. Each is refused with its field or flag named, before anything runs.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tandem.bench.config import BenchConfig
from tandem.errors import ClusterError, RecipeError
from tandem.spec.loading import load_cluster, load_recipe
from tandem.upgrade import GateLimits
from tests.test_bad_input import CLUSTER, RECIPE, problems_of, write


def refused(tmp_path: Path, text: str) -> dict[str, str]:
    with pytest.raises(RecipeError) as caught:
        load_recipe(write(tmp_path, text))
    return problems_of(caught.value)


YES_NO = {
    "replicas": ("replicas: true\n", "replicas"),
    "tensor parallel": (
        RECIPE.replace("tensor_parallel_size: 2", "tensor_parallel_size: true"),
        "engine.serve.tensor_parallel_size",
    ),
    "a timeout": ("timeouts: {startup_s: false}\n", "timeouts.startup_s"),
    "a port": ("ports: {api: true}\n", "ports.api"),
    "the router's port": ("router: {port: true}\n", "router.port"),
    "an optional number": (
        RECIPE.replace(
            "{tensor_parallel_size: 2}", "{tensor_parallel_size: 2, max_num_seqs: true}"
        ),
        "engine.serve.max_num_seqs",
    ),
}


@pytest.mark.parametrize("text,field", YES_NO.values(), ids=YES_NO)
def test_a_yes_no_where_a_number_is_meant_is_refused(tmp_path, text, field):
    full = text if text.startswith("name:") else RECIPE + text
    assert "a yes/no, not a number" in refused(tmp_path, full)[field]


def test_a_yes_no_for_a_node_number_is_refused(tmp_path):
    text = CLUSTER.replace("address: 10.0.0.2}", "address: 10.0.0.2, gpus: true}")
    with pytest.raises(ClusterError) as caught:
        load_cluster(write(tmp_path, text, "cluster.yaml"))
    assert any("yes/no" in str(p) for p in caught.value.problems)


def test_yes_no_fields_still_take_yes_no(tmp_path):
    text = RECIPE.replace("{repo_id: org/model}", "{repo_id: org/model, offline: false}")
    assert load_recipe(write(tmp_path, text)).model.offline is False


@pytest.mark.parametrize("image", ["Not An Image", "repo/x:bad tag", "repo@sha256:abc"])
def test_a_router_image_that_is_no_image_reference_is_refused(tmp_path, image):
    problems = refused(tmp_path, RECIPE + f"router: {{image: '{image}'}}\n")
    assert "docker images --digests" in problems["router.image"]


@pytest.mark.parametrize(
    "repo_id",
    ["org/..", "../etc", "org/a..b", "org--x/y", "org/-x", "org/x.", "org/x/y", "o/" + "a" * 97],
)
def test_a_repo_id_that_would_be_another_path_is_refused(tmp_path, repo_id):
    problems = refused(tmp_path, RECIPE.replace("org/model", repo_id))
    assert "not a Hugging Face repo id" in problems["model.repo_id"]


@pytest.mark.parametrize(
    "revision",
    [
        "..",
        "../../etc",
        "main/../x",
        "-rf",
        "/abs",
        "a b",
        "x.lock",
        "x/",
        "a\x1bb",
        "a~1",
        "@{-1}",
    ],
)
def test_a_revision_that_would_be_another_path_or_option_is_refused(tmp_path, revision):
    quoted = revision.replace("\x1b", "\\e")
    text = RECIPE.replace("{repo_id: org/model}", f'{{repo_id: org/model, revision: "{quoted}"}}')
    assert "not a revision" in refused(tmp_path, text)["model.revision"]


@pytest.mark.parametrize(
    "repo_id,revision",
    [("deepseek-ai/DeepSeek-V4-Flash", "main"), ("org/m.v2_x", "refs/pr/1"), ("a/b", "a" * 40)],
)
def test_ids_and_revisions_the_hub_takes_are_kept(tmp_path, repo_id, revision):
    text = RECIPE.replace("{repo_id: org/model}", f"{{repo_id: {repo_id}, revision: {revision}}}")
    model = load_recipe(write(tmp_path, text)).model
    assert (model.repo_id, model.revision) == (repo_id, revision)


# --- flags checked against each other -----------------------------------------------------------


def test_no_bench_with_a_bench_limit_is_refused_before_anything(tandem_here, tmp_path):
    result = tandem_here(
        "upgrade", "ghost", "--recipe", "tiny-local", "--no-bench", "--max-tpot-increase", "0.5",
        TANDEM_HOME=str(tmp_path),
    )  # fmt: skip
    assert result.code == 2 and "--max-tpot-increase limit the gate bench" in result.err
    assert "--no-bench" in result.err and not (tmp_path / "deployments").exists()


def test_no_bench_with_the_default_limits_is_no_conflict():
    assert GateLimits.model_validate({"bench": False}).bench is False
    with pytest.raises(ValueError, match="bench=False skips"):
        GateLimits.model_validate({"bench": False, "max_throughput_drop": 0.1})


@pytest.mark.parametrize("value", ["25", "10.5"])
def test_a_tpot_limit_of_a_percent_mistaken_for_a_fraction_is_refused(tandem_here, value):
    result = tandem_here("upgrade", "ghost", "--recipe", "tiny-local", "--max-tpot-increase", value)
    assert result.code == 2 and "--max-tpot-increase" in result.err and "0<=x<=10" in result.err


@pytest.mark.parametrize(
    "args,flag",
    [
        (["--rates", "1,2"], "--rates"),
        (["--concurrency", "4"], "--concurrency"),
        (["--rounds", "3"], "--rounds"),
        (["--depths", "0,512"], "--depths"),
        (["--long-context"], "--long-context"),
    ],
)
def test_an_slo_search_refuses_the_options_it_would_drop(tandem_here, tmp_path, args, flag):
    out = tmp_path / "s"
    result = tandem_here(
        "bench", "--url", "http://127.0.0.1:9", "--search-slo", "--slo-ttft-ms", "500", *args,
        "--out", str(out),
    )  # fmt: skip
    assert result.code == 2 and "--search-slo would drop" in result.err, result.err
    assert f"{flag}:" in result.err and not out.exists()


def test_depths_are_measured_shallow_to_deep_whatever_the_order_given():
    config = BenchConfig(url="http://h", depths=[4096, 0, 512])
    assert config.depths == [0, 512, 4096]
