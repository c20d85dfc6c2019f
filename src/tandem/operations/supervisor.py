"""Gang supervision: when any rank faults, restart the whole group.

This is the bare-host equivalent of LeaderWorkerSet's ``RecreateGroupOnPodRestart``. vLLM's
multi-node mode cannot heal a group: a dead headless worker leaves the leader answering
``/health`` until the next request fails with HTTP 500, and a dead leader leaves the workers
waiting forever. So a partial group is never repaired; it is replaced.

Algorithm (one loop, every ``interval_s``):

1. read the deployment's state; if it is gone (``tandem down``), exit;
2. judge it with the health model (``tandem.operations.health``): every process of every rank
   alive and running (on remote nodes too), the leader's ``/health``, forward progress under
   load, a canary completion every ``canary_interval_s`` when idle, error signatures in the rank
   logs;
3. ``healthy`` or ``starting``: continue; after ``stable_s`` of health the restart count resets,
   and after ``backoff_reset_s`` the back-off does (a fault after a healthy spell is a new
   fault, not a crash loop). A leader that only misses ``/health`` gets ``health_failures``
   looks before it counts; one whose process the process table shows gone counts at once;
4. otherwise, if ``max_restarts`` restarts in a row are used up, stop every rank and exit 1;
5. else wait the back-off (``backoff_s * backoff_factor ** attempt``, at most
   ``max_backoff_s``), stop every rank (which also removes leftovers: processes that lost their
   main process, namespaces), move the crashed group's logs to ``logs/restart-N/``, start the
   group again workers first, and wait until a real completion answers, exactly like ``up``.

Every event is written with a UTC timestamp to ``deployments/NAME/events.log`` and passed to
``on_event``: the verdict, the rank, the evidence line, and how long the group took to answer
again after the fault was seen, and why the supervisor stopped. ``tandem down`` stops a running
supervisor first (``stop_supervisor``), so the supervisor never fights a deliberate shutdown.
The supervisor is found again by its ``supervisor.pid`` file, which holds its
``ProcessIdentity`` (pid, start time, boot): a file whose process is gone is stale and names
nobody, whatever process has that pid now.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import httpx
from pydantic import BaseModel, ConfigDict, Field

from tandem.backends import router as routers
from tandem.backends.base import Backend, backend_for
from tandem.backends.processes import ProcessIdentity, boot_time_s, read_process, started_at_s
from tandem.backends.router import RouterProcess
from tandem.backends.state import (
    DeploymentDir,
    GroupDir,
    GroupState,
    Place,
    load_state,
)
from tandem.errors import BackendError, StateError, TandemError
from tandem.files import append_line, private_dir, write_text
from tandem.interrupts import interruption
from tandem.operations.health import Assessment, ProgressTracker, Verdict, assess
from tandem.rankplan import plan_ranks
from tandem.vllm_metrics import REQUESTS_RUNNING, REQUESTS_WAITING, parse_metrics

BACKOFF_RESET_S = 120.0
"""Healthy this long and the back-off starts over: faults minutes apart are unrelated, and only
a group that breaks again soon after its restart (a crash loop) should wait longer each time."""


class SupervisorPolicy(BaseModel):
    """How often to look, when to act, and how many times to try. The fields a user sets are
    ``tandem supervise``'s options (their descriptions are its help).

    Usage:
        SupervisorPolicy(interval_s=5, max_restarts=3, backoff_s=10)
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    interval_s: float = Field(
        default=5.0, gt=0, description="Seconds between two looks at the ranks and the leader."
    )
    max_restarts: int = Field(
        default=3,
        ge=0,
        description="Group restarts in a row before giving up and stopping every rank.",
    )
    backoff_s: float = Field(
        default=10.0,
        ge=0,
        description="Seconds before the first restart; each further one waits twice as long, "
        f"until the group stays healthy for {BACKOFF_RESET_S:g} s.",
    )
    backoff_factor: float = 2.0
    """Each further restart waits this many times longer."""
    max_backoff_s: float = 300.0
    backoff_reset_s: float = BACKOFF_RESET_S
    """Healthy this long and the next restart waits ``backoff_s`` again."""
    health_failures: int = Field(
        default=3,
        ge=1,
        description="Failed /health requests in a row that count as the leader not answering.",
    )
    stable_s: float = 600.0
    """Healthy this long after a restart and the restart count starts over."""
    canary_interval_s: float = Field(
        default=30.0,
        ge=0,
        description="Seconds between 1-token canary completions on an idle server (0: none; "
        "under load the token counters show progress instead).",
    )
    canary_timeout_s: float = 10.0
    """A canary slower than this means the engine makes no progress."""
    stall_s: float = Field(
        default=30.0,
        gt=0,
        description="Seconds with requests running and no token counted that mean stalled.",
    )
    membership: bool = Field(
        default=True,
        description="With replicas: take a broken group out of the router before its restart "
        "and put it back after its canary (off: the router's own /health poll decides alone).",
    )


