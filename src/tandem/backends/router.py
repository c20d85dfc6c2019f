"""vLLM's router (PyPI ``vllm-router``): the one front door of a deployment's groups, on this
machine or on a node of an ssh cluster (``tandem.backends.router_node``).

tandem does not route: it starts the router empty and adds a group's leader (``/add_worker``)
only once tandem has seen that group answer, and removes it (``/remove_worker``) when tandem's
verdict says it no longer serves. The router's own ``/health`` poll (every 60 s, blind to a
wedged engine that still answers ``/health``) stays on as a backstop.

What was read from the router itself (0.1.17): it passes the client's ``Authorization`` header
through, so the groups' API key guards the front door too; its admin API (``/add_worker``,
``/remove_worker``, ``/list_workers``) has no key at all, so on this machine it binds
127.0.0.1 only (on a node, that node's address: the cluster's network must be private);
``/add_worker`` answers 400 for a worker it already has or cannot reach.
"""

from __future__ import annotations

import importlib.metadata
import os
import shlex
import shutil
import signal
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families
from pydantic import BaseModel, Field

from tandem.backends.processes import ProcessIdentity, read_process
from tandem.backends.router_node import RouterNode
from tandem.errors import BackendError
from tandem.files import open_private, private_dir
from tandem.interrupts import detached
from tandem.spec.recipe import Router

PACKAGE = "vllm-router"
LOOPBACK = "127.0.0.1"


class RouterProcess(BaseModel):
    """A router tandem started: how to find it again and how to reach it."""

    pid: int
    start_ticks: int
    boot: str | None = None
    url: str = Field(description="Where clients send requests, e.g. http://127.0.0.1:8100.")
    metrics_url: str = Field(description="The router's own Prometheus /metrics.")
    policy: str
    version: str
    log: str
    node: RouterNode | None = Field(
        default=None, description="Set when it runs on a cluster node (pid and log are there)."
    )

    @property
    def identity(self) -> ProcessIdentity:
        return ProcessIdentity(self.pid, self.start_ticks, self.boot)

    def running(self) -> bool:
        if self.node is not None:
            return self.node.alive(self.identity)
        return self.identity.find() is not None


def installed_version() -> str | None:
    """The vllm-router installed beside tandem, None when there is none."""
    try:
        return importlib.metadata.version(PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        return None


def executable() -> str | None:
    """The ``vllm-router`` program beside this Python (a venv's ``bin/``), else on PATH."""
    beside = Path(sys.executable).parent / PACKAGE
    return str(beside) if beside.is_file() else shutil.which(PACKAGE)


def version_problem(spec: Router) -> str | None:
    """Why the router the recipe pins cannot be started here, or None."""
    found = installed_version()
    if found is None or executable() is None:
        return f"vllm-router is not installed; the recipe's router is vllm-router {spec.version}"
    if found != spec.version:
        return f"vllm-router {found} is installed; the recipe pins {spec.version}"
    return None


def start(
    spec: Router,
    *,
    log: Path,
    host: str = LOOPBACK,
    node: RouterNode | None = None,
    timeout_s: float = 30.0,
    on_event: Callable[[str], None] = lambda text: None,
) -> RouterProcess:
    """Start the router, here or on ``node``, and wait until it answers ``/liveness``.

    Raises:
        BackendError: the pinned version is not installed, or it exited or did not answer.
    """
    if node is not None:
        return _start_on(node, spec, timeout_s=timeout_s, on_event=on_event)
    if problem := version_problem(spec):
        raise BackendError(
            problem,
            field="router.version",
            hint=f"pip install {PACKAGE}=={spec.version} beside tandem",
        )
    command = spec.argv(host=host, program=[executable() or PACKAGE])
    private_dir(log.parent)
    with open_private(log, "ab") as handle:
        process = detached(command, handle)
    facts = read_process(process.pid)
    identity = ProcessIdentity.of(facts) if facts else ProcessIdentity(process.pid, 0, None)
    started = _record(spec, identity, host=host, log=str(log))
    on_event(
        f"router: vllm-router {spec.version} ({spec.policy.value}) pid {process.pid}, {started.url}"
    )
    _wait_live(
        started,
        timeout_s,
        exited=lambda: process.poll() is not None,
        log=lambda: "\n".join(log.read_text(errors="replace").splitlines()[-20:]),
    )
    return started


def _record(
    spec: Router, identity: ProcessIdentity, *, host: str, log: str, node: RouterNode | None = None
) -> RouterProcess:
    """What the deployment's record keeps of a router just started at ``host``."""
    return RouterProcess(
        pid=identity.pid,
        start_ticks=identity.start_ticks,
        boot=identity.boot,
        url=f"http://{host}:{spec.port}",
        metrics_url=f"http://{host}:{spec.metrics_port}/metrics",
        policy=spec.policy.value,
        version=spec.version,
        log=log,
        node=node,
    )


def _start_on(
    node: RouterNode, spec: Router, *, timeout_s: float, on_event: Callable[[str], None]
) -> RouterProcess:
    found = node.version()
    if found != spec.version:
        raise BackendError(
            f"{node.command} on {node.node} is vllm-router {found or 'of an unknown version'}; "
            f"the recipe pins {spec.version}",
            field="ssh.router_command",
            node=node.node,
            hint=f"pip install {PACKAGE}=={spec.version} on {node.node} and name that program "
            "in ssh.router_command",
        )
    command = spec.argv(host=node.address, program=shlex.split(node.command))
    out = node.run(node.start_script(command))
    identity = ProcessIdentity.parse(out.strip().splitlines()[-1] if out.strip() else "")
    if identity is None:
        raise BackendError(
            f"vllm-router did not start on {node.node}: {out.strip()[-200:] or 'no pid'}; the "
            f"end of its log ({node.log}):\n{node.tail()}",
            node=node.node,
        )
    started = _record(spec, identity, host=node.address, log=f"{node.node}:{node.log}", node=node)
    on_event(
        f"router: vllm-router {spec.version} ({spec.policy.value}) on {node.node}, "
        f"pid {identity.pid}, {started.url}"
    )
    _wait_live(started, timeout_s, exited=lambda: not node.alive(identity), log=node.tail)
    return started


def _wait_live(
    router: RouterProcess,
    timeout_s: float,
    *,
    exited: Callable[[], bool],
    log: Callable[[], str],
) -> None:
    """Until the router answers ``/liveness``; stop it and raise when it exits or stays mute.

    Raises:
        BackendError: it exited, or did not answer in ``timeout_s``.
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(router.url + "/liveness", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if exited():
            raise BackendError(
                f"vllm-router exited at start; the end of its log ({router.log}):\n{log()}"
            )
        time.sleep(0.2)
    stop(router)
    raise BackendError(f"vllm-router did not answer {router.url}/liveness in {timeout_s:.0f} s")


def stop(router: RouterProcess, *, grace_s: float = 10.0) -> bool:
    """Stop the router tandem started, and nothing else: the pid must still be that process
    (its start time on this boot), or on a node carry the launch's marks. True when it was
    running."""
    if router.node is not None:
        return router.node.stop(router.identity, grace_s)
    process = router.identity.find()
    if process is None:
        return False
    os.kill(router.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if router.identity.find() is None:
            return True
        time.sleep(0.1)
    if router.identity.find() is not None:
        os.kill(router.pid, signal.SIGKILL)
    return True


def members(router: RouterProcess) -> list[str]:
    """The group leaders the router sends requests to.

    Raises:
        BackendError: the router does not answer.
    """
    try:
        response = httpx.get(router.url + "/list_workers", timeout=5)
        response.raise_for_status()
        return sorted(response.json().get("urls", []))
    except (httpx.HTTPError, ValueError, AttributeError) as exc:
        raise BackendError(f"the router at {router.url} did not list its workers: {exc}") from exc


class MembersDiff(BaseModel):
    """What to change in the router's rotation: the leaders to add and to take out."""

    add: list[str] = Field(default_factory=list)
    remove: list[str] = Field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.add or self.remove)


