"""``tandem sync``: every node holds the same image and the same model snapshot before ``up``.

Seed 000 stages the weights "at the same path on both nodes" by hand and pre-pulls the image on
each; eugr's launcher aborts when ``docker image inspect`` ids differ. This module checks both
and repairs what it can:

1. **probe** every node in parallel over ssh: the image id and repo digests (docker runtime,
   when the recipe has an image), and the snapshot's files with their sizes under the node's
   Hugging Face home (``HF_HOME`` of the node, else the recipe's ``model.cache_root``, else
   ``~/.cache/huggingface``), for the recipe's revision;
2. **plan** (pure, ``plan_sync``): the reference is the node with the most complete snapshot
   (the leader on a tie); every node whose files or sizes differ gets a copy; every node
   without the image (or with another id) gets a pull (digest-pinned images) or a copy;
3. **copy**: the model folder (``hub/models--ORG--NAME``: blobs, refs, snapshots, symlinks kept)
   with ``rsync -a`` from the reference node through this machine (which already reaches every
   node; the nodes need no keys for each other), staged under the state folder so a repeated
   sync only moves what changed; images with ``docker pull`` or ``docker save | docker load``;
4. **verify**: probe again and fail unless every node now matches.
"""

from __future__ import annotations

import shlex
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from tandem import hf_cache, wire
from tandem.backends.openssh import OpenSSH, SSHTarget
from tandem.backends.runtimes import resolve_runtime
from tandem.backends.state import state_root
from tandem.errors import BackendError
from tandem.render import shellwords
from tandem.render.docker import is_pinned
from tandem.spec.cluster import Node, Runtime
from tandem.spec.deployment import Deployment


@dataclass(frozen=True)
class SnapshotFacts:
    """One node's copy of the model: the commit it resolves to and its files' sizes."""

    node: str
    commit: str | None
    files: dict[str, int] = field(default_factory=dict)

    @property
    def present(self) -> bool:
        return bool(self.files)


@dataclass(frozen=True)
class ImageFacts:
    """One node's copy of the image: its id (None when absent) and repo digests."""

    node: str
    image_id: str | None
    digests: tuple[str, ...] = ()


@dataclass(frozen=True)
class SyncAction:
    """One repair: ``copy-snapshot`` or ``copy-image`` from a node, or ``pull-image``."""

    kind: str
    target: str
    source: str | None = None
    detail: str = ""

    def __str__(self) -> str:
        origin = f" from {self.source}" if self.source else ""
        return f"{self.kind} to {self.target}{origin}: {self.detail}".rstrip(": ")


@dataclass
class SyncReport:
    """What ``sync`` found, did, and found afterwards."""

    snapshots: dict[str, SnapshotFacts]
    images: dict[str, ImageFacts]
    actions: list[SyncAction]
    verified: bool = False


def hf_home_of(node: Node, deployment: Deployment) -> str:
    """The node's Hugging Face home as the remote shell should write it."""
    return node.env.get(wire.HF_HOME) or deployment.recipe.model.cache_root or hf_cache.DEFAULT_HOME


def model_folder(deployment: Deployment, node: Node) -> str:
    """``HF_HOME/hub/models--ORG--NAME`` on a node."""
    home = PurePosixPath(hf_home_of(node, deployment))
    return str(hf_cache.repo_dir(home, deployment.recipe.model.repo_id))


def snapshot_probe(deployment: Deployment, node: Node) -> str:
    """A script printing ``commit REV`` and then ``PATH SIZE`` per file of the snapshot."""
    folder = shellwords.quote(model_folder(deployment, node))
    revision = shlex.quote(deployment.recipe.model.revision)
    return (
        f'm={folder}; rev=$(cat "$m"/refs/{revision} 2>/dev/null || echo {revision})\n'
        'echo "commit $rev"\n'
        'if [ -d "$m/snapshots/$rev" ]; then cd "$m/snapshots/$rev" && '
        "find -L . -type f -printf '%P %s\\n' | sort; fi\n"
    )


