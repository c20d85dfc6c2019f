"""``tandem watch``: soak telemetry of a running deployment, and its report.

``tandem watch [NAME] [options]`` is ``tandem watch run``: the group routes anything that is not
one of its subcommands to ``run``, as ``tandem bench`` does.
"""

from __future__ import annotations

import json
import re
from collections import deque
from contextlib import nullcontext, suppress
from pathlib import Path

import click
from rich.live import Live

from tandem import ownership, screen
from tandem.backends.state import load_state
from tandem.cli.layout import HELP_OPTIONS, RunByDefault
from tandem.cli.options import PORT, field_option, force_option, out_option
from tandem.errors import CheckFailed, SpecError
from tandem.report.watch import live_view, markdown, report_folder
from tandem.spec.recipe import Watch, port_clash
from tandem.watch.exporter import SampleCollector, serve
from tandem.watch.fleet import RUN as WATCH_RUN
from tandem.watch.fleet import (
    RouterLook,
    group_folders,
    is_fleet_watch,
    router_record,
    watch_fleet,
)
from tandem.watch.sample import Sample
from tandem.watch.sampler import Watcher

_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhd]?)")
_UNIT_S = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


class Duration(click.ParamType):
    """``5s``, ``90m``, ``3h``, ``1h30m`` or plain seconds -> seconds."""

    name = "duration"

    def convert(self, value, param, ctx) -> float:
        if isinstance(value, int | float):
            return float(value)
        text = str(value).strip().lower()
        parts = _DURATION.findall(text)
        if not parts or "".join(n + u for n, u in parts) != text:
            self.fail(f"'{value}' is not a duration; write e.g. 5s, 90m, 3h or 1h30m", param, ctx)
        seconds = sum(float(n) * _UNIT_S[u] for n, u in parts)
        if seconds <= 0:
            self.fail("must be more than 0 s", param, ctx)
        return seconds


@click.group("watch", cls=RunByDefault, context_settings=HELP_OPTIONS)
def watch_command() -> None:
    """Soak telemetry of a running deployment: sample it over hours, then judge the run.

    Every interval: host memory of each node (/proc/meminfo; the only memory figure on DGX
    Spark), each rank's processes (RSS, CPU), GPUs (nvidia-smi), RDMA port counters, the
    leader's /metrics (queue, KV cache, tokens, preemptions, request outcomes, speculative
    acceptance), the health verdict and restarts from events.log. `tandem watch ...` without a
    subcommand is `tandem watch run ...`; `tandem watch run --help` lists its options.

    \b
    Examples:
      tandem watch tiny-local --duration 3h --out runs/soak1
      tandem watch tiny-local --out runs/soak1            # after a kill: resumes the folder
      tandem watch tiny-local --serve-metrics 9478        # per-rank health for Prometheus
      tandem watch report runs/soak1 --max-memory-used-gib 120
    """


