"""What tandem knows of a model snapshot across the nodes, kept under its own state folder.

Two records, both written by tandem and read by the preflight:

- the **manifest** a pull took (``models/REPO_FOLDER/COMMIT.json``, ``hf_cache.SnapshotManifest``):
  every file of the commit with the Hub's id and size, so a node's copy is judged against what
  was published, not only against another node's copy;
- the **verified blobs** of each node (``verified.json``): blob -> (size, mtime) of every file
  whose content was read and found to have its id. The next probe skips a blob while its size
  and mtime are unchanged, so a check after a pull reads nothing again, and a file written
  since (a flipped byte moves the mtime) is read again. sparkrun hashes every file at every
  check; a 160 GB snapshot takes minutes a node that way.

Nothing here is written on the nodes: the records live on the machine that runs tandem, keyed
by node name and address, and by the repo folder the probe resolved on that node.
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from tandem import files, hf_cache, jsonfiles, wire
from tandem.backends.state import state_root
from tandem.errors import BackendError
from tandem.spec.cluster import Node
from tandem.spec.deployment import Deployment

VERIFIED_FILE = "verified.json"

Blobs = dict[str, list[int]]
"""blob -> [size, mtime_ns] of a verified file."""


class VerifiedBlobs(BaseModel):
    """``verified.json``: node key -> repo folder on that node -> the blobs verified there."""

    model_config = ConfigDict(extra="forbid")

    nodes: dict[str, dict[str, Blobs]] = Field(default_factory=dict)


def hf_home_of(node: Node, deployment: Deployment) -> str:
    """The node's Hugging Face home as the remote shell should write it: the node's HF_HOME,
    else the recipe's ``model.cache_root``, else ``~/.cache/huggingface``."""
    return node.env.get(wire.HF_HOME) or deployment.recipe.model.cache_root or hf_cache.DEFAULT_HOME


def model_folder(deployment: Deployment, node: Node) -> str:
    """``HF_HOME/hub/models--ORG--NAME`` on a node."""
    home = PurePosixPath(hf_home_of(node, deployment))
    return str(hf_cache.repo_dir(home, deployment.recipe.model.repo_id))


def node_key(node: Node) -> str:
    """A node's key in the record: its name and address (two clusters may both have a host0)."""
    return f"{node.name}@{node.address}"


def _verified_path() -> Path:
    return state_root() / VERIFIED_FILE


def _load_verified() -> VerifiedBlobs:
    path = _verified_path()
    if not path.exists():
        return VerifiedBlobs()
    return jsonfiles.read_json(
        path,
        VerifiedBlobs,
        what="record of verified snapshots",
        hint=f"remove {path}: every file is then verified again at the next check",
        error=BackendError,
    )


def known(deployment: Deployment) -> dict[str, dict[str, Blobs]]:
    """Node name -> ``{repo_dir: {blob: [size, mtime_ns]}}`` verified before on that node."""
    record = _load_verified()
    return {n.name: record.nodes.get(node_key(n), {}) for n in deployment.cluster.nodes}


def verified_blobs(model: dict[str, Any]) -> Blobs:
    """The blobs of one node's probed snapshot whose content matched its id (or was unchanged
    since it did); a mismatched or unverified file is left out."""
    return {
        f["blob"]: [f["size"], f["mtime_ns"]]
        for f in model.get("files") or []
        if f.get("blob") and f.get("verified") in ("hashed", "remembered") and "mtime_ns" in f
    }


def remember(deployment: Deployment, facts: dict[str, dict[str, Any]]) -> None:
    """Record what each node's probe verified (``facts``: node name -> probe facts). A node's
    entry for that repo folder is replaced, so a file that failed is read again next time."""
    changed = False
    record = _load_verified()
    for node in deployment.cluster.nodes:
        model = (facts.get(node.name) or {}).get("model") or {}
        repo_dir = model.get("repo_dir")
        if not repo_dir or not any(f.get("verified") for f in model.get("files") or []):
            continue
        record.nodes.setdefault(node_key(node), {})[repo_dir] = verified_blobs(model)
        changed = True
    if changed:
        files.private_dir(state_root())
        files.write_json(_verified_path(), record, private=True)


def manifest_path(repo_id: str, commit: str) -> Path:
    """``STATE/models/models--ORG--NAME/COMMIT.json``."""
    folder = hf_cache.repo_dir(Path(), repo_id).name
    return state_root() / "models" / folder / f"{commit}.json"


def save_manifest(manifest: hf_cache.SnapshotManifest) -> Path:
    path = manifest_path(manifest.repo_id, manifest.commit)
    files.private_dir(path.parent)
    return files.write_json(path, manifest, private=True)


def load_manifest(repo_id: str, revision: str) -> hf_cache.SnapshotManifest | None:
    """The manifest a pull recorded for this revision: by commit when the revision is one,
    else the newest recorded for that branch or tag name; None when nothing was pulled."""
    folder = manifest_path(repo_id, "0" * 40).parent
    if not folder.is_dir():
        return None
    found = []
    for path in folder.glob("*.json"):
        manifest = jsonfiles.read_json(
            path,
            hf_cache.SnapshotManifest,
            what="model manifest",
            hint=f"remove {path} and run `tandem model pull` again",
            error=BackendError,
        )
        if revision in (manifest.commit, manifest.revision):
            found.append((path.stat().st_mtime, manifest))
    return max(found, key=lambda pair: pair[0])[1] if found else None
