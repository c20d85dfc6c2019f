"""``tandem sync``: every node holds the same image and the same model snapshot before ``up``.

Seed 000 stages the weights "at the same path on both nodes" by hand and pre-pulls the image on
each; eugr's launcher aborts when ``docker image inspect`` ids differ. This module checks both
and repairs what it can:

1. **the model**: ``tandem.backends.pull`` without its download: every node's snapshot probed
   and each file checked against its Hub id, the commit copied node to node from one that holds
   it whole, then verified (a node with a file whose content is not its id is named, not
   overwritten). When no node holds it, ``tandem model pull`` is the command that downloads;
2. **the image** (docker runtime, when the recipe names one): every node's image id and repo
   digests probed in parallel over ssh; ``plan_images`` (pure) gives every node without the
   image (or with another id) a pull (digest-pinned images) or a ``docker save | docker load``
   from a node that has it; then every node is probed again and must match.

A node without room for what it would receive is named before anything is copied (the
snapshot: ``tandem.backends.pull.refuse_short_of_room``; the image: ``refuse_short_of_room``).
"""

from __future__ import annotations

import shlex
import subprocess
from collections.abc import Callable
from dataclasses import dataclass

from tandem.backends.openssh import OpenSSH, SSHTarget
from tandem.backends.pull import Pull, PullReport, gb
from tandem.backends.runtimes import resolve_runtime
from tandem.errors import BackendError, SpecError
from tandem.render.docker import is_pinned
from tandem.spec.cluster import Node, Runtime
from tandem.spec.deployment import Deployment


@dataclass(frozen=True)
class ImageFacts:
    """One node's copy of the image: its id (None when absent), repo digests and size."""

    node: str
    image_id: str | None
    digests: tuple[str, ...] = ()
    size: int | None = None


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

    model: PullReport
    images: dict[str, ImageFacts]
    actions: list[SyncAction]
    verified: bool = False


def image_probe(image: str, docker: str) -> str:
    return (
        # `range`, not `join`: docker's template refuses `join` on an image without repo
        # digests (a `docker import`ed or locally built one): "expected []string".
        f"{docker} image inspect --format "
        "'{{.Id}} {{.Size}} {{range .RepoDigests}}{{.}} {{end}}' "
        f"{shlex.quote(image)} 2>/dev/null || echo missing\n"
    )


def parse_image(node: str, text: str) -> ImageFacts:
    words = text.split()
    if not words or words[0] == "missing":
        return ImageFacts(node=node, image_id=None)
    return ImageFacts(node=node, image_id=words[0], size=int(words[1]), digests=tuple(words[2:]))


def room_probe(docker: str) -> str:
    """Docker's root folder on a node and the kB free on its filesystem, on one line."""
    return (
        f"root=$({docker} info --format '{{{{.DockerRootDir}}}}' 2>/dev/null) "
        "|| root=/var/lib/docker\n"
        'echo "$(df -Pk "$root" 2>/dev/null | awk \'NR == 2 {print $4}\') $root"\n'
    )


def refuse_short_of_room(
    copies: list[SyncAction], images: dict[str, ImageFacts], rooms: dict[str, str]
) -> None:
    """Refuse, before anything is copied, every target whose docker root cannot take the image:
    ``docker load`` first writes the whole archive out under its root (the size of the image)
    and then unpacks its layers beside it (up to that size again), so a copy needs twice the
    image's size free there, or it stops at "no space left on device" after minutes.

    Raises:
        BackendError: naming each such node, its root, what it has and what the copy needs.
    """
    short = []
    for action in copies:
        size = images[action.source or ""].size
        free_kb, _, root = rooms.get(action.target, "").strip().partition(" ")
        if size is None or not free_kb.isdigit():
            continue
        if 2 * size > int(free_kb) * 1024:
            short.append(
                f"{action.target} has {gb(int(free_kb) * 1024)} free under {root}, "
                f"the copy needs {gb(2 * size)} (the {gb(size)} archive and its layers)"
            )
    if short:
        raise BackendError(
            f"not enough room for image {copies[0].detail}: " + "; ".join(short),
            field="engine.image",
            hint="free space there (docker image prune removes images no container uses), or "
            "move docker's data-root to a disk with room; nothing was copied",
        )


