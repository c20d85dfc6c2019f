"""The docker runtime against real Docker engines: a dockerd on each of two ssh hosts.

The hosts are network namespaces with their own sshd and dockerd (``docker_hosts``); tandem
reaches them only over ssh. The engine image (the CPU vLLM environment, imported on the first
host only) is moved to the second by ``tandem sync``; then ``tandem up`` starts the tiny model
with TP=2 in one container per host, and the one deployment is checked end to end: the
rendered commands against what the daemons run, status, logs, the support bundle, a killed
container brought back by ``supervise`` with its caches, and ``down`` removing the two
containers and nothing else. The hosts use 10.84.0.0/24, a subnet no other test uses (the venv
ssh tests: 10.78.0.0/24; the start-up failures: 10.79.0.0/24).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import tarfile
import time
from pathlib import Path

import docker_hosts
import httpx
import pytest
import yaml
from tandem_cli import TANDEM, run_tandem

from tandem.backends import sync
from tandem.spec.loading import load_recipe

pytestmark = [pytest.mark.engine, pytest.mark.netns]
NAME = "tiny-docker"
REMOTE_DIR = "~/tandem"
"""In the ssh user's home, so the rank folders and cache mounts go through ``~`` expansion."""


class DockerDeployment:
    def __init__(self, hosts: docker_hosts.DockerHosts, folder: Path, env: dict[str, str]):
        self.hosts, self.folder, self.env = hosts, folder, env
        self.recipe = folder / f"{NAME}.yaml"
        self.cluster = folder / "cluster.yaml"
        self.sync_output = self.up_output = ""

    def tandem(self, *args: str, timeout: float = 120, check: bool = True):
        return run_tandem(*args, env=self.env, timeout=timeout, check=check)

    def ssh(self, rank: int, command: str, **kw):
        return self.hosts.ssh.ssh(self.hosts.ssh.hosts[rank], command, **kw)

    def status(self) -> dict:
        return json.loads(self.tandem("status", NAME, "--json").stdout)

    def inspect(self, rank: int, what: str = f"tandem-{NAME}-rank{{rank}}") -> dict:
        out = self.hosts.daemons[rank].docker("inspect", what.format(rank=rank)).stdout
        return json.loads(out)[0]

    def chat(self, endpoint: str) -> httpx.Response:
        return httpx.post(
            f"{endpoint}/v1/chat/completions",
            timeout=180,
            json={
                "model": "tiny-deepseek",
                "max_tokens": 8,
                "temperature": 0,
                "messages": [{"role": "user", "content": "Name two planets."}],
            },
        )


def words_on_host(deployment: DockerDeployment, rank: int, command: str) -> list[str]:
    """The words ``docker`` gets when the host's own ``sh`` runs ``command`` (a function named
    docker prints them: the host shell's expansion is what is looked at)."""
    script = "docker() { printf '%s\\0' \"$@\"; }\n" + command + "\n"
    out = deployment.ssh(rank, f"sh -c {shlex.quote(script)}").stdout
    return out.split("\0")[:-1]


def flag_values(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == flag]


@pytest.fixture(scope="module")
def setup(docker_test_hosts: docker_hosts.DockerHosts, tiny_hf_home: Path, tmp_path_factory):
    folder = tmp_path_factory.mktemp("dockerdeploy")
    deployment = DockerDeployment(
        docker_test_hosts, folder, {**os.environ, "TANDEM_HOME": str(folder / "home")}
    )
    deployment.env.pop("TANDEM_SSH_CONFIG", None)
    recipe = load_recipe("tiny-local").model_dump(mode="json", exclude_defaults=True)
    recipe["name"] = NAME
    recipe["engine"]["image"] = docker_test_hosts.image  # a tag: up pins it to the id
    deployment.recipe.write_text(yaml.safe_dump(recipe))
    hosts = docker_test_hosts.ssh.hosts
    # host0 keeps the model in its user's default Hugging Face home (~/.cache/huggingface);
    # host1 names its own HF_HOME.
    home0 = Path(deployment.ssh(0, "echo $HOME").stdout.strip())
    assert home0 == docker_test_hosts.homes[0], "host0's sshd did not set its own HOME"
    (home0 / ".cache").mkdir(parents=True, exist_ok=True)
    (home0 / ".cache" / "huggingface").unlink(missing_ok=True)
    (home0 / ".cache" / "huggingface").symlink_to(tiny_hf_home)
    deployment.cluster.write_text(
        yaml.safe_dump(
            {
                "name": "docker-pair",
                "transport": "ssh",
                "ssh": {
                    "config_file": str(docker_test_hosts.ssh.config_file),
                    "runtime": "docker",
                    "docker_gpus": None,  # CPU nodes: docker refuses --gpus without NVIDIA
                    "remote_dir": REMOTE_DIR,
                    "connect_timeout_s": 5,
                },
                "nodes": [
                    {
                        "name": h.name,
                        "address": h.address,
                        "control_plane_interface": h.interface,
                        "env": {
                            "VLLM_CPU_OMP_THREADS_BIND": str(i),
                            **({"HF_HOME": str(tiny_hf_home)} if i else {}),
                        },
                    }
                    for i, h in enumerate(hosts)
                ],
            }
        )
    )
    return deployment


