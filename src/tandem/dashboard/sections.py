"""The page's sections, each a pure function of the view: verdicts, front door, traffic, nodes,
memory by plan, ranks, identity, events.

Each value of the observation is drawn with ``html.observed`` (its path into ``tandem status
--json``), each figure of several observations with ``html.derived``. Nothing is shown as
healthy without a sample: a stale view greys the verdicts, a leader without ``/metrics`` shows
"no sample", a window in which nothing finished shows "no traffic".
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from tandem.backends.base import RankObservation
from tandem.dashboard.html import (
    NO_SAMPLE,
    NO_TRAFFIC,
    NOTHING_TO_MEASURE,
    ago,
    clock,
    derived,
    esc,
    gib,
    ms,
    observed,
    rate,
    section,
    share,
    table,
    tile,
)
from tandem.dashboard.observe import GroupView, View
from tandem.dashboard.traffic import Traffic
from tandem.operations.evidence import Evidence
from tandem.operations.lifecycle import DeploymentStatus, GroupStatus
from tandem.watch.nodes import node_reading
from tandem.watch.sample import GpuReading, NodeReading

Link = Callable[[str, str, Evidence], str]
"""(group, kind, evidence) -> the href of its report."""

VERDICT_CLASS = {
    "healthy": "ok",
    "starting": "starting",
    "degraded": "warn",
    "stalled": "bad",
    "down": "bad",
}


def verdicts(view: View, now: datetime, *, stale: bool) -> str:
    status = view.status
    if status is None:
        return section("verdicts", "Verdict", f'<p class="none">{NO_SAMPLE}</p>')
    by_group = {g.group: g for g in view.groups}
    rows = []
    for i, g in enumerate(status.groups):
        extra = by_group.get(g.group) or GroupView(group=g.group, name=g.name)
        word = "stale" if stale else VERDICT_CLASS.get(g.verdict.value, "")
        phase = ""
        if g.verdict.value == "starting" and status.phases and len(status.groups) == 1:
            phase = f" ({esc(status.phases[-1].phase)})"
        restarts = g.overview.restarts if g.overview else None
        rows.append(
            [
                observed(f"groups.{i}.name", g.name),
                observed(f"groups.{i}.verdict", g.verdict.value, cls=f"verdict {word}") + phase,
                observed(f"groups.{i}.reason", g.reason, g.reason or "—"),
                observed(
                    f"groups.{i}.member",
                    g.member,
                    {True: "in", False: "out", None: "no router"}[g.member],
                    cls="ok" if g.member else ("bad" if g.member is False else ""),
                ),
                derived("last_token_at", f"{clock(extra.last_token_at)}"),
                derived("last_canary_at", f"{clock(extra.last_canary_at)}"),
                observed(f"groups.{i}.overview.restarts", restarts, str(restarts or 0)),
            ]
        )
    columns = ["group", "verdict", "reason", "router", "last token", "last canary", "restarts"]
    return section("verdicts", "Verdict, per group", table(columns, rows, cls="strip"))


def front_door(status: DeploymentStatus | None) -> str:
    if status is None:
        return section("front-door", "Front door", f'<p class="none">{NO_SAMPLE}</p>')
    router = status.router
    if router is None:
        models = status.groups[0].overview.models if status.groups[0].overview else None
        body = (
            f"<p>{observed('endpoint', status.endpoint)} (the leader; no router)</p>"
            f"<p>/v1/models: "
            + observed("groups.0.overview.models", models, _models(models))
            + "</p>"
        )
        return section("front-door", "Front door", body)
    rows = [
        [
            observed(f"groups.{i}.name", g.name),
            esc(g.endpoint or "—"),
            observed(
                f"groups.{i}.member",
                g.member,
                "in rotation" if g.member else "out of rotation",
                cls="ok" if g.member else "bad",
            ),
            esc("" if g.member else (g.reason or g.verdict.value)),
        ]
        for i, g in enumerate(status.groups)
    ]
    body = (
        f"<p>{observed('router.url', router.url)} · "
        f"policy {observed('router.policy', router.policy)}"
        f" · vllm-router {observed('router.version', router.version)} · "
        + observed(
            "router.running",
            router.running,
            "running" if router.running else "not answering",
            cls="ok" if router.running else "bad",
        )
        + "</p>"
        + table(["group", "leader", "rotation", "why out"], rows)
        + "<p>/v1/models: "
        + observed("router.models", router.models, _models(router.models))
        + "</p>"
    )
    return section("front-door", "Front door", body)


def _models(models: list[str] | None) -> str:
    return "not answering" if models is None else (", ".join(models) or "none")


def _windowed(traffic: Traffic | None, value: str | None) -> str:
    """A window's figure, or why the window has none (no sample, a restart, no traffic)."""
    if traffic is None:
        return NO_SAMPLE
    if traffic.reset:
        return "restarted"
    if traffic.idle:
        return NO_TRAFFIC
    return value if value is not None else NOTHING_TO_MEASURE


