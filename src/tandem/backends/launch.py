"""What every backend does the same way when it launches ranks.

The state record of a new deployment, the record of each launched rank, the recording of
start-up phases as readiness reaches them, and the wait itself with the recipe's timeouts.
Backends differ in how a rank is started and watched (a local process, a process or container
over SSH, a pod); not in what is written down.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable, Sequence
from datetime import UTC, datetime

from tandem import wire
from tandem.backends.processes import ProcessIdentity
from tandem.backends.state import GroupState, Place, RankState
from tandem.plan.status import planned_vs_boot
from tandem.rankplan import RankPlan, RankSpec, Role
from tandem.readiness import Readiness, WatchedRank, wait_ready
from tandem.spec.deployment import Deployment
from tandem.vllm_log import PhaseMark


def launch_marked(rank: RankSpec, state: GroupState) -> RankSpec:
    """The rank as it is started: the leader, which serves the API, also gets ``VLLM_API_KEY``
    from tandem's own environment when it is set there, and every rank this launch's id
    (``TANDEM_LAUNCH``).

    Both are added only at launch, never to the plan: ``tandem plan``, ``render``, the state
    files and support bundles cannot hold the key (readiness, chat, bench and eval read the same
    variable and send it), and the plan and rendered commands stay the same from one ``up`` to
    the next.
    """
    added = {}
    key = os.environ.get(wire.VLLM_API_KEY)
    if rank.role is Role.LEADER and key:
        added[wire.VLLM_API_KEY] = key
    if state.launch_id:
        added[wire.TANDEM_LAUNCH] = state.launch_id
    return rank.model_copy(update={"env": {**rank.env, **added}}) if added else rank


def new_state(
    plan: RankPlan,
    deployment: Deployment,
    *,
    backend: str,
    run_dir: str | None = None,
    place: Place | None = None,
) -> GroupState:
    """The record of a group about to launch, with the resolved recipe and cluster, this
    launch's id, and the command and boot that launch it (``tandem.backends.processes``);
    ``place``: which group of which deployment (default: the one group of its own name)."""
    me = ProcessIdentity.current()
    place = place or Place(deployment.name)
    return GroupState(
        name=deployment.name,
        deployment_name=place.deployment,
        group=place.group,
        home=place.home or place.deployment,
        backend=backend,
        recipe=deployment.recipe.model_dump(mode="json"),
        cluster=deployment.cluster.model_dump(mode="json"),
        endpoint=plan.endpoint,
        model=plan.model,
        run_dir=run_dir,
        launch_id=secrets.token_hex(8),
        launcher_pid=me.pid,
        launcher_start_ticks=me.start_ticks,
        boot_id=me.boot,
    )


def interrupted(state: GroupState) -> bool:
    """Its launch never became ready and the command that launched it is gone (killed, or the
    machine rebooted): a live process that merely has its pid now does not count.

    What such a launch left is no deployment to protect: the next ``up`` clears it.
    """
    if state.ready or state.launcher_pid is None:
        return False
    if state.launcher_start_ticks is None:
        return True
    # the command that launched it (``up``, or a supervisor's restart), as recorded
    launcher = ProcessIdentity(state.launcher_pid, state.launcher_start_ticks, state.boot_id)
    return launcher.find() is None


def record_rank(
    state: GroupState,
    rank: RankSpec,
    *,
    log: str,
    pid: int | None = None,
    netns: str | None = None,
    netns_inode: str | None = None,
) -> RankState:
    """Add a launched rank to the state and save it at once (a crash then still finds it)."""
    record = RankState(
        rank=rank.rank,
        node=rank.node,
        role=rank.role.value,
        address=rank.address,
        pid=pid,
        netns=netns,
        netns_inode=netns_inode,
        log=log,
        started_at=datetime.now(UTC),
    )
    state.ranks.append(record)
    state.save()
    return record


def phase_recorder(
    state: GroupState, on_phase: Callable[[PhaseMark], None]
) -> Callable[[PhaseMark], None]:
    """An ``on_phase`` that saves each phase in the state before passing it on."""

    def record(mark: PhaseMark) -> None:
        state.phases.append(mark)
        state.save()
        on_phase(mark)

    return record


def await_ready(
    plan: RankPlan,
    deployment: Deployment,
    ranks: Sequence[WatchedRank],
    state: GroupState,
    *,
    timeout_s: float | None,
    on_phase: Callable[[PhaseMark], None],
) -> Readiness:
    """Wait for readiness with the recipe's timeouts, saving phases and then the boot figures,
    compared with the plan once, here (``tandem status`` shows the comparison and plans nothing).

    The API key, when the server needs one, comes from tandem's own VLLM_API_KEY.
    """
    readiness = wait_ready(
        plan.endpoint,
        plan.model,
        ranks,
        timeout_s=deployment.recipe.timeouts.startup_s if timeout_s is None else timeout_s,
        request_timeout_s=deployment.recipe.timeouts.request_s,
        on_phase=phase_recorder(state, on_phase),
        api_key=os.environ.get(wire.VLLM_API_KEY),
    )
    state.boot = readiness.boot
    state.planned = planned_vs_boot(state.recipe, state.cluster, state.boot)
    state.ready = True
    state.save()
    return readiness
