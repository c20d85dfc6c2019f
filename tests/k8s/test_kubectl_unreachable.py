"""An API server kubectl cannot reach is one line with where it looked and the fix, not
kubectl's stderr repeated per API group (newcomer review, defect 15)."""

from __future__ import annotations

import stat

import pytest

from tandem.backends.k8s import Kubectl
from tandem.errors import KubernetesError

REFUSED = (
    "E1205 06:57:10.172410   17983 memcache.go:381] \"Couldn't get current server API group "
    'list" err="Get \\"http://localhost:8080/api?timeout=32s\\": dial tcp 127.0.0.1:8080: '
    'connect: connection refused"\n'
    * 7
    + "The connection to the server localhost:8080 was refused - did you specify the right "
    "host or port?\n"
)


@pytest.fixture
def kubectl(tmp_path):
    """A kubectl that says what kubectl 1.34 says with no API server at its default address."""
    script = tmp_path / "kubectl"
    (tmp_path / "said").write_text(REFUSED)
    script.write_text(f"#!/bin/sh\ncat {tmp_path / 'said'} >&2\nexit 1\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return Kubectl(str(script), "default")


def test_an_unreachable_api_server_is_one_line_with_the_fix(kubectl):
    with pytest.raises(KubernetesError) as caught:
        kubectl.get_json("customresourcedefinitions.apiextensions.k8s.io", "lws")
    assert str(caught.value.message) == (
        "cannot reach the Kubernetes API (kubectl: connection refused at localhost:8080, the "
        "current context of $KUBECONFIG or ~/.kube/config)"
    )
    assert "kubernetes.context" in caught.value.hint
    with pytest.raises(KubernetesError, match="cannot reach") as again:
        kubectl.run("apply", "-f", "-")
    assert "\n" not in again.value.message


def test_another_failure_keeps_kubectl_s_words(tmp_path):
    script = tmp_path / "kubectl"
    script.write_text(
        "#!/bin/sh\necho 'Error from server (Forbidden): pods is forbidden' >&2\nexit 1\n"
    )
    script.chmod(0o755)
    with pytest.raises(KubernetesError, match="Forbidden"):
        Kubectl(str(script), "default").run("get", "pods")
