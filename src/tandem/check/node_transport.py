"""How the probe and the fabric ranks reach a node: the seam each cluster transport implements.

A ``NodeTransport`` does two things on one node, both with the standard library's subprocess:

- ``run_probe(node) -> facts``: run the node agent's ``facts`` there (``tandem/agent.py``) and
  return its JSON facts, with
  ``clock_offset_s`` (the node's clock minus ours) and ``clock_offset_bound_s`` (how far off
  that figure can be) added by ``parse_facts``;
- ``spawn(node, argv, env, output) -> Popen``: start a process there (a fabric rank) with
  exactly ``env`` and stdout/stderr into ``output``.

``local`` is implemented here: the current Python runs the probe, inside the node's network
namespace (``ip netns exec``) when nodes are namespaces. An SSH transport implements the same
two methods with ``ssh HOST python3 - ARGS < agent.py`` (see ``agent.source`` and
``probe_args``), ``tandem.backends.ssh_check``; a Kubernetes one reads the Node objects,
``tandem.backends.k8s_check``. The preflight (``tandem.operations.preflight``), above the backends,
picks one per cluster transport.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import IO, Any, Protocol

from tandem import agent, caches
from tandem.errors import BackendError
from tandem.interrupts import detached
from tandem.spec.cluster import Node
from tandem.spec.deployment import Deployment

PROBE_TIMEOUT_S = 60.0
VERIFY_TIMEOUT_S = 3600.0
"""A probe that reads every weight file: 150-170 GB at a disk's 1-3 GB/s takes minutes."""


@dataclass(frozen=True)
class Verification:
    """What the probe checks of the model snapshot on each node.

    ``enabled``: read every file and check its content against its blob id (the Hub's sha256 or
    git id); ``known``: node name -> ``{repo_dir: {blob: [size, mtime_ns]}}``, the blobs verified
    before (``tandem.backends.verified``), which the probe skips while they are unchanged.
    """

    enabled: bool = False
    known: dict[str, dict[str, dict[str, list[int]]]] = field(default_factory=dict)

    @property
    def timeout_s(self) -> float:
        return VERIFY_TIMEOUT_S if self.enabled else PROBE_TIMEOUT_S

    def args_for(self, node: str) -> list[str]:
        """The probe's arguments for one node."""
        if not self.enabled:
            return []
        known = self.known.get(node)
        return ["--verify", *(["--known", json.dumps(known, separators=(",", ":"))] * bool(known))]


class NodeTransport(Protocol):
    """Runs the probe and fabric ranks on the nodes of one deployment."""

    def run_probe(self, node: Node) -> dict[str, Any]:
        """The node's facts; raises ``ProbeError`` when the node cannot be probed."""

    def spawn(
        self, node: Node, argv: list[str], env: dict[str, str], output: IO[bytes]
    ) -> subprocess.Popen:
        """Start ``argv`` on the node with exactly ``env``; stdout and stderr into ``output``.

        ``argv[0]`` may be ``python3``: the transport substitutes the node's Python.
        """


class ProbeError(BackendError):
    """The probe could not run on a node, or printed no facts."""

    code = "probe-failed"


def probe_args(
    deployment: Deployment,
    node: str,
    verification: Verification,
    compile_caches: dict[str, str] | None = None,
) -> list[str]:
    """The node agent's ``facts`` call on ``node`` for this deployment's model, the node's
    snapshot verification (``Verification.args_for``) and, when ``compile_caches`` names one,
    its compile cache root (``tandem.caches.rank_root``)."""
    model = deployment.recipe.model
    args = ["facts", "--model", model.repo_id, "--revision", model.revision]
    if compile_cache := (compile_caches or {}).get(node):
        args += [
            "--compile-cache",
            compile_cache,
            "--cache-named",
            ",".join(caches.NAMED_FOLDERS),
            "--cache-depth",
            str(caches.ENTRY_DEPTH),
            "--cache-opaque",
            ",".join(caches.OPAQUE_FOLDERS),
        ]
    if model.cache_root:
        args += ["--cache-root", model.cache_root]
    if model.path:
        args += ["--model-path", model.path]
    return args + verification.args_for(node)


