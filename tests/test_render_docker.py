"""The docker runtime as rendered commands, compared with the seeds' container settings.

No Docker engine runs here: these tests read the argv ``tandem render --target docker`` prints
and check it against seed 002 (eugr's no-Ray launcher: host network and IPC, privileged, HF
cache, workers first, `--nnodes/--node-rank/--master-addr/--master-port`, `--headless`) and
seed 000 (the LWS pod spec: hostNetwork, hostIPC, privileged + IPC_LOCK, /dev/infiniband,
64Gi memory /dev/shm, /cache/huggingface).
"""

from __future__ import annotations

import shlex
import subprocess

import pytest
from click.testing import CliRunner
from factories import make_cluster, make_deployment, make_recipe
from pydantic import ValidationError

from tandem.backends.runtimes import DockerRuntime
from tandem.cli import cli
from tandem.errors import RecipeError
from tandem.rankplan import plan_ranks
from tandem.render.docker import container_name, docker_run_argv, render
from tandem.spec.cluster import Node, SSHOptions, Transport
from tandem.spec.deployment import Deployment
from tandem.spec.loading import load_cluster, load_deployment, load_recipe


def flag_values(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == flag]


def seed_002() -> Deployment:
    recipe = load_recipe("deepseek-v4-flash")
    recipe = recipe.model_copy(
        update={
            "engine": recipe.engine.model_copy(
                update={"image": "vllm-node-dsv4@sha256:" + "a" * 64}
            )
        }
    )
    return Deployment(recipe=recipe, cluster=load_cluster("examples/dgx-spark-pair.yaml"))


def seed_000() -> Deployment:
    cluster = load_cluster("examples/dgx-spark-eks.yaml").model_copy(
        update={"transport": Transport.SSH}
    )
    return Deployment(recipe=load_recipe("deepseek-v4-flash-dspark"), cluster=cluster)


@pytest.mark.parametrize("seed", [seed_002, seed_000], ids=["seed 002", "seed 000"])
def test_every_container_has_the_seeds_host_settings(seed):
    deployment = seed()
    plan = plan_ranks(deployment)
    for rank in plan.ranks:
        argv = docker_run_argv(rank, deployment)
        assert argv[:3] == ["docker", "run", "--detach"]
        assert flag_values(argv, "--network") == ["host"]
        assert flag_values(argv, "--ipc") == ["host"]
        assert "--privileged" in argv and flag_values(argv, "--cap-add") == ["IPC_LOCK"]
        assert flag_values(argv, "--ulimit") == ["memlock=-1"]
        assert flag_values(argv, "--tmpfs") == ["/dev/shm:rw,nosuid,nodev,size=64g"]
        assert flag_values(argv, "--gpus") == ["all"]
        assert flag_values(argv, "--volume") == [
            "~/.cache/huggingface:/cache/huggingface"
        ] or flag_values(argv, "--volume")[0].endswith(":/cache/huggingface")
        env = dict(e.split("=", 1) for e in flag_values(argv, "--env"))
        assert env["HF_HOME"] == "/cache/huggingface"
        assert env["VLLM_HOST_IP"] == rank.address
        assert flag_values(argv, "--name") == [container_name(deployment.name, rank.rank)]
        # the serve command is the process target's, after the image
        image_at = argv.index(deployment.recipe.engine.image)
        assert argv[image_at - 2 : image_at] == ["--entrypoint", "vllm"]
        assert argv[image_at + 1 :] == rank.argv[1:]


def test_seed_002_no_ray_flags_and_workers_first():
    deployment = seed_002()
    text = render(plan_ranks(deployment), deployment, "shell")
    worker, leader = text.index("# rank 1 (worker)"), text.index("# rank 0 (leader)")
    assert worker < leader
    body = text[worker:leader]
    for flags in (
        "--nnodes 2",
        "--node-rank 1",
        "--master-addr 169.254.73.22",
        "--master-port 29501",
        "--headless",
        "--distributed-executor-backend mp",
    ):
        assert flags in body
    assert "--headless" not in text[leader:]
    assert "NCCL_IB_DISABLE=0" in body and "GLOO_SOCKET_IFNAME=enp1s0f1np1" in body
    assert "--device" not in text  # seed 002 pins no RDMA fabric