@watch_command.command("run")
@click.argument("name", required=False)
@click.option(
    "--interval",
    "interval_s",
    type=Duration(),
    help="Between two samples, e.g. 5s. Default: the recipe's watch.interval_s (5 s). "
    "Each /metrics scrape stalls vLLM's API server ~35 ms.",
)
@click.option(
    "--duration",
    "duration_s",
    type=Duration(),
    help="Sampled time in all, e.g. 3h; a resumed watch samples what is left. "
    "Default: until Ctrl-C.",
)
@out_option(
    "Folder for watch.json and samples.jsonl; a folder that holds a watch is "
    "resumed. Default: the deployment's state folder, watch/."
)
@click.option(
    "--serve-metrics",
    "metrics_port",
    type=PORT,
    help="Serve the latest sample as Prometheus metrics on this port (rank up, "
    "memory, GPU), for the rules of `tandem render --target prometheus`.",
)
@click.option(
    "--serve-address",
    default="0.0.0.0",
    show_default=True,
    help="Address the metrics endpoint binds.",
)
@click.option("--quiet", "-q", is_flag=True, help="No live view.")
@force_option
def run_command(
    name: str | None,
    interval_s: float | None,
    duration_s: float | None,
    out_dir: str | None,
    metrics_port: int | None,
    serve_address: str,
    quiet: bool,
    force: bool,
) -> None:
    """Sample a deployment every interval into a folder, with a live view.

    \b
    Examples:
      tandem watch run tiny-local --interval 5s --duration 3h --out runs/soak1
      tandem watch run --quiet --serve-metrics 9478
      tandem watch run smollm2-replicas --duration 1h --out runs/fleet1

    With replicas, each group is watched into a folder of its own (OUT/NAME-gG/) and the
    router (running, members, requests sent to each group) into OUT/router.jsonl.
    """
    whole = load_state(name)
    if len(whole.groups) > 1:
        _watch_fleet(whole.name, interval_s, duration_s, out_dir, metrics_port, quiet, force)
        return
    state = whole.groups[0]
    clash = metrics_port and port_clash(
        metrics_port,
        state.deployment(lenient=True).recipe.ports,  # an old state is watched too
    )
    if clash:
        raise SpecError(
            f"{clash} of '{state.name}'",
            field="--serve-metrics",
            hint=f"serve the metrics on another port, e.g. {Watch().metrics_port} "
            "(the recipe's watch.metrics_port)",
        )
    collector = None
    if metrics_port:  # bound first: a port in use or a bad address refuses before any file
        collector = SampleCollector(state.name)
        serve(collector, metrics_port, serve_address)
    out = _claimed(out_dir, whole.name, force) or whole.directory.watch
    watcher = Watcher(whole.name, out, interval_s=interval_s, duration_s=duration_s)
    console = screen.console(stderr=True)
    if watcher.resumed and (interval_s or duration_s):
        console.print(
            f"resuming {out}: its own interval "
            f"({watcher.run_info.interval_s:g} s) and duration apply"
        )
    window: deque[Sample] = deque(maxlen=60)
    live = None if quiet else Live(console=console, auto_refresh=False, transient=False)

    def on_sample(sample: Sample) -> None:
        window.append(sample)
        if collector is not None:
            collector.update(sample)
        if live is not None:
            live.update(live_view(watcher.run_info, window), refresh=True)

    watcher.on_sample = on_sample
    with suppress(KeyboardInterrupt), live if live is not None else nullcontext():
        watcher.run()  # until its duration, or Ctrl-C
    console.print(f"samples in {out / 'samples.jsonl'}; `tandem watch report {out}` judges them")


def _claimed(out_dir: str | None, name: str, force: bool) -> Path | None:
    """``--out`` as the folder of the watch of ``name`` (resumed when it holds it), created."""
    if out_dir is None:
        return None
    return ownership.claim_output(
        Path(out_dir), WATCH_RUN, {"deployment": name}, force=force
    ).make()


def _watch_fleet(
    name: str,
    interval_s: float | None,
    duration_s: float | None,
    out_dir: str | None,
    metrics_port: int | None,
    quiet: bool,
    force: bool,
) -> None:
    """``watch run`` of a deployment with replicas: each group into its own folder, the router
    beside them (``tandem.watch.fleet``); a line per look at the router."""
    if metrics_port:
        raise SpecError(
            f"'{name}' has replicas; --serve-metrics serves one group's samples",
            field="--serve-metrics",
            hint="leave --serve-metrics out: each group's samples are in its folder, and the "
            "router has its own /metrics",
        )
    out = _claimed(out_dir, name, force) or load_state(name).directory.watch
    console = screen.console(stderr=True)

    def on_look(look: RouterLook) -> None:
        if quiet:
            return
        sent = ", ".join(f"{w} {f.processed:g}" for w, f in sorted(look.workers.items()))
        console.print(
            f"{look.time:%H:%M:%S} router "
            + (
                f"{len(look.members)}/{look.groups} groups in rotation; sent {sent or 'none'}"
                if look.running
                else "[bold red]not answering[/bold red]"
            )
        )

    with suppress(KeyboardInterrupt):
        watch_fleet(name, out, interval_s=interval_s, duration_s=duration_s, on_look=on_look)
    console.print(f"groups and router in {out}; `tandem watch report {out}` judges them")