def clock_offset(
    node_stamp: float, node_work_s: float, started: float, finished: float
) -> tuple[float, float]:
    """The node's clock minus ours, and the most that figure can be off, in seconds.

    The node read its clock (``node_stamp``) at some instant of our call, between ``started``
    and ``finished - node_work_s``: after it, the node still worked ``node_work_s`` before the
    call could return. The offset is taken against the middle of that window, so its error is
    at most half the window: half the round trip *minus* the node's own work (NTP's delay/2).
    What remains of the round trip is the cheap part (connection, interpreter start, output),
    so a probe that spends seconds in ``nvidia-smi`` widens neither the offset nor its bound.

    Returns ``(offset_s, bound_s)``, the offset rounded to the millisecond and the bound rounded
    up, so that ``abs(offset_s) <= bound_s`` holds whenever both clocks are one clock.
    """
    window_end = max(started, finished - max(node_work_s, 0.0))
    offset = node_stamp - (started + window_end) / 2
    bound = (window_end - started) / 2
    return round(offset, 3), math.ceil(bound * 1000 - 1e-6) / 1000  # float noise is not a ms


def finished_probe(
    returncode: int, stdout: str, stderr: str, node: str, started: float
) -> dict[str, Any]:
    """A probe run's facts, or the ``ProbeError`` naming its exit status and last words; the end
    of every transport's ``run_probe``. ``started`` is ``time.time()`` before the call."""
    finished = time.time()
    if returncode:
        raise ProbeError(f"the probe exited {returncode}: {stderr[-300:]}", node=node)
    return parse_facts(stdout, node, started, finished)


def parse_facts(stdout: str, node: str, started: float, finished: float) -> dict[str, Any]:
    """The probe's JSON with ``clock_offset_s`` and ``clock_offset_bound_s`` (``clock_offset``).

    ``started`` and ``finished`` are our clock (``time.time()``) around the whole call. Facts
    of an older probe, which stamped only ``time_unix`` at its end, are read with no work
    subtracted: the bound is then half the whole call, which is what their error really was.
    """
    try:
        facts = json.loads(stdout.strip().splitlines()[-1])
    except (ValueError, IndexError) as exc:
        raise ProbeError(f"the probe printed no facts: {stdout[-300:]!r}", node=node) from exc
    stamp, work_s = facts.get("started_unix"), facts.get("elapsed_s")
    if not (isinstance(stamp, (int, float)) and isinstance(work_s, (int, float))):
        stamp, work_s = facts.get("time_unix"), 0.0
    if isinstance(stamp, (int, float)):
        facts["clock_offset_s"], facts["clock_offset_bound_s"] = clock_offset(
            stamp, work_s, started, finished
        )
    return facts


class LocalTransport:
    """Nodes on this machine: plain processes, or processes in each node's network namespace.

    ``netns``: node name -> namespace for namespace nodes; empty for loopback nodes.
    ``compile_caches``: node name -> its rank's compile cache root (``tandem.caches``), probed
    for the cache-parity rule.
    ``python``: the interpreter for the probe and fabric ranks (default: this one, the venv
    that also runs vLLM).
    """

    def __init__(
        self,
        deployment: Deployment,
        *,
        netns: dict[str, str] | None = None,
        python: str | None = None,
        verification: Verification | None = None,
        compile_caches: dict[str, str] | None = None,
    ) -> None:
        self.deployment = deployment
        self.netns = netns or {}
        self.compile_caches = compile_caches or {}
        self.python = python or sys.executable
        self.verification = verification or Verification()

    def _wrap(self, node: Node, argv: list[str]) -> list[str]:
        if argv and argv[0] == "python3":
            argv = [self.python, *argv[1:]]
        namespace = self.netns.get(node.name)
        return ["ip", "netns", "exec", namespace, *argv] if namespace else argv

    def run_probe(self, node: Node) -> dict[str, Any]:
        argv = self._wrap(
            node,
            [
                "python3",
                agent.__file__,
                *probe_args(self.deployment, node.name, self.verification, self.compile_caches),
            ],
        )
        started = time.time()
        try:
            result = subprocess.run(
                argv,
                capture_output=True,
                text=True,
                timeout=self.verification.timeout_s,
                env={**os.environ, **node.env},
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ProbeError(f"the probe did not run: {exc}", node=node.name) from exc
        return finished_probe(result.returncode, result.stdout, result.stderr, node.name, started)

    def spawn(
        self, node: Node, argv: list[str], env: dict[str, str], output: IO[bytes]
    ) -> subprocess.Popen:
        return detached(self._wrap(node, argv), output, env)