@pytest.fixture(scope="module")
def synced(setup: DockerDeployment):
    started = time.monotonic()
    result = setup.tandem(
        "sync", str(setup.recipe), "--cluster", str(setup.cluster), timeout=600, check=False
    )
    if result.returncode:
        pytest.fail(f"tandem sync failed:\n{result.stdout}\n{result.stderr}")
    setup.sync_output = result.stdout
    setup.sync_s = time.monotonic() - started
    return setup


@pytest.fixture(scope="module")
def deployment(synced: DockerDeployment):
    # A container on each host that is not tandem's: down must leave it. Privileged like the
    # ranks: an unprivileged one gets the docker-default AppArmor profile on a kernel with
    # AppArmor on, and failed to start in CI (exit 127, the CLI's code for "not found": most
    # likely apparmor_parser, which .ci/run now installs too).
    for daemon in synced.hosts.daemons:
        daemon.docker("rm", "--force", "bystander", check=False)
        daemon.docker(
            "run", "--detach", "--name", "bystander", "--network", "host", "--privileged",
            synced.hosts.image, "python3", "-c", "import time; time.sleep(3600)",
        )  # fmt: skip
    started = time.monotonic()
    up = synced.tandem(
        "up", str(synced.recipe), "--cluster", str(synced.cluster), timeout=900, check=False
    )
    if up.returncode:
        pytest.fail(f"tandem up failed ({up.returncode}):\n{up.stdout}\n{up.stderr}")
    synced.up_output, synced.up_s = up.stdout, time.monotonic() - started
    yield synced
    synced.tandem("down", NAME, timeout=300, check=False)


# --- before anything runs ----------------------------------------------------------------------


def test_rendered_commands_are_accepted_by_the_hosts_daemons_as_printed(synced: DockerDeployment):
    """Each rank's block of ``render --target docker``, pasted into its host's shell with
    ``docker run`` turned into ``docker create``: the real daemon checks every flag and mount
    (a quoted ``~`` was refused here as a volume name) without starting vLLM."""
    text = synced.tandem("render", str(synced.recipe), "--cluster", str(synced.cluster),
                         "--target", "docker").stdout  # fmt: skip
    blocks = [b for b in text.split("\n\n") if "docker run" in b]
    assert len(blocks) == 2 and "'~" not in text
    for block in blocks:
        rank = int(re.search(r"# rank (\d)", block).group(1))
        command = "\n".join(x for x in block.splitlines() if not x.startswith("#"))
        create = command.replace("docker run \\\n  --detach", "docker create", 1)
        create = create.replace(f"tandem-{NAME}-rank{rank}", f"pasted-rank{rank}", 1)
        made = synced.ssh(rank, create, check=False)
        try:
            assert made.returncode == 0, made.stderr
            seen = synced.inspect(rank, "pasted-rank{rank}")
            assert all(m["Source"].startswith("/") for m in seen["Mounts"])
            hf = next(m for m in seen["Mounts"] if m["Destination"] == "/cache/huggingface")
            home = synced.ssh(rank, "echo $HOME").stdout.strip()
            if rank == 0:  # the default ~/.cache/huggingface, expanded by host0's shell
                assert hf["Source"] == f"{home}/.cache/huggingface"
        finally:
            synced.hosts.daemons[rank].docker("rm", "--force", f"pasted-rank{rank}", check=False)


