"""``tandem upgrade`` and ``tandem rollback``: change a running deployment behind a gate, and back.

A new image that garbles long context, a recipe change that halves throughput, an engine that
no longer starts: each passes a readiness probe or fails after the old revision is gone. So an
upgrade goes:

1. **check before stopping**: the new recipe must load, plan and pass its preflight (but for
   the ports and memory the running revision holds), and be the same deployment (its name);
2. **baseline**: the current revision's bench figures, measured now if it has none (the gate
   compares like with like: same workload, same machine);
3. stop the current revision (its compile caches stay, so the way back is a warm start) and
   bring up the new one (the preflight runs; leader and workers start from one recipe, so they
   are always on one revision);
4. **the gate**: ``tandem eval smoke`` (template, determinism, and the tool and reasoning checks
   the recipe promises) and a short bench against the baseline, with the TPOT and throughput
   limits of ``GateLimits``;
5. a failure at 3 or 4 **rolls back**: the new revision is stopped and recorded as failed with
   the check and its evidence, and the previous revision starts again, warm.

A file ``upgrade.json`` in the deployment's folder names the phase while an upgrade runs; a
killed upgrade leaves it, and the next ``upgrade``, ``rollback`` or ``status`` says which
revision was being left and which was coming.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, model_validator

from tandem import files, ownership, wire
from tandem.backends.base import OnEvent, OnPhase
from tandem.backends.state import (
    DeploymentDir,
    DeploymentState,
    list_deployments,
    load_fleet,
    load_state,
)
from tandem.bench.config import BenchConfig
from tandem.bench.load_generator import run as run_bench
from tandem.errors import BackendError, CheckFailed, SpecError, StateError, TandemError
from tandem.eval import smoke
from tandem.operations import lifecycle, revisions
from tandem.operations.preflight import run_check
from tandem.operations.supervisor import cycle_group, others_serve
from tandem.rankplan import placed_groups, plan_ranks
from tandem.spec.deployment import Deployment

HELD_BY_THE_RUNNING = {"port-taken", "memory-headroom", "shm-too-small"}
"""Preflight rules that the running revision itself fails the new one on (its ports, its
memory): checked again once it has stopped, by the new revision's own ``up``."""
GATE_SMOKE_CHECKS = ["template", "determinism", "tools", "reasoning", "speculative"]
"""The smoke checks of the gate: all but the long needle, which takes minutes on a real
context (run it with ``tandem eval smoke`` when the context is what changed)."""


class GateLimits(BaseModel):
    """How much slower a new revision may be than its baseline before the gate fails it."""

    max_tpot_increase: float = Field(
        default=0.25,
        ge=0,
        le=10,
        description="Median TPOT may grow by this fraction (0.25 = 25 %; 3 on a noisy CPU "
        "engine); at most 10: 25 would be +2,500 %, no gate.",
    )
    max_throughput_drop: float = Field(
        default=0.25, ge=0, le=1, description="Output tok/s may fall by this fraction."
    )
    concurrency: int = Field(default=4, ge=1, description="The gate bench's concurrency.")
    requests: int = Field(default=16, ge=1, description="Requests of the gate bench.")
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


class GateResult(BaseModel):
    passed: bool
    check: str | None = Field(default=None, description="The check that failed, if one did.")
    evidence: list[str] = Field(default_factory=list)
    figures: dict[str, float] = Field(default_factory=dict)


class UpgradeResult(BaseModel):
    name: str
    from_revision: int
    to_revision: int
    outcome: Literal["upgraded", "rolled-back"]
    gate: GateResult
    running_revision: int