def backoff_delay(policy: SupervisorPolicy, attempt: int) -> float:
    """Seconds to wait before restart number ``attempt + 1`` (attempt counts from 0)."""
    return min(policy.max_backoff_s, policy.backoff_s * policy.backoff_factor**attempt)


class EventLog:
    """Appends timestamped events to the deployment's ``events.log`` and passes them on."""

    def __init__(
        self,
        name: str,
        on_event: Callable[[str], None] = lambda text: None,
        *,
        group: int | None = None,
    ) -> None:
        self.path = DeploymentDir.of(name).events
        self.on_event = on_event
        self.prefix = "" if group is None else f"group {group}: "

    def __call__(self, text: str) -> None:
        stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        private_dir(self.path.parent)
        append_line(self.path, f"{stamp}  {self.prefix}{text}", private=True)
        self.on_event(self.prefix + text)


def archive_logs(directory: GroupDir) -> Path | None:
    """Move a group's rank logs into ``logs/restart-N/`` (N one more than the last); its path."""
    logs = directory.logs
    current = directory.rank_logs()
    if not current:
        return None
    numbers = [
        int(p.name.split("-", 1)[1])
        for p in logs.glob("restart-*")
        if p.name.split("-", 1)[1].isdigit()
    ]
    folder = logs / f"restart-{max(numbers, default=0) + 1}"
    folder.mkdir(parents=True)
    for path in current:
        path.rename(folder / path.name)
    return folder


def restart_group(group: GroupState, backend: Backend, log: Callable[[str], None]) -> GroupState:
    """Stop every rank of the group, keep its logs, start it again, wait for it; every step and
    start-up phase is an event of ``log``.

    Raises:
        StateError: the saved recipe or cluster fails today's checks; checked before anything
            is stopped, so a group that cannot be relaunched is left running.
    """
    deployment = group.deployment()
    backend.down(group, on_event=log)
    kept = archive_logs(group.directory)
    if kept:
        log(f"kept the crashed group's logs in {kept}")
    new_state, _ = backend.up(
        plan_ranks(deployment),
        deployment,
        timeout_s=None,
        on_phase=lambda m: log(
            f"  {m.elapsed_s:6.1f}s rank {m.rank if m.rank is not None else '-'} "
            f"{m.phase} {m.detail}".rstrip()
        ),
        on_event=log,
        place=Place(group.deployment_name, group.group, group.home),
    )
    new_state.revision = group.revision
    new_state.save()
    return new_state


def _router(name: str) -> RouterProcess | None:
    """The router in front of deployment ``name``'s groups, if it has one."""
    try:
        return load_state(name).router
    except StateError:
        return None


def leave_rotation(name: str, endpoint: str, log: Callable[[str], None]) -> None:
    """Take a broken group out of its deployment's router before anything else is done to it,
    so that no new request reaches it while it waits for its back-off and restarts. A
    deployment without a router has nothing to leave."""
    router = _router(name)
    if router is None:
        return
    try:
        routers.sync_members(router, set(routers.members(router)) - {endpoint})
        log(f"out of the router's rotation: {endpoint}")
    except BackendError as exc:
        log(f"could not take {endpoint} out of the router's rotation: {exc.message}")


def join_rotation(name: str, endpoint: str, log: Callable[[str], None]) -> None:
    """Put a restarted group back into its deployment's router: only after its restart answered
    a real completion at its own leader (``restart_group`` waits for one, as ``up`` does)."""
    router = _router(name)
    if router is None:
        return
    try:
        routers.sync_members(router, set(routers.members(router)) | {endpoint})
        log(f"back in the router's rotation after its canary answered: {endpoint}")
    except BackendError as exc:
        log(f"could not put {endpoint} back into the router's rotation: {exc.message}")


@dataclass(frozen=True)
class Member:
    """Another group of the deployment, as a planned stop of one group needs to know it."""

    name: str
    endpoint: str
    verdict: Verdict


