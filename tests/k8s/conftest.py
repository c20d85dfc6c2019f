"""Fixtures of the Kubernetes tests: the LWS CRD file, a real API server (session-wide), and a
real cluster with two kubelet nodes (module-wide; ``kube_cluster``).

Without a built Kubernetes the server and cluster tests skip, except under CI (``CI=true``),
where the build is awaited and a missing program is a failure: ``.ci/run`` starts
``scripts/build-kubernetes.sh`` in the background at the lowest priority, these tests run after
the other engine tests (``tests/conftest.py``), and the first fixture that finds no program
waits for that build through its lock (or builds, where none runs).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import docker_hosts
import pytest

from k8s import kube_cluster as cluster_module
from k8s.apiserver import CACHE_ROOT, LWS_CRD, ApiServer, apiserver_binary

IN_CI = os.environ.get("CI", "").lower() == "true"
BUILD = Path(__file__).resolve().parents[2] / "scripts" / "build-kubernetes.sh"


def _await_build() -> None:
    """Under CI, the programs once the build is done: the script waits for a running build on
    its lock, then finds the programs and exits at once."""
    if IN_CI:
        subprocess.run([str(BUILD), str(CACHE_ROOT)], stdout=subprocess.DEVNULL, check=False)


@contextmanager
def _kubeconfig(path: Path) -> Iterator[None]:
    """``KUBECONFIG`` pointing at ``path`` (what tandem's kubectl reads) inside the block, as it
    was after."""
    old = os.environ.get("KUBECONFIG")
    os.environ["KUBECONFIG"] = str(path)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("KUBECONFIG", None)
        else:
            os.environ["KUBECONFIG"] = old


def _missing(what: str, fix: str) -> None:
    if IN_CI:
        pytest.fail(f"{what} (required under CI=true): {fix}")
    pytest.skip(f"{what}: {fix}")


@pytest.fixture(scope="session")
def lws_crd() -> Path:
    """The LeaderWorkerSet CRD YAML (LWS v0.10.0, in ``tests/k8s/crd/``)."""
    return LWS_CRD


@pytest.fixture(scope="session")
def apiserver(lws_crd: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiServer]:
    """etcd + kube-apiserver 1.20.2 on loopback with the LWS CRD installed; KUBECONFIG is set
    for the session so that tandem's own kubectl calls reach it."""
    binary = apiserver_binary()
    if binary is None:
        _await_build()
        binary = apiserver_binary()
    if binary is None:
        _missing(
            "kube-apiserver is not built",
            "run scripts/build-kubernetes.sh (about 4 min once, then cached)",
        )
    server = ApiServer(workdir=tmp_path_factory.mktemp("apiserver"), binary=binary)
    try:
        server.start()
        server.install_lws_crd(lws_crd)
        with _kubeconfig(server.kubeconfig):
            yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def kube_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[cluster_module.KubeCluster]:
    """The two-node cluster (``k8s.kube_cluster``), with the engine image in both nodes'
    containerd; KUBECONFIG is set while it runs, so that tandem's kubectl reaches it. Booted
    once per module, and everything it started is gone when the module is done."""
    reason = cluster_module.available()
    if reason and cluster_module.programs_folder() is None:
        _await_build()
        reason = cluster_module.available()
    if reason:
        _missing("the Kubernetes test bed cannot start", reason)
    image = docker_hosts.built_image()
    reason = cluster_module.short_of_room(image)
    if reason:
        pytest.skip(reason)
    cluster = cluster_module.KubeCluster(tmp_path_factory.mktemp("kube"), image)
    try:
        cluster.start()
        with _kubeconfig(cluster.kubeconfig):
            yield cluster
    finally:
        cluster.stop()