def measure(state: DeploymentState, limits: GateLimits, out: Path) -> dict[str, float]:
    """The gate bench on a running deployment: median TPOT and output tok/s.

    Each measurement draws its prompts from a seed of its own (kept in its ``config.json``):
    with one fixed seed, a baseline taken on a server that had run the gate's bench before
    would be answered from its prefix cache and set a bar no fresh revision reaches.
    """
    config = BenchConfig(
        url=state.endpoint,
        model=state.model,
        api_key=os.environ.get(wire.VLLM_API_KEY),
        concurrency=[limits.concurrency],
        requests=limits.requests,
        input_tokens=limits.input_tokens,
        output_tokens=limits.output_tokens,
        ignore_eos=True,
        seed=secrets.randbelow(2**31),
    )
    result = run_bench(config, ownership.output_folder(out, force=True))
    metrics = result.points[0].metrics
    figures = {
        "tpot_p50_s": metrics.tpot_s.p50,
        "output_tok_s": metrics.output_throughput_tok_s,
        "failed": float(metrics.failed),
    }
    return {k: float(v) for k, v in figures.items() if v is not None}


def judge_bench(
    baseline: dict[str, float], figures: dict[str, float], limits: GateLimits
) -> GateResult:
    """The bench part of the gate: failed requests, TPOT and throughput against the baseline."""
    evidence = [f"baseline {baseline}", f"new {figures}"]
    if figures.get("failed"):
        return GateResult(
            passed=False, check="bench: failed requests", evidence=evidence, figures=figures
        )
    tpot, base_tpot = figures.get("tpot_p50_s"), baseline.get("tpot_p50_s")
    if tpot and base_tpot and tpot > base_tpot * (1 + limits.max_tpot_increase):
        return GateResult(
            passed=False,
            check=f"bench: median TPOT {tpot * 1000:.1f} ms vs {base_tpot * 1000:.1f} ms "
            f"(more than +{limits.max_tpot_increase:.0%})",
            evidence=evidence,
            figures=figures,
        )
    tok_s, base_tok_s = figures.get("output_tok_s"), baseline.get("output_tok_s")
    if tok_s and base_tok_s and tok_s < base_tok_s * (1 - limits.max_throughput_drop):
        return GateResult(
            passed=False,
            check=f"bench: output {tok_s:.1f} tok/s vs {base_tok_s:.1f} "
            f"(more than -{limits.max_throughput_drop:.0%})",
            evidence=evidence,
            figures=figures,
        )
    return GateResult(passed=True, evidence=evidence, figures=figures)


def gate(
    state: DeploymentState,
    baseline: dict[str, float],
    limits: GateLimits,
    out: Path,
    on_event: OnEvent = lambda text: None,
) -> GateResult:
    """Smoke checks, then the bench against ``baseline``; the first failure decides."""
    report = smoke.run_smoke(
        smoke.target_of(state),
        ownership.output_folder(out / "smoke", force=True),
        api_key=os.environ.get(wire.VLLM_API_KEY),  # the key the deployment was started with
        checks=GATE_SMOKE_CHECKS,
        first_failure=True,
        on_result=lambda r: on_event(f"gate: smoke {r.check} {r.outcome.value}: {r.summary}"),
    )
    failed = next((c for c in report.checks if c.outcome is smoke.Outcome.FAIL), None)
    if failed:
        return GateResult(
            passed=False, check=f"smoke {failed.check}: {failed.summary}", evidence=failed.evidence
        )
    if not limits.bench:
        return GateResult(passed=True)
    figures = measure(state, limits, out / "bench")
    result = judge_bench(baseline, figures, limits)
    on_event(f"gate: bench {'passed' if result.passed else 'failed'} ({figures})")
    return result


