"""Bad input gets one clear message, every problem at once; impossible plans are refused.

Issue 16's points, each as a table of bad inputs (the case ids say what is wrong):

1. ``engine.extra_args`` repeating a typed field or a flag tandem sets;
3. secrets in a recipe's or node's ``env`` and ``--api-key`` in extra_args (refused here;
   the redaction of what still carries one is in ``test_redact.py``);
5. impossible plans (``max_model_len`` beyond the model, DOES NOT FIT in the preflight);
6. files that are not UTF-8; 7. every problem of recipe, cluster and plan in one report;
8. ``supervise`` of an unknown name; 9. addresses; 10. CLI numbers out of range;
11. repeated YAML keys, huge files, ``--format`` against the target, ``logs --tail``,
    ``speculative_config`` contents, PlanErrors naming their file, the API without a key.
"""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from tandem.backends import ssh as ssh_backend
from tandem.backends.state import DeploymentState, RankState
from tandem.bench.datasets import load_dataset
from tandem.check.rules import CheckContext, evaluate
from tandem.check.rules.network import open_api_finding
from tandem.cli import main
from tandem.cli.check import ByteSizes
from tandem.errors import ClusterError, PlanError, RecipeError, SpecError, StateError
from tandem.operations.lifecycle import log_lines
from tandem.plan.config import load_model_facts
from tandem.plan.hardware import load_profile
from tandem.plan.planner import plan_deployment
from tandem.rankplan import plan_ranks, serve_argv
from tandem.spec.cluster import LocalIsolation
from tandem.spec.deployment import local_cluster
from tandem.spec.loading import MAX_SPEC_BYTES, load_cluster, load_deployment, load_recipe
from tandem.spec.recipe import RESERVED_FLAGS, TYPED_FLAGS, ServeOptions
from tandem.watch.exporter import SampleCollector, serve
from tandem.watch.sampler import Watcher
from tests.factories import make_cluster, make_deployment, make_recipe

ROOT = Path(__file__).resolve().parents[1]
PAIR = str(ROOT / "examples" / "dgx-spark-pair.yaml")
EKS = str(ROOT / "examples" / "dgx-spark-eks.yaml")

RECIPE = """\
name: demo
model: {repo_id: org/model}
engine:
  serve: {tensor_parallel_size: 2}
"""
CLUSTER = """\
name: pair
transport: ssh
nodes:
  - {name: a, address: 10.0.0.1}
  - {name: b, address: 10.0.0.2}
"""


def write(tmp_path: Path, text: str | bytes, name: str = "recipe.yaml") -> Path:
    path = tmp_path / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return path


def problems_of(error: SpecError) -> dict[str, str]:
    return {p.field: f"{p.message} | {p.hint}" for p in error.problems}


def refused_recipe(tmp_path: Path, text: str | bytes) -> RecipeError:
    path = write(tmp_path, text)
    with pytest.raises(RecipeError) as info:
        load_recipe(path)
    assert info.value.file == str(path) and str(path) in str(info.value)
    return info.value


def refused_cluster(tmp_path: Path, text: str | bytes) -> ClusterError:
    path = write(tmp_path, text, "cluster.yaml")
    with pytest.raises(ClusterError) as info:
        load_cluster(path)
    assert info.value.file == str(path) and str(path) in str(info.value)
    return info.value