def _report_fleet(run_dir: Path, overrides: dict, *, as_json: bool, plots: bool) -> None:
    """``watch report`` of a fleet's folder: each group judged as a watch of its own, then the
    router's record; fails when a group fails or the router missed a look or a member."""
    results = {f.name: report_folder(f, overrides, plots=plots)[0] for f in group_folders(run_dir)}
    record = router_record(run_dir)
    failed = [group for group, summary in results.items() if not summary.passed]
    if not record.ok:
        failed.append("router")
    if as_json:
        screen.echo(
            json.dumps(
                {
                    "groups": {k: v.model_dump(mode="json") for k, v in results.items()},
                    "router": record.model_dump(mode="json"),
                    "passed": not failed,
                },
                indent=2,
            )
        )
    else:
        for group, summary in results.items():
            screen.echo(f"{group}: {'PASS' if summary.passed else 'FAIL'} ({run_dir / group})")
        screen.echo(
            f"router: {'PASS' if record.ok else 'FAIL'} — {record.looks} looks, not answering "
            f"in {record.not_running}, a group out of rotation in {record.short_of_members}; "
            "sent " + (", ".join(f"{w} {n:g}" for w, n in sorted(record.sent.items())) or "none")
        )
    if failed:
        raise CheckFailed(f"the watch failed for {', '.join(failed)}")


def _threshold(name: str, help_text: str):
    """An override of the recipe's ``watch.NAME``: its type and bounds are the field's."""
    return field_option(Watch, name, default=None, help=help_text)


@watch_command.command("report")
@click.argument("run_dir", type=click.Path(exists=True, file_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print summary.json instead of Markdown.")
@click.option("--plots/--no-plots", default=True, show_default=True, help="Write PNG plots.")
@_threshold("max_temperature_c", "Peak GPU temperature that passes, °C.")
@_threshold("max_throttle_events", "GPU throttle events that pass.")
@_threshold("max_memory_used_gib", "Highest memory in use on a node that passes, GiB.")
@_threshold("max_memory_drift_gib", "Largest memory drift on a node that passes, GiB.")
@_threshold("max_oom_events", "OOM kills on a node that pass.")
@_threshold("max_restarts", "Group restarts that pass.")
@_threshold("max_down_samples", "Samples whose health verdict was `down` that pass.")
@_threshold("max_error_rate", "Share of requests ending in error or abort that passes, 0-1.")
def report_command(run_dir: str, as_json: bool, plots: bool, **limits: float | None) -> None:
    """Judge a watch folder: checks against thresholds (PASS/FAIL), report.md, plots.

    Thresholds are the recipe's `watch:` section as the watch began, each overridden by its
    flag. Exits 1 when a check fails.

    \b
    Examples:
      tandem watch report runs/soak1
      tandem watch report runs/soak1 --max-memory-used-gib 120 --max-temperature-c 70 --json
    """
    overrides = {k: v for k, v in limits.items() if v is not None}
    if is_fleet_watch(Path(run_dir)):
        _report_fleet(Path(run_dir), overrides, as_json=as_json, plots=plots)
        return
    summary, written = report_folder(Path(run_dir), overrides, plots=plots)
    if as_json:
        screen.echo(json.dumps(summary.model_dump(mode="json"), indent=2))
    else:
        screen.echo(markdown(summary))
        screen.echo("wrote " + ", ".join(str(p) for p in written))
    if not summary.passed:
        failed = [c.name for c in summary.checks if c.result.value == "FAIL"]
        raise CheckFailed(f"the watch failed {len(failed)} check(s): {', '.join(failed)}")
