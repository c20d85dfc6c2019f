"""The rank plan as shell commands or JSON: what each node runs, exactly.

The shell form is what a user would paste on each host; the JSON form is the stable interface
for scripts: ``{"ranks": [{"rank", "node", "role", "argv", "env", ...}]}``.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable

from tandem.rankplan import RankPlan, RankSpec
from tandem.spec.deployment import Deployment


def to_json(plan: RankPlan) -> str:
    """The plan as JSON: endpoint, model, world size and every rank in rank order."""
    return json.dumps(plan.model_dump(mode="json"), indent=2)


def shell_command(rank: RankSpec) -> str:
    """One rank as a POSIX shell command: ``env VAR=value ... vllm serve ...``."""
    assignments = [f"{key}={shlex.quote(value)}" for key, value in rank.env.items()]
    lines = ["env \\"] + [f"  {a} \\" for a in assignments]
    argv = [shlex.quote(a) for a in rank.argv]
    # One flag (with its value) per line, as the seeds write their commands.
    parts: list[str] = [" ".join(argv[:3])]
    i = 3
    while i < len(argv):
        if i + 1 < len(argv) and not rank.argv[i + 1].startswith("--"):
            parts.append(f"{argv[i]} {argv[i + 1]}")
            i += 2
        else:
            parts.append(argv[i])
            i += 1
    lines += [f"  {p} \\" for p in parts[:-1]] + [f"  {parts[-1]}"]
    return "\n".join(lines)


def shell_blocks(
    plan: RankPlan, runs: str, command: Callable[[RankSpec], str], note: str = ""
) -> str:
    """Every rank's command in start order (workers first), each headed by where it runs, under
    a line on the deployment (``runs``: what runs a rank); the process and docker targets."""
    blocks = [
        f"# deployment {plan.deployment}: {len(plan.ranks)} {runs}(s), world size "
        f"{plan.world_size}; API at {plan.endpoint}/v1 as model '{plan.model}'{note}"
    ]
    for rank in plan.in_start_order():
        blocks.append(
            f"# rank {rank.rank} ({rank.role.value}) on node {rank.node} "
            f"[{rank.address}], start wave {rank.start_order}\n{command(rank)}"
        )
    return "\n\n".join(blocks) + "\n"


def render(plan: RankPlan, deployment: Deployment, fmt: str) -> str:
    """The ``process`` target: ``fmt`` is ``shell`` or ``json``."""
    return to_json(plan) if fmt == "json" else shell_blocks(plan, "rank", shell_command)
