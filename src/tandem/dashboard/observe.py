"""The page's observations: one ``tandem status`` a refresh, and what follows from the last few.

``observe`` is the one way the page gathers facts: the status that ``tandem status --json
--nodes`` prints (verdict, groups, router, ranks, and each group's overview: its leader's
``/metrics``, its nodes' readings, revision, evidence and events). It calls status through
this one function, so the page can never show a fact status does not.

``Observer.take`` makes one observation and keeps it with its predecessors (a window of
``window_s``); from them it derives what one observation cannot hold: each group's traffic over
the window (``tandem.dashboard.traffic``), when a group last produced a token (its generation
counter moved between two observations) and when its last canary answered. A canary (a
1-token completion on an idle server) is sent at most every ``canary_every_s``, as a watch
does, so the page does not make the traffic it shows. Clock injected.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from datetime import UTC, datetime

from pydantic import BaseModel, Field

from tandem.dashboard.traffic import Traffic, between, combine
from tandem.errors import TandemError
from tandem.operations import lifecycle
from tandem.operations.health import ProgressTracker
from tandem.operations.lifecycle import DeploymentStatus
from tandem.vllm_metrics import ServingReading
from tandem.watch.sampler import CANARY_EVERY_S


def observe(
    name: str | None,
    *,
    canary_mode: str = "idle",
    trackers: dict[int, ProgressTracker] | None = None,
) -> DeploymentStatus:
    """One observation: ``tandem status --json --nodes`` of deployment ``name``."""
    return lifecycle.status(name, canary_mode=canary_mode, nodes=True, trackers=trackers)


class GroupView(BaseModel):
    """One group's figures that need more than one observation."""

    group: int
    name: str
    traffic: Traffic | None = Field(
        default=None, description="Over the window; None: no window yet or no /metrics."
    )
    last_token_at: datetime | None = Field(
        default=None, description="The last observation at which its output tokens had grown."
    )
    last_canary_at: datetime | None = Field(
        default=None, description="The last observation whose canary answered."
    )


class View(BaseModel):
    """What one page shows: the latest observation and what follows from its predecessors."""

    name: str | None
    status: DeploymentStatus | None = Field(
        default=None, description="The latest observation; None: none succeeded yet."
    )
    error: str | None = Field(default=None, description="Why the latest observation failed.")
    observed_at: datetime | None = Field(
        default=None, description="When the latest successful observation was complete."
    )
    took_s: float | None = None
    total: Traffic | None = Field(default=None, description="Every group's traffic together.")
    groups: list[GroupView] = Field(default_factory=list)
    refresh_s: float
    window_s: float
    started_at: datetime


class _Moment(BaseModel):
    at: float
    serving: dict[str, ServingReading | None]


class Observer:
    """Observes one deployment every refresh and keeps the view the page renders.

    Usage:
        observer = Observer("tiny-local", refresh_s=2)
        view = observer.take()            # one observation now
        observer.run(stop)                # or: one a refresh, until ``stop`` is set
    """

    def __init__(
        self,
        name: str | None,
        *,
        refresh_s: float = 2.0,
        window_s: float = 30.0,
        canary_every_s: float = CANARY_EVERY_S,
        clock: Callable[[], float] = time.time,
        look: Callable[..., DeploymentStatus] = observe,
    ) -> None:
        self.name, self.refresh_s, self.window_s = name, refresh_s, window_s
        self.canary_every_s = canary_every_s
        self.clock, self.look = clock, look
        self.trackers: dict[int, ProgressTracker] = {}
        self._moments: deque[_Moment] = deque()
        self._last_canary = -canary_every_s
        self._last_token: dict[str, datetime] = {}
        self._last_answer: dict[str, datetime] = {}
        self._lock = threading.Lock()
        self._view = View(
            name=name,
            refresh_s=refresh_s,
            window_s=window_s,
            started_at=datetime.fromtimestamp(clock(), UTC),
        )

    @property
    def view(self) -> View:
        with self._lock:
            return self._view

    def take(self) -> View:
        """One observation now; the new view (the previous status stays on a failure)."""
        begun = self.clock()
        due = begun - self._last_canary >= self.canary_every_s
        try:
            status = self.look(
                self.name, canary_mode="idle" if due else "never", trackers=self.trackers
            )
        except TandemError as exc:
            with self._lock:
                self._view = self._view.model_copy(update={"error": exc.message})
            return self._view
        if due:
            self._last_canary = begun
        done = self.clock()
        view = self._derive(status, done)
        view.took_s = round(done - begun, 3)
        with self._lock:
            self._view = view
        return view

    def _derive(self, status: DeploymentStatus, now: float) -> View:
        serving = {g.name: g.overview.serving if g.overview else None for g in status.groups}
        moment = _Moment(at=now, serving=serving)
        previous = self._moments[-1] if self._moments else None
        self._moments.append(moment)
        while len(self._moments) > 2 and now - self._moments[1].at >= self.window_s:
            self._moments.popleft()
        base = self._moments[0] if len(self._moments) > 1 else None
        at = datetime.fromtimestamp(now, UTC)
        groups = []
        for g in status.groups:
            reading = serving[g.name]
            before = previous.serving.get(g.name) if previous else None
            if _grew(before, reading):
                self._last_token[g.name] = at
            if g.overview is not None and g.overview.canary == "ok":
                self._last_answer[g.name] = g.overview.observed_at
            old = base.serving.get(g.name) if base else None
            groups.append(
                GroupView(
                    group=g.group,
                    name=g.name,
                    traffic=between(old, reading, now - base.at)
                    if base and old and reading
                    else None,
                    last_token_at=self._last_token.get(g.name),
                    last_canary_at=self._last_answer.get(g.name),
                )
            )
        total = None
        if base is not None:  # over the groups read at both ends, so none comes or goes
            both = [n for n, r in serving.items() if r and base.serving.get(n)]
            then = combine([r for n in both if (r := base.serving.get(n))])
            current = combine([r for n in both if (r := serving.get(n))])
            if then and current:
                total = between(then, current, now - base.at)
        return View(
            name=self.name,
            status=status,
            observed_at=at,
            total=total,
            groups=groups,
            refresh_s=self.refresh_s,
            window_s=self.window_s,
            started_at=self._view.started_at,
        )

    def run(self, stop: threading.Event) -> None:
        """One observation a refresh (on a fixed grid) until ``stop`` is set."""
        while not stop.is_set():
            begun = self.clock()
            self.take()
            stop.wait(max(0.0, self.refresh_s - (self.clock() - begun)))


def _grew(before: ServingReading | None, after: ServingReading | None) -> bool:
    if before is None or after is None:
        return False
    was, now = before.generation_tokens, after.generation_tokens
    return was is not None and now is not None and now > was
