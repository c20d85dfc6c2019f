"""``tandem upgrade`` and ``tandem rollback``: change a running deployment behind a gate, and back.

A new image that garbles long context, a recipe change that halves throughput, an engine that
no longer starts: each passes a readiness probe or fails after the old revision is gone. So an
upgrade goes:

1. **check before stopping**: the new recipe must load, plan and pass its preflight (but for
   the ports and memory the running revision holds), and be the same deployment (its name, its
   number of groups);
2. **what the gate holds the new revision to**, taken from the running revision before
   anything stops: its answers reference (``tandem.eval.reference``: the greedy answers to
   tandem's shipped prompt and known-answer sets, with their log-probabilities and the noise
   the server itself showed; recorded once a revision and kept beside it as
   ``revisions/N.answers.json``) and its speed, measured now on the first group in rounds (the
   gate compares like with like: same workload, same machine, the same warm-up);
3. **roll**: one group at a time (every group at once on Kubernetes, where one object launches
   them), the first the canary: the group leaves the router's rotation while another serves,
   drains, stops (its compile caches stay, so the way back is a warm start), starts on the new
   revision and meets **the gate** at its own leader: ``tandem eval smoke`` (template, the
   answers against the reference, determinism, and the tool and reasoning checks the recipe
   promises) and the same bench rounds, judged by ``bench.speed_gate``: slower than the
   limits of ``GateLimits`` beyond the rounds' noise fails; within them passes; a difference
   the noise cannot tell from the limit is measured again, and passes if it still cannot be
   told (a gate that cries wolf is worse than none); then it joins again;
4. a failure at 3 **rolls back**: that group starts again on the old revision, warm, and so do
   the groups the roll had already moved, one at a time in reverse; the new revision is
   recorded as failed with the check and its evidence. One group is a roll of one.

``rollback`` is the same roll toward an earlier revision, without a gate. A file
``upgrade.json`` in the deployment's folder names the phase while an upgrade runs; a killed
upgrade leaves it, and the next ``upgrade``, ``rollback`` or ``status`` says which revision was
being left and which was coming.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass
from enum import StrEnum
from functools import partial
from pathlib import Path

from pydantic import BaseModel, Field, model_validator

from tandem import files, ownership, wire
from tandem.backends.base import OnEvent, OnPhase, backend_for
from tandem.backends.state import DeploymentState, GroupState, list_deployments, load_state
from tandem.bench.config import BenchConfig
from tandem.bench.load_generator import BenchResult
from tandem.bench.load_generator import run as run_bench
from tandem.bench.speed_gate import SpeedLimits, counted_medians, speed_verdict
from tandem.errors import CheckFailed, SpecError, StateError, TandemError
from tandem.eval import smoke
from tandem.eval.prompt_sets import reference_sets
from tandem.eval.reference import Reference, load_reference, record_at, save_reference
from tandem.operations import admission, lifecycle, revisions
from tandem.operations.preflight import run_check
from tandem.operations.revisions import Revision, RevisionOutcome
from tandem.operations.supervisor import cycle_group, others_serve
from tandem.rankplan import placed_groups
from tandem.spec.deployment import Deployment

HELD_BY_THE_RUNNING = {"port-taken", "memory-headroom", "shm-too-small"}
"""Preflight rules that the running revision itself fails the new one on (its ports, its
memory): checked again once it has stopped, by the new revision's own start."""
GATE_SMOKE_CHECKS = ["template", "answers", "determinism", "tools", "reasoning", "speculative"]
"""The smoke checks of the gate: all but the long needle, which takes minutes on a real
context (run it with ``tandem eval smoke`` when the context is what changed). ``answers``
early: a revision that answers garbage deterministically passes every other check."""