def who_serves(
    others: list[Member], figures: routers.RouterFigures
) -> tuple[list[Member], list[Member]]:
    """Of the other groups, those that can take the traffic while one group is out (healthy
    by tandem's verdict and members of the router), and among them those whose circuit
    breaker the router holds open. The router answers 503 while every member is unavailable
    to it, and it kept a breaker open for minutes after the group's restart answered (vllm-router
    0.1.17, after a wedged engine): tandem's verdict, not the breaker, says who serves."""
    serving = [m for m in others if m.verdict is Verdict.HEALTHY and m.endpoint in figures.members]
    stuck = [
        m
        for m in serving
        if (worker := figures.workers.get(m.endpoint)) is not None and worker.circuit_open
    ]
    return serving, stuck


def others_serve(name: str, group: int, log: Callable[[str], None]) -> None:
    """Before a planned stop of group ``group`` of ``name`` (a step of a rolling upgrade), make
    sure another group serves: each other group is judged (``tandem.operations.health.assess``),
    and one that is healthy but whose breaker the router holds open is put in again (a worker
    added anew starts with its breaker closed). A deployment without a router has nothing to
    check.

    Raises:
        BackendError: no other group is healthy and in the router's rotation; nothing was
            stopped.
    """
    state = load_state(name)
    if state.router is None:
        return
    others: list[Member] = []
    for other in state.groups:
        if other.group == group:
            continue
        try:
            verdict = assess(other, backend=backend_for(other.backend)).verdict
        except TandemError:
            continue
        others.append(Member(f"group {other.group}", other.endpoint, verdict))
    serving, stuck = who_serves(others, routers.look(state.router))
    for member in stuck:
        routers.readmit(state.router, member.endpoint)
        log(
            f"{member.name} is healthy but the router held its circuit breaker open: put in "
            f"again ({member.endpoint})"
        )
    if not serving:
        raise BackendError(
            f"taking group {group} out of the router would leave no group serving: "
            + ("; ".join(f"{m.name} {m.verdict.value}" for m in others) or "no other group runs"),
            hint=f"`tandem status {name}`; bring the others back first",
        )


