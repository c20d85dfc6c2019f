"""A model tandem builds, stored in the Hugging Face cache as a download leaves it: each file a
blob named by its sha256, a snapshot of relative links named by the commit, ``refs/main`` on
it (``tandem.hf_cache`` names the layout). vLLM and transformers then read it offline, and
``tandem check`` verifies it like any downloaded snapshot. Shared by ``tiny``, ``real`` and
``shapes``; writing again what is complete changes nothing."""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tandem import hf_cache


def staged_digests(staging: Path) -> dict[str, str]:
    """Each staged file's sha256 by name, eight files at once (hashlib releases the GIL, and a
    shape model's shards are gigabytes)."""
    paths = sorted(staging.iterdir())
    with ThreadPoolExecutor(max_workers=8) as pool:
        return dict(zip([p.name for p in paths], pool.map(file_sha256, paths), strict=True))


def file_sha256(*parts: Path) -> str:
    """The sha256 of the files' contents one after the other (a GGUF shipped in chunks is
    pinned by the hash of the whole)."""
    digest = hashlib.sha256()
    for part in parts:
        with part.open("rb") as file:
            for chunk in iter(lambda: file.read(1 << 20), b""):
                digest.update(chunk)
    return digest.hexdigest()


def snapshot_commit(digests: dict[str, str]) -> str:
    """The snapshot id: sha1 of the ``name sha256`` lines, sorted by name (40 hex, like git)."""
    manifest = "".join(f"{name} {digests[name]}\n" for name in sorted(digests))
    return hashlib.sha1(manifest.encode()).hexdigest()


def store(repo_dir: Path, staging: Path, digests: dict[str, str], commit: str) -> Path:
    """Move staged files into blobs/, link them from snapshots/<commit>/, point refs/main at it."""
    snapshot = repo_dir / "snapshots" / commit
    blobs = repo_dir / "blobs"
    blobs.mkdir(exist_ok=True)
    if not _complete(snapshot, digests):
        for name, sha in digests.items():
            blob = blobs / sha
            if not blob.exists():
                os.replace(staging / name, blob)
        partial = Path(tempfile.mkdtemp(dir=repo_dir, prefix=".snapshot-"))
        partial.chmod(0o755)  # mkdtemp makes it private; the cache is shared like a download
        for name, sha in digests.items():
            (partial / name).symlink_to(Path("..") / ".." / "blobs" / sha)
        (repo_dir / "snapshots").mkdir(exist_ok=True)
        if snapshot.exists():
            shutil.rmtree(snapshot)
        os.replace(partial, snapshot)
    point_main_at(repo_dir, commit)
    return snapshot


def point_main_at(repo_dir: Path, commit: str) -> None:
    """Write ``refs/main`` unless it already names ``commit``."""
    ref = hf_cache.ref_file(repo_dir, "main")
    if not ref.is_file() or ref.read_text() != commit:
        ref.parent.mkdir(exist_ok=True)
        ref.write_text(commit)


def store_built(repo_dir: Path, staging: Path) -> tuple[Path, str, int]:
    """Store a model built into ``staging`` as the snapshot its contents name: the snapshot's
    folder, its commit and its size in bytes (the same build gives the same commit)."""
    digests = staged_digests(staging)
    commit = snapshot_commit(digests)
    snapshot = store(repo_dir, staging, digests, commit)
    return snapshot, commit, sum((snapshot / name).stat().st_size for name in digests)


def _complete(snapshot: Path, digests: dict[str, str]) -> bool:
    """True when every file of the snapshot links to a blob with the expected name."""
    if not snapshot.is_dir():
        return False
    for name, sha in digests.items():
        link = snapshot / name
        if not link.is_file() or link.resolve().name != sha:
            return False
    return True
