"""The rank plan as ``docker run`` commands: one container per rank, one rank per node.

The container settings are those both seed deployments run with, so a rank behaves as it does
under seed 002's eugr launcher and seed 000's LeaderWorkerSet pods:

- host network and host IPC (``--network host --ipc host``): the ranks meet on the nodes' own
  addresses, and NCCL finds the RDMA devices;
- ``--privileged --cap-add IPC_LOCK --ulimit memlock=-1`` and ``/dev/infiniband`` for RDMA
  (seed 000's securityContext and hostPath; the device only with ``transport: ib``);
- a memory-backed ``/dev/shm`` of the recipe's ``shm_size`` (seed 000's 64Gi emptyDir; with host
  IPC docker would ignore ``--shm-size``, so it is a tmpfs mount);
- the Hugging Face cache mounted from the host at ``/cache/huggingface`` with ``HF_HOME``
  pointing there (seed 000's hf-cache hostPath). A mount source is an absolute path on the
  node, or one in the node user's home (``~/.cache/huggingface``, the default), which the shell
  form writes ``"$HOME"/.cache/huggingface`` so the node expands it (``tandem.render.
  shellwords``; docker takes a relative or quoted-``~`` source for a volume name and refuses
  it). The recipe and inventory refuse any other source when they are read
  (``tandem.spec.paths``). The JSON form keeps the ``~/``: expand it on the node first;
- the rank's compile cache root on the node (``tandem.caches``: ``ssh.remote_dir/DEPLOYMENT/
  caches/rankN``) mounted at ``/cache/tandem``, with vLLM's, Inductor's, Triton's, FlashInfer's,
  DeepGEMM's and TileLang's cache variables pointing into it, so a new container starts warm;
- the node's GPUs (``--gpus`` with the cluster's ``ssh.docker_gpus``, ``all`` by default,
  left out when it is null: CPU nodes), the rank's environment as ``-e`` flags, and
  ``vllm serve ...`` exactly as the process target prints it.

Secret variables (``HF_TOKEN``...) are written as ``-e NAME`` without a value, so docker takes
them from the environment of the shell that runs the command and they never appear in text.
This module is pure: it only builds argv lists and text.
"""

from __future__ import annotations

import json
import shlex

from tandem import caches, wire
from tandem.errors import RecipeError
from tandem.rankplan import RankPlan, RankSpec
from tandem.redact import is_secret
from tandem.render import shellwords
from tandem.render.commands import shell_blocks
from tandem.spec.deployment import Deployment

LABEL_DEPLOYMENT = "tandem.deployment"
LABEL_RANK = "tandem.rank"


def container_name(deployment: str, rank: int) -> str:
    """The container of a rank, e.g. ``tandem-deepseek-v4-flash-rank1``."""
    return f"tandem-{deployment}-rank{rank}"


def image_of(deployment: Deployment) -> str:
    """The recipe's image; raises when there is none."""
    image = deployment.recipe.engine.image
    if not image:
        raise RecipeError(
            f"recipe '{deployment.name}' names no container image",
            field="engine.image",
            hint="set engine.image (ideally repo@sha256:...), or use the venv "
            "runtime (cluster ssh.runtime: venv)",
        )
    return image


def is_pinned(image: str) -> bool:
    """True when the image is pinned by digest (``repo@sha256:...``)."""
    return "@sha256:" in image