def test_sync_moves_the_image_and_every_host_holds_the_same_id(synced: DockerDeployment):
    out = synced.sync_output
    assert "host1: image missing" in out, out
    assert "copy-image to host1 from host0" in out and "docker save" in out
    assert "verified" in out
    ids = [
        d.docker("image", "inspect", "--format", "{{.Id}}", synced.hosts.image).stdout.strip()
        for d in synced.hosts.daemons
    ]
    assert ids == [synced.hosts.image_id] * 2
    again = synced.tandem("sync", str(synced.recipe), "--cluster", str(synced.cluster),
                          "--dry-run")  # fmt: skip
    assert "nothing to copy" in again.stdout


def test_sync_judges_an_image_copy_by_the_room_under_the_targets_own_docker_root(
    synced: DockerDeployment,
):
    """The probe behind sync's refusal (``sync.refuse_short_of_room``), on a real daemon over
    ssh: the host's own data root, not the first host's, and the room df gives for it."""
    out = synced.ssh(1, sync.room_probe("docker")).stdout
    free_kb, _, root = out.strip().partition(" ")
    assert root.endswith("/host1/root"), out
    stat = os.statvfs(root)
    assert abs(int(free_kb) * 1024 - stat.f_bavail * stat.f_frsize) < 256 * 2**20


# --- the deployment ------------------------------------------------------------------------------


def test_up_pins_the_image_starts_workers_first_and_waits_for_an_answer(
    deployment: DockerDeployment,
):
    out = deployment.up_output
    assert f"pinned to {deployment.hosts.image_id}" in out, out
    assert out.index("started rank 1 (worker) on host1") < out.index("started rank 0 (leader)")
    assert f"container tandem-{NAME}-rank1" in out
    for phase in ("rendezvous", "weights loaded", "health 200", "model listed", "answered"):
        assert phase in out, out
    assert "ready at http://10.84.0.1:8000/v1" in out


def test_containers_run_what_render_prints(deployment: DockerDeployment):
    """What each daemon runs (``docker inspect``) is the rendered command's words as the host's
    shell expands them, with the image pinned to its id."""
    text = deployment.tandem("render", str(deployment.recipe), "--cluster",
                             str(deployment.cluster), "--target", "docker").stdout  # fmt: skip
    for block in (b for b in text.split("\n\n") if "docker run" in b):
        rank = int(re.search(r"# rank (\d)", block).group(1))
        words = words_on_host(deployment, rank, block)
        seen = deployment.inspect(rank)
        host = seen["HostConfig"]
        assert seen["Image"] == deployment.hosts.image_id
        assert seen["Config"]["Entrypoint"] + seen["Config"]["Cmd"] == [
            words[words.index("--entrypoint") + 1],
            *words[words.index("--entrypoint") + 3 :],
        ]
        assert sorted(host["Binds"]) == sorted(flag_values(words, "--volume"))
        assert set(flag_values(words, "--env")) <= set(seen["Config"]["Env"])
        assert host["NetworkMode"] == "host" and host["IpcMode"] == "host"
        assert host["Privileged"] is True and host["CapAdd"] == ["CAP_IPC_LOCK"]  # normalized
        assert {"Name": "memlock", "Hard": -1, "Soft": -1} in host["Ulimits"]
        assert seen["State"]["Running"] is True
        assert seen["Config"]["Labels"]["tandem.rank"] == str(rank)


def test_ranks_met_over_the_hosts_addresses(deployment: DockerDeployment):
    log = deployment.tandem("logs", NAME, "--rank", "1").stdout
    assert "world_size=2 rank=1" in log and "tcp://10.84.0.1:29501" in log


def test_status_reads_each_container_over_ssh(deployment: DockerDeployment):
    status = deployment.status()
    assert status["backend"] == "ssh" and status["healthy"] is True
    assert [(r["rank"], r["node"], r["state"]) for r in status["ranks"]] == [
        (0, "host0", "running"),
        (1, "host1", "running"),
    ]
    assert deployment.chat(status["endpoint"]).json()["usage"]["completion_tokens"] == 8


