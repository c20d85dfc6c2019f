"""How the probe and the fabric ranks reach a node: the seam each cluster transport implements.

A ``NodeTransport`` does two things on one node, both with the standard library's subprocess:

- ``run_probe(node) -> facts``: run ``probe.py`` there and return its JSON facts, with
  ``clock_offset_s`` (the node's clock minus ours, from the midpoint of the call) added;
- ``spawn(node, argv, env, output) -> Popen``: start a process there (a fabric rank) with
  exactly ``env`` and stdout/stderr into ``output``.

``local`` is implemented here: the current Python runs the probe, inside the node's network
namespace (``ip netns exec``) when nodes are namespaces. An SSH transport implements the same
two methods with ``ssh HOST python3 - ARGS < probe.py`` (see ``probe_source`` and
``probe_args``); a Kubernetes one with ``kubectl exec -i POD -- python3 - ARGS``. They register
in ``TRANSPORTS`` by cluster transport name.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import time
from importlib import resources
from typing import IO, Any, Protocol

from tandem import caches
from tandem.backends.state import state_root
from tandem.errors import BackendError
from tandem.spec.cluster import Node
from tandem.spec.deployment import Deployment

PROBE_TIMEOUT_S = 60.0


class NodeTransport(Protocol):
    """Runs the probe and fabric ranks on the nodes of one deployment."""

    def run_probe(self, node: Node) -> dict[str, Any]:
        """The node's facts; raises ``ProbeError`` when the node cannot be probed."""

    def spawn(self, node: Node, argv: list[str], env: dict[str, str],
              output: IO[bytes]) -> subprocess.Popen:
        """Start ``argv`` on the node with exactly ``env``; stdout and stderr into ``output``.

        ``argv[0]`` may be ``python3``: the transport substitutes the node's Python.
        """


class ProbeError(BackendError):
    """The probe could not run on a node, or printed no facts."""

    code = "probe-failed"


# cluster transport -> "module:Class"; the class is built with the Deployment.
TRANSPORTS: dict[str, str] = {
    "local": "tandem.check.transport:LocalTransport",
    "ssh": "tandem.backends.ssh_check:SSHNodeTransport",
    "k8s": "tandem.backends.k8s_check:KubernetesNodeTransport",
}


def transport_for(deployment: Deployment, **options: Any) -> NodeTransport:
    """The node transport of the deployment's cluster (``local``, ``ssh``, ``k8s``)."""
    name = deployment.cluster.transport.value
    if name not in TRANSPORTS:
        raise ProbeError(f"tandem check cannot reach '{name}' nodes in this version",
                         field="transport", hint=f"use one of {', '.join(TRANSPORTS)}")
    module, _, cls = TRANSPORTS[name].partition(":")
    return getattr(importlib.import_module(module), cls)(deployment, **options)


def probe_source() -> str:
    """The probe script's text, to pipe into ``python3 -`` on a remote node."""
    return resources.files("tandem.check").joinpath("probe.py").read_text()


def probe_args(deployment: Deployment, *, with_hashes: bool = False,
               compile_cache: str | None = None) -> list[str]:
    """The probe's arguments for this deployment's model and, when given, the node's compile
    cache root (``tandem.caches.rank_root``)."""
    model = deployment.recipe.model
    args = ["--model", model.repo_id, "--revision", model.revision]
    if compile_cache:
        args += ["--compile-cache", compile_cache, "--cache-named", ",".join(caches.NAMED_FOLDERS),
                 "--cache-opaque", ",".join(caches.OPAQUE_FOLDERS)]
    if model.cache_root:
        args += ["--cache-root", model.cache_root]
    if model.path:
        args += ["--model-path", model.path]
    if with_hashes:
        args.append("--hash")
    return args


def node_rank(deployment: Deployment, node: Node) -> int:
    """The rank a node runs (its place in the cluster's node list)."""
    return [n.name for n in deployment.cluster.nodes].index(node.name)


def parse_facts(stdout: str, node: str, started: float, finished: float) -> dict[str, Any]:
    """The probe's JSON with ``clock_offset_s``: node time minus the call's midpoint here."""
    try:
        facts = json.loads(stdout.strip().splitlines()[-1])
    except (ValueError, IndexError) as exc:
        raise ProbeError(f"the probe printed no facts: {stdout[-300:]!r}", node=node) from exc
    if isinstance(facts.get("time_unix"), (int, float)):
        facts["clock_offset_s"] = round(facts["time_unix"] - (started + finished) / 2, 3)
    return facts


class LocalTransport:
    """Nodes on this machine: plain processes, or processes in each node's network namespace.

    ``netns``: node name -> namespace for namespace nodes; empty for loopback nodes.
    ``python``: the interpreter for the probe and fabric ranks (default: this one, the venv
    that also runs vLLM).
    """

    def __init__(self, deployment: Deployment, *, netns: dict[str, str] | None = None,
                 python: str | None = None, with_hashes: bool = False) -> None:
        self.deployment = deployment
        self.netns = netns or {}
        self.python = python or sys.executable
        self.with_hashes = with_hashes

    def _wrap(self, node: Node, argv: list[str]) -> list[str]:
        if argv and argv[0] == "python3":
            argv = [self.python, *argv[1:]]
        namespace = self.netns.get(node.name)
        return ["ip", "netns", "exec", namespace, *argv] if namespace else argv

    def run_probe(self, node: Node) -> dict[str, Any]:
        script = str(resources.files("tandem.check").joinpath("probe.py"))
        cache = caches.rank_root(self.deployment, node_rank(self.deployment, node),
                                 state_root=state_root())
        argv = self._wrap(node, ["python3", script,
                                 *probe_args(self.deployment, with_hashes=self.with_hashes,
                                             compile_cache=cache)])
        started = time.time()
        try:
            result = subprocess.run(argv, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S,
                                    env={**os.environ, **node.env})
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ProbeError(f"the probe did not run: {exc}", node=node.name) from exc
        if result.returncode:
            raise ProbeError(f"the probe exited {result.returncode}: {result.stderr[-300:]}",
                             node=node.name)
        return parse_facts(result.stdout, node.name, started, time.time())

    def spawn(self, node: Node, argv: list[str], env: dict[str, str],
              output: IO[bytes]) -> subprocess.Popen:
        return subprocess.Popen(self._wrap(node, argv), env=env, stdin=subprocess.DEVNULL,
                                stdout=output, stderr=subprocess.STDOUT, start_new_session=True)