def drain(endpoint: str, timeout_s: float, log: Callable[[str], None]) -> bool:
    """Wait until the group at ``endpoint`` has no request running or waiting (its /metrics),
    at most ``timeout_s``; True when it drained. A group that does not answer has nothing to
    drain."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            snapshot = parse_metrics(httpx.get(endpoint + "/metrics", timeout=5).text)
        except httpx.HTTPError:
            return True
        left = (snapshot.get(REQUESTS_RUNNING) or 0.0) + (snapshot.get(REQUESTS_WAITING) or 0.0)
        if not left:
            return True
        if time.monotonic() >= deadline:
            log(f"{endpoint} still has {left:g} request(s) after {timeout_s:g} s: not waiting")
            return False
        time.sleep(0.5)


def cycle_group(
    name: str,
    endpoint: str,
    relaunch: Callable[[], str],
    log: Callable[[str], None],
    *,
    drain_s: float = 0.0,
) -> str:
    """Drain, restart, canary, re-add: the group of deployment ``name`` at ``endpoint`` leaves
    the router's rotation, finishes what it runs (up to ``drain_s``), is relaunched, and joins
    again. ``relaunch`` stops and starts the group (a gang restart, or an upgrade's switch and
    gate) and returns the endpoint that answered a real completion at the group's own leader,
    which is the canary; a relaunch that raises leaves the group out of rotation. A deployment
    without a router is just relaunched. Returns the new endpoint."""
    leave_rotation(name, endpoint, log)
    if drain_s > 0:
        drain(endpoint, drain_s, log)
    answered = relaunch()
    join_rotation(name, answered, log)
    return answered


def describe(report: Assessment) -> str:
    """One event line: verdict, rank, reason, evidence."""
    who = f"rank {report.rank}: " if report.rank is not None else ""
    return f"{report.verdict.value}: {who}{report.reason}" + (
        f" [evidence: {report.evidence}]" if report.evidence else ""
    )


Assess = Callable[..., Assessment]


def kubernetes_restarts_groups(name: str) -> BackendError:
    """Why a LeaderWorkerSet of several groups is not supervised by tandem."""
    return BackendError(
        f"'{name}' is a LeaderWorkerSet of several groups: Kubernetes restarts a "
        "broken group itself (RecreateGroupOnPodRestart), and the router sends "
        "requests only to leaders whose readiness probe, tandem's verdict, passes",
        hint=f"`tandem status {name}` shows each group's verdict; leave out --supervise",
    )


def supervise(
    name: str,
    policy: SupervisorPolicy = SupervisorPolicy(),
    *,
    group: int = 0,
    on_event: Callable[[str], None] = lambda text: None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    judge: Assess = assess,
    should_stop: Callable[[], bool] = lambda: False,
) -> int:
    """Watch group ``group`` of deployment ``name`` until it is taken down; restart the group
    when it faults (a deployment of several groups runs one of these for each,
    ``tandem supervise NAME``).

    ``judge`` is ``tandem.operations.health.assess`` (a test passes a scripted one).

    Returns:
        0 when the deployment was taken down, 1 after giving up (every rank is then stopped).

    Raises:
        BackendError: the deployment is a LeaderWorkerSet of several groups, whose groups
            Kubernetes restarts one by one itself.
    """
    try:
        groups = load_state(name).groups
    except StateError:  # taken down already: the loop says so
        groups = []
    if groups and groups[0].backend == "k8s" and len(groups) > 1:
        raise kubernetes_restarts_groups(name)
    several = len(groups) > 1
    log = EventLog(name, on_event, group=group if several else None)
    pid_file = DeploymentDir.of(name).supervisor_pid(group if several else None)
    me = ProcessIdentity.current()
    private_dir(pid_file.parent)
    write_text(pid_file, me.text() + "\n", private=True)
    restarts, last_restart, misses = 0, clock(), 0
    step, healthy_since = 0, None  # the back-off's exponent; since when the group is healthy
    tracker = ProgressTracker(clock=clock)
    last_canary = -float("inf")
    log(
        f"supervising '{name}' (pid {me.pid}): every {policy.interval_s:g} s, at most "
        f"{policy.max_restarts} restart(s) in a row, back-off {policy.backoff_s:g} s "
        f"x{policy.backoff_factor:g} (back to {policy.backoff_s:g} s after "
        f"{policy.backoff_reset_s:g} s healthy)"
    )
    try:
        while not should_stop():
            try:
                state = load_state(name).group(group)
            except StateError:
                log(f"'{name}' was taken down; the supervisor stops")
                return 0
            backend = backend_for(state.backend)
            canary_due = bool(policy.canary_interval_s) and (
                clock() - last_canary >= policy.canary_interval_s
            )
            try:
                report = judge(
                    state,
                    backend=backend,
                    tracker=tracker,
                    canary_mode="idle" if canary_due else "never",
                    canary_timeout_s=policy.canary_timeout_s,
                    stall_s=policy.stall_s,
                )
            except TandemError as exc:  # a node unreachable counts as its rank being gone
                report = Assessment(
                    name=name,
                    verdict=Verdict.DEGRADED,
                    rank=exc.rank,
                    reason=f"cannot check the ranks: {exc.message}",
                )
            if report.api.canary != "skipped":
                last_canary = clock()
            if report.verdict is not Verdict.HEALTHY:
                healthy_since = None
            elif healthy_since is None:
                healthy_since = clock()
            only_health = report.only_the_api_is_silent
            misses = misses + 1 if only_health else 0
            if report.verdict in (Verdict.HEALTHY, Verdict.STARTING) or (
                only_health and misses < policy.health_failures
            ):
                if restarts and clock() - last_restart >= policy.stable_s:
                    log(f"healthy for {policy.stable_s:g} s: the restart count starts over")
                    restarts = 0
                healthy_s = clock() - healthy_since if healthy_since is not None else 0.0
                if step and healthy_s >= policy.backoff_reset_s:
                    log(
                        f"healthy for {policy.backoff_reset_s:g} s: the next restart waits "
                        f"{policy.backoff_s:g} s again"
                    )
                    step = 0
                sleep(policy.interval_s)
                continue
            seen_at = clock()
            log("group broken: " + describe(report))
            if policy.membership:
                leave_rotation(name, state.endpoint, log)
            if restarts >= policy.max_restarts:
                log(
                    f"giving up after {restarts} restart(s): stopping every rank "
                    f"(`tandem up` starts it again, `tandem down` clears it)"
                )
                backend.down(state, on_event=log)
                state.ready = False
                state.save()
                return 1
            delay = backoff_delay(policy, step)
            restarts, step = restarts + 1, step + 1
            log(
                f"restart {restarts}/{policy.max_restarts} in {delay:g} s: stopping every rank, "
                "then starting workers first, then the leader"
            )
            sleep(delay)
            if should_stop() or not DeploymentDir.of(name).state_file.exists():
                continue

            def relaunch(
                state: GroupState = state,
                backend: Backend = backend,
                restart: int = restarts,
                seen_at: float = seen_at,
            ) -> str:
                new_state = restart_group(state, backend, log)
                log(
                    f"restart {restart} done: {new_state.endpoint} answers again "
                    f"{clock() - seen_at:.1f} s after the fault was seen"
                )
                return new_state.endpoint

            try:
                if policy.membership:  # it left at once; a broken group has nothing to drain
                    cycle_group(name, state.endpoint, relaunch, log)
                else:
                    relaunch()
                misses = 0
                tracker = ProgressTracker(clock=clock)
            except TandemError as exc:
                log(f"restart {restarts} failed: {exc.message}")
            last_restart = clock()
        log("the supervisor stops: asked to")
        return 0
    except BaseException as exc:
        log(f"the supervisor stops: {interruption(exc) or f'{type(exc).__name__}: {exc}'}")
        raise
    finally:
        if ProcessIdentity.parse(_read(pid_file)) == me:
            pid_file.unlink(missing_ok=True)


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def running_supervisor(
    name: str, path: Path, *, on_event: Callable[[str], None] = lambda text: None
) -> ProcessIdentity | None:
    """The supervisor of ``name`` running on this machine, if its pid file ``path``
    (``supervisor.pid``, or ``supervisor-gG.pid`` of one group of several) proves it.

    The file holds the supervisor's identity (pid, start time, boot): it names that process only
    while that very process runs. A file an older tandem wrote holds a bare pid; it counts when
    that process runs ``supervise``, was started on this boot and before the file was written.
    Anything else is stale: ``on_event`` says so, and the file is removed, never its pid
    signalled.
    """
    text = _read(path).strip()
    if not text:
        return None
    identity = ProcessIdentity.parse(text)
    if identity is None and text.isdigit():
        identity = _legacy_identity(int(text), path)
    if identity is not None and identity.find() is not None:
        return identity
    on_event(
        f"{path.name} names pid {text.split()[0]}, which is no supervisor of '{name}' now "
        "(it exited; the pid may be another process's): not signalled, stale file removed"
    )
    path.unlink(missing_ok=True)
    return None


def _legacy_identity(pid: int, path: Path) -> ProcessIdentity | None:
    """The identity of the supervisor a bare-pid file (an older tandem's) names, if it runs."""
    process = read_process(pid)
    try:
        written = path.stat().st_mtime
    except OSError:
        return None
    if (
        process is None
        or "supervise" not in process.cmdline
        or written < boot_time_s()
        or started_at_s(process) > written + 30  # start times from btime drift by seconds
    ):
        return None
    return ProcessIdentity.of(process)


def stop_supervisors(
    name: str,
    *,
    timeout_s: float = 120.0,
    resend_s: float = 5.0,
    on_event: Callable[[str], None] = lambda text: None,
) -> bool:
    """Stop every supervisor of ``name`` (SIGTERM, then wait); True if one was running.

    Only a process its pid file proves to be it is signalled (``running_supervisor``). The
    request goes into the deployment's ``events.log``, before the supervisor's own "stops"
    line. A supervisor in the middle of a restart stops the ranks it started before it exits.
    SIGTERM is sent again every ``resend_s``: one that lands while the supervisor stops ranks
    only hurries that stop (``tandem.interrupts.shielded``), the next one ends it.
    """
    running = [
        found
        for path in DeploymentDir.of(name).supervisor_pids()
        if (found := running_supervisor(name, path, on_event=on_event)) is not None
    ]
    if not running:
        return False
    log = EventLog(name, on_event)
    pids = ", ".join(str(s.pid) for s in running)
    log(f"`tandem down` (pid {os.getpid()}) stops the supervisor (pid {pids})")
    deadline, resend_at = time.monotonic() + timeout_s, 0.0
    while time.monotonic() < deadline and any(s.find() is not None for s in running):
        if time.monotonic() >= resend_at:
            for supervisor in running:
                _signal(supervisor, signal.SIGTERM)
            resend_at = time.monotonic() + resend_s
        time.sleep(0.2)
    for supervisor in running:
        if supervisor.find() is not None:
            log(f"the supervisor (pid {supervisor.pid}) did not stop in {timeout_s:g} s: SIGKILL")
            _signal(supervisor, signal.SIGKILL)
    return True


def _signal(process: ProcessIdentity, sig: signal.Signals) -> None:
    if process.find() is None:
        return
    try:
        os.kill(process.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