def upgrade(
    name: str,
    new: Deployment,
    *,
    limits: GateLimits | None = None,
    timeout_s: float | None = None,
    on_event: OnEvent = lambda text: None,
    on_phase: OnPhase = lambda mark: None,
) -> UpgradeResult:
    """Move running deployment ``name`` to ``new`` behind the gate; roll back on a failure.

    Raises:
        SpecError: ``new`` is another deployment.
        PlanError: ``new`` does not fit (nothing was stopped).
        StateError: ``name`` is not running.
    """
    limits = limits or GateLimits()
    if new.name != name:
        raise SpecError(
            f"the new recipe is deployment '{new.name}', not '{name}'",
            field="name",
            hint=f"an upgrade keeps the name: set `name: {name}` in the new recipe",
        )
    state = load_state(name)
    if not state.ready:
        raise StateError(
            f"deployment '{name}' is not running",
            hint=f"`tandem up` it first, or `tandem status {name}`",
        )
    plan_ranks(new)  # refuse what does not fit before anything stops
    report = run_check(new, on_event=on_event)
    blocking = [f for f in report.errors if f.rule not in HELD_BY_THE_RUNNING]
    if blocking:
        raise CheckFailed(
            f"refusing to upgrade '{name}': the new revision fails its preflight; nothing was "
            "stopped\n" + "\n".join(f.render() for f in blocking),
            hint="fix the new recipe (`tandem check` shows the same findings)",
        )
    old = revisions.current(state) or revisions.record(state.deployment(lenient=True), None)
    work = files.private_dir(state.directory.path / "upgrades" / f"from-{old.number}")
    if not old.baseline and limits.bench:
        on_event(f"measuring the baseline of revision {old.number} (the gate compares with it)")
        old.baseline = measure(state, limits, work / "baseline")
        revisions.save(name, old)
    marker = revisions.mark_upgrade(name, old.number, "starting the new revision")
    on_event(f"stopping revision {old.number} (compile caches kept)")
    lifecycle.down(name, on_event=on_event)
    try:
        new_state, _ = lifecycle.up(
            new, timeout_s=timeout_s, on_event=on_event, on_phase=on_phase, gated=True
        )
    except TandemError as exc:
        failed = revisions.record(new, None, outcome="failed")
        result = GateResult(passed=False, check="start", evidence=[str(exc)])
        return _roll_back(name, old, failed, result, marker, timeout_s, on_event, on_phase)
    revisions.mark_upgrade(name, old.number, "gate")
    result = gate(new_state, old.baseline, limits, work / f"to-{new_state.revision}", on_event)
    candidate = revisions.revision(name, new_state.revision or 0)
    if not result.passed:
        lifecycle.down(name, on_event=on_event)
        return _roll_back(name, old, candidate, result, marker, timeout_s, on_event, on_phase)
    candidate.outcome = "good"
    candidate.baseline = result.figures
    revisions.save(name, candidate)
    marker.unlink(missing_ok=True)
    on_event(f"revision {candidate.number} passed the gate and is current")
    return UpgradeResult(
        name=name,
        from_revision=old.number,
        to_revision=candidate.number,
        outcome="upgraded",
        gate=result,
        running_revision=candidate.number,
    )