def image_probe(image: str, docker: str) -> str:
    return (
        # `range`, not `join`: docker's template refuses `join` on an image without repo
        # digests (a `docker import`ed or locally built one): "expected []string".
        f"{docker} image inspect --format "
        "'{{.Id}} {{range .RepoDigests}}{{.}} {{end}}' "
        f"{shlex.quote(image)} 2>/dev/null || echo missing\n"
    )


def parse_snapshot(node: str, text: str) -> SnapshotFacts:
    lines = text.splitlines()
    commit = lines[0].split(maxsplit=1)[1] if lines and lines[0].startswith("commit ") else None
    files = {}
    for line in lines[1:]:
        path, _, size = line.rpartition(" ")
        if path and size.isdigit():
            files[path] = int(size)
    return SnapshotFacts(node=node, commit=commit, files=files)


def parse_image(node: str, text: str) -> ImageFacts:
    words = text.split()
    if not words or words[0] == "missing":
        return ImageFacts(node=node, image_id=None)
    return ImageFacts(node=node, image_id=words[0], digests=tuple(words[1:]))


def plan_sync(
    snapshots: dict[str, SnapshotFacts],
    images: dict[str, ImageFacts],
    image: str | None,
    leader: str,
) -> list[SyncAction]:
    """The repairs that make every node match the best node (pure).

    Raises:
        BackendError: no node holds the snapshot, or no node holds an unpinned image.
    """
    actions: list[SyncAction] = []
    if snapshots:
        best = max(snapshots.values(), key=lambda s: (len(s.files), s.node == leader))
        if not best.present:
            raise BackendError(
                "no node holds the model snapshot",
                hint="download it on one node (`hf download REPO` with HF_HOME "
                "set as the node's), then run `tandem sync` again",
            )
        for facts in snapshots.values():
            if facts.files != best.files:
                missing = len(set(best.files) - set(facts.files))
                differ = sum(1 for f, s in facts.files.items() if best.files.get(f, s) != s)
                actions.append(
                    SyncAction(
                        "copy-snapshot",
                        facts.node,
                        best.node,
                        f"{missing} file(s) missing, {differ} of another size",
                    )
                )
    if image and images:
        reference = next((f for f in images.values() if f.node == leader and f.image_id), None)
        reference = reference or next((f for f in images.values() if f.image_id), None)
        for held in images.values():
            if reference and held.image_id == reference.image_id:
                continue
            if is_pinned(image):
                actions.append(SyncAction("pull-image", held.node, None, image))
            elif reference:
                actions.append(SyncAction("copy-image", held.node, reference.node, image))
            else:
                raise BackendError(
                    f"no node holds image {image} and it is not pinned by digest",
                    field="engine.image",
                    hint="pin it (repo@sha256:...) so nodes can pull it, or "
                    "load it on one node first",
                )
    return actions


def _targets(deployment: Deployment) -> dict[str, tuple[Node, SSHTarget]]:
    return {n.name: (n, SSHTarget.of(n)) for n in deployment.cluster.nodes}


def probe(
    deployment: Deployment, ssh: OpenSSH
) -> tuple[dict[str, SnapshotFacts], dict[str, ImageFacts]]:
    """The snapshot and image facts of every node, probed in parallel."""
    nodes = _targets(deployment)
    found = ssh.run_all(
        {
            name: (target, snapshot_probe(deployment, node))
            for name, (node, target) in nodes.items()
        },
        timeout_s=120,
    )
    snapshots = {name: parse_snapshot(name, r.stdout) for name, r in found.items()}
    images: dict[str, ImageFacts] = {}
    image = deployment.recipe.engine.image
    if image and resolve_runtime(deployment.cluster.ssh, image) is Runtime.DOCKER:
        docker = deployment.cluster.ssh.docker_command
        found = ssh.run_all(
            {name: (target, image_probe(image, docker)) for name, (_, target) in nodes.items()},
            timeout_s=120,
        )
        images = {name: parse_image(name, r.stdout) for name, r in found.items()}
    return snapshots, images


def _rsync(argv: list[str], ssh: OpenSSH) -> None:
    ssh.control_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode:
        raise BackendError(
            f"`{shlex.join(argv)}` failed: {done.stderr.strip()[-500:]}",
            hint="is rsync installed on the nodes and on this machine?",
        )