def test_logs_merge_the_containers_output(deployment: DockerDeployment):
    out = deployment.tandem("logs", NAME, "--tail", "400").stdout
    assert "[rank 0]" in out and "[rank 1]" in out
    assert "POST /v1/chat/completions" in out  # the leader container's access log


def test_bundle_names_the_daemons_and_the_pinned_image(deployment: DockerDeployment):
    out = deployment.tandem("logs", NAME, "--bundle", str(deployment.folder)).stdout
    path = Path(out.split("wrote", 1)[1].strip())
    with tarfile.open(path) as archive:
        read = lambda member: archive.extractfile(f"{NAME}-bundle/{member}").read().decode()  # noqa: E731
        versions = read("versions.txt")
        assert "[node host1]" in versions and "docker 20.10" in versions
        assert deployment.hosts.image_id in versions
        assert "VLLM_HOST_IP=10.84.0.2" in read("ranks/rank1.env")
        assert read("ranks/rank1.log").strip()


def test_a_killed_container_brings_the_group_back_with_its_caches(deployment: DockerDeployment):
    events = deployment.folder / "home" / "deployments" / NAME / "events.log"
    before = [deployment.inspect(rank)["Id"] for rank in (0, 1)]
    supervisor = subprocess.Popen(
        [*TANDEM, "supervise", NAME, "--interval", "2", "--backoff", "1"],
        env=deployment.env,
        stdout=(deployment.folder / "supervise.out").open("w"),
        stderr=subprocess.STDOUT,
    )
    deployment.supervisor = supervisor
    deadline = time.monotonic() + 30
    while not (events.exists() and "supervising" in events.read_text()):
        assert time.monotonic() < deadline and supervisor.poll() is None
        time.sleep(0.5)
    deployment.ssh(1, f"docker kill tandem-{NAME}-rank1")  # host1's own daemon
    deadline = time.monotonic() + 600
    while "restart 1 done" not in events.read_text():
        text = events.read_text()
        assert "giving up" not in text and supervisor.poll() is None, text
        assert time.monotonic() < deadline, text
        time.sleep(2)
    text = events.read_text()
    assert re.search(r"group broken: (degraded: rank 1|down: rank [01]|down: no rank)", text), text
    assert text.index("stopped 2 rank(s)") < text.index("started rank 1 (worker)")
    assert text.index("started rank 1 (worker)") < text.index("started rank 0 (leader)")
    after = [deployment.inspect(rank)["Id"] for rank in (0, 1)]
    assert all(a != b for a, b in zip(after, before))  # new containers, same names
    status = deployment.status()
    assert [r["state"] for r in status["ranks"]] == ["running", "running"]
    assert deployment.chat(status["endpoint"]).status_code == 200


def test_down_removes_the_two_containers_and_nothing_else(deployment: DockerDeployment):
    supervisor = getattr(deployment, "supervisor", None)
    result = deployment.tandem("down", NAME, timeout=300)
    assert f"{NAME} is down" in result.stdout
    if supervisor is not None:
        assert supervisor.wait(timeout=30) == 0
    for rank, daemon in enumerate(deployment.hosts.daemons):
        names = daemon.docker("ps", "--all", "--format", "{{.Names}}").stdout.split()
        assert names == ["bystander"]  # ours gone, the host's own one left running
        assert daemon.docker("image", "inspect", deployment.hosts.image).returncode == 0
        assert daemon.docker("volume", "ls", "--quiet").stdout == ""  # no stray named volume
        # the rank's cache root, a bind mount written from inside the container, stays
        root = f"{REMOTE_DIR}/{NAME}/caches/rank{rank}".replace("~", '"$HOME"', 1)
        assert deployment.ssh(rank, f"ls {root}/vllm/modelinfos | wc -l").stdout.strip() != "0"
        left = deployment.ssh(
            rank, f"grep -lzxF TANDEM_DEPLOYMENT={NAME} /proc/[0-9]*/environ 2>/dev/null | wc -l"
        )
        assert left.stdout.strip() == "0"
    assert deployment.tandem("status", NAME, check=False).returncode == 2
