"""``tandem check`` over SSH: the probe and the fabric ranks on remote nodes.

Implements ``tandem.check.node_transport.NodeTransport`` with tandem's OpenSSH transport, so the
preflight that ``tandem up`` runs reaches ssh nodes exactly as the launch does (same
ssh_config, same shared connection). The probe script travels on stdin (``python3 -``), with
the node's own variables (``nodes[].env``, e.g. HF_HOME) exported first.

An unreachable node or a refused key raises ``SSHError`` at once, since nothing can be checked;
a probe that runs and fails becomes that node's ``probe_error`` finding.
"""

from __future__ import annotations

import subprocess
import time
from typing import IO, Any

from tandem import agent
from tandem.backends.openssh import OpenSSH, SSHTarget, engine_python
from tandem.check.node_transport import (
    Verification,
    finished_probe,
    probe_args,
)
from tandem.interrupts import detached
from tandem.spec.cluster import Node
from tandem.spec.deployment import Deployment


class SSHNodeTransport:
    """Probe and spawn on ssh nodes (``check.node_transport.NodeTransport``)."""

    def __init__(
        self,
        deployment: Deployment,
        *,
        python: str | None = None,
        verification: Verification | None = None,
        compile_caches: dict[str, str] | None = None,
    ) -> None:
        self.deployment = deployment
        self.ssh = OpenSSH.for_cluster(deployment.cluster)
        self.python = python or engine_python(deployment.cluster.ssh.vllm_command)
        self.verification = verification or Verification()
        self.compile_caches = compile_caches or {}

    def run_probe(self, node: Node) -> dict[str, Any]:
        args = probe_args(self.deployment, node.name, self.verification, self.compile_caches)
        started = time.time()
        # the engine's Python when it is there, else the node's python3
        result = self.ssh.run_python(
            SSHTarget.of(node),
            agent.source(),
            args,
            python=self.python,
            env=node.env,
            timeout_s=self.verification.timeout_s,
        )
        return finished_probe(result.returncode, result.stdout, result.stderr, node.name, started)

    def spawn(
        self, node: Node, argv: list[str], env: dict[str, str], output: IO[bytes]
    ) -> subprocess.Popen:
        if argv and argv[0] == "python3":
            argv = [self.python, *argv[1:]]
        remote = ["env", "-i", *(f"{k}={v}" for k, v in env.items()), *argv]
        self.ssh.control_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        return detached(self.ssh.argv(SSHTarget.of(node), remote), output)
