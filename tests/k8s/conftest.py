"""Fixtures of the Kubernetes tests: the LWS CRD file, and a real API server (session-wide).

Without a built kube-apiserver the server tests skip, except under CI (``CI=true``), where a
missing binary is a failure: ``.ci/run`` builds it with ``scripts/build-kube-apiserver.sh``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from k8s.apiserver import LWS_CRD, ApiServer, apiserver_binary

IN_CI = os.environ.get("CI", "").lower() == "true"


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
        _missing(
            "kube-apiserver is not built",
            "run scripts/build-kube-apiserver.sh (about 6 min once, then cached)",
        )
    server = ApiServer(workdir=tmp_path_factory.mktemp("apiserver"), binary=binary)
    old = os.environ.get("KUBECONFIG")
    try:
        server.start()
        server.install_lws_crd(lws_crd)
        os.environ["KUBECONFIG"] = str(server.kubeconfig)
        yield server
    finally:
        server.stop()
        if old is None:
            os.environ.pop("KUBECONFIG", None)
        else:
            os.environ["KUBECONFIG"] = old