def rolling_upgrade(
    name: str,
    new: Deployment,
    *,
    limits: GateLimits | None = None,
    timeout_s: float | None = None,
    drain_s: float = 60.0,
    on_event: OnEvent = lambda text: None,
    on_phase: OnPhase = lambda mark: None,
) -> list[UpgradeResult]:
    """Move a deployment with replicas to ``new`` one group at a time, the first as the canary.

    Each group leaves the router, drains (up to ``drain_s``), is upgraded behind the gate on its
    own leader (``upgrade``: switch, smoke and bench against its own baseline, or back to its
    old revision) and joins again (``tandem.operations.supervisor.cycle_group``), while the other
    groups serve. A group leaves only while another serves
    (``tandem.operations.supervisor.others_serve``). The first group that fails its gate is rolled
    back and the roll stops: the groups after it never leave the revision that runs. Returns each
    group's result, in order.

    Raises:
        SpecError: ``new`` is another deployment, or has another number of groups.
        PlanError: ``new`` does not fit (nothing was stopped).
        BackendError: no other group would serve while the next one is out (the roll stops
            before it).
    """
    fleet = load_fleet(name)
    if new.name != name:
        raise SpecError(
            f"the new recipe is deployment '{new.name}', not '{name}'",
            field="name",
            hint=f"an upgrade keeps the name: set `name: {name}` in the new recipe",
        )
    if new.recipe.replicas != len(fleet.groups):
        raise SpecError(
            f"the new recipe has {new.recipe.replicas} replicas, the running deployment "
            f"{len(fleet.groups)}; an upgrade changes what each group runs, not how many run",
            field="replicas",
            hint=f"keep replicas: {len(fleet.groups)}, or `tandem down` and `tandem up` anew",
        )
    targets = placed_groups(new)  # refuse what does not fit before anything stops
    results: list[UpgradeResult] = []
    for index, (group, target) in enumerate(zip(fleet.groups, targets, strict=True)):
        role = "the canary" if index == 0 else f"group {index}"
        try:
            others_serve(group, on_event)
        except BackendError as exc:
            raise BackendError(
                f"{exc.message}; the rolling upgrade stops before {group}"
                + (f" ({index} group(s) already run the new revision)" if index else ""),
                hint=exc.hint,
            ) from exc
        on_event(f"{role} ({group}): out of rotation, drained, upgraded behind the gate")
        state = load_state(group)

        refused: list[TandemError] = []

        def relaunch(
            group: str = group, target: Deployment = target, refused: list = refused
        ) -> str:
            try:
                results.append(
                    upgrade(
                        group,
                        target,
                        limits=limits,
                        timeout_s=timeout_s,
                        on_event=on_event,
                        on_phase=on_phase,
                    )
                )
            except TandemError as exc:  # refused before anything stopped: it serves as it was
                refused.append(exc)
            return load_state(group).endpoint

        cycle_group(group, state.endpoint, relaunch, on_event, drain_s=drain_s)
        if refused:
            raise refused[0]
        if results[-1].outcome == "rolled-back":
            on_event(
                f"{role} failed its gate and runs revision {results[-1].running_revision} "
                f"again: the rolling upgrade stops; {len(fleet.groups) - index - 1} group(s) "
                "never left their revision"
            )
            break
    return results


def _roll_back(
    name: str,
    old: revisions.Revision,
    failed: revisions.Revision,
    result: GateResult,
    marker: Path,
    timeout_s: float | None,
    on_event: OnEvent,
    on_phase: OnPhase,
) -> UpgradeResult:
    failed.outcome = "failed"
    failed.reason = result.check or ""
    revisions.save(name, failed)
    on_event(
        f"revision {failed.number} failed the gate ({result.check}): rolling back to {old.number}"
    )
    revisions.mark_upgrade(name, old.number, "rolling back")
    lifecycle.up(
        old.deployment(),
        timeout_s=timeout_s,
        on_event=on_event,
        on_phase=on_phase,
        revision=old.number,
    )
    marker.unlink(missing_ok=True)
    return UpgradeResult(
        name=name,
        from_revision=old.number,
        to_revision=failed.number,
        outcome="rolled-back",
        gate=result,
        running_revision=old.number,
    )


def rollback(
    name: str,
    to: int | None = None,
    *,
    timeout_s: float | None = None,
    on_event: OnEvent = lambda text: None,
    on_phase: OnPhase = lambda mark: None,
) -> revisions.Revision:
    """Stop what runs of ``name`` and start revision ``to`` (default: the good one before the
    current), warm from the kept caches.

    Raises:
        StateError: no such revision, or no earlier good one.
    """
    known = revisions.history(name)
    running = load_state(name).revision if name in list_deployments() else None
    if to is None:
        earlier = [r for r in known if r.outcome == "good" and r.number != running]
        if not earlier:
            raise StateError(
                f"deployment '{name}' has no good revision to go back to",
                hint=f"`tandem history {name}` lists them; pass --to N",
            )
        target = earlier[-1]
    else:
        target = revisions.revision(name, to)
    (DeploymentDir.of(name).path / revisions.MARKER).unlink(missing_ok=True)
    if running is not None or name in list_deployments():
        lifecycle.down(name, on_event=on_event)
    on_event(f"starting revision {target.number}")
    lifecycle.up(
        target.deployment(),
        timeout_s=timeout_s,
        on_event=on_event,
        on_phase=on_phase,
        revision=target.number,
    )
    return target
