"""What `tandem model pull` costs beside the plain tools, on two real ssh hosts of this machine.

Two figures the issue asks for, each side by side in one run, interleaved over rounds:

1. **Verification**, per node: the probe's check of every file of the snapshot against its id
   (what `check` and `up` run on a node the first time, and on every changed file after)
   against reading the same files with `cat > /dev/null`, i.e. the disk's read rate: the
   snapshot on this machine's disk, the page cache dropped before each read (as root; warm
   otherwise, and said so). The ratio says how much of the disk's rate the hashing keeps.
2. **Fan-out**, host0 to host1: `tandem model pull` (rsync from a daemon on host0's address,
   no ssh in the data path) against a plain `rsync -a` of the repo folder over ssh between the
   same two hosts, each into an empty folder.

The hosts are network namespaces with their own sshd (`tests/ssh_hosts.py`), sharing this
machine's memory: both Hugging Face homes are on tmpfs (``--dir``) and the copy's bytes go over
a veth bridge, so the fan-out figures compare the two tools' own costs (ssh's cipher, rsync's
checksums), not a disk or a ConnectX-7 link.

Usage (root, for the namespaces):
    .venv/bin/python benchmarks/pull_rates.py --gb 2 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import ssh_hosts  # noqa: E402  (the test bed's hosts: namespaces with their own sshd)
from test_pull import COMMIT, FOLDER, REPO, build_snapshot  # noqa: E402


def timed(argv: list[str], **kwargs) -> tuple[float, subprocess.CompletedProcess]:
    started = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, check=True, **kwargs)
    return time.monotonic() - started, done


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gb", type=float, default=2.0, help="size of the snapshot's shards")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--dir",
        default="/dev/shm",
        help="where both hosts' Hugging Face homes go (default tmpfs: this machine's disk writes "
        "~56 MB/s, which would be the figure of either tool)",
    )
    args = parser.parse_args()
    reason = ssh_hosts.available()
    if reason:
        sys.exit(f"cannot make ssh hosts here: {reason}")
    folder = Path(tempfile.mkdtemp(prefix="pull-rates-", dir=args.dir))
    disk = Path(tempfile.mkdtemp(prefix="pull-rates-"))
    try:
        with ssh_hosts.ssh_hosts(folder / "hosts", name="pullrate", subnet="10.98.0.0/24") as hosts:
            return run(hosts, folder, disk, args)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        shutil.rmtree(disk, ignore_errors=True)


def drop_caches() -> bool:
    """Empty the page cache (root), so that a read comes from the disk."""
    subprocess.run(["sync"], check=True)
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
    except OSError:
        return False
    return True


def run(hosts: ssh_hosts.SSHHosts, folder: Path, disk: Path, args: argparse.Namespace) -> int:
    homes = [folder / "hf0", folder / "hf1"]
    shard = int(args.gb * 1e9 / 2)
    build_snapshot(disk / "hf0", shard_bytes=shard)
    repo_disk = disk / "hf0" / "hub" / FOLDER
    size = sum(p.stat().st_size for p in (repo_disk / "blobs").iterdir())
    recipe = folder / "pull-rates.yaml"
    recipe.write_text(
        (ROOT / "src/tandem/recipes/tiny-local.yaml")
        .read_text()
        .replace("name: tiny-local", "name: pull-rates")
        .replace("tandem-org/tiny-deepseek-v3", REPO)
        .replace("  offline: true\n", f"  offline: true\n  revision: {COMMIT}\n")
    )
    cluster = folder / "cluster.yaml"
    nodes = [
        {"name": h.name, "address": h.address, "env": {"HF_HOME": str(home)}}
        for h, home in zip(hosts.hosts, homes)
    ]
    cluster.write_text(
        json.dumps(
            {
                "name": "pullrate",
                "transport": "ssh",
                "nodes": nodes,
                "ssh": {"config_file": str(hosts.config_file), "vllm_command": sys.executable},
            }
        )
    )
    agent = ROOT / "src/tandem/agent.py"
    verify_argv = [
        sys.executable, str(agent), "facts", "--only", "model", "--model", REPO,
        "--revision", COMMIT, "--cache-root", str(disk / "hf0"), "--verify",
    ]  # fmt: skip
    files = sorted(str(p) for p in (repo_disk / "blobs").iterdir())
    cold = drop_caches()
    if not cold:
        timed(["sh", "-c", 'cat "$@" > /dev/null', "cat", *files])  # then both read warm
    read_s, hash_s = [], []
    for _ in range(args.rounds):
        drop_caches()
        read_s.append(timed(["sh", "-c", 'cat "$@" > /dev/null', "cat", *files])[0])
        drop_caches()
        seconds, done = timed(verify_argv)
        facts = json.loads(done.stdout)["model"]
        assert facts["verified_bytes"] == size and not facts["corrupt"], facts
        hash_s.append(seconds)
    shutil.copytree(disk / "hf0", homes[0], symlinks=True)  # the fan-out runs on tmpfs
    repo0 = homes[0] / "hub" / FOLDER
    env = {**os.environ, "TANDEM_HOME": str(folder / "state")}
    pull_s, copy_s, rsync_s = [], [], []
    repo1 = homes[1] / "hub" / FOLDER
    host0 = hosts.hosts[0]
    for _ in range(args.rounds):
        shutil.rmtree(homes[1], ignore_errors=True)
        homes[1].mkdir()
        shutil.rmtree(folder / "state", ignore_errors=True)
        seconds, done = timed(
            [sys.executable, "-m", "tandem.cli", "model", "pull", str(recipe),
             "--cluster", str(cluster)],
            env=env,
        )  # fmt: skip
        copied = re.search(r"copied [\d.]+ GB to host1 in ([\d.]+) s", done.stdout)
        assert copied, done.stdout
        pull_s.append(seconds)
        copy_s.append(float(copied.group(1)))
        shutil.rmtree(homes[1], ignore_errors=True)
        (homes[1] / "hub").mkdir(parents=True)
        ssh = f"ssh -F {hosts.config_file}"
        seconds, _ = timed(
            ["ip", "netns", "exec", hosts.hosts[1].netns, "rsync", "-a", "-e", ssh,
             f"{host0.address}:{repo0}/", f"{repo1}/"]
        )  # fmt: skip
        rsync_s.append(seconds)
    gb = size / 1e9
    read, hashing = statistics.median(read_s), statistics.median(hash_s)
    pull, rsync = statistics.median(pull_s), statistics.median(rsync_s)
    print(
        f"snapshot: {gb:.2f} GB in {len(files)} blobs; {args.rounds} rounds, medians; "
        + ("verification read cold from the disk" if cold else "verification read warm")
    )
    print("| figure | tandem | reference | ratio |")
    print("|---|---:|---:|---:|")
    print(
        f"| verify vs read, GB/s | {gb / hashing:.2f} (sha256, probe) | "
        f"{gb / read:.2f} (cat) | {read / hashing:.3f} |"
    )
    copy = statistics.median(copy_s)
    print(
        f"| fan-out host0 -> host1, GB/s | {gb / copy:.2f} (`model pull`'s copy) | "
        f"{gb / rsync:.2f} (`rsync -a` over ssh) | {rsync / copy:.3f} |"
    )
    print(
        f"| whole pull (probe + verify both + copy), s | {pull:.1f} | {rsync:.1f} (rsync, "
        "nothing verified) | |"
    )
    print(
        f"rounds, s: read {read_s}, verify {hash_s}, pull {pull_s}, copy {copy_s}, rsync {rsync_s}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
