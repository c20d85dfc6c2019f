"""The front door: one endpoint on this machine for every deployment under this state root,
routing each request by its ``model`` (``tandem.backends.front_app``), its members decided by
tandem's verdicts.

Every ``interval_s`` the front door looks at each recorded deployment as ``tandem status``
does (``lifecycle.status``, without a canary): a deployment whose verdict serves (healthy, or
degraded: its router still has a group, or its one group lost a rank but answers) is listed
under its model name and receives that model's requests at its own endpoint (its router, or
its one group's leader); one that is starting, stalled or down is not listed, and a request for
its model gets the 404 of a model not served. So a model whose every group died leaves
``/v1/models`` within one look, and is listed again at the first look after it serves again
(after a ``tandem supervise`` restart, a rollback, an ``up``). ``up`` and ``down`` of a
deployment never touch the front door: it finds the record, or finds it gone.

The process is this module (``python -m tandem.operations.front``), started by ``start`` and
owned by its own record (``tandem.backends.front_door``); ``stop`` stops it by that record.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable

import httpx
from pydantic import BaseModel, Field

from tandem import files, screen, wire
from tandem.backends import front_door
from tandem.backends.front_door import LOOPBACK, FrontDoor
from tandem.backends.processes import ProcessIdentity, read_process
from tandem.backends.state import list_deployments, load_state
from tandem.errors import BackendError, TandemError
from tandem.interrupts import detached
from tandem.operations import lifecycle
from tandem.operations.admission import port_claims
from tandem.operations.health import ProgressTracker, Verdict
from tandem.plan.ledger import THIS_MACHINE

SERVING = (Verdict.HEALTHY, Verdict.DEGRADED)
"""The verdicts under which a deployment's model is listed and routed to."""
DEFAULT_PORT = 8300
OnEvent = Callable[[str], None]


class Member(BaseModel):
    """One deployment as the front door sees it on one look."""

    deployment: str
    model: str
    endpoint: str
    verdict: Verdict | None = Field(default=None, description="None: it could not be judged.")
    reason: str = ""
    max_model_len: int | None = None
    root: str | None = None
    created: int = 0

    @property
    def serving(self) -> bool:
        return self.verdict in SERVING


def members(trackers: dict[str, dict[int, ProgressTracker]] | None = None) -> list[Member]:
    """Every recorded deployment, judged as ``tandem status`` judges it (no canary). A caller
    that looks again and again keeps ``trackers`` (by deployment, then group), so a group
    under load is judged by whether its counters moved since the last look, not by a second
    scrape two seconds later."""
    found = []
    for name in list_deployments():
        try:
            state = load_state(name)
            recipe = state.deployment(lenient=True).recipe
            judged = lifecycle.status(
                name,
                canary_mode="never",
                trackers=trackers.setdefault(name, {}) if trackers is not None else None,
            )
        except TandemError as exc:
            found.append(Member(deployment=name, model="", endpoint="", reason=exc.message))
            continue
        found.append(
            Member(
                deployment=name,
                model=state.model,
                endpoint=state.endpoint,
                verdict=judged.verdict if state.ready else Verdict.STARTING,
                reason=judged.reason,
                max_model_len=recipe.engine.serve.max_model_len,
                root=recipe.model.repo_id,
                created=int(state.created_at.timestamp()),
            )
        )
    return found


def _upstreams(found: list[Member]) -> list:
    from tandem.backends.front_app import Upstream  # the router extra; only the process needs it

    return [
        Upstream(
            model=m.model,
            deployment=m.deployment,
            url=m.endpoint,
            max_model_len=m.max_model_len,
            root=m.root,
            created=m.created,
        )
        for m in found
        if m.serving
    ]


def watch(routes, interval_s: float, stop: threading.Event, say: OnEvent) -> None:
    """Look at every deployment each ``interval_s`` and replace the routes; say each model
    that joins or leaves, and why."""
    listed: dict[str, str] = {}
    trackers: dict[str, dict[int, ProgressTracker]] = {}
    while not stop.is_set():
        started = time.monotonic()
        found = members(trackers)
        routes.replace(_upstreams(found))
        now = {m.model: m.deployment for m in found if m.serving}
        for model in sorted(now.keys() - listed.keys()):
            say(f"model '{model}' joined: deployment {now[model]} serves")
        for model in sorted(listed.keys() - now.keys()):
            why = next((m for m in found if m.deployment == listed[model]), None)
            reason = f"{why.verdict or 'unknown'}: {why.reason}" if why else "its record is gone"
            say(f"model '{model}' left (deployment {listed[model]}: {reason})")
        listed = now
        stop.wait(max(interval_s - (time.monotonic() - started), 0.05))


def serve(host: str, port: int, interval_s: float) -> None:
    """Run the front door in this process until SIGTERM: the routes, their watcher, the app."""
    try:
        import uvicorn  # the router extra: vllm-router brings uvicorn, vLLM starlette

        from tandem.backends.front_app import Routes, front_app
    except ImportError as exc:
        raise BackendError(
            f"the front door needs starlette and uvicorn: {exc}",
            hint="pip install 'tandem[router]'",
        ) from exc
    routes = Routes()
    stop = threading.Event()

    def say(text: str) -> None:
        screen.echo(f"{time.strftime('%H:%M:%S')} {text}")

    watcher = threading.Thread(target=watch, args=(routes, interval_s, stop, say), daemon=True)
    watcher.start()
    app = front_app(routes, api_key=os.environ.get(wire.VLLM_API_KEY))
    say(f"front door on {host}:{port}, looking every {interval_s:g} s")
    try:
        uvicorn.Server(
            uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False)
        ).run()
    finally:
        stop.set()