def test_seed_000_rdma_device_and_control_plane():
    deployment = seed_000()
    argv = docker_run_argv(plan_ranks(deployment).ranks[1], deployment)
    assert flag_values(argv, "--device") == ["/dev/infiniband:/dev/infiniband"]
    env = dict(e.split("=", 1) for e in flag_values(argv, "--env"))
    assert env["NCCL_IB_HCA"] == "rocep1s0f1,roceP2p1s0f1" and env["NCCL_NET"] == "IB"
    assert {env[v] for v in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME")} == {
        "enP7s7"
    }
    assert "--port" in argv and argv[argv.index("--port") + 1] == "8888"


def test_secrets_are_passed_by_name_only():
    deployment = make_deployment(make_recipe(engine__image="repo/vllm:1"))
    rank = plan_ranks(deployment).ranks[0]
    # A secret reaches a rank only at launch, from the caller's environment (never the recipe).
    rank = rank.model_copy(update={"env": {**rank.env, "HF_TOKEN": "hf_abc123"}})
    argv = docker_run_argv(rank, deployment)
    assert "HF_TOKEN" in flag_values(argv, "--env")
    assert "hf_abc123" not in shlex.join(argv)


def test_node_hf_home_is_the_mounted_host_path():
    cluster = make_cluster().model_copy(
        update={
            "nodes": [
                n.model_copy(update={"env": {"HF_HOME": f"/data/hf{i}"}})
                for i, n in enumerate(make_cluster().nodes)
            ]
        }
    )
    deployment = make_deployment(make_recipe(engine__image="repo/vllm:1"), cluster)
    argv = docker_run_argv(plan_ranks(deployment).ranks[1], deployment)
    assert flag_values(argv, "--volume")[0] == "/data/hf1:/cache/huggingface"


def test_each_container_mounts_its_own_compile_cache_root_beside_the_rank_folders():
    deployment = make_deployment(make_recipe(engine__image="repo/vllm:1"))
    for rank in plan_ranks(deployment).ranks:
        argv = docker_run_argv(rank, deployment)
        root = f"/tmp/tandem/{deployment.name}/caches/rank{rank.rank}"
        assert flag_values(argv, "--volume")[1:] == [f"{root}:/cache/tandem"]
        env = dict(e.split("=", 1) for e in flag_values(argv, "--env") if "=" in e)
        assert env["VLLM_CACHE_ROOT"] == "/cache/tandem/vllm"
        assert env["TRITON_CACHE_DIR"] == "/cache/tandem/triton"
        assert env["FLASHINFER_WORKSPACE_BASE"] == "/cache/tandem/flashinfer"
        assert env["TILELANG_CACHE_DIR"] == "/cache/tandem/tilelang"


def test_no_image_is_a_recipe_error_naming_the_field():
    deployment = make_deployment()
    with pytest.raises(RecipeError) as info:
        render(plan_ranks(deployment), deployment, "shell")
    assert info.value.field == "engine.image"


def test_cli_prints_each_nodes_docker_run():
    result = CliRunner().invoke(
        cli,
        [
            "render",
            "deepseek-v4-flash-dspark",
            "--cluster",
            "examples/dgx-spark-pair.yaml",
            "--target",
            "docker",
        ],
    )
    assert result.exit_code == 0, result.output
    assert result.output.count("docker run") == 2
    assert "is a tag, not a digest" in result.output
    parsed = load_deployment(
        "deepseek-v4-flash-dspark",
        "examples/dgx-spark-pair.yaml",
        as_root=False,
        cpu_count=1,
        gpu_count=0,
    )
    assert parsed.recipe.engine.image in result.output


