"""A sample's nodes, from the one look the sample took (``Backend.observe(state, nodes=True)``).

Every backend reaches its nodes once per sample through the node agent
(``tandem.agent``): the same answer gives the health model the ranks' processes and
the watch each node's memory, GPUs and RDMA ports, and the ranks' RSS and CPU. A node that
could not be read has ``error`` set, not an exception, so one bad node never stops the watch.
"""

from __future__ import annotations

from tandem.backends.base import Look, NodeFacts, RankObservation
from tandem.backends.observation import ranks_by_node
from tandem.backends.state import GroupState
from tandem.watch.gpu import parse_nvidia_smi
from tandem.watch.sample import NodeReading, RankUsage, RdmaPort


def node_readings(state: GroupState, look: Look, up: dict[int, bool]) -> list[NodeReading]:
    """One reading per node of ``state``; ``up`` is each rank's liveness as judged (pure)."""
    return [
        node_reading(
            look.nodes.get(node) or NodeFacts(node=node, error="not read"),
            [(r.rank, r.role, look.rank(r.rank)) for r in ranks],
            up,
        )
        for node, ranks in ranks_by_node(state).items()
    ]


def node_reading(
    facts: NodeFacts, ranks: list[tuple[int, str, RankObservation]], up: dict[int, bool]
) -> NodeReading:
    """A node's facts and its ranks' processes -> its reading (pure)."""
    return NodeReading(
        **facts.memory(),
        ranks=[_usage(rank, role, seen, up) for rank, role, seen in ranks],
        gpus=parse_nvidia_smi(facts.nvidia_smi),
        rdma=[
            RdmaPort(
                device=p.device,
                port=p.port,
                state=p.state,
                xmit_bytes=_words(p.port_xmit_data),
                rcv_bytes=_words(p.port_rcv_data),
                xmit_discards=p.port_xmit_discards,
                symbol_errors=p.symbol_error,
                link_downed=p.link_downed,
            )
            for p in facts.rdma
        ],
        error=facts.error,
    )


def _usage(rank: int, role: str, seen: RankObservation, up: dict[int, bool]) -> RankUsage:
    alive = [p for p in seen.processes if p.state not in ("Z", "X")]
    rss = [p.rss_bytes for p in alive if p.rss_bytes is not None]
    cpu = [p.cpu_s for p in alive if p.cpu_s is not None]
    return RankUsage(
        rank=rank,
        role=role,
        up=up.get(rank, False),
        processes=len(alive),
        rss_bytes=sum(rss) if alive else None,
        cpu_s=round(sum(cpu), 2) if alive else None,
    )


def _words(value: int | None) -> int | None:
    return value * 4 if value is not None else None  # the data counters count 4-byte words