def start(
    *, host: str = LOOPBACK, port: int = DEFAULT_PORT, interval_s: float = 1.0,
    timeout_s: float = 30.0, on_event: OnEvent = lambda text: None,
) -> FrontDoor:  # fmt: skip
    """Start the front door of this state root and wait until it answers.

    Raises:
        BackendError: one already runs, the port is taken (by a deployment's router too), or
            it exited or stayed mute at start.
    """
    with front_door.locked():
        old = front_door.read()
        if old is not None and old.running():
            raise BackendError(
                f"the front door already runs at {old.url} (pid {old.pid})",
                hint="`tandem front stop` first to move it",
            )
        _refuse_taken(host, port)
        log = front_door.log_file()
        files.private_dir(log.parent)
        with files.open_private(log, "ab") as handle:
            process = detached(
                [sys.executable, "-m", __name__, "--host", host, "--port", str(port),
                 "--interval", str(interval_s)],
                handle,
            )  # fmt: skip
        facts = read_process(process.pid)
        identity = ProcessIdentity.of(facts) if facts else ProcessIdentity(process.pid, 0, None)
        door = FrontDoor(
            pid=identity.pid, start_ticks=identity.start_ticks, boot=identity.boot, host=host,
            port=port, interval_s=interval_s, log=str(log),
        )  # fmt: skip
        front_door.write(door)
    on_event(f"front door: pid {door.pid}, {door.url}/v1, looking every {interval_s:g} s")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(door.url + "/health", timeout=2).status_code == 200:
                return door
        if process.poll() is not None:
            break
        time.sleep(0.2)
    stop()
    tail = "\n".join(log.read_text(errors="replace").splitlines()[-20:])
    raise BackendError(f"the front door did not start; the end of its log ({log}):\n{tail}")


def _refuse_taken(host: str, port: int) -> None:
    """Raise when ``port`` is a deployment's (its router's, or a leader's on loopback) or is
    bound on this machine now."""
    for name in list_deployments():
        with contextlib.suppress(TandemError):
            deployment = load_state(name).deployment(lenient=True)
            for claim in port_claims(deployment):
                if claim.where == THIS_MACHINE and claim.port == port:
                    raise BackendError(
                        f"port {port} is deployment '{name}''s ({claim.field})",
                        field="--port",
                        hint=f"give the front door another port, e.g. --port {port + 1}",
                    )
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise BackendError(
                f"port {port} on {host} is already in use ({exc.strerror})",
                field="--port",
                hint="stop what uses it, or give the front door another port",
            ) from exc


def stop(*, grace_s: float = 10.0) -> FrontDoor | None:
    """Stop the front door this state root's record names (that process and nothing else) and
    remove the record; the door that was recorded, None when there was none."""
    with front_door.locked():
        door = front_door.read()
        if door is None:
            return None
        if door.identity.find() is not None:
            os.kill(door.pid, signal.SIGTERM)
            deadline = time.monotonic() + grace_s
            while door.identity.find() is not None and time.monotonic() < deadline:
                time.sleep(0.1)
            if door.identity.find() is not None:
                os.kill(door.pid, signal.SIGKILL)
        front_door.forget()
    return door


def front_door_line() -> str | None:
    """One line on this state root's front door for ``tandem status`` and ``up``; None when
    there is none (no HTTP call: a look at its record and its process)."""
    with contextlib.suppress(TandemError):
        door = front_door.read()
        if door is None:
            return None
        if door.running():
            return f"front door {door.url}/v1 (pid {door.pid}): every serving model by name"
        return f"front door {door.url} is recorded but not running: `tandem front stop` clears it"
    return None


class FrontStatus(BaseModel):
    """What ``tandem front status --json`` prints."""

    url: str | None = Field(default=None, description="Where clients send requests.")
    running: bool
    pid: int | None = None
    interval_s: float | None = None
    listed: list[str] = Field(
        default_factory=list, description="The models its /v1/models lists now."
    )
    members: list[Member] = Field(
        default_factory=list, description="Every deployment, judged now, listed or not."
    )
    log: str | None = None


def status() -> FrontStatus:
    """The front door and every deployment it would route to, judged now."""
    door = front_door.read()
    found = members()
    if door is None:
        return FrontStatus(running=False, members=found)
    running = door.running()
    listed: list[str] = []
    if running:
        with contextlib.suppress(httpx.HTTPError, ValueError, KeyError, TypeError):
            answer = httpx.get(
                door.url + wire.MODELS_PATH,
                headers=wire.bearer(os.environ.get(wire.VLLM_API_KEY)),
                timeout=5,
            )
            listed = [card["id"] for card in answer.json()["data"]]
    return FrontStatus(
        url=door.url, running=running, pid=door.pid, interval_s=door.interval_s,
        listed=listed, members=found, log=door.log,
    )  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    """The front door's process: ``python -m tandem.operations.front --port 8300``."""
    parser = argparse.ArgumentParser(prog="tandem-front-door")
    parser.add_argument("--host", default=LOOPBACK)
    parser.add_argument("--port", type=int, default=DEFAULT_PORT)
    parser.add_argument("--interval", type=float, default=1.0)
    args = parser.parse_args(argv)
    serve(args.host, args.port, args.interval)


if __name__ == "__main__":
    main()
