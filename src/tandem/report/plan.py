"""The human view of a ``Plan``: rich tables made from the plan's JSON model only."""

from __future__ import annotations

from rich.console import Console, Group
from rich.table import Column, Table
from rich.text import Text

from tandem.plan.memory import GIB
from tandem.plan.planner import Plan
from tandem.report.terminal import show


def _gib(value: float) -> str:
    return f"{value / GIB:,.2f} GiB"


def _signed_gib(value: float) -> str:
    """A headroom: what is left, or by how much it is short."""
    return _gib(value) if value >= 0 else f"{_gib(-value)} short"


def _memory_table(plan: Plan) -> Table:
    """Each term of one rank's memory, the KV pool what is left (or how far short)."""
    mem = Table("item", Column("size", justify="right"), "basis", title="Memory per rank")
    m = plan.memory
    mem.add_row("device total", _gib(m.memory_total_bytes), "hardware profile")
    mem.add_row("vLLM budget (total x util)", _gib(m.budget_bytes), "vLLM's accounting")
    mem.add_row(
        "weights",
        _gib(m.weights_bytes_per_rank),
        f"{_gib(m.weights_replicated_bytes_per_rank)} of it replicated on every rank",
    )
    for r in m.reserves:
        mem.add_row(r.name, _gib(r.bytes), r.basis.split(":", 1)[0])
    mem.add_row(
        "[bold]KV pool[/]",
        f"[bold]{_gib(m.kv_pool_bytes)}[/]" if m.kv_pool_bytes > 0 else "[bold red]none[/]",
        "what is left"
        if m.kv_pool_bytes > 0
        else f"the rest is {_gib(-m.kv_pool_bytes)} short of the weights and reserves",
    )
    if m.outside_budget_bytes:
        mem.add_row(
            "outside vLLM (OS, CUDA context)", _gib(m.outside_budget_bytes), "unified memory"
        )
    mem.add_row(
        "per node in use", f"{_gib(m.node_use_bytes)} ({m.node_use_bytes / 1e9:.1f} GB)", ""
    )
    return mem


def plan_tables(plan: Plan) -> Group:
    """Summary, memory, KV, roofline and calibration tables, then verdict and notes."""
    s = plan.settings
    head = Table(title=f"tandem plan: {plan.deployment}", show_header=False, box=None)
    head.add_column(style="bold")
    head.add_column()
    head.add_row("model", f"{plan.model}  ({plan.model_source})")
    head.add_row(
        "hardware",
        f"{plan.hardware}, {plan.nodes} node(s), TP={s.tensor_parallel_size} "
        f"PP={s.pipeline_parallel_size}",
    )
    head.add_row(
        "serve",
        f"max_model_len {s.max_model_len:,}, util {s.gpu_memory_utilization}, "
        f"block {s.block_size}, kv {plan.kv.kv_cache_dtype}, batched "
        f"{s.max_num_batched_tokens}, max_num_seqs {s.max_num_seqs}",
    )

    mem = _memory_table(plan)

    kv = Table("figure", Column("value", justify="right"), title="KV cache")
    kv.add_row("architecture", plan.kv.architecture)
    kv.add_row("bytes per token (ideal)", f"{plan.kv_bytes_per_token_ideal:,.0f} B")
    kv.add_row("bytes per reported token", f"{plan.kv_bytes_per_token:,.0f} B")
    if plan.kv_capacity_scale != 1.0:
        kv.add_row("  before calibration", f"{plan.kv_bytes_per_token_layout_model:,.0f} B")
    kv.add_row("KV cache size", f"[bold]{plan.kv_pool_tokens:,} tokens[/]")
    kv.add_row(
        "max concurrency",
        f"{plan.max_concurrency:.2f}x at {s.max_model_len:,} tokens"
        if plan.max_concurrency > 0
        else f"none: no {s.max_model_len:,}-token request fits",
    )

    roof = Table(title=f"Decode roofline (context {plan.roofline.context_tokens:,} tokens)")
    for col in (
        "sequences",
        "tokens/step",
        "experts/layer",
        "bytes/step/rank",
        "all-reduce",
        "steps/s",
        "tok/s bound",
    ):
        roof.add_column(col, justify="right")
    for p in (plan.roofline.single_stream, plan.roofline.at_concurrency):
        roof.add_row(
            str(p.concurrency),
            str(p.tokens_per_step),
            f"{p.distinct_experts_per_layer:g}",
            f"{p.bytes_per_step_per_rank / 1e9:.2f} GB",
            f"{p.allreduce_s_per_step * 1e3:.2f} ms",
            f"{p.steps_per_s:.1f}",
            f"{p.decode_tok_s:.1f}",
        )

    parts: list = [head, mem, kv, roof]
    if plan.calibration is not None:
        cal = Table(title=f"Planned vs measured ({plan.calibration.source})")
        for col in ("figure", "planned", "measured", "error"):
            cal.add_column(col, justify="right")
        c = plan.calibration
        for comp in (c.kv_pool_gib, c.kv_pool_tokens, c.max_concurrency):
            cal.add_row(
                comp.name,
                f"{comp.planned:,.2f}" if comp.planned is not None else "-",
                f"{comp.measured:,.2f}" if comp.measured is not None else "-",
                f"{comp.error_pct:+.2f}%" if comp.error_pct is not None else "-",
            )
        parts.append(cal)
    f = plan.fit
    verdict = Text()
    verdict.append(
        "FITS" if f.fits else "DOES NOT FIT", style="bold green" if f.fits else "bold red"
    )
    verdict.append(
        f"  KV headroom {_signed_gib(f.kv_headroom_bytes)}, node headroom "
        f"{_signed_gib(f.node_headroom_bytes)}; largest max_model_len "
        f"{f.largest_max_model_len_tokens:,}"
    )
    if f.min_gpu_memory_utilization is not None:
        verdict.append(
            f"; util range {f.min_gpu_memory_utilization}-{f.max_gpu_memory_utilization}"
        )
    parts.append(verdict)
    parts += [Text(f"  why: {reason}", style="red") for reason in f.reasons]
    parts += [Text(f"  change: {change}", style="yellow") for change in f.changes]
    parts += [Text(f"explained: {e.text}", style="cyan") for e in plan.explanations]
    parts.append(Text("notes:", style="bold"))
    parts += [Text(f"  - {n}") for n in plan.notes]
    return Group(*parts)


def print_plan(plan: Plan, console: Console | None = None) -> None:
    show(plan_tables(plan), console)