class GateLimits(BaseModel):
    """How much slower a new revision may be than its baseline before the gate fails it."""

    max_tpot_increase: float = Field(
        default=0.25,
        ge=0,
        le=10,
        description="Median TPOT may grow by this fraction beyond the rounds' noise (0.25 = "
        "25 %); at most 10: 25 would be +2,500 %, no gate.",
    )
    max_throughput_drop: float = Field(
        default=0.25,
        ge=0,
        le=1,
        description="Output tok/s may fall by this fraction beyond the rounds' noise.",
    )
    concurrency: int = Field(default=4, ge=1, description="The gate bench's concurrency.")
    requests: int = Field(default=16, ge=1, description="Requests of each gate bench round.")
    rounds: int = Field(
        default=5,
        ge=2,
        le=20,
        description="Gate bench rounds on each revision, the first a warm-up not counted: 5 "
        "leaves the 4 a side that a 95 % interval of the shift needs.",
    )
    input_tokens: int = Field(default=128, ge=1)
    output_tokens: int = Field(default=32, ge=1)
    bench: bool = Field(
        default=True, description="Run the gate bench (--no-bench: the smoke checks alone)."
    )

    @model_validator(mode="after")
    def _limits_of_a_bench_that_runs(self) -> GateLimits:
        """A bench limit given with ``bench`` off would be ignored: refused, not dropped."""
        given = sorted(self.model_fields_set - {"bench"})
        if not self.bench and given:
            raise ValueError(f"{', '.join(given)} limit the gate bench, which bench=False skips")
        return self

    def speed(self) -> SpeedLimits:
        return SpeedLimits(
            max_tpot_increase=self.max_tpot_increase, max_throughput_drop=self.max_throughput_drop
        )


class GateResult(BaseModel):
    passed: bool
    check: str | None = Field(default=None, description="The check that failed, if one did.")
    evidence: list[str] = Field(default_factory=list)
    figures: dict[str, float] = Field(default_factory=dict)
    answers: str | None = Field(
        default=None, description="The answers check's verdict, once it ran: its summary."
    )


class UpgradeOutcome(StrEnum):
    UPGRADED = "upgraded"
    ROLLED_BACK = "rolled-back"


class UpgradeResult(BaseModel):
    name: str
    from_revision: int
    to_revision: int
    outcome: UpgradeOutcome
    gate: GateResult = Field(description="The failed gate, else the last group's.")
    group: int | None = Field(default=None, description="The group whose gate failed.")
    running_revision: int


def measure(endpoint: str, model: str, limits: GateLimits, out: Path) -> BenchResult:
    """The gate bench on a group's leader: ``limits.rounds`` rounds of one load point.

    Each measurement draws its prompts from a seed of its own (kept in its ``config.json``):
    with one fixed seed, a baseline taken on a server that had run the gate's bench before
    would be answered from its prefix cache and set a bar no fresh revision reaches.
    """
    config = BenchConfig(
        url=endpoint,
        model=model,
        api_key=os.environ.get(wire.VLLM_API_KEY),
        concurrency=[limits.concurrency],
        requests=limits.requests,
        input_tokens=limits.input_tokens,
        output_tokens=limits.output_tokens,
        ignore_eos=True,
        rounds=limits.rounds,
        seed=secrets.randbelow(2**31),
    )
    return run_bench(config, ownership.output_folder(_unused(out)))


def _unused(path: Path) -> Path:
    """``path``, else ``path.2``, ``path.3``...: the first that does not exist (the run of an
    upgrade killed before its revision was recorded stays as it was)."""
    found, n = path, 1
    while found.exists():
        n += 1
        found = path.with_name(f"{path.name}.{n}")
    return found


def judge_speed(
    baseline: list[BenchResult], measured: Callable[[str], BenchResult], limits: GateLimits
) -> GateResult:
    """The speed part of the gate (``bench.speed_gate``): fail beyond the noise, pass within
    it; a verdict the noise cannot give is measured again once (``measured(folder)``) and
    passes if it still cannot be given, its figures in the evidence."""
    runs = [measured("bench")]
    verdict = speed_verdict(baseline, runs, limits.speed())
    if verdict.outcome == "cannot-tell":
        runs.append(measured("bench-again"))
        verdict = speed_verdict(baseline, runs, limits.speed())
    figures = {f.key: f.new for f in verdict.figures if f.new is not None}
    failed = verdict.outcome == "fail"
    return GateResult(
        passed=not failed,
        check=f"bench: {verdict.summary}" if failed else None,
        evidence=[verdict.summary],
        figures={**figures, "failed": float(verdict.failed_requests)},
    )


