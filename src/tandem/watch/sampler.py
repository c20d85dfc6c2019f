"""The watch loop: one sample every interval, appended to the folder, until the duration is up.

Algorithm (``Watcher.run``):

1. read the deployment's state; open the folder. A folder with a ``watch.json`` is resumed:
   it must watch the same deployment; its interval, duration and thresholds are kept, the
   segment number goes up by one and the time already covered counts against the duration (the
   gap while no watch ran does not). A new folder gets a ``watch.json`` from the state and the
   recipe's ``watch:`` section;
2. every ``interval_s`` (ticks on a fixed grid, so a slow sample does not shift the next):
   one look at the deployment — its backend asks each node once (``Backend.observe(state,
   nodes=True)``: the ranks' processes and logs for the verdict, the node's memory, GPUs and
   RDMA ports for the sample), the leader is asked once (``/health``, one ``/metrics`` scrape
   that both the verdict and the sample read), judged once by ``tandem.operations.health`` — and
   the new lines of ``events.log``; append the sample and hand it to ``on_sample`` (the live view,
   the exporter);
3. stop when the duration is covered, ``should_stop()`` says so, the deployment was taken
   down (its state is gone), or on Ctrl-C; the file is complete after every sample, so a kill
   loses at most the sample being taken. A node that cannot be reached is a sample with the
   verdict ``down``, not an end of the watch.

Clock and sleep are injected (``clock`` is wall time: samples carry UTC timestamps).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from tandem.backends.base import Backend, Look, NodeFacts, backend_for
from tandem.backends.state import load_state
from tandem.errors import StateError, TandemError
from tandem.operations.health import Assessment, ProgressTracker, RankCondition, Verdict, assess
from tandem.watch.events import EventReader
from tandem.watch.folder import SampleLog, read_run, read_samples, write_run
from tandem.watch.leader import parse_leader_metrics
from tandem.watch.nodes import node_readings
from tandem.watch.sample import LeaderReading, RankInfo, Sample, WatchRun
from tandem.watch.series import covered_s

CANARY_EVERY_S = 60.0
"""At most one 1-token canary a minute from a watch (an idle engine that hangs shows then)."""


class Watcher:
    """Samples one deployment into one folder.

    Usage:
        Watcher("tiny-local", Path("runs/w1"), interval_s=5, duration_s=3 * 3600).run()

    Args:
        interval_s, duration_s: for a new folder (None: the recipe's interval; run until
            stopped); a resumed folder keeps its own.
        on_sample: called with each sample after it is written.
        backend: how the nodes are reached (the deployment's own backend unless given).
        group: which group of a deployment of several (each is watched on its own).
    """

    def __init__(
        self,
        name: str | None,
        out: Path,
        *,
        interval_s: float | None = None,
        duration_s: float | None = None,
        on_sample: Callable[[Sample], None] = lambda sample: None,
        should_stop: Callable[[], bool] = lambda: False,
        backend: Backend | None = None,
        group: int = 0,
    ) -> None:
        whole = load_state(name)
        self.state = whole.group(group)
        self.several = len(whole.groups) > 1
        self.out = Path(out)
        self.on_sample, self.should_stop = on_sample, should_stop
        self.clock: Callable[[], float] = time.time
        self.sleep: Callable[[float], None] = time.sleep
        self._tracker = ProgressTracker()
        self._last_canary = -CANARY_EVERY_S
        previous = read_run(self.out)
        if previous is not None and previous.name != self.state.name:
            raise StateError(
                f"{self.out} holds a watch of '{previous.name}', not of '{self.state.name}'",
                hint="point --out at a new folder",
            )
        self.samples_before = read_samples(self.out).records if previous else []
        self.run_info = previous or self._new_run(interval_s, duration_s)
        self.backend = backend or backend_for(self.state.backend)

    def _new_run(self, interval_s: float | None, duration_s: float | None) -> WatchRun:
        thresholds = self.state.deployment(lenient=True).recipe.watch
        ranks = sorted(self.state.ranks, key=lambda r: r.rank)
        run = WatchRun(
            name=self.state.name,
            backend=self.state.backend,
            endpoint=self.state.endpoint,
            interval_s=interval_s or thresholds.interval_s,
            duration_s=duration_s,
            nodes=list(dict.fromkeys(r.node for r in ranks)),
            ranks=[RankInfo(rank=r.rank, node=r.node, role=r.role) for r in ranks],
            thresholds=thresholds,
            started_at=datetime.fromtimestamp(self.clock(), UTC),
        )
        write_run(self.out, run)
        return run

    @property
    def resumed(self) -> bool:
        return bool(self.samples_before)

    def run(self) -> WatchRun:
        """Sample until the duration is covered or ``should_stop``; returns the folder's run."""
        before = self.samples_before
        seq = before[-1].seq + 1 if before else 0
        segment = before[-1].segment + 1 if before else 0
        remaining = (
            self.run_info.duration_s - covered_s(before)
            if self.run_info.duration_s is not None
            else None
        )
        interval = self.run_info.interval_s
        since = before[-1].time if before else self.run_info.started_at
        events = EventReader(
            self.state.deployment_name,
            since=since,
            group=self.state.group if self.several else None,
        )
        log = SampleLog(self.out)
        started = self.clock()
        try:
            while not self.should_stop() and (remaining is None or remaining > 0):
                tick = self.clock()
                try:
                    sample = self.take(events, seq=seq, segment=segment)
                except StateError:  # `tandem down` removed the state: nothing to watch
                    break
                log.append(sample)
                self.on_sample(sample)
                seq += 1
                if remaining is not None and self.clock() - started >= remaining:
                    break
                elapsed = self.clock() - tick
                self.sleep(max(0.0, interval - elapsed % interval))
        finally:
            log.close()
        return self.run_info

    def _judge(self, look: Look) -> Assessment:
        """The health model's verdict on this look; a canary completion at most every
        ``CANARY_EVERY_S`` (between them the token counters, tracked across samples, show
        progress), so the watch does not add a request to the counters it records at every
        sample."""
        due = self.clock() - self._last_canary >= CANARY_EVERY_S
        report = assess(
            self.state,
            look=look,
            canary_mode="idle" if due else "never",
            tracker=self._tracker,
        )
        if due:
            self._last_canary = self.clock()
        return report

    def take(self, events: EventReader, *, seq: int, segment: int) -> Sample:
        """One sample now: one look at the nodes and the leader, judged once.

        Raises:
            StateError: the deployment's state is gone (taken down).
        """
        begun = self.clock()
        # a restart records new processes
        self.state = load_state(self.state.deployment_name).group(self.state.group)
        try:
            look = self.backend.observe(self.state, nodes=True)
        except TandemError as exc:  # no node could be asked: every rank counts as down
            look = Look(
                nodes={n: NodeFacts(node=n, error=exc.message) for n in self.run_info.nodes}
            )
            up, verdict, leader = {}, Verdict.DOWN, None
        else:
            report = self._judge(look)
            up = {r.rank: r.health.state is not RankCondition.DEAD for r in report.ranks}
            verdict, api = report.verdict, report.api
            leader = _leader_reading(api.metrics_text, api.metrics_s)
        new, restarts = events.read()
        return Sample(
            seq=seq,
            segment=segment,
            time=datetime.fromtimestamp(begun, UTC),
            verdict=verdict,
            nodes=node_readings(self.state, look, up),
            leader=leader,
            restarts=restarts,
            events=new,
            cost_s=round(self.clock() - begun, 4),
        )


def _leader_reading(text: str | None, scrape_s: float | None) -> LeaderReading | None:
    """The sample's reading of the page the verdict's scrape brought; None without one."""
    if text is None:
        return None
    try:
        return parse_leader_metrics(text, scrape_s or 0.0)
    except ValueError:
        return None
