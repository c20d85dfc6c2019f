"""Rules on each host: memory headroom for the plan, a desktop session holding GPU memory,
/dev/shm, and clocks that agree."""

from __future__ import annotations

from collections.abc import Iterable

from tandem.check.findings import Finding, Severity
from tandem.check.rules.context import GIB, MIB, CheckContext, fact, gib, listing
from tandem.spec.cluster import Transport


class MemoryHeadroomRule:
    """Memory available on each node covers what ``tandem plan`` says the rank needs."""

    name = "memory-headroom"
    margin_bytes = 4 * GIB
    """Left over for the OS, the driver and page cache on unified-memory nodes."""

    def check(self, ctx: CheckContext) -> Iterable[Finding]:
        """Every node of a local cluster is this one machine: its nodes' needs add up, judged
        once, at the first node, against the one memory they share."""
        if not ctx.memory_need_bytes:
            return
        needs = dict(ctx.memory_need_bytes)
        if ctx.deployment.cluster.transport is Transport.LOCAL:
            first = ctx.nodes[0].name
            needs = {first: sum(n for n in needs.values() if n is not None)}
        for node, facts in ctx.probed():
            need = needs.get(node.name)
            gpus = fact(facts, "gpu", "gpus") or []
            unified = fact(facts, "gpu", "unified_memory") or not gpus
            if unified:
                available = fact(facts, "memory", "available_bytes")
                pool = "memory available (unified CPU+GPU memory)" if gpus else "memory available"
            else:
                free = [(g["memory_total_mib"] or 0) - (g["memory_used_mib"] or 0) for g in gpus]
                available = min(free) * MIB * len(gpus) if free else None
                pool = "free GPU memory"
            if need is None or available is None:
                continue
            if available < need + self.margin_bytes:
                yield Finding(
                    rule=self.name,
                    severity=Severity.ERROR if available < need else Severity.WARNING,
                    node=node.name,
                    message=f"{pool} {gib(available)} is short of the planned {gib(need)} "
                    f"+ {gib(self.margin_bytes)} margin"
                    + (
                        f" (its {len(ctx.nodes)} nodes are all this machine)"
                        if len(ctx.nodes) > 1
                        and ctx.deployment.cluster.transport is Transport.LOCAL
                        else ""
                    ),
                    evidence=f"MemAvailable {gib(fact(facts, 'memory', 'available_bytes') or 0)}"
                    f", GUI resident {gib(fact(facts, 'display', 'gui_rss_bytes') or 0)}",
                    fix="stop other processes (and the desktop), or lower "
                    "engine.serve.gpu_memory_utilization / max_model_len",
                )


class PlanFitRule:
    """``tandem plan``'s verdict DOES NOT FIT: vLLM would fail at KV cache sizing, or the
    node would run out of memory; the preflight refuses it before anything starts."""

    name = "plan-does-not-fit"

    def check(self, ctx: CheckContext) -> Iterable[Finding]:
        refused = ctx.plan_refused
        if refused is not None:
            yield Finding(
                rule=self.name,
                severity=Severity.ERROR,
                node=None,
                message=f"tandem plan refuses the deployment: {refused.message}",
                evidence=f"field {refused.field}" if refused.field else "tandem plan",
                fix=refused.hint or "see `tandem plan`",
            )
        fit = ctx.plan_fit
        if fit is None or fit.fits:
            return
        yield Finding(
            rule=self.name,
            severity=Severity.ERROR,
            node=None,
            message="tandem plan says the deployment DOES NOT FIT",
            evidence="; ".join(fit.reasons),
            fix="; ".join(fit.changes) or "see `tandem plan` for the figures",
        )


class GuiRule:
    """A desktop session holds memory (unified memory on GB10) and GPU time."""

    name = "gui-running"

    def check(self, ctx: CheckContext) -> Iterable[Finding]:
        for node, facts in ctx.probed():
            display = facts.get("display") or {}
            processes = display.get("gui_processes") or []
            if display.get("display_manager") != "active" and not processes:
                continue
            held = ", ".join(
                f"{p['name']} {(p['rss_bytes'] or 0) / MIB:.0f} MiB" for p in processes
            )
            gpu = ", ".join(
                f"{p['name'].rsplit('/', 1)[-1]} {p['memory_mib']} MiB"
                for p in fact(facts, "gpu", "graphics_processes") or []
            )
            yield Finding(
                rule=self.name,
                severity=Severity.WARNING,
                node=node.name,
                message=f"a desktop is running and holds {gib(display.get('gui_rss_bytes') or 0)}",
                evidence=f"display-manager {display.get('display_manager')}; resident: "
                f"{held or 'none found'}" + (f"; on the GPU: {gpu}" if gpu else ""),
                fix="`sudo systemctl stop display-manager` before launching (a reboot restores "
                "it; `sudo systemctl set-default multi-user.target` makes it permanent)",
            )


class ShmRule:
    """/dev/shm is at least the recipe's shm_size (NCCL and vLLM's IPC buffers live there)."""

    name = "shm-too-small"

    def check(self, ctx: CheckContext) -> Iterable[Finding]:
        recipe = ctx.deployment.recipe
        for node, facts in ctx.probed():
            total = fact(facts, "shm", "total_bytes")
            if total is None or total >= recipe.shm_bytes:
                continue
            yield Finding(
                rule=self.name,
                severity=Severity.ERROR,
                node=node.name,
                message=f"/dev/shm is {gib(total)}, smaller than shm_size {recipe.shm_size}",
                evidence=f"df /dev/shm: {total} bytes, {fact(facts, 'shm', 'free_bytes')} free",
                fix=f"`sudo mount -o remount,size={recipe.shm_size.upper()} /dev/shm` (and in "
                "/etc/fstab), or lower shm_size",
            )


class ClockSkewRule:
    """Node clocks agree within a second (logs and timeouts are compared across nodes).

    Each node's offset from tandem's clock is known only within its bound
    (``clock_offset_bound_s``, see ``tandem.check.node_transport.clock_offset``), so two nodes
    disagree for certain only by ``|offset_a - offset_b| - bound_a - bound_b``; the rule warns
    when that exceeds the limit for some pair, never because a probe was slow. Facts without a
    bound count as exact.
    """

    name = "clock-skew"
    limit_s = 1.0

    def check(self, ctx: CheckContext) -> Iterable[Finding]:
        clocks = {
            node.name: (facts["clock_offset_s"], facts.get("clock_offset_bound_s") or 0.0)
            for node, facts in ctx.probed()
            if isinstance(facts.get("clock_offset_s"), (int, float))
        }
        if not clocks:
            return
        # the smallest spread the readings allow: the highest low end minus the lowest high end
        spread_s = max(o - b for o, b in clocks.values()) - min(o + b for o, b in clocks.values())
        if spread_s > self.limit_s:
            yield Finding(
                rule=self.name,
                severity=Severity.WARNING,
                node=None,
                message="node clocks disagree by more than a second",
                evidence=listing({n: f"{o:+.2f} s ± {b:.2f} s" for n, (o, b) in clocks.items()}),
                fix="enable NTP on every node (`timedatectl set-ntp true`)",
            )
