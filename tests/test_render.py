"""``tandem render`` through the CLI runner: shell and JSON forms."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from click.testing import CliRunner

from tandem.cli import cli, main

ROOT = Path(__file__).resolve().parents[1]


def run(*args: str):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def test_render_json_interface():
    result = run(
        "render",
        "deepseek-v4-flash-dspark",
        "--cluster",
        str(ROOT / "examples" / "dgx-spark-eks.yaml"),
        "--format",
        "json",
    )
    assert result.exit_code == 0
    data = json.loads(result.output)
    assert [r["rank"] for r in data["ranks"]] == [0, 1]
    leader = data["ranks"][0]
    assert leader["role"] == "leader" and leader["node"] == "spark-101"
    assert leader["argv"][:2] == ["vllm", "serve"]
    assert leader["env"]["GLOO_SOCKET_IFNAME"] == "enP7s7"
    assert data["endpoint"] == "http://192.168.100.101:8888"


def test_render_shell_is_runnable_text_workers_first():
    result = run(
        "render", "deepseek-v4-flash", "--cluster", str(ROOT / "examples" / "dgx-spark-pair.yaml")
    )
    assert result.exit_code == 0
    blocks = [b for b in result.output.split("\n\n") if b.startswith("# rank")]
    assert blocks[0].startswith("# rank 1 (worker)") and blocks[1].startswith("# rank 0 (leader)")
    command = "\n".join(blocks[1].splitlines()[1:]).replace("\\\n", " ")
    words = shlex.split(command)
    assert words[0] == "env" and "vllm" in words
    assert (
        words[words.index("--speculative-config") + 1]
        == '{"method":"deepseek_mtp","num_speculative_tokens":2}'
    )


def test_render_without_cluster_uses_this_machine():
    data = json.loads(run("render", "tiny-local", "--format", "json").output)
    assert len(data["ranks"]) == 2
    assert all(r["env"]["TANDEM_DEPLOYMENT"] == "tiny-local" for r in data["ranks"])


def test_bad_recipe_is_one_message_and_exit_2(tmp_path, capsys):
    bad = tmp_path / "r.yaml"
    bad.write_text("name: x\nmodel: {repo_id: a/b}\nengine: {serve: {tensor_parallel_size: 0}}\n")
    assert main(["render", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and str(bad) in err
    assert "engine.serve.tensor_parallel_size" in err and "Traceback" not in err


def test_impossible_plan_is_one_message(tmp_path, capsys):
    assert (
        main(["render", "tiny-local", "--cluster", str(ROOT / "examples" / "dgx-spark-eks.yaml")])
        == 0
    )
    assert (
        main(
            [
                "render",
                "deepseek-v4-flash",
                "--cluster",
                str(ROOT / "examples" / "local-netns.yaml"),
            ]
        )
        == 0
    )
    cluster = tmp_path / "c.yaml"
    cluster.write_text("name: one\nnodes: [{name: a, address: 10.0.0.1}]\n")
    assert main(["render", "tiny-local", "--cluster", str(cluster)]) == 2
    assert "does not match 1 node(s) x 1 GPU(s)" in capsys.readouterr().err
