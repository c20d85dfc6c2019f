"""One look at a deployment: the node agent's request for each node, and its answers typed.

The backends differ only in how they reach a node (this machine's ``/proc``, ``ssh``,
``kubectl exec``); what a node is asked and how its answer becomes a ``Look`` is here, once.
A node that cannot be asked makes its ranks ``unreachable`` and its readings an ``error``: one
bad node never hides the others.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping

from tandem.backends.base import Look, NodeFacts, ProcessFact, RankObservation
from tandem.backends.state import GroupState, RankState


def ranks_by_node(state: GroupState) -> dict[str, list[RankState]]:
    """Each node's ranks, in rank order."""
    nodes: dict[str, list[RankState]] = {}
    for record in sorted(state.ranks, key=lambda r: r.rank):
        nodes.setdefault(record.node, []).append(record)
    return nodes


def agent_request(
    state: GroupState,
    ranks: list[RankState],
    log_of: Callable[[RankState], str],
    *,
    nodes: bool,
) -> str:
    """The JSON request for the node holding ``ranks`` (``tandem.agent``)."""
    return json.dumps(
        {
            "deployment": state.name,
            "launch": state.launch_id,
            "logs": {str(r.rank): [log_of(r), r.log_offset_ready] for r in ranks},
            "node": nodes,
        }
    )


def answer_of(returncode: int, stdout: str, stderr: str) -> dict | str:
    """The agent's answer from how its run ended: its JSON line, or why there is none."""
    if returncode != 0:
        return stderr.strip()[-300:] or f"the node agent exited {returncode}"
    lines = stdout.strip().splitlines()
    try:
        answer = json.loads(lines[-1]) if lines else None
    except ValueError:
        answer = None
    if not isinstance(answer, dict):
        return f"the node agent printed no answer: {stdout[-200:]!r}"
    return answer


def look_of(state: GroupState, answers: Mapping[str, dict | str], *, nodes: bool) -> Look:
    """The look from each node's answer (a dict) or why it could not be asked (a str). Pure."""
    look = Look()
    for node, ranks in ranks_by_node(state).items():
        answer = answers.get(node, "not asked")
        if isinstance(answer, str):
            for record in ranks:
                look.ranks[record.rank] = RankObservation(
                    rank=record.rank, unreachable=answer[:300]
                )
            if nodes:
                look.nodes[node] = NodeFacts(node=node, error=answer[-200:])
            continue
        found = answer.get("ranks") or {}
        logs = answer.get("logs") or {}
        for record in ranks:
            look.ranks[record.rank] = RankObservation(
                rank=record.rank,
                processes=[ProcessFact.model_validate(p) for p in found.get(str(record.rank), [])],
                log_since_ready=logs.get(str(record.rank), []),
            )
        if nodes:
            look.nodes[node] = NodeFacts.of(node, answer.get("node") or {})
    return look