def _traffic_tiles(traffic: Traffic | None, window_s: float) -> str:
    t = traffic or Traffic(seconds=0)
    off = {
        "prefix_hit_rate": "caching off" if t.prefix_caching is False else None,
        "spec_acceptance": "not drafting" if t.spec_decoding is False else None,
    }
    figures = [
        ("requests/s", "requests_per_s", rate(t.requests_per_s, "req/s")),
        ("output tok/s", "output_tok_s", rate(t.output_tok_s, "tok/s")),
        ("input tok/s", "input_tok_s", rate(t.input_tok_s, "tok/s")),
        ("TTFT p95", "ttft_p95_s", ms(t.ttft_p95_s)),
        ("ITL p95", "itl_p95_s", ms(t.itl_p95_s)),
        ("TPOT p95", "tpot_p95_s", ms(t.tpot_p95_s)),
        ("E2E p95", "e2e_p95_s", ms(t.e2e_p95_s)),
        ("errors", "error_share", share(t.error_share)),
        ("preemptions/s", "preemptions_per_s", rate(t.preemptions_per_s, "/s")),
        ("prefix-cache hits", "prefix_hit_rate", share(t.prefix_hit_rate)),
        ("spec-decode acceptance", "spec_acceptance", share(t.spec_acceptance)),
    ]
    note = f"over {window_s:.0f} s"
    return "".join(
        tile(
            label,
            derived(field, off.get(field) or _windowed(traffic, value)),
            note=note,
            cls="traffic",
        )
        for label, field, value in figures
    )


def traffic(view: View) -> str:
    status = view.status
    if status is None:
        return section("traffic", "Traffic and SLOs", f'<p class="none">{NO_SAMPLE}</p>')
    total = _traffic_tiles(view.total, view.window_s)
    windows = {g.group: g.traffic for g in view.groups}
    gauges = []
    for i, g in enumerate(status.groups):
        serving = g.overview.serving if g.overview else None
        base = f"groups.{i}.overview.serving"
        if serving is None:
            gauges.append([esc(g.name), *[NO_SAMPLE] * 5])
            continue
        window = windows.get(g.group)
        gauges.append(
            [
                esc(g.name),
                observed(f"{base}.requests_running", serving.requests_running),
                observed(f"{base}.requests_waiting", serving.requests_waiting),
                observed(
                    f"{base}.kv_cache_usage",
                    serving.kv_cache_usage,
                    share(serving.kv_cache_usage) or "—",
                ),
                derived("group_requests_per_s", _rate_in(window, "requests_per_s", "req/s")),
                derived("group_output_tok_s", _rate_in(window, "output_tok_s", "tok/s")),
            ]
        )
    columns = ["group", "running", "waiting", "KV cache used", "requests/s", "output tok/s"]
    per_group = table(columns, gauges)
    return section("traffic", "Traffic and SLOs", f'<div class="tiles">{total}</div>{per_group}')


def _rate_in(window: Traffic | None, field: str, unit: str) -> str:
    return _windowed(window, rate(getattr(window, field), unit) if window else None)


