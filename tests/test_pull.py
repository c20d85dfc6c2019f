"""``tandem model pull`` and the snapshot verification of ``check``, on real ssh hosts (network
namespaces, each with its own sshd, tests/ssh_hosts.py) and a real rsync between them.

The Hub cannot be reached here, so the snapshot is built on host0 as a download leaves it: the
HF cache layout, the weights' blobs named by their sha256 (LFS), the small files' by their git
blob id, ``refs/main`` holding the commit. Everything after the download is real: the probe on
each host, the rsync daemon on host0's address, host1 pulling from it, the verification.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import ssh_hosts
from tandem_cli import run_tandem

pytestmark = pytest.mark.netns

REPO = "tandem-org/pull-test"
FOLDER = "models--tandem-org--pull-test"
COMMIT = "9f1c2d3e4b5a69788796a5b4c3d2e1f0a9b8c7d6"
SHARD = 24 * 1024 * 1024
SHARDS = [f"model-0000{i}-of-00002.safetensors" for i in (1, 2)]
SMALL = {
    "config.json": b'{"architectures": ["LlamaForCausalLM"], "model_type": "llama"}\n',
    "model.safetensors.index.json": json.dumps(
        {"weight_map": {f"w{i}": name for i, name in enumerate(SHARDS)}}
    ).encode(),
}


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def build_snapshot(home: Path, shard_bytes: int = SHARD) -> dict[str, str]:
    """The snapshot as huggingface_hub leaves it; returns file name -> blob id."""
    repo = home / "hub" / FOLDER
    shards = {name: os.urandom(shard_bytes) for name in SHARDS}
    ids = {}
    for name, data in {**shards, **SMALL}.items():
        blob = hashlib.sha256(data).hexdigest() if name in shards else git_blob_id(data)
        (repo / "blobs").mkdir(parents=True, exist_ok=True)
        (repo / "blobs" / blob).write_bytes(data)
        link = repo / "snapshots" / COMMIT / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(f"../../blobs/{blob}")
        ids[name] = blob
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    return ids


@pytest.fixture(scope="module")
def bed(tmp_path_factory: pytest.TempPathFactory):
    reason = ssh_hosts.available()
    if reason:
        pytest.skip(reason)
    folder = tmp_path_factory.mktemp("pull")
    with ssh_hosts.ssh_hosts(folder / "hosts", name="pulltest", subnet="10.97.0.0/24") as hosts:
        homes = [folder / f"hf{i}" for i in range(2)]
        ids = build_snapshot(homes[0])
        homes[1].mkdir()
        recipe = folder / "pull-test.yaml"
        recipe.write_text(
            (Path(__file__).parents[1] / "src/tandem/recipes/tiny-local.yaml")
            .read_text()
            .replace("name: tiny-local", "name: pull-test")
            .replace("tandem-org/tiny-deepseek-v3", REPO)
        )
        nodes = [
            {"name": h.name, "address": h.address, "env": {"HF_HOME": str(home)}}
            for h, home in zip(hosts.hosts, homes)
        ]
        cluster = folder / "cluster.yaml"
        cluster.write_text(
            json.dumps(
                {
                    "name": "pulltest",
                    "transport": "ssh",
                    "nodes": nodes,
                    "ssh": {"config_file": str(hosts.config_file), "vllm_command": sys.executable},
                }
            )
        )
        env = {**os.environ, "TANDEM_HOME": str(folder / "state")}
        yield (
            {"hosts": hosts, "homes": homes, "ids": ids, "recipe": recipe, "cluster": cluster},
            env,
        )


def pull(bed, env, *flags: str, check: bool = True):
    return run_tandem(
        "model",
        "pull",
        str(bed["recipe"]),
        "--cluster",
        str(bed["cluster"]),
        *flags,
        env=env,
        timeout=300,
        check=check,
    )


def snapshot_findings(bed, env) -> list[dict]:
    """The model-snapshot findings of ``tandem check --json`` (other rules judge a vLLM that
    these hosts do not run)."""
    out = run_tandem(
        "check",
        str(bed["recipe"]),
        "--cluster",
        str(bed["cluster"]),
        "--json",
        env=env,
        check=False,
        timeout=300,
    )
    return [f for f in json.loads(out.stdout)["findings"] if f["rule"].startswith("model-")]


def blob(bed, node: int, name: str) -> Path:
    return bed["homes"][node] / "hub" / FOLDER / "blobs" / bed["ids"][name]


def test_a_pull_fetches_nothing_copies_to_the_second_host_and_verifies_both(bed):
    bed, env = bed
    out = pull(bed, env).stdout
    assert "host0 holds the whole commit: nothing is downloaded" in out, out
    assert "revision main is commit " + COMMIT in out and "pin it" in out
    assert "copied 0.05 GB to host1" in out, out
    assert "host0: verified 4 file(s)" in out and "host1: verified 4 file(s), read 0.05 GB" in out
    for name, blob_id in bed["ids"].items():
        copied = blob(bed, 1, name)
        assert copied.read_bytes() == blob(bed, 0, name).read_bytes()
        link = bed["homes"][1] / "hub" / FOLDER / "snapshots" / COMMIT / name
        assert link.is_symlink() and os.readlink(link) == f"../../blobs/{blob_id}"
    assert (bed["homes"][1] / "hub" / FOLDER / "refs" / "main").read_text() == COMMIT
    manifest = Path(env["TANDEM_HOME"]) / "models" / FOLDER / f"{COMMIT}.json"
    assert set(json.loads(manifest.read_text())["files"]) == set(bed["ids"])
    # the rsync daemon and its folder are gone from host0
    left = bed["hosts"].ssh(
        bed["hosts"].hosts[0],
        "pgrep -f '[r]sync --daemon --no-detach --config=.*tandem-pull' || true",
    )
    assert left.stdout.strip() == ""
    assert not list(Path(os.environ.get("TMPDIR", "/tmp")).glob("tandem-pull.*"))


def test_a_second_pull_copies_nothing_and_reads_nothing_again(bed):
    bed, env = bed
    out = pull(bed, env).stdout
    assert "every node holds the commit: nothing to copy" in out, out
    assert out.count("unchanged since verified") == 2, out
    assert snapshot_findings(bed, env) == []


@pytest.mark.parametrize("fault", ["truncated", "flipped", "missing", "wrong-revision"])
def test_check_refuses_a_damaged_copy_naming_the_file(bed, fault):
    bed, env = bed
    shard = "model-00002-of-00002.safetensors"
    target = blob(bed, 1, shard)
    original = target.read_bytes()
    repo1 = bed["homes"][1] / "hub" / FOLDER
    try:
        if fault == "truncated":
            target.write_bytes(original[: SHARD // 2])
        elif fault == "flipped":
            target.write_bytes(original[:1000] + bytes([original[1000] ^ 1]) + original[1001:])
        elif fault == "missing":
            (repo1 / "snapshots" / COMMIT / "config.json").unlink()
        else:
            (repo1 / "refs" / "main").write_text("0" * 40)
        findings = snapshot_findings(bed, env)
        assert findings and all(f["node"] == "host1" for f in findings), findings
        text = json.dumps(findings)
        named = {"truncated": shard, "flipped": shard, "missing": "config.json"}
        assert named.get(fault, "0" * 40) in text, text
        assert any(f["severity"] == "error" for f in findings)
    finally:
        target.write_bytes(original)
        link = repo1 / "snapshots" / COMMIT / "config.json"
        if not link.is_symlink():
            link.symlink_to(f"../../blobs/{bed['ids']['config.json']}")
        (repo1 / "refs" / "main").write_text(COMMIT)
    assert snapshot_findings(bed, env) == []


def test_a_pull_never_replaces_a_file_it_did_not_write(bed):
    bed, env = bed
    target = blob(bed, 1, "model-00001-of-00002.safetensors")
    original = target.read_bytes()
    target.write_bytes(b"\0" + original[1:])
    try:
        result = pull(bed, env, check=False)
        assert result.returncode != 0
        assert "host1: model-00001-of-00002.safetensors" in result.stderr, result.stderr
        assert target.read_bytes()[:1] == b"\0"  # left as found
    finally:
        target.write_bytes(original)


def test_a_pull_to_a_disk_without_room_is_refused_before_a_byte_moves(bed):
    """host1's cache on a 16 MiB filesystem (a tmpfs over its ``hub``, mounted on host1 itself:
    its sshd has a mount namespace of its own) cannot take the 50 MB commit: the pull names the
    node, what it lacks and what it has, and copies nothing."""
    bed, env = bed
    host1 = bed["hosts"].hosts[1]
    hub = bed["homes"][1] / "hub"
    hub.mkdir(exist_ok=True)
    small = bed["hosts"].ssh(
        host1, f"mount -t tmpfs -o size=16m tandem-small-disk {hub}", check=False
    )
    if small.returncode:
        pytest.skip(f"cannot mount a small filesystem here: {small.stderr.strip()}")
    try:
        result = pull(bed, env, check=False)
        assert result.returncode != 0
        assert "host1 lacks 0.05 GB of it and has 0.02 GB free under " in result.stderr, (
            result.stdout + result.stderr
        )
        assert "nothing was copied" in result.stderr
        assert bed["hosts"].ssh(host1, f"ls -A {hub}").stdout == ""
    finally:
        bed["hosts"].ssh(host1, f"umount {hub}")


def started_a_shard(blobs: Path) -> bool:
    """rsync writes a file under a dot-name beside its place; a few MB of a shard are there."""
    try:
        return any(p.name.startswith(".") and p.stat().st_size > 2**21 for p in blobs.iterdir())
    except OSError:
        return False


def test_an_interrupted_pull_resumes(bed):
    """A pull cut in the middle of a shard leaves no short file under a blob's name (the part
    waits in rsync's partial folder) and the next pull finishes it."""
    bed, env = bed
    repo1 = bed["homes"][1] / "hub" / FOLDER
    moved = repo1.parent / "moved-aside"
    if repo1.exists():
        repo1.rename(moved)
    try:
        command = [
            "model",
            "pull",
            str(bed["recipe"]),
            "--cluster",
            str(bed["cluster"]),
            "--bwlimit",
            "4M",
        ]
        running = subprocess.Popen(
            [sys.executable, "-m", "tandem.cli", *command],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not started_a_shard(repo1 / "blobs"):
            time.sleep(0.1)
        running.send_signal(signal.SIGINT)
        running.wait(timeout=60)
        assert running.returncode != 0
        parts = list((repo1 / "blobs" / ".tandem-partial").iterdir())
        assert len(parts) == 1 and 0 < parts[0].stat().st_size < SHARD, parts
        whole = [p for p in (repo1 / "blobs").iterdir() if p.is_file()]
        assert all(p.stat().st_size in (SHARD, *map(len, SMALL.values())) for p in whole)
        assert not (repo1 / "blobs" / parts[0].name).exists()
        out = pull(bed, env).stdout
        assert "host1: verified 4 file(s)" in out, out
        assert not (repo1 / "blobs" / ".tandem-partial").exists()
        for name in bed["ids"]:
            assert blob(bed, 1, name).read_bytes() == blob(bed, 0, name).read_bytes()
    finally:
        if moved.exists() and not repo1.exists():
            moved.rename(repo1)
        elif moved.exists():
            subprocess.run(["rm", "-rf", str(moved)], check=True)


def test_sync_copies_the_snapshot_as_the_pull_does_and_never_downloads(bed):
    bed, env = bed
    repo0, repo1 = (home / "hub" / FOLDER for home in bed["homes"])
    aside = repo1.parent / "sync-aside"
    repo1.rename(aside)
    try:

        def sync(*flags: str):
            return run_tandem(
                "sync", str(bed["recipe"]), "--cluster", str(bed["cluster"]), *flags,
                env=env, timeout=300, check=False,
            )  # fmt: skip

        planned = sync("--dry-run")
        assert "would copy-snapshot to host1 from host0" in planned.stdout, planned.stdout
        assert not repo1.exists()
        done = sync()
        assert done.returncode == 0 and "in sync" in done.stdout, done.stdout + done.stderr
        for name in bed["ids"]:
            assert blob(bed, 1, name).read_bytes() == blob(bed, 0, name).read_bytes()
        subprocess.run(["rm", "-rf", str(repo1)], check=True)
        repo0.rename(repo0.parent / "held-aside")
        try:
            nowhere = sync()
            assert nowhere.returncode != 0 and "tandem model pull pull-test" in nowhere.stderr
        finally:
            (repo0.parent / "held-aside").rename(repo0)
    finally:
        if repo1.exists():
            subprocess.run(["rm", "-rf", str(aside)], check=True)
        else:
            aside.rename(repo1)
