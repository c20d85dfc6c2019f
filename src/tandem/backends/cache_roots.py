"""Clearing the compile cache roots of a deployment on its nodes (`tandem down --purge-caches`).

Where they are is ``tandem.caches``; this module does the file work: on this machine directly,
on ssh nodes with one shell line each over the shared connection. ``down`` never calls
``purge``; only ``tandem down --purge-caches`` does, so every other stop and every supervised
restart starts warm.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from pathlib import PurePosixPath

from tandem import caches, ownership
from tandem.backends.openssh import OpenSSH, SSHTarget
from tandem.backends.state import state_root
from tandem.errors import BackendError
from tandem.spec.cluster import Cluster, Transport


def purge(
    name: str, cluster: Cluster | None, *, on_event: Callable[[str], None] = lambda text: None
) -> list[str]:
    """Remove every rank's cache root of deployment ``name``; return what could not be removed.

    ``cluster`` None means this machine (the local transport).

    Raises:
        BackendError: on Kubernetes, whose hostPaths tandem cannot reach (the hint says how).
    """
    ownership.check_name(name)
    if cluster is None or cluster.transport is Transport.LOCAL:
        root = state_root() / "caches"
        folder = caches.local_deployment_root(state_root(), name)
        try:
            removed = ownership.remove_tree(folder, root=root)
        except OSError:
            return [str(folder)]
        on_event(
            f"removed the compile caches of '{name}' ({folder})"
            if removed
            else f"'{name}' had no compile caches on this machine ({folder} does not exist)"
        )
        return []
    if cluster.transport is Transport.SSH:
        remote = ownership.inside_remote(
            caches.remote_deployment_root(cluster.ssh.remote_dir, name),
            PurePosixPath(cluster.ssh.remote_dir),
        )
        quoted = shlex.quote(str(remote))
        script = (
            f"if [ ! -e {quoted} ]; then echo none; exit 0; fi\n"
            f"rm -rf {quoted} 2>/dev/null; if [ -e {quoted} ]; then echo left; fi\n"
        )
        results = OpenSSH.for_cluster(cluster).run_all(
            {node.name: (SSHTarget.of(node), script) for node in cluster.nodes},
            timeout_s=120,
            check=False,
        )
        held = [n for n, r in results.items() if r.ok and "none" not in r.stdout]
        on_event(
            f"removed the compile caches of '{name}' ({remote}) on {', '.join(map(str, held))}"
            if held
            else f"'{name}' had no compile caches on any node ({remote} does not exist)"
        )
        return [
            f"{remote} on {node}"
            for node, result in results.items()
            if not result.ok or "left" in result.stdout
        ]
    raise BackendError(
        f"tandem cannot clear the hostPath caches of '{name}' on Kubernetes nodes",
        hint=f"on each node: sudo rm -rf {caches.k8s_host_root(name)}",
    )