def nodes(status: DeploymentStatus | None) -> str:
    if status is None:
        return ""
    cards = []
    for i, g in enumerate(status.groups):
        overview = g.overview
        if overview is None:
            continue
        for j, facts in enumerate(overview.nodes):
            ranks = [
                (r.rank, r.role, RankObservation(rank=r.rank, processes=r.processes))
                for r in g.ranks
                if r.node == facts.node
            ]
            reading = node_reading(facts, ranks, {r: True for r, _, _ in ranks})
            cards.append(_node_card(f"groups.{i}.overview.nodes.{j}", g.name, reading))
    if not cards:
        return section("nodes", "Nodes", f'<p class="none">{NO_SAMPLE}</p>')
    return section("nodes", "Nodes", f'<div class="cards">{"".join(cards)}</div>')


def memory(status: DeploymentStatus | None) -> str:
    """Each host the deployment's nodes draw on: its memory and what every deployment's plan
    holds there (``ledger``), so a page shows every model on the nodes."""
    if status is None or not status.ledger:
        return ""
    rows = []
    for i, ledger in enumerate(status.ledger):
        for j, hold in enumerate(ledger.holds):
            path = f"ledger.{i}.holds.{j}"
            rows.append(
                [
                    observed(f"ledger.{i}.host", ledger.host) if j == 0 else "",
                    observed(f"{path}.deployment", hold.deployment)
                    + ("" if hold.deployment != status.name else " (this one)"),
                    observed(f"{path}.node", hold.node),
                    observed(f"{path}.budget_bytes", hold.budget_bytes, gib(hold.budget_bytes))
                    if hold.known
                    else "unknown",
                    observed(f"{path}.kv_pool_bytes", hold.kv_pool_bytes, gib(hold.kv_pool_bytes)),
                    derived(
                        "left", gib(ledger.left_bytes), cls="bad" if ledger.left_bytes < 0 else ""
                    )
                    + f" of {gib(ledger.total_bytes)}"
                    if j == len(ledger.holds) - 1
                    else "",
                ]
            )
    body = table(["host", "deployment", "node", "planned budget", "KV pool", "left"], rows)
    return section("memory", "Memory by plan", body)


def _node_card(path: str, group: str, reading: NodeReading) -> str:
    if reading.error:
        body = f'<p class="bad">{observed(path + ".error", reading.error)}</p>'
    else:
        total, available = reading.mem_total_bytes, reading.mem_available_bytes
        used = (total - available) / total if total and available is not None else None
        gpus = (
            "".join(f"<li>GPU {g.index}: {esc(_gpu(g))}</li>" for g in reading.gpus)
            or "<li>no GPU reported (nvidia-smi absent)</li>"
        )
        ports = (
            "".join(
                f"<li>{esc(p.device)}/{p.port} {esc(p.state or '?')}: "
                f"tx {gib(p.xmit_bytes)}, rx {gib(p.rcv_bytes)}</li>"
                for p in reading.rdma
            )
            or "<li>no RDMA port</li>"
        )
        body = (
            "<p>memory available "
            + observed(path + ".mem_available_bytes", available, gib(available))
            + " of "
            + observed(path + ".mem_total_bytes", total, gib(total))
            + f' <meter min="0" max="1" value="{used or 0:.3f}"></meter></p>'
            + "<p>OOM kills since boot "
            + observed(path + ".oom_kills", reading.oom_kills)
            + f"</p><ul>{gpus}</ul><ul>{ports}</ul>"
        )
    return (
        f'<div class="card"><h3>{observed(path + ".node", reading.node)}'
        f" <small>{esc(group)}</small></h3>{body}</div>"
    )


def _gpu(g: GpuReading) -> str:
    parts = [g.name or "GPU"]
    if g.power_w is not None:
        parts.append(f"{g.power_w:.0f} W")
    if g.temperature_c is not None:
        parts.append(f"{g.temperature_c:.0f} °C")
    if g.sm_clock_mhz is not None:
        parts.append(f"SM {g.sm_clock_mhz:.0f} MHz")
    if g.throttled:
        parts.append("THROTTLED " + ",".join(g.event_reasons))
    return ", ".join(parts)