def plan_images(images: dict[str, ImageFacts], image: str | None, leader: str) -> list[SyncAction]:
    """The repairs that give every node the leader's image (pure): a pull where the image is
    pinned by digest, else a copy from a node that holds it.

    Raises:
        BackendError: no node holds an image that is not pinned.
    """
    actions: list[SyncAction] = []
    if not image or not images:
        return actions
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
                hint="pin it (repo@sha256:...) so nodes can pull it, or load it on one node first",
            )
    return actions


def _targets(deployment: Deployment) -> dict[str, tuple[Node, SSHTarget]]:
    return {n.name: (n, SSHTarget.of(n)) for n in deployment.cluster.nodes}


def probe_images(deployment: Deployment, ssh: OpenSSH) -> dict[str, ImageFacts]:
    """Every node's copy of the recipe's image, probed in parallel ({} without docker)."""
    image = deployment.recipe.engine.image
    if not image or resolve_runtime(deployment.cluster.ssh, image) is not Runtime.DOCKER:
        return {}
    docker = deployment.cluster.ssh.docker_command
    found = ssh.run_all(
        {
            name: (target, image_probe(image, docker))
            for name, (_, target) in _targets(deployment).items()
        },
        timeout_s=120,
    )
    return {name: parse_image(name, r.stdout) for name, r in found.items()}


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
    on: str | None = None,
    bwlimit: str | None = None,
    on_event: Callable[[str], None] = lambda text: None,
) -> SyncReport:
    """Probe, repair and verify every node's model snapshot and image.

    ``on``: the node to copy from when it holds them (default: the leader, then any that does),
    as ``model pull --on``; ``bwlimit``: rsync's cap on each node's copy of the snapshot.

    Raises:
        BackendError: nothing to copy from, a copy failed, or nodes still differ afterwards.
        SpecError: ``on`` names no node of the cluster.
    """
    ssh = OpenSSH.for_cluster(deployment.cluster)
    nodes = _targets(deployment)
    docker = deployment.cluster.ssh.docker_command
    if on is not None and on not in nodes:
        raise SpecError(
            f"--on {on}: the cluster has no such node",
            field="--on",
            hint=f"name one of {', '.join(nodes)}",
        )
    leader = on or deployment.cluster.leader.name
    image = deployment.recipe.engine.image
    images = probe_images(deployment, ssh)
    for held in images.values():
        on_event(f"{held.node}: image {held.image_id or 'missing'}")
    image_actions = plan_images(images, image, leader)  # refuses before any copy
    copies = [a for a in image_actions if a.kind == "copy-image"]
    if copies:
        rooms = ssh.run_all(
            {a.target: (nodes[a.target][1], room_probe(docker)) for a in copies}, timeout_s=60
        )
        refuse_short_of_room(copies, images, {n: r.stdout for n, r in rooms.items()})
    model = Pull(deployment, bwlimit=bwlimit, on_event=on_event).run(
        on=on, download=False, dry_run=dry_run
    )
    actions = [
        SyncAction("copy-snapshot", node, model.source, f"{size:,} bytes missing or other")
        for node, size in model.need.items()
    ] + image_actions
    report = SyncReport(model=model, images=images, actions=actions)
    if dry_run:
        return report
    for action in image_actions:
        on_event(str(action))
        if action.kind == "copy-image":
            copy_image(deployment, ssh, action, on_event)
        else:
            ssh.run(
                nodes[action.target][1],
                f"{docker} pull {shlex.quote(action.detail)}\n",
                timeout_s=3600,
            )
    if image_actions:
        report.images = probe_images(deployment, ssh)
        left = plan_images(report.images, image, leader)
        if left:
            raise BackendError("nodes still differ after sync: " + "; ".join(map(str, left)))
    report.verified = True
    on_event("verified: every node holds the same snapshot" + (" and image" if images else ""))
    return report