def reference_of(name: str, revision: Revision, lead: GroupState, on_event: OnEvent) -> Reference:
    """The answers reference of ``revision``, running at ``lead``: the one recorded beside it,
    else recorded now (a minute or two on a small model; every answer is asked twice).

    Raises:
        EndpointError: the server failed a request (nothing is recorded).
    """
    path = revisions.reference_file(name, revision.number)
    if path.is_file():
        return load_reference(path)
    on_event(
        f"recording the answers of revision {revision.number} (the gate holds the new to them)"
    )
    api_key = os.environ.get(wire.VLLM_API_KEY)
    reference = record_at(lead.endpoint, lead.model, api_key, reference_sets())
    files.private_dir(path.parent)
    save_reference(reference, path)
    judged = "" if reference.judgeable else ", near ties that cannot judge"
    revision.answers = f"{len(reference.answers)} answers{judged} ({path.name})"
    revisions.save(name, revision)
    return reference


def gate(
    group: GroupState,
    held_to: tuple[Reference | None, list[BenchResult]],
    limits: GateLimits,
    out: Path,
    on_event: OnEvent = lambda text: None,
) -> GateResult:
    """Smoke checks at the group's leader (the answers against the reference), then the bench
    rounds against the baseline's; the first failure decides."""
    reference, baseline = held_to
    report = smoke.run_smoke(
        smoke.target_of(group),
        ownership.output_folder(out / "smoke", force=True),
        smoke.SmokeRun(checks=GATE_SMOKE_CHECKS, first_failure=True, reference=reference),
        api_key=os.environ.get(wire.VLLM_API_KEY),  # the key the deployment was started with
        on_result=lambda r: on_event(f"gate: smoke {r.check} {r.outcome.value}: {r.summary}"),
    )
    failed = next((c for c in report.checks if c.outcome is smoke.Outcome.FAIL), None)
    answers = next(
        (f"{c.outcome.value}: {c.summary}" for c in report.checks if c.check == "answers"), None
    )
    if failed:
        return GateResult(
            passed=False, check=f"smoke {failed.check}: {failed.summary}", evidence=failed.evidence
        )
    if not limits.bench:
        return GateResult(passed=True, answers=answers)
    result = judge_speed(
        baseline, lambda name: measure(group.endpoint, group.model, limits, out / name), limits
    )
    on_event(f"gate: bench {'passed' if result.passed else 'failed'}: {result.evidence[0]}")
    return result.model_copy(update={"answers": answers})


Judge = Callable[[GroupState], GateResult]


@dataclass(frozen=True)
class Roll:
    """Moves a deployment's groups to a revision one launch at a time, through its router."""

    name: str
    _: KW_ONLY
    timeout_s: float | None
    drain_s: float
    on_event: OnEvent
    on_phase: OnPhase

    def move(self, unit: list[GroupState], revision: Revision, judge: Judge | None) -> GateResult:
        """Group(s) ``unit`` leave the router, drain, start on ``revision`` and, with a
        ``judge``, meet it; one that fails starts again on the revision it ran. Returns the
        judgement (passed without one).

        Raises:
            BackendError: taking it out would leave no group serving (nothing was stopped).
        """
        state = load_state(self.name)
        unit = [state.group(g.group) for g in unit]  # as they run now
        first = unit[0]
        if state.router is not None:
            others_serve(self.name, first.group, self.on_event)
        previous = revisions.revision(self.name, first.revision) if first.revision else None
        result = GateResult(passed=True)

        def relaunch() -> str:
            nonlocal result
            try:
                moved = self._restart(state, unit, revision)
                result = judge(moved) if judge is not None else result
            except TandemError as exc:
                result = GateResult(passed=False, check="start", evidence=[str(exc)])
            if not result.passed and previous is not None:
                self.on_event(
                    f"group {first.group}: revision {revision.number} failed ({result.check}): "
                    f"back to revision {previous.number}"
                )
                return self._restart(load_state(self.name), unit, previous).endpoint
            return load_state(self.name).group(first.group).endpoint

        who = f"group {first.group}" if len(unit) == 1 else "every group"
        self.on_event(f"{who}: to revision {revision.number}")
        cycle_group(self.name, first.endpoint, relaunch, self.on_event, drain_s=self.drain_s)
        return result

    def _restart(
        self, state: DeploymentState, unit: list[GroupState], revision: Revision
    ) -> GroupState:
        """Stop the unit's groups as ``state`` has them now and start them from ``revision``;
        its first group, running."""
        whole = revision.deployment(self.name)
        first = unit[0].group
        running = next((g for g in state.groups if g.group == first), None)
        if running is not None:  # its launch now (a start that failed left none)
            backend_for(state.backend).down(running, on_event=self.on_event)
        together = lifecycle.launched_together(state.backend)  # one launch of every group
        part, index = (whole, 0) if together else (placed_groups(whole)[first], first)
        lifecycle.start_group(
            state,
            part,
            index,
            timeout_s=self.timeout_s,
            on_phase=self.on_phase,
            on_event=self.on_event,
        )
        fresh = load_state(self.name)
        for group in unit:
            moved = fresh.group(group.group)
            moved.revision = revision.number
            moved.save()
        return load_state(self.name).group(first)