def _remote_path(target: SSHTarget, path: str) -> str:
    return f"{target.destination}:{path}"


def copy_snapshot(
    deployment: Deployment, ssh: OpenSSH, action: SyncAction, on_event: Callable[[str], None]
) -> None:
    """rsync the model folder from the source node through this machine to the target node."""
    nodes = _targets(deployment)
    source_node, source = nodes[action.source or ""]
    target_node, target = nodes[action.target]
    staging = state_root() / "sync" / Path(model_folder(deployment, source_node)).name
    staging.mkdir(parents=True, exist_ok=True)
    src = model_folder(deployment, source_node)
    dst = model_folder(deployment, target_node)
    on_event(f"rsync {source.node}:{src} -> {target.node}:{dst} (staged in {staging})")
    _rsync(
        [
            "rsync",
            "-a",
            "-e",
            ssh.rsync_shell(source),
            _remote_path(source, src) + "/",
            f"{staging}/",
        ],
        ssh,
    )
    ssh.run(target, f"mkdir -p {shellwords.quote(dst)}\n")
    _rsync(
        [
            "rsync",
            "-a",
            "-e",
            ssh.rsync_shell(target),
            f"{staging}/",
            _remote_path(target, dst) + "/",
        ],
        ssh,
    )


def copy_image(
    deployment: Deployment, ssh: OpenSSH, action: SyncAction, on_event: Callable[[str], None]
) -> None:
    """``docker save`` on the source node piped into ``docker load`` on the target node."""
    nodes = _targets(deployment)
    docker = deployment.cluster.ssh.docker_command
    _, source = nodes[action.source or ""]
    _, target = nodes[action.target]
    on_event(f"docker save {action.detail} on {source.node} | docker load on {target.node}")
    save = subprocess.Popen(
        ssh.argv(source, [*shlex.split(docker), "save", action.detail]), stdout=subprocess.PIPE
    )
    load = subprocess.run(
        ssh.argv(target, [*shlex.split(docker), "load"]),
        stdin=save.stdout,
        capture_output=True,
        text=True,
    )
    save.wait()
    if save.returncode or load.returncode:
        raise BackendError(
            f"copying image {action.detail} to {target.node} failed: {load.stderr.strip()[-300:]}",
            node=target.node,
        )


def sync(
    deployment: Deployment,
    *,
    dry_run: bool = False,
    on_event: Callable[[str], None] = lambda text: None,
) -> SyncReport:
    """Probe, repair and verify every node's image and model snapshot.

    Raises:
        BackendError: nothing to copy from, a copy failed, or nodes still differ afterwards.
    """
    ssh = OpenSSH.for_cluster(deployment.cluster)
    leader = deployment.cluster.leader.name
    snapshots, images = probe(deployment, ssh)
    for facts in snapshots.values():
        on_event(
            f"{facts.node}: snapshot {facts.commit or '?'}, {len(facts.files)} file(s), "
            f"{sum(facts.files.values()):,} bytes"
        )
    for held in images.values():
        on_event(f"{held.node}: image {held.image_id or 'missing'}")
    actions = plan_sync(snapshots, images, deployment.recipe.engine.image, leader)
    report = SyncReport(snapshots=snapshots, images=images, actions=actions)
    if dry_run or not actions:
        report.verified = not actions
        return report
    nodes = _targets(deployment)
    docker = deployment.cluster.ssh.docker_command
    for action in actions:
        on_event(str(action))
        if action.kind == "copy-snapshot":
            copy_snapshot(deployment, ssh, action, on_event)
        elif action.kind == "copy-image":
            copy_image(deployment, ssh, action, on_event)
        else:
            ssh.run(
                nodes[action.target][1],
                f"{docker} pull {shlex.quote(action.detail)}\n",
                timeout_s=3600,
            )
    after, after_images = probe(deployment, ssh)
    left = plan_sync(after, after_images, deployment.recipe.engine.image, leader)
    if left:
        raise BackendError("nodes still differ after sync: " + "; ".join(map(str, left)))
    report.snapshots, report.images, report.verified = after, after_images, True
    on_event("verified: every node holds the same snapshot" + (" and image" if images else ""))
    return report