def members_diff(want: Iterable[str], have: Iterable[str]) -> MembersDiff:
    """The change that makes the members ``have`` into ``want`` (pure)."""
    wanted, held = set(want), set(have)
    return MembersDiff(add=sorted(wanted - held), remove=sorted(held - wanted))


def sync_members(router: RouterProcess, want: Iterable[str]) -> MembersDiff:
    """Make the router's members exactly ``want`` (leaders out first, then in), the one
    writer of its rotation; returns what changed.

    Raises:
        BackendError: the router did not answer, or refused a leader (it could not reach it).
    """
    diff = members_diff(want, members(router))
    for worker in diff.remove:
        _admin(router, "/remove_worker", worker)
    for worker in diff.add:
        _admin(router, "/add_worker", worker)
    return diff


def readmit(router: RouterProcess, worker: str) -> None:
    """Take a member out and put it in again: a worker added anew starts with its circuit
    breaker closed (vllm-router 0.1.17 held one open for minutes after its group recovered).

    Raises:
        BackendError: the router did not answer or refused it.
    """
    _admin(router, "/remove_worker", worker)
    _admin(router, "/add_worker", worker)


def _admin(router: RouterProcess, route: str, worker: str) -> None:
    try:
        response = httpx.post(router.url + route, params={"url": worker}, timeout=30)
    except httpx.HTTPError as exc:
        raise BackendError(f"the router at {router.url} did not answer {route}: {exc}") from exc
    if response.status_code != 200:
        raise BackendError(
            f"the router refused {route} {worker}: {response.status_code} {response.text[:200]}"
        )


class WorkerFigures(BaseModel):
    """What the router's own ``/metrics`` says of one group's leader."""

    processed: float = Field(default=0.0, description="Requests it sent there, in total.")
    healthy: bool | None = Field(default=None, description="Its own /health poll's opinion.")
    circuit_open: bool | None = Field(default=None, description="Its circuit breaker tripped.")


class RouterFigures(BaseModel):
    """One look at the router: its members and its own counters."""

    running: bool
    members: list[str] = Field(default_factory=list)
    workers: dict[str, WorkerFigures] = Field(default_factory=dict)
    request_errors: float = 0.0


def look(router: RouterProcess) -> RouterFigures:
    """The router's members (``/list_workers``) and its ``/metrics`` per worker; a router
    that does not answer is ``running: false``, not an error."""
    try:
        listed = members(router)
        text = httpx.get(router.metrics_url, timeout=5).text
    except (BackendError, httpx.HTTPError):
        return RouterFigures(running=False)
    workers: dict[str, WorkerFigures] = {}
    errors = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            worker = sample.labels.get("worker")
            if sample.name == "vllm_router_request_errors_total":
                errors += sample.value
            if worker is None:
                continue
            figures = workers.setdefault(worker, WorkerFigures())
            if sample.name == "vllm_router_processed_requests_total":
                figures.processed += sample.value
            elif sample.name == "vllm_router_worker_health":
                figures.healthy = sample.value == 1
            elif sample.name == "vllm_router_cb_state":
                figures.circuit_open = sample.value != 0
    return RouterFigures(running=True, members=listed, workers=workers, request_errors=errors)