def _refuse_another(state: DeploymentState, new: Deployment) -> None:
    """An upgrade changes what each group runs, not which deployment nor how many groups.

    Raises:
        SpecError: ``new`` is another deployment or has another number of groups.
        StateError: the deployment is not running.
    """
    name = state.name
    if new.name != name:
        raise SpecError(
            f"the new recipe is deployment '{new.name}', not '{name}'",
            field="name",
            hint=f"an upgrade keeps the name: set `name: {name}` in the new recipe",
        )
    if new.recipe.replicas != len(state.groups):
        raise SpecError(
            f"the new recipe has {new.recipe.replicas} replicas, the running deployment "
            f"{len(state.groups)}; an upgrade changes what each group runs, not how many run",
            field="replicas",
            hint=f"keep replicas: {len(state.groups)}, or `tandem down` and `tandem up` anew",
        )
    if not state.ready:
        raise StateError(
            f"deployment '{name}' is not running",
            hint=f"`tandem up` it first, or `tandem status {name}`",
        )


def _preflight(new: Deployment, on_event: OnEvent) -> dict[str, dict]:
    """Every group's preflight before anything stops, but for what the running revision holds.

    Raises:
        PlanError: ``new`` does not fit, alone or beside the other deployments on its nodes.
        CheckFailed: it fails its preflight.
    """
    parts = placed_groups(new)
    admission.admit(new)  # beside the others: what the running revision holds is its own
    hosts: dict[str, dict] = {}
    for part in [new] if lifecycle.launched_together(new.cluster.transport.value) else parts:
        report = run_check(part, on_event=on_event)
        blocking = [f for f in report.errors if f.rule not in HELD_BY_THE_RUNNING]
        if blocking:
            raise CheckFailed(
                f"refusing to upgrade '{new.name}': the new revision fails its preflight; "
                "nothing was stopped\n" + "\n".join(f.render() for f in blocking),
                hint="fix the new recipe (`tandem check` shows the same findings)",
            )
        hosts |= report.nodes
    return hosts


def upgrade(
    name: str,
    new: Deployment,
    *,
    limits: GateLimits | None = None,
    timeout_s: float | None = None,
    drain_s: float = 60.0,
    on_event: OnEvent = lambda text: None,
    on_phase: OnPhase = lambda mark: None,
) -> UpgradeResult:
    """Move running deployment ``name`` to ``new`` behind the gate, group by group; roll back
    every group moved so far on the first failure.

    Raises:
        SpecError: ``new`` is another deployment, or has another number of groups.
        PlanError: ``new`` does not fit (nothing was stopped).
        CheckFailed: ``new`` fails its preflight (nothing was stopped).
        StateError: ``name`` is not running.
        BackendError: a group cannot leave the router while no other serves (the roll stops
            before it).
    """
    limits = limits or GateLimits()
    state = load_state(name)
    _refuse_another(state, new)
    hosts = _preflight(new, on_event)
    old = revisions.current(state) or revisions.record(state.deployment(lenient=True), {})
    work = files.private_dir(state.directory.path / "upgrades" / f"from-{old.number}")
    # this attempt's folder: an upgrade from the same revision again measures anew
    attempt = work / f"to-{revisions.next_number(name)}"
    held_to = _held_to(name, old, state.groups[0], limits, attempt, on_event)
    candidate = revisions.record(new, hosts, outcome=RevisionOutcome.STARTING)
    revisions.mark_upgrade(name, old.number, f"rolling to revision {candidate.number}")
    roll = Roll(name, timeout_s=timeout_s, drain_s=drain_s, on_event=on_event, on_phase=on_phase)
    moved: list[list[GroupState]] = []
    result = GateResult(passed=True)
    ended = partial(
        UpgradeResult, name=name, from_revision=old.number, to_revision=candidate.number
    )
    for unit in lifecycle.launch_units(state):
        out = attempt / f"group-{unit[0].group}"
        judge = partial(gate, held_to=held_to, limits=limits, out=out, on_event=on_event)
        result = roll.move(unit, candidate, judge)
        if not result.passed:
            revisions.transition(name, candidate, RevisionOutcome.FAILED, result.check or "")
            for earlier in reversed(moved):
                roll.move(earlier, old, None)
            _settle(name, old)
            return ended(
                outcome=UpgradeOutcome.ROLLED_BACK,
                gate=result,
                group=unit[0].group,
                running_revision=old.number,
            )
        moved.append(unit)
    candidate.baseline = result.figures
    candidate.answers_checked = (
        f"against revision {old.number}'s reference, {result.answers}" if result.answers else None
    )
    revisions.transition(name, candidate, RevisionOutcome.GOOD)
    _settle(name, candidate)
    on_event(f"revision {candidate.number} passed the gate and is current")
    return ended(outcome=UpgradeOutcome.UPGRADED, gate=result, running_revision=candidate.number)