def ranks(status: DeploymentStatus | None, *, stale: bool) -> str:
    if status is None:
        return ""
    rows = []
    for i, g in enumerate(status.groups):
        for j, r in enumerate(g.ranks):
            path = f"groups.{i}.ranks.{j}"
            rss = [p.rss_bytes for p in r.processes if p.rss_bytes is not None]
            state = r.health.state.value
            rows.append(
                [
                    esc(g.name),
                    observed(f"{path}.rank", r.rank),
                    esc(r.role),
                    esc(r.node),
                    observed(
                        f"{path}.health.state",
                        state,
                        cls=f"verdict {'stale' if stale else _rank_class(state)}",
                    ),
                    str(len(r.processes)),
                    gib(sum(rss)) if rss else "—",
                    esc(r.health.reason or "—"),
                    f"<code>{esc(r.health.evidence)}</code>" if r.health.evidence else "",
                ]
            )
    columns = ["group", "rank", "role", "node", "health", "processes", "RSS", "why", "evidence"]
    return section("ranks", "Ranks", table(columns, rows))


def _rank_class(state: str) -> str:
    return {"healthy": "ok", "starting": "starting"}.get(state, "bad")


def identity(status: DeploymentStatus | None, link: Link) -> str:
    if status is None:
        return ""
    blocks = []
    for i, g in enumerate(status.groups):
        if g.overview is None:
            continue
        blocks.append(_identity_card(i, g, link))
    return section("identity", "What runs", f'<div class="cards">{"".join(blocks)}</div>')


def _identity_card(i: int, g: GroupStatus, link: Link) -> str:
    assert g.overview is not None
    ident = g.overview.identity
    path = f"groups.{i}.overview.identity"
    per_node = sorted(set(ident.vllm_version) | set(ident.model_commit) | set(ident.model_verified))
    nodes_rows = [
        [
            esc(n),
            esc(ident.vllm_version.get(n, "—")),
            esc((ident.model_commit.get(n) or "—")[:12]),
            _verified(ident.model_verified.get(n)),
        ]
        for n in per_node
    ]
    runs = []
    for kind in ("bench", "smoke", "eval"):
        found = ident.evidence.get(kind)
        if found is None:
            runs.append(f"<li>{kind}: none of this revision</li>")
            continue
        verdict = {True: " PASS", False: " FAIL", None: ""}[found.passed]
        href = link(g.name, kind, found) if found.report else None
        anchor = f' <a href="{esc(href)}">report</a>' if href else ""
        runs.append(f"<li>{kind}{verdict}: {esc(found.summary)} ({clock(found.at)}){anchor}</li>")
    changes = "".join(f"<li>{esc(c)}</li>" for c in ident.host_changes) or "<li>none</li>"
    return (
        f'<div class="card wide"><h3>{esc(g.name)}: revision '
        + observed(f"{path}.revision", ident.revision)
        + f" <small>{esc(ident.outcome or '')}</small></h3>"
        + f"<p>image {observed(path + '.image', ident.image, ident.image or 'none (a venv)')}"
        + f" · tandem {esc(ident.tandem_version or '—')}</p>"
        + table(["node", "vLLM", "model commit", "model files"], nodes_rows)
        + f"<p>host facts changed since the revision before: </p><ul>{changes}</ul>"
        + f"<p>measured of this revision:</p><ul>{''.join(runs)}</ul>"
        + "<p>answers checked: "
        + observed(
            f"{path}.answers_checked",
            ident.answers_checked,
            ident.answers_checked or "not recorded",
        )
        + "</p></div>"
    )


def _verified(value: bool | None) -> str:
    if value is None:
        return "—"
    return '<span class="ok">verified</span>' if value else '<span class="warn">not verified</span>'


def events(status: DeploymentStatus | None, now: datetime) -> str:
    if status is None:
        return ""
    lines = sorted(  # newest first; lines of one second in reverse file order too
        (
            (e.time, n, g.name, e)
            for g in status.groups
            if g.overview
            for n, e in enumerate(g.overview.events)
        ),
        key=lambda line: (line[0], line[1]),
        reverse=True,
    )[:30]
    rows = [
        [
            f'<span title="{esc(ago(e.time, now))}">'
            f"{esc(e.time.strftime('%Y-%m-%d %H:%M:%S'))}</span>",
            esc(group),
            f'<span class="{"warn" if e.restart else ""}">{esc(e.text)}</span>',
        ]
        for _, _, group, e in lines
    ]
    body = table(["time (UTC)", "group", "event"], rows) if rows else "<p>no event recorded</p>"
    return section("events", "Events", body)