def cli(*args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    """Run ``tandem ARGS`` as a user does (``main``: messages, exit codes), output captured."""
    runner = CliRunner()
    with runner.isolation(env=env) as streams:
        code = main(list(args))
    out, err = streams[0].getvalue(), streams[1].getvalue()
    return code, (out + err).decode(errors="replace")


# --- 1. extra_args that repeat a typed field or a flag tandem sets ------------------------------


def extra_args_recipe(args: list[str]) -> str:
    quoted = ", ".join(f"'{a}'" for a in args)
    return RECIPE.replace("engine:\n", f"engine:\n  extra_args: [{quoted}]\n")


@pytest.mark.parametrize("flag", sorted(TYPED_FLAGS))
def test_extra_args_repeating_a_typed_field_names_the_field(tmp_path, flag):
    error = refused_recipe(tmp_path, extra_args_recipe([flag, "4"]))
    message = problems_of(error)["engine.extra_args"]
    assert TYPED_FLAGS[flag] in message and "remove" in message


@pytest.mark.parametrize(
    "args",
    [
        ["--tensor_parallel_size", "4"],
        ["--tensor-parallel-size=4"],
        ["--MAX_MODEL_LEN=5".lower()],
        ["-tp", "4"],
    ],
    ids=["underscores", "with equals", "underscores with equals", "short"],
)
def test_extra_args_spellings_vllm_accepts_are_caught(tmp_path, args):
    assert "engine.extra_args" in problems_of(refused_recipe(tmp_path, extra_args_recipe(args)))


@pytest.mark.parametrize("flag", RESERVED_FLAGS)
def test_extra_args_with_a_flag_tandem_sets(tmp_path, flag):
    message = problems_of(refused_recipe(tmp_path, extra_args_recipe([flag, "1"])))
    assert "set by tandem" in message["engine.extra_args"]


def test_every_flag_the_plan_renders_is_in_the_one_table():
    """The table and rankplan cannot drift: a fully set ServeOptions renders only known flags."""
    serve = {
        name: (True if info.annotation in (bool, bool | None) else None)
        for name, info in ServeOptions.model_fields.items()
    }
    serve |= {
        "kv_cache_dtype": "fp8",
        "block_size": 16,
        "max_model_len": 8,
        "max_num_seqs": 1,
        "max_num_batched_tokens": 8,
        "max_cudagraph_capture_size": 1,
        "gpu_memory_utilization": 0.5,
        "moe_backend": "x",
        "tokenizer_mode": "x",
        "load_format": "x",
        "generation_config": "vllm",
        "reasoning_parser": "x",
        "tool_call_parser": "x",
        "speculative_config": {"method": "mtp"},
        "pipeline_parallel_size": 1,
    }
    deployment = make_deployment(make_recipe(engine__serve=serve | {"tensor_parallel_size": 2}))
    rendered = {a for a in serve_argv(deployment, 0) if a.startswith("-")}
    assert rendered - set(TYPED_FLAGS) - set(RESERVED_FLAGS) == set()
    assert {f"--{n.replace('_', '-')}" for n in serve} <= rendered


def test_a_secret_given_as_api_key_equals_is_not_echoed(tmp_path):
    error = refused_recipe(tmp_path, extra_args_recipe(["--api-key=sk-abcdefghijklmnop1234"]))
    assert "sk-abcdefghijklmnop1234" not in str(error)
    assert "VLLM_API_KEY" in problems_of(error)["engine.extra_args"]


# --- 3. secrets written into env -----------------------------------------------------------------

SECRET_NAMES = [
    "HF_TOKEN",
    "HUGGING_FACE_HUB_TOKEN",
    "VLLM_API_KEY",
    "OPENAI_API_KEY",
    "AWS_SECRET_ACCESS_KEY",
    "DB_PASSWORD",
    "MY_PASSWD",
    "GITHUB_TOKEN",
    "WANDB_API_KEY",
    "HFTOKEN",
    "APIKEY",
    "CLIENT_SECRET",
    "ngc_api_key",
]
SECRET_VALUES = [
    "hf_abcdefghijklmnopqrstuvwx",
    "sk-abcdefghijklmnopqrstuv",
    "sk-proj-ABCDEFGHIJKLMNOPQRSTUV",
    "Bearer abcdefghijklmnop",
]


@pytest.mark.parametrize("name", SECRET_NAMES)
def test_secret_named_variable_in_recipe_env_is_refused_with_the_fix(tmp_path, name):
    error = refused_recipe(tmp_path, RECIPE + f"env: {{{name}: value123456}}\n")
    message = problems_of(error)["env"]
    assert name in message and "environment of `tandem up`" in message
    assert "value123456" not in str(error)


@pytest.mark.parametrize("value", SECRET_VALUES)
def test_secret_shaped_value_in_recipe_env_is_refused(tmp_path, value):
    error = refused_recipe(tmp_path, RECIPE + f"env: {{SOME_SETTING: '{value}'}}\n")
    assert "its value" in problems_of(error)["env"] and value not in str(error)


@pytest.mark.parametrize("name", ["HF_TOKEN", "VLLM_API_KEY", "DB_PASSWORD"])
def test_secret_in_a_nodes_env_is_refused(tmp_path, name):
    text = CLUSTER.replace("address: 10.0.0.2}", f"address: 10.0.0.2, env: {{{name}: x}}}}")
    assert "nodes.1.env" in problems_of(refused_cluster(tmp_path, text))


@pytest.mark.parametrize(
    "name",
    [
        "TOKENIZERS_PARALLELISM",
        "HF_TOKEN_PATH",
        "SSH_KEY_FILE",
        "VLLM_CPU_KVCACHE_SPACE",
        "MAX_TOKENS",
        "KEYRING_DIR",
    ],
)
def test_ordinary_variables_are_not_mistaken_for_secrets(tmp_path, name):
    assert load_recipe(write(tmp_path, RECIPE + f"env: {{{name}: '1'}}\n")).env[name] == "1"


@pytest.mark.parametrize("name", ["--foo", "1ST", "A-B", "A B", "X=Y", ""])
def test_an_env_name_no_shell_can_export_is_refused_in_a_recipe_and_a_node(tmp_path, name):
    """``--foo`` reached ``docker run`` as ``--env --foo=bar``, a flag of its own."""
    message = problems_of(refused_recipe(tmp_path, RECIPE + f"env: {{'{name}': bar}}\n"))["env"]
    assert repr(name) in message and "not a variable name" in message and "_" in message
    text = CLUSTER.replace("address: 10.0.0.2}", f"address: 10.0.0.2, env: {{'{name}': x}}}}")
    assert "not a variable name" in problems_of(refused_cluster(tmp_path, text))["nodes.1.env"]


# --- 5. impossible plans ----------------------------------------------------------------------


def seed_plan(**changes):
    deployment = load_deployment("deepseek-v4-flash-dspark", EKS)
    facts = load_model_facts(deployment.recipe.model.repo_id)
    return deployment, facts, plan_deployment(deployment, facts, load_profile("gb10"), **changes)


@pytest.mark.parametrize("length", [1_048_577, 2_000_000, 10**9])
def test_plan_beyond_the_models_longest_context_is_refused(length):
    with pytest.raises(PlanError) as info:
        seed_plan(max_model_len=length)
    assert info.value.field == "--max-model-len" and "1,048,576" in info.value.message


def test_recipe_max_model_len_beyond_the_model_names_the_file_and_field(tmp_path):
    deployment = load_deployment("deepseek-v4-flash-dspark", EKS)
    serve = deployment.recipe.engine.serve.model_copy(update={"max_model_len": 2_000_000})
    recipe = deployment.recipe.model_copy(
        update={"engine": deployment.recipe.engine.model_copy(update={"serve": serve})}
    )
    deployment = deployment.model_copy(update={"recipe": recipe})
    facts = load_model_facts(recipe.model.repo_id)
    with pytest.raises(PlanError) as info:
        plan_deployment(deployment, facts, load_profile("gb10"))
    assert info.value.field == "engine.serve.max_model_len"
    assert info.value.file == "built-in recipe 'deepseek-v4-flash-dspark'"


@pytest.mark.parametrize("utilization", [0.3, 0.5, 0.6])
def test_advice_of_a_plan_that_does_not_fit_stays_within_the_model(utilization):
    _, _, plan = seed_plan(gpu_memory_utilization=utilization)
    assert not plan.fits
    assert plan.fit.largest_max_model_len_tokens <= 1_048_576


@pytest.mark.parametrize("utilization", [0.3, 0.5])
def test_preflight_refuses_a_plan_that_does_not_fit(utilization):
    from tests.check.conftest import facts_of, seed_deployment

    deployment = seed_deployment()
    _, _, plan = seed_plan(gpu_memory_utilization=utilization)
    facts = {n.name: facts_of(n.name) for n in deployment.cluster.nodes}
    findings = evaluate(CheckContext(deployment=deployment, facts=facts, plan_fit=plan.fit))
    fired = [f for f in findings if f.rule == "plan-does-not-fit"]
    assert fired and fired[0].severity == "error" and "gpu_memory_utilization" in fired[0].fix
    _, _, fitting = seed_plan()
    assert "plan-does-not-fit" not in {
        f.rule
        for f in evaluate(CheckContext(deployment=deployment, facts=facts, plan_fit=fitting.fit))
    }


# --- 6. files that are not UTF-8 --------------------------------------------------------------

NOT_UTF8 = {
    "latin-1 e acute": "name: d\xe9mo\n".encode("latin-1"),
    "utf-16": RECIPE.encode("utf-16"),
    "binary": bytes(range(256)),
    "truncated multibyte": b"name: demo\ndescription: \xe2\x82\n",
}


@pytest.mark.parametrize("raw", NOT_UTF8.values(), ids=NOT_UTF8.keys())
def test_recipe_not_utf8_is_one_message(tmp_path, raw):
    assert "not UTF-8" in refused_recipe(tmp_path, raw).message


@pytest.mark.parametrize("raw", NOT_UTF8.values(), ids=NOT_UTF8.keys())
def test_cluster_not_utf8_is_one_message(tmp_path, raw):
    assert "not UTF-8" in refused_cluster(tmp_path, raw).message


def test_prompt_file_not_utf8_is_one_message(tmp_path):
    with pytest.raises(SpecError) as info:
        load_dataset(write(tmp_path, "caf\xe9\n".encode("latin-1"), "prompts.txt"))
    assert info.value.field == "prompt_file" and "UTF-8" in info.value.message


# --- 7. every problem of recipe, cluster and plan at once --------------------------------------


def test_recipe_cluster_and_plan_problems_come_in_one_report(tmp_path):
    recipe = write(tmp_path, RECIPE.replace("2}", "4}") + "colour: blue\n")
    cluster = write(tmp_path, CLUSTER.replace("{name: a,", "{name: a, gpu: 1,"), "cluster.yaml")
    with pytest.raises(SpecError) as info:
        load_deployment(recipe, cluster)
    where = {(p.file, p.field) for p in info.value.problems}
    assert (str(recipe), "colour") in where and (str(cluster), "nodes.0.gpu") in where
    assert (str(recipe), "engine.serve") in where  # TP 4 on 2 nodes x 1 GPU: the plan's fault


def test_field_errors_do_not_hide_repeated_nodes(tmp_path):
    text = CLUSTER.replace("{name: b, address: 10.0.0.2}", "{name: a, address: 10.0.0.1, gpus: 0}")
    assert {"nodes.1.gpus", "nodes.1.name", "nodes.1.address"} <= set(
        problems_of(refused_cluster(tmp_path, text))
    )


def test_plan_problems_name_the_file_they_are_in(tmp_path):
    recipe = write(tmp_path, RECIPE.replace("2}", "4}"))
    cluster = write(tmp_path, CLUSTER, "cluster.yaml")
    with pytest.raises(PlanError) as info:
        plan_ranks(load_deployment(recipe, cluster))
    assert {p.file for p in info.value.problems} == {str(recipe)}
    assert str(recipe) in str(info.value)


# --- 8. supervise of an unknown name --------------------------------------------------------------


@pytest.mark.parametrize(
    "name,said",
    [
        ("TYPO", "not a deployment name"),
        ("tiny-locall", "no deployment named"),
        ("../etc", "not a deployment name"),
    ],
)
def test_supervise_of_an_unknown_name_fails_and_writes_nothing(tmp_path, name, said):
    code, output = cli("supervise", name, env={"TANDEM_HOME": str(tmp_path / "home")})
    assert code == 2 and said in output
    assert not (tmp_path / "home").exists()


# --- 9. addresses ------------------------------------------------------------------------------

BAD_ADDRESSES = [
    "10.0.0.300",
    "not an ip!",
    "",
    "999.1.1.1",
    "10.0.0",
    "-host",
    "a..b",
    "host_name",
    "10.0.0.1:22",
    "fe80::1::2",
]


@pytest.mark.parametrize("address", BAD_ADDRESSES)
def test_bad_node_address_is_refused(tmp_path, address):
    text = CLUSTER.replace("address: 10.0.0.2", f"address: '{address}'")
    assert "nodes.1.address" in problems_of(refused_cluster(tmp_path, text))


@pytest.mark.parametrize("address", ["10.0.0.3", "fd00::2", "node-b.example.com", "spark-102"])
def test_good_node_addresses_load(tmp_path, address):
    text = CLUSTER.replace("address: 10.0.0.2", f"address: '{address}'")
    assert load_cluster(write(tmp_path, text, "c.yaml")).nodes[1].address == address


@pytest.mark.parametrize("host", ["", "has space", "a;rm -rf /", "x'y"])
def test_bad_ssh_host_is_refused(tmp_path, host):
    text = CLUSTER.replace("address: 10.0.0.2", f'address: 10.0.0.2, ssh_host: "{host}"')
    assert "nodes.1.ssh_host" in problems_of(refused_cluster(tmp_path, text))


@pytest.mark.parametrize("ip", ["999.1.1.1", "lb.example.com", "10.0.0.1,300.1.1.1", ""])
def test_bad_load_balancer_ip_is_refused(tmp_path, ip):
    text = CLUSTER + f"kubernetes: {{service: {{type: LoadBalancer, load_balancer_ip: '{ip}'}}}}\n"
    assert "kubernetes.service.load_balancer_ip" in problems_of(refused_cluster(tmp_path, text))


@pytest.mark.parametrize("host", ["not an ip!", "10.0.0.300", "", "0.0.0.0.0"])
def test_bad_api_host_is_refused(tmp_path, host):
    assert "host" in problems_of(refused_recipe(tmp_path, RECIPE + f"host: '{host}'\n"))


@pytest.mark.parametrize(
    "isolation,address,message",
    [
        ("netns", "node-a.example", "host name"),
        ("auto", "node-a", "host name"),
        ("netns", "10.99.0.1", "outside local.subnet"),
    ],
)
def test_local_namespace_cluster_needs_addresses_in_its_subnet(
    tmp_path, isolation, address, message
):
    text = (
        f"name: ns\ntransport: local\nlocal: {{isolation: {isolation}}}\nnodes:\n"
        f"  - {{name: a, address: '{address}'}}\n  - {{name: b, address: 10.77.0.2}}\n"
    )
    assert message in problems_of(refused_cluster(tmp_path, text))["nodes.0.address"]
    code, output = cli("up", "tiny-local", "--cluster", str(tmp_path / "cluster.yaml"), "--dry-run")
    assert code == 2 and "Traceback" not in output and "nodes.0.address" in output


# --- 11. YAML keys, file size, formats, logs --tail, speculative_config -----------------------

DUPLICATE_KEYS = {
    "top level": RECIPE + "name: other\n",
    "nested": RECIPE.replace(
        "{tensor_parallel_size: 2}", "{tensor_parallel_size: 2, tensor_parallel_size: 4}"
    ),
    "env": RECIPE + "env:\n  A: '1'\n  A: '2'\n",
}


@pytest.mark.parametrize("text", DUPLICATE_KEYS.values(), ids=DUPLICATE_KEYS.keys())
def test_a_repeated_yaml_key_is_refused_with_its_line(tmp_path, text):
    error = refused_recipe(tmp_path, text)
    assert "appears twice" in error.message and "line" in error.message


def test_a_repeated_key_in_a_cluster_is_refused(tmp_path):
    text = CLUSTER.replace(
        "{name: a, address: 10.0.0.1}", "{name: a, address: 10.0.0.1, address: 10.0.0.9}"
    )
    assert "appears twice" in refused_cluster(tmp_path, text).message


@pytest.mark.parametrize("kind", ["recipe", "cluster"])
def test_a_huge_file_is_refused_before_parsing(tmp_path, kind):
    path = write(tmp_path, "# " + "x" * 70 * 2**20 + "\n", f"{kind}.yaml")  # 70 MB
    started = time.perf_counter()
    with pytest.raises(SpecError) as info:
        load_recipe(path) if kind == "recipe" else load_cluster(path)
    assert time.perf_counter() - started < 1.0
    assert f"{MAX_SPEC_BYTES:,}" in info.value.message


def test_a_folder_as_recipe_is_one_message(tmp_path):
    (tmp_path / "dir.yaml").mkdir()
    with pytest.raises(RecipeError) as info:
        load_recipe(tmp_path / "dir.yaml")
    assert "folder" in info.value.message


@pytest.mark.parametrize("target,fmt", [("process", "yaml"), ("docker", "yaml"), ("k8s", "shell")])
def test_a_format_the_target_does_not_write_is_refused(target, fmt):
    code, output = cli(
        "render", "deepseek-v4-flash-dspark", "--cluster", EKS, "--target", target, "--format", fmt
    )
    assert code == 2 and "--format" in output and f"does not write {fmt}" in output


@pytest.mark.parametrize(
    "target,fmt", [("process", "json"), ("docker", "json"), ("k8s", "json"), ("k8s", "yaml")]
)
def test_formats_that_fit_render(target, fmt):
    code, output = cli(
        "render", "deepseek-v4-flash-dspark", "--cluster", EKS, "--target", target, "--format", fmt
    )
    assert code == 0, output


SPECULATIVE = {
    "no method": "{num_speculative_tokens: 2}",
    "unknown key": "{method: mtp, num_speculative_tokenz: 2}",
    "method not text": "{method: 3}",
    "method with spaces": "{method: 'deep mtp'}",
    "zero tokens": "{method: mtp, num_speculative_tokens: 0}",
    "negative tokens": "{method: mtp, num_speculative_tokens: -1}",
    "tokens as text": "{method: mtp, num_speculative_tokens: two}",
    "tokens as bool": "{method: mtp, num_speculative_tokens: true}",
    "draft tp zero": "{method: eagle, model: org/d, draft_tensor_parallel_size: 0}",
    "empty draft model": "{method: eagle, model: ''}",
    "lookup min above max": "{method: ngram, prompt_lookup_min: 5, prompt_lookup_max: 2}",
    "flag not bool": "{method: mtp, enforce_eager: 'yes'}",
}


@pytest.mark.parametrize("value", SPECULATIVE.values(), ids=SPECULATIVE.keys())
def test_speculative_config_contents_are_checked(tmp_path, value):
    text = RECIPE.replace("{tensor_parallel_size: 2}", f"{{speculative_config: {value}}}")
    assert "engine.serve.speculative_config" in problems_of(refused_recipe(tmp_path, text))


def local_state(tmp_path: Path, lines: int) -> str:
    log = tmp_path / "rank0.log"
    log.write_text("".join(f"line {i}\n" for i in range(lines)))
    state = DeploymentState(
        name="taildemo",
        backend="local",
        recipe={},
        cluster={},
        endpoint="http://127.0.0.1:1",
        model="m",
        ranks=[RankState(rank=0, node="n", role="leader", address="127.0.0.1", log=str(log))],
    )
    state.save()
    return state.name


@pytest.mark.parametrize(
    "tail,expected",
    [
        (0, []),
        (1, ["line 4"]),
        (3, ["line 2", "line 3", "line 4"]),
        (99, [f"line {i}" for i in range(5)]),
        (None, [f"line {i}" for i in range(5)]),
    ],
)
def test_logs_tail_counts_lines_from_the_end(tmp_path, monkeypatch, tail, expected):
    monkeypatch.setenv("TANDEM_HOME", str(tmp_path / "home"))
    name = local_state(tmp_path, 5)
    assert [line for _, _, line in log_lines(name, tail=tail)] == expected


# --- 10. CLI numbers out of range -------------------------------------------------------------

OUT_OF_RANGE = [
    ("plan", "--max-model-len", "-5"),
    ("plan", "--max-model-len", "0"),
    ("plan", "--gpu-memory-utilization", "-1"),
    ("plan", "--gpu-memory-utilization", "0"),
    ("plan", "--gpu-memory-utilization", "1.5"),
    ("plan", "--gpu-memory-utilization", "nan"),
    ("plan", "--acceptance", "-3"),
    ("plan", "--acceptance", "1.01"),
    ("plan", "--context", "0"),
    ("plan", "--concurrency", "0"),
    ("up", "--timeout", "-1"),
    ("up", "--timeout", "0"),
    ("up", "--timeout", "inf"),
    ("up", "--timeout", "nan"),
    ("logs", "--tail", "-1"),
    ("logs", "--rank", "-1"),
    ("chat", "--max-tokens", "0"),
    ("check", "--fabric-port", "0"),
    ("check", "--fabric-port", "70000"),
    ("supervise", "--interval", "0"),
    ("supervise", "--max-restarts", "-1"),
    ("supervise", "--backoff", "-1"),
    ("supervise", "--health-failures", "0"),
    ("bench", "--timeout", "0"),
    ("bench", "--burstiness", "0"),
    ("bench", "--seed", "-1"),
    ("bench", "--temperature", "-1"),
    ("eval", "--top-p", "0"),
    ("eval", "--reference", "2"),
    ("model", "--seed", "-1"),
]


@pytest.mark.parametrize(
    "command,option,value", OUT_OF_RANGE, ids=[" ".join(c) for c in OUT_OF_RANGE]
)
def test_a_number_out_of_range_is_refused_naming_the_option(command, option, value):
    args = (
        [command, "gpqa", option, value]
        if command == "eval"
        else [command, "tiny", option, value]
        if command == "model"
        else [command, option, value]
    )
    code, output = cli(*args)
    assert code == 2, output
    assert f"'{option}'" in output and "Traceback" not in output


# --- the API beyond loopback without a key ----------------------------------------------------


@pytest.mark.parametrize(
    "host,key,warned",
    [
        ("0.0.0.0", False, True),
        ("10.0.0.1", False, True),
        ("::", False, True),
        ("0.0.0.0", True, False),
        ("127.0.0.1", False, False),
        ("::1", False, False),
    ],
)
def test_api_beyond_loopback_without_a_key_is_a_warning(host, key, warned):
    deployment = make_deployment(make_recipe(host=host))
    finding = open_api_finding(deployment, key)
    assert (finding is not None) is warned
    if warned:
        assert finding.severity == "warning" and "VLLM_API_KEY" in finding.fix


def test_check_reports_an_open_api(tmp_path):
    deployment = make_deployment(make_recipe())
    found = evaluate(CheckContext(deployment=deployment, facts={}, api_key_set=False))
    assert "api-without-key" in {f.rule for f in found}
    assert "api-without-key" not in {
        f.rule for f in evaluate(CheckContext(deployment=deployment, facts={}, api_key_set=True))
    }


def test_a_load_balancer_service_exposes_even_a_loopback_host(tmp_path):
    deployment = load_deployment("deepseek-v4-flash-dspark", EKS)
    recipe = deployment.recipe.model_copy(update={"host": "127.0.0.1"})
    assert open_api_finding(deployment.model_copy(update={"recipe": recipe}), False) is not None


def test_up_with_skipped_checks_still_warns_of_an_open_api(capsys, monkeypatch):
    from tandem.cli.check import show_skipped_preflight

    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    show_skipped_preflight(make_deployment(make_recipe()))
    assert "api-without-key" in capsys.readouterr().out


def test_kubernetes_plan_errors_name_the_cluster_file(tmp_path):
    from tandem.render import renderer_for

    cluster = write(
        tmp_path,
        "name: k\ntransport: k8s\nnodes:\n"
        "  - {name: a, address: 10.0.0.1}\n  - {name: b, address: 10.0.0.2}\n"
        "  - {name: c, address: 10.0.0.3, env: {NCCL_DEBUG: INFO}}\n",
        "k.yaml",
    )
    recipe = write(tmp_path, RECIPE.replace("2}", "3}"))
    deployment = load_deployment(recipe, cluster)
    with pytest.raises(PlanError) as info:
        renderer_for("k8s")(plan_ranks(deployment), deployment, "yaml")
    assert info.value.file == str(cluster) and str(cluster) in str(info.value)


def test_preflight_refuses_what_tandem_plan_refuses():
    from tandem.operations.preflight import memory_plan
    from tests.check.conftest import facts_of, seed_deployment

    deployment = seed_deployment(engine__serve__max_model_len=2_000_000)
    plan, why_not, refused = memory_plan(deployment)
    assert plan is None and why_not is None and refused.field == "engine.serve.max_model_len"
    facts = {n.name: facts_of(n.name) for n in deployment.cluster.nodes}
    fired = [
        f
        for f in evaluate(CheckContext(deployment=deployment, facts=facts, plan_refused=refused))
        if f.rule == "plan-does-not-fit"
    ]
    assert fired and fired[0].severity == "error" and "1,048,576" in fired[0].message


def test_up_refuses_to_launch_what_the_plan_refuses(tmp_path):
    """`tandem up` runs the preflight on this machine (loopback: no namespaces, no engine) and
    stops at the plan's refusal; `--timeout 1` bounds a regression that would launch."""
    cluster = write(
        tmp_path,
        "name: here\ntransport: local\nlocal: {isolation: loopback}\n"
        "nodes:\n  - {name: n0, address: 127.0.0.1}\n"
        "  - {name: n1, address: 127.0.0.1}\n",
        "loopback.yaml",
    )
    recipe = write(
        tmp_path,
        (ROOT / "src/tandem/recipes/deepseek-v4-flash-dspark.yaml")
        .read_text()
        .replace("max_model_len: 524288", "max_model_len: 2000000")
        .replace("api: 8888", "api: 18888")
        .replace("master: 25000", "master: 35000"),
    )
    code, output = cli(
        "up",
        str(recipe),
        "--cluster",
        str(cluster),
        "--timeout",
        "1",
        env={"TANDEM_HOME": str(tmp_path / "home"), "VLLM_API_KEY": "k" * 8},
    )
    assert code == 1, output
    assert "plan-does-not-fit" in output and "1,048,576" in output
    assert "started rank" not in output


# --- issue 26: values that feed another program, and flags that contradict each other ----------

DIGEST = "sha256:" + "a" * 64


@pytest.mark.parametrize(
    "recipe_text,cluster_text,field",
    [
        (
            RECIPE.replace("org/model}", "org/model, cache_root: '/data/hf:ro'}"),
            CLUSTER,
            "model.cache_root",
        ),
        (RECIPE + "env: {HF_HOME: '/data/a:b'}\n", CLUSTER, "env"),
        (RECIPE, CLUSTER.replace("10.0.0.2}", "10.0.0.2, env: {HF_HOME: '/h:f'}}"), "nodes.1.env"),
        (RECIPE, CLUSTER + "ssh: {remote_dir: '/tmp/a:b'}\n", "ssh.remote_dir"),
    ],
    ids=["recipe cache_root", "recipe HF_HOME", "node HF_HOME", "remote_dir"],
)
def test_a_mount_source_with_a_colon_is_refused_naming_its_field(
    tmp_path, recipe_text, cluster_text, field
):
    """docker's --volume SRC:DST splits at ':': '/data/hf:ro' would mount /data/hf read-only."""
    with pytest.raises(SpecError) as info:
        load_deployment(write(tmp_path, recipe_text), write(tmp_path, cluster_text, "c.yaml"))
    problems = {p.field: f"{p.message} | {p.hint}" for p in info.value.problems}
    assert "':'" in problems[field] and "without ':'" in problems[field]


@pytest.mark.parametrize("runtime", ["venv", "docker"])
def test_a_relative_cache_root_is_refused_on_every_runtime(tmp_path, runtime):
    """The venv runtime would resolve it in the rank's working folder; docker refused it."""
    recipe = RECIPE.replace("org/model}", "org/model, cache_root: hf}").replace(
        "engine:\n", f"engine:\n  image: repo/vllm@{DIGEST}\n"
    )
    cluster = CLUSTER.replace("transport: ssh\n", f"transport: ssh\nssh: {{runtime: {runtime}}}\n")
    with pytest.raises(SpecError) as info:
        load_deployment(write(tmp_path, recipe), write(tmp_path, cluster, "c.yaml"))
    assert "relative" in problems_of(info.value)["model.cache_root"]


@pytest.mark.parametrize("value", ["none", "None", "'0'", "''"])
def test_docker_gpus_none_is_refused_with_the_spelling_of_null(tmp_path, value):
    error = refused_cluster(tmp_path, CLUSTER + f"ssh: {{docker_gpus: {value}}}\n")
    assert "docker_gpus: null" in problems_of(error)["ssh.docker_gpus"]


@pytest.mark.parametrize(
    "value",
    ["device=0,1", "devices=0", "count=all,count=2", "two"],
    ids=["unquoted device list", "unknown key", "key twice", "not a count"],
)
def test_a_gpu_request_docker_refuses_is_refused(tmp_path, value):
    error = refused_cluster(tmp_path, CLUSTER + f"ssh: {{docker_gpus: '{value}'}}\n")
    assert "docker takes" in problems_of(error)["ssh.docker_gpus"]


@pytest.mark.parametrize(
    "value", ["all", "2", "device=0", '"device=0,1"', "count=all,driver=nvidia"]
)
def test_gpu_requests_docker_takes_are_kept(tmp_path, value):
    cluster = load_cluster(write(tmp_path, CLUSTER + f"ssh: {{docker_gpus: '{value}'}}\n"))
    assert cluster.ssh.docker_gpus == value


def test_docker_gpus_null_leaves_the_flag_out(tmp_path):
    assert (
        load_cluster(write(tmp_path, CLUSTER + "ssh: {docker_gpus: null}\n")).ssh.docker_gpus
        is None
    )


@pytest.mark.parametrize(
    "field,value",
    [("docker_command", "''"), ("docker_command", "'   '"), ("vllm_command", "'\"/opt/vllm'")],
    ids=["empty docker", "blank docker", "unclosed quote"],
)
def test_a_command_that_runs_nothing_is_refused(tmp_path, field, value):
    error = refused_cluster(tmp_path, CLUSTER + f"ssh: {{{field}: {value}}}\n")
    assert f"ssh.{field}" in problems_of(error)


@pytest.mark.parametrize(
    "image",
    [
        "repo/vllm@sha256:abc",
        "repo/vllm@sha256:" + "A" * 64,
        "repo/vllm@md5:" + "a" * 32,
        "Repo Name:1",
        "repo/vllm:bad tag",
    ],
    ids=["truncated digest", "upper-case digest", "unknown algorithm", "space", "bad tag"],
)
def test_an_image_reference_docker_refuses_is_refused(tmp_path, image):
    error = refused_recipe(tmp_path, RECIPE + f"  image: '{image}'\n")
    assert "docker images --digests" in problems_of(error)["engine.image"]


@pytest.mark.parametrize(
    "image",
    [
        f"repo/vllm@{DIGEST}",
        "ghcr.io/anemll/dspark-vllm-gx10:0.1.1",
        f"localhost:5000/a/b:c@{DIGEST}",
        "vllm",
    ],
)
def test_image_references_docker_takes_are_kept(tmp_path, image):
    assert load_recipe(write(tmp_path, RECIPE + f"  image: '{image}'\n")).engine.image == image


def test_a_truncated_digest_says_how_many_digits_it_has(tmp_path):
    error = refused_recipe(tmp_path, RECIPE + "  image: 'repo/vllm@sha256:abc'\n")
    assert "64" in problems_of(error)["engine.image"] and "it has 3" in str(error)


@pytest.mark.parametrize(
    "watch,field",
    [
        ("{max_temperature_c: -5}", "watch.max_temperature_c"),
        ("{max_temperature_c: 0}", "watch.max_temperature_c"),
        ("{metrics_port: 8000}", "watch.metrics_port"),
        ("{metrics_port: 29501}", "watch.metrics_port"),
    ],
    ids=["negative temperature", "zero temperature", "API port", "rendezvous port"],
)
def test_watch_limits_and_ports_are_checked(tmp_path, watch, field):
    assert field in problems_of(refused_recipe(tmp_path, RECIPE + f"watch: {watch}\n"))


def test_a_metrics_port_clash_is_reported_with_the_other_problems(tmp_path):
    error = refused_recipe(
        tmp_path, RECIPE + "watch: {metrics_port: 8000, max_error_rate: 5}\nshm_size: lots\n"
    )
    assert {"watch.metrics_port", "watch.max_error_rate", "shm_size"} <= set(problems_of(error))


@pytest.mark.parametrize(
    "option,value",
    [("--max-error-rate", "5"), ("--max-temperature-c", "0"), ("--max-restarts", "-1")],
)
def test_watch_report_thresholds_have_the_bounds_of_the_recipe_fields(tmp_path, option, value):
    code, output = cli("watch", "report", str(tmp_path), option, value)
    assert code == 2 and f"'{option}'" in output, output


def test_cli_overrides_take_the_options_of_the_fields_they_override():
    """Each threshold of `watch report` and `--timeout` of `up`/`service install` is the
    recipe field's: the same type and bounds (a share stays 0..1, a timeout above 0)."""
    from tandem.cli.service import install_command
    from tandem.cli.watch import report_command
    from tandem.spec.recipe import Timeouts, Watch

    def bounds(param):
        return (param.type.min, param.type.max, param.type.min_open)

    options = {p.name: p for p in report_command.params}
    for name, info in Watch.model_fields.items():
        if name.startswith("max_"):
            limits = {
                k: getattr(m, k) for m in info.metadata for k in ("ge", "gt", "le") if hasattr(m, k)
            }
            low, high, open_low = bounds(options[name])
            assert (low, high) == (limits.get("ge", limits.get("gt")), limits.get("le")), name
            assert open_low == ("gt" in limits), name
    timeout = next(p for p in install_command.params if p.name == "timeout_s")
    assert bounds(timeout) == (0, None, True) and Timeouts.model_fields["startup_s"].metadata


def test_watch_serve_metrics_on_the_api_port_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("TANDEM_HOME", str(tmp_path / "home"))
    DeploymentState(
        name="portdemo",
        backend="local",
        recipe={"ports": {"api": 8123, "master": 29501}},
        cluster={},
        endpoint="http://127.0.0.1:8123",
        model="m",
    ).save()
    code, output = cli(
        "watch", "portdemo", "--serve-metrics", "8123", "--quiet", "--duration", "1s"
    )
    assert code == 2 and "--serve-metrics" in output and "API port" in output, output
    assert not (tmp_path / "home" / "portdemo" / "watch").exists()


@pytest.mark.parametrize(
    "args,flag,fix",
    [
        (["--token-ids"], "--token-ids", "--endpoint completions"),
        (
            ["--token-ids", "--endpoint", "completions", "--prompt-file", __file__],
            "--token-ids",
            "drop --token-ids",
        ),
        (["--extra-body", '{"max_tokens": 5}'], "--extra-body", "--output-tokens"),
        (["--extra-body", '{"max_completion_tokens": 5}'], "--extra-body", "--output-tokens"),
        (["--extra-body", '{"stream": false}'], "--extra-body", "always on"),
    ],
    ids=[
        "token ids with chat",
        "token ids with a prompt file",
        "max_tokens",
        "max_completion_tokens",
        "stream",
    ],
)
def test_bench_options_that_would_be_ignored_or_overridden_are_refused(tmp_path, args, flag, fix):
    out = tmp_path / "run"
    code, output = cli("bench", "--url", "http://127.0.0.1:9", "--out", str(out), *args)
    assert code == 2 and f"{flag}:" in output and fix in output, output
    assert not out.exists()


def test_service_install_refuses_start_without_enable_and_writes_nothing(tmp_path):
    units = tmp_path / "units"
    code, output = cli(
        "service", "install", "tiny-local", "--no-enable", "--start", "--unit-dir", str(units)
    )
    assert code == 2 and "--start" in output and "--no-enable" in output, output
    assert not units.exists()


@pytest.mark.parametrize(
    "field,value,hint",
    [
        ("ssh_host", "-oProxyCommand", "not starting with '-'"),
        ("ssh_user", "root@host", "login name"),
    ],
)
def test_ssh_destinations_that_ssh_would_misread_are_refused(tmp_path, field, value, hint):
    error = refused_cluster(
        tmp_path, CLUSTER.replace("10.0.0.2}", f"10.0.0.2, {field}: '{value}'}}")
    )
    assert hint in problems_of(error)[f"nodes.1.{field}"]


def test_a_namespace_kubectl_refuses_is_refused(tmp_path):
    error = refused_cluster(tmp_path, CLUSTER + "namespace: My_Space\n")
    assert "DNS-1123" in problems_of(error)["namespace"]


@pytest.mark.parametrize(
    "model,serve,field",
    [
        ("{repo_id: org/model, path: snapshots/abc}", "{}", "model.path"),
        ("{repo_id: org/model, revision: 'v1 '}", "{}", "model.revision"),
        ("{repo_id: org/model, served_name: ''}", "{}", "model.served_name"),
        ("{repo_id: org/model}", "{kv_cache_dtype: ''}", "engine.serve.kv_cache_dtype"),
    ],
    ids=["relative model path", "revision with a space", "empty served name", "empty dtype"],
)
def test_model_words_of_the_serve_command_are_checked(tmp_path, model, serve, field):
    text = f"name: demo\nmodel: {model}\nengine:\n  serve: {serve}\n"
    assert field in problems_of(refused_recipe(tmp_path, text))


# --- issue 26: one error edge ------------------------------------------------------------------


def old_state(tmp_path: Path, monkeypatch, backend: str = "local") -> DeploymentState:
    """A state saved by an older tandem: its recipe has a secret name in ``env``, which
    today's validator refuses."""
    monkeypatch.setenv("TANDEM_HOME", str(tmp_path / "home"))
    recipe = make_recipe(name="olddemo", tp=1).model_dump(mode="json")
    recipe["env"] = {"HF_TOKEN": "REDACTED"}
    cluster = (
        local_cluster(1, isolation=LocalIsolation.LOOPBACK)
        if backend == "local"
        else make_cluster(nodes=1)
    ).model_dump(mode="json")
    log = tmp_path / "rank0.log"
    log.write_text("booting\n")
    state = DeploymentState(
        name="olddemo",
        backend=backend,
        recipe=recipe,
        cluster=cluster,
        endpoint="http://127.0.0.1:9",
        model="m",
        ranks=[
            RankState(
                rank=0,
                node=cluster["nodes"][0]["name"],
                role="leader",
                address="127.0.0.1",
                log=str(log),
            )
        ],
    )
    state.save()
    return state


def test_an_old_state_is_refused_for_a_launch_naming_its_file(tmp_path, monkeypatch):
    state = old_state(tmp_path, monkeypatch)
    with pytest.raises(StateError) as caught:
        state.deployment()
    assert caught.value.file == str(state.directory.state_file)
    assert "env" in caught.value.message and "tandem down olddemo" in caught.value.hint


def test_an_old_state_can_be_bundled_and_watched_with_a_warning(
    tmp_path, monkeypatch, tandem_here, caplog
):
    state = old_state(tmp_path, monkeypatch)
    done = tandem_here("logs", "olddemo", "--bundle", str(tmp_path))
    assert done.code == 0, done.err
    assert list(tmp_path.glob("olddemo-bundle-*.tar.gz"))
    assert "the saved recipe fails today's checks (env" in caplog.text
    watcher = Watcher("olddemo", tmp_path / "watch")
    assert watcher.run_info.thresholds.max_restarts == 0
    lenient = state.deployment(lenient=True)
    assert lenient.recipe.env == {"HF_TOKEN": "REDACTED"}
    assert lenient.recipe.engine.serve.tensor_parallel_size == 1  # the rest is typed


def test_an_old_ssh_state_can_still_be_stopped_and_watched(tmp_path, monkeypatch):
    state = old_state(tmp_path, monkeypatch, backend="ssh")
    cluster, _, targets, runtime = ssh_backend._launched(state)  # what `down`, `logs`, `status` use
    assert cluster.nodes[0].address == "192.168.1.10" and runtime is not None
    assert targets  # what a look at its nodes reaches (`watch`)


@pytest.mark.parametrize("value", ["1kb", "lots", "0", "1KiB,", "8GiB"])
def test_fabric_sizes_are_refused_naming_the_option(value):
    code, output = cli("check", "tiny-local", "--fabric-sizes", value)
    assert code == 2 and "'--fabric-sizes'" in output and "Traceback" not in output, output


def test_fabric_sizes_take_the_units_their_help_shows():
    assert ByteSizes().convert("1KiB,64 KiB,1MiB,4096", None, None) == [
        1024,
        65536,
        1 << 20,
        4096,
    ]


def test_a_metrics_port_in_use_or_a_bad_address_is_one_message():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(SpecError) as caught:
            serve(SampleCollector("d"), port, "127.0.0.1")
        assert caught.value.field == "--serve-metrics" and "in use" in caught.value.message
    for address in ("not an address", "10.255.255.254", "a..b"):
        with pytest.raises(SpecError) as caught:
            serve(SampleCollector("d"), 0, address)
        assert caught.value.field == "--serve-address", address


def test_render_to_a_folder_of_a_target_that_prints_is_refused_before_the_folder_is_made(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("TANDEM_HOME", str(tmp_path / "home"))
    code, output = cli("render", "tiny-local", "--target", "k8s", "--out", str(tmp_path / "r"))
    assert code == 2 and "prints to stdout" in output, output
    assert not (tmp_path / "r").exists()


def test_more_ranks_than_this_machine_has_nodes_is_refused_with_every_problem(tmp_path):
    """Without a cluster each rank gets a node of this machine, an address each on one /24: a
    world size past it was an IndexError."""
    path = write(tmp_path, RECIPE.replace("tensor_parallel_size: 2", "tensor_parallel_size: 300"))
    with pytest.raises(RecipeError) as info:
        load_deployment(path)
    assert info.value.file == str(path) and info.value.field == "engine.serve"
    assert "300 ranks" in info.value.message and "--cluster" in (info.value.hint or "")
    typo = RECIPE.replace("{repo_id: org/model}", "{repo_id: org/model, served_name: 7}")
    path = write(tmp_path, typo.replace("tensor_parallel_size: 2", "tensor_parallel_size: 254"))
    with pytest.raises(RecipeError) as info:
        load_deployment(path)
    fields = [p.field for p in info.value.problems]
    assert fields == ["model.served_name", "engine.serve"], info.value
    load_deployment(write(tmp_path, RECIPE.replace("size: 2", "size: 253")))  # fits