def last_reference(name: str) -> Reference | None:
    """The answers reference of deployment ``name``'s newest good revision that has one (what
    ``up --smoke`` holds a new start to), or None."""
    if not revisions.folder(name).revisions.is_dir():
        return None
    for revision in reversed(revisions.history(name)):
        path = revisions.reference_file(name, revision.number)
        if revision.outcome is RevisionOutcome.GOOD and path.is_file():
            return load_reference(path)
    return None


def _held_to(
    name: str, old: Revision, lead: GroupState, limits: GateLimits, work: Path, on_event: OnEvent
) -> tuple[Reference, list[BenchResult]]:
    """What the gate holds the new revision to, from the running one before anything stops:
    its answers reference and, with the bench on, its speed measured now."""
    reference = reference_of(name, old, lead, on_event)
    if not limits.bench:
        return reference, []
    on_event(f"measuring revision {old.number}'s speed, {limits.rounds} rounds (the gate's bar)")
    measured = measure(lead.endpoint, lead.model, limits, work / "baseline")
    old.baseline = counted_medians([measured], limits.speed())
    revisions.save(name, old)
    return reference, [measured]


def _settle(name: str, revision: Revision) -> None:
    """The deployment runs ``revision`` (every group moved to it): the record says so and the
    upgrade's marker goes."""
    state = load_state(name)
    state.revision = revision.number
    state.holds = admission.planned_holds(revision.deployment(name))
    state.save()
    revisions.clear_upgrade(name)


def rollback(
    name: str,
    to: int | None = None,
    *,
    group: int | None = None,
    timeout_s: float | None = None,
    drain_s: float = 60.0,
    on_event: OnEvent = lambda text: None,
    on_phase: OnPhase = lambda mark: None,
) -> Revision:
    """Move every group of ``name`` (or only ``group``) to revision ``to`` (default: the good
    one before the current), one group at a time through the router, warm from the kept
    caches; a deployment that is down starts on it.

    Raises:
        StateError: no such deployment, no such revision, or no earlier good one.
    """
    known = revisions.history(name)
    running = load_state(name) if name in list_deployments() else None
    if to is None:
        current = running.revision if running is not None else None
        earlier = [r for r in known if r.outcome is RevisionOutcome.GOOD and r.number != current]
        if not earlier:
            raise StateError(
                f"deployment '{name}' has no good revision to go back to",
                hint=f"`tandem history {name}` lists them; pass --to N",
            )
        target = earlier[-1]
    else:
        target = revisions.revision(name, to)
    revisions.clear_upgrade(name)
    if running is None or not running.groups:
        on_event(f"starting revision {target.number}")
        lifecycle.up(
            target.deployment(name),
            timeout_s=timeout_s,
            on_event=on_event,
            on_phase=on_phase,
            revision=target.number,
        )
        return target
    roll = Roll(name, timeout_s=timeout_s, drain_s=drain_s, on_event=on_event, on_phase=on_phase)
    for unit in lifecycle.launch_units(running):
        if group is None or any(g.group == group for g in unit):
            roll.move(unit, target, None)
    if group is None:
        _settle(name, target)
    return target
