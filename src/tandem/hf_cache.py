"""The Hugging Face cache, as tandem finds a model in it: the default home and the hub layout.

``HF_HOME`` (default ``~/.cache/huggingface``) holds ``hub/``, and a model repo's folder there
is ``hub/models--ORG--NAME`` with ``refs/REVISION`` (a commit), ``snapshots/COMMIT/FILE``
(links into ``blobs/``). The folder name is huggingface_hub's own (``repo_folder_name``); the
paths work for this machine (``Path``) and for a node's (``PurePosixPath``, ``~`` unexpanded).
The node agent (``tandem/agent.py``) is a stdlib-only script and keeps its own copy of
the layout; ``tests/test_hf_cache.py`` holds the two together.

``SnapshotManifest`` is one commit's files with the Hub's ids (blob name and size), what a
pull records and every node is checked against.

Pure, except ``local_home``, which reads ``$HF_HOME`` of this process.
"""

from __future__ import annotations

import os
from pathlib import Path, PurePath
from typing import TypeVar

from pydantic import BaseModel, ConfigDict, Field

from tandem import wire

DEFAULT_HOME = "~/.cache/huggingface"
"""The Hugging Face home when ``HF_HOME`` is unset, as a node's shell writes it (not expanded:
a remote ``~`` is the remote user's)."""

P = TypeVar("P", bound=PurePath)


def local_home() -> Path:
    """This machine's Hugging Face home: ``$HF_HOME``, else ``~/.cache/huggingface``."""
    return Path(os.environ.get(wire.HF_HOME) or Path(DEFAULT_HOME).expanduser())


def repo_dir(home: P, repo_id: str) -> P:
    """``HOME/hub/models--ORG--NAME``: one model repo's folder under a Hugging Face home."""
    # Imported here: the module holding it loads huggingface_hub's whole download stack
    # (httpx, tqdm, filelock; 0.3 s), which every `tandem` command would pay at start-up.
    from huggingface_hub.file_download import repo_folder_name

    return home / "hub" / repo_folder_name(repo_id=repo_id, repo_type="model")


def snapshot_dir(repo: P, commit: str) -> P:
    """``REPO/snapshots/COMMIT``: the files of one commit."""
    return repo / "snapshots" / commit


def ref_file(repo: P, revision: str) -> P:
    """``REPO/refs/REVISION``: the commit a branch or tag name points at."""
    return repo / "refs" / revision


class ManifestFile(BaseModel):
    """One file of a snapshot as the Hub published it: its blob id and size."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    blob: str = Field(description="The blob's name: sha256 (LFS file) or git blob id (small).")
    size: int = Field(ge=0)


class SnapshotManifest(BaseModel):
    """The files of one commit of a model repo with the Hub's ids: what every node must hold.

    ``tandem model pull`` records it from the node it downloaded on, once that copy is verified
    (the cache names each blob by the id the Hub gave it, and the content was checked against
    it), so a node that lacks a file, holds a shorter one or serves another commit is named
    against it, not only against its peers.
    """

    model_config = ConfigDict(extra="forbid")

    repo_id: str
    revision: str = Field(description="The revision asked for (a branch, tag or commit).")
    commit: str = Field(pattern=r"^[0-9a-f]{40}$", description="The commit it resolved to.")
    files: dict[str, ManifestFile]

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files.values())