def docker_run_argv(
    rank: RankSpec, deployment: Deployment, *, image: str | None = None, docker: str = "docker"
) -> list[str]:
    """The ``docker run`` command of one rank (detached, named, labelled).

    Args:
        image: overrides the recipe's image, e.g. with the digest resolved on the nodes.
        docker: the docker CLI, e.g. ``sudo docker``.
    """
    image = image or image_of(deployment)
    argv = [
        *shlex.split(docker),
        "run",
        "--detach",
        "--name",
        container_name(deployment.name, rank.rank),
        "--label",
        f"{LABEL_DEPLOYMENT}={deployment.name}",
        "--label",
        f"{LABEL_RANK}={rank.rank}",
        "--network",
        "host",
        "--ipc",
        "host",
        "--privileged",
        "--cap-add",
        "IPC_LOCK",
        "--ulimit",
        "memlock=-1",
        "--tmpfs",
        f"/dev/shm:rw,nosuid,nodev,size={deployment.recipe.shm_size}",
    ]
    if deployment.cluster.ssh.docker_gpus:
        argv += ["--gpus", deployment.cluster.ssh.docker_gpus]
    for mount in rank.mounts:
        if mount.kind == "device":
            argv += ["--device", f"{mount.source}:{mount.target}"]
        else:  # from the node's own setting of the mount's variable (e.g. HF_HOME), if any
            source = rank.env.get(mount.env, mount.source) if mount.env else mount.source
            argv += ["--volume", f"{source}:{mount.target}"]
    cache = caches.remote_root(deployment.cluster.ssh.remote_dir, deployment.name, rank.rank)
    argv += ["--volume", f"{cache}:{wire.CONTAINER_CACHE_ROOT}"]
    # the environment as the container sees it: the mounts' variables point at their targets
    mounted = {mount.env: mount.target for mount in rank.mounts if mount.env}
    env = {**rank.env, **mounted, **caches.cache_env(wire.CONTAINER_CACHE_ROOT)}
    for key, value in env.items():
        argv += ["--env", key if is_secret(key) else f"{key}={value}"]
    argv += ["--entrypoint", rank.argv[0], image, *rank.argv[1:]]
    return argv


def shell_command(argv: list[str]) -> str:
    """A docker command as shell text, one option per line (words as ``shellwords.quote``)."""
    quoted = [shellwords.quote(a) for a in argv]
    start = next(i for i, a in enumerate(argv) if a == "run") + 1
    lines = [" ".join(quoted[:start])]
    i = start
    while i < len(argv):
        takes_value = argv[i].startswith("--") and argv[i] not in ("--detach", "--privileged")
        if argv[i] == "--entrypoint":  # entrypoint, image, then the serve command on one line
            lines.append(" ".join(quoted[i : i + 3]))
            lines.append(" ".join(quoted[i + 3 :]))
            break
        if takes_value and i + 1 < len(argv):
            lines.append(f"{quoted[i]} {quoted[i + 1]}")
            i += 2
        else:
            lines.append(quoted[i])
            i += 1
    return " \\\n  ".join(line for line in lines if line)


def to_shell(plan: RankPlan, deployment: Deployment) -> str:
    """Every node's ``docker run``, workers first, each headed by where it runs."""
    image = image_of(deployment)
    note = (
        ""
        if is_pinned(image)
        else f"\n# note: {image} is a tag, not a digest; `tandem up` pins it to the "
        "digest found on the nodes, and `tandem sync` makes them agree"
    )
    return shell_blocks(
        plan,
        "container",
        lambda rank: shell_command(docker_run_argv(rank, deployment, image=image)),
        note,
    )


def to_json(plan: RankPlan, deployment: Deployment) -> str:
    """``{"ranks": [{"rank", "node", "role", "start_order", "argv"}]}`` in start order."""
    image = image_of(deployment)
    return json.dumps(
        {
            "deployment": plan.deployment,
            "endpoint": plan.endpoint,
            "ranks": [
                {
                    "rank": r.rank,
                    "node": r.node,
                    "role": r.role.value,
                    "start_order": r.start_order,
                    "argv": docker_run_argv(r, deployment, image=image),
                }
                for r in plan.in_start_order()
            ],
        },
        indent=2,
    )


def render(plan: RankPlan, deployment: Deployment, fmt: str) -> str:
    """The ``docker`` target: ``fmt`` is ``shell`` or ``json``."""
    return to_json(plan, deployment) if fmt == "json" else to_shell(plan, deployment)