def words_on_a_node(command: str, home: str) -> list[str]:
    """The words ``docker`` gets when a node's real ``sh`` runs ``command`` (HOME=``home``).

    The shell function named ``docker`` only prints its arguments: what is checked is the
    node shell's expansion of the text, not docker.
    """
    script = "docker() { printf '%s\\0' \"$@\"; }\n" + command + "\n"
    out = subprocess.run(
        ["sh", "-c", script],
        env={"HOME": home, "PATH": "/usr/bin:/bin"},
        capture_output=True,
        check=True,
    ).stdout
    return out.decode().split("\0")[:-1]


def rank_blocks(text: str) -> list[str]:
    """The command of each rank block of ``render --target docker`` (comments dropped)."""
    return [
        "\n".join(line for line in block.splitlines() if not line.startswith("#"))
        for block in text.split("\n\n")[1:]
    ]


def test_a_home_mount_source_reaches_docker_as_the_nodes_absolute_path():
    deployment = make_deployment(make_recipe(engine__image="repo/vllm:1"))
    plan = plan_ranks(deployment)
    text = render(plan, deployment, "shell")
    assert "'~" not in text  # a quoted ~ is a literal one: docker refused it as a volume name
    for block, rank in zip(rank_blocks(text), plan.in_start_order()):
        words = words_on_a_node(block, "/home/ops")
        assert (
            flag_values(words, "--volume")[0] == "/home/ops/.cache/huggingface:/cache/huggingface"
        )
        assert all(v.startswith("/") for v in flag_values(words, "--volume"))
        expected = docker_run_argv(rank, deployment)
        assert words == [w.replace("~/", "/home/ops/", 1) for w in expected][1:]


def test_the_rendered_command_is_the_one_up_runs():
    cluster = make_cluster().model_copy(
        update={"ssh": SSHOptions(remote_dir="~/tandem", docker_gpus=None)}
    )
    deployment = make_deployment(make_recipe(engine__image="repo/vllm:1"), cluster)
    plan = plan_ranks(deployment)
    runtime = DockerRuntime(cluster.ssh, "repo/vllm:1")
    for block, rank in zip(rank_blocks(render(plan, deployment, "shell")), plan.in_start_order()):
        script = runtime.start_script(rank, deployment)
        line = next(x for x in script.splitlines() if x.startswith("docker run "))
        ran = words_on_a_node(line.rsplit(" > ", 1)[0], "/home/ops")
        assert ran == words_on_a_node(block, "/home/ops")
        cache = f"/home/ops/tandem/{deployment.name}/caches/rank{rank.rank}:/cache/tandem"
        assert flag_values(ran, "--volume")[1] == cache
        assert "--gpus" not in ran  # docker_gpus null: CPU nodes, where docker refuses --gpus
        assert 'mkdir -p "$HOME"/tandem/' in script  # the rank folders land in the home too


@pytest.mark.parametrize(
    ("build", "loc"),
    [
        (
            lambda: make_recipe(engine__image="repo/vllm:1", model__cache_root="hf-cache"),
            ("model", "cache_root"),
        ),
        (lambda: Node(name="n1", address="10.0.0.2", env={"HF_HOME": "data/hf"}), ("env",)),
    ],
    ids=["relative cache_root", "relative node HF_HOME"],
)
def test_a_relative_mount_source_is_refused_where_it_is_written(build, loc):
    """Docker would take it for a volume's name, vLLM for a folder below the rank's working
    folder: the recipe and the inventory refuse it on every runtime (``tandem.spec.paths``)."""
    with pytest.raises(ValidationError) as info:
        build()
    assert info.value.errors()[0]["loc"] == loc


def test_a_relative_remote_dir_is_refused_at_load():
    with pytest.raises(ValidationError) as info:
        SSHOptions(remote_dir="tandem")
    assert info.value.errors()[0]["loc"] == ("remote_dir",)
