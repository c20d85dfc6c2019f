"""``tandem dashboard``: the read-only status page of a running deployment."""

from __future__ import annotations

import time
from contextlib import suppress
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click
from pydantic import BaseModel

from tandem import files, ownership, screen
from tandem.cli.options import PORT, force_option, out_option
from tandem.cli.watch import Duration
from tandem.dashboard.observe import Observer
from tandem.dashboard.page import document
from tandem.dashboard.server import Access, serve
from tandem.errors import StateError
from tandem.operations.evidence import Evidence

DEFAULT_PORT = 8480


class PageOptions(BaseModel):
    """The command's options, as click parsed them."""

    host: str
    port: int
    refresh_s: float
    window_s: float
    token_env: str | None
    token_file: Path | None
    once: bool
    out_dir: str | None
    force: bool


PAGE_FILE = "index.html"
STATUS_FILE = "status.json"


@click.command("dashboard")
@click.argument("name", required=False)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to serve on.")
@click.option("--port", type=PORT, default=DEFAULT_PORT, show_default=True)
@click.option(
    "--refresh",
    "refresh_s",
    type=Duration(),
    default="2s",
    show_default=True,
    help="One observation (`tandem status --json --nodes`) every this long; the page "
    "fetches the newest at the same pace.",
)
@click.option(
    "--window",
    "window_s",
    type=Duration(),
    default="30s",
    show_default=True,
    help="Rates and p95s are over the observations of this last stretch.",
)
@click.option(
    "--token-env",
    metavar="VAR",
    help="Beyond loopback: the environment variable that holds the page's token (never printed).",
)
@click.option(
    "--token-file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Beyond loopback: a file that holds the page's token.",
)
@click.option("--once", is_flag=True, help="Write the page as a file (--out) and exit.")
@out_option(f"With --once: the folder for {PAGE_FILE} and {STATUS_FILE}.")
@force_option
def dashboard_command(name: str | None, **options: Any) -> None:
    """Serve a read-only status page of a deployment, refreshed every few seconds.

    NAME defaults to the only deployment there is. Everything on the page comes from one
    observation a refresh, the one `tandem status --json --nodes` prints: the verdict of each
    group, the router and its members, the leaders' /metrics (traffic and SLOs over --window),
    each node's memory, GPUs and RDMA ports, each rank, the revision and the bench, smoke and
    eval runs of it, and the events. Nothing is fetched from the internet.

    The page binds 127.0.0.1 by default; from another machine open an ssh tunnel
    (`ssh -L 8480:127.0.0.1:8480 HOST`, then http://127.0.0.1:8480). Another --host needs a
    token, given by reference (--token-env or --token-file); open the page once as
    http://HOST:PORT/?token=TOKEN, or send `Authorization: Bearer TOKEN` from a script.

    \b
    Examples:
      tandem dashboard tiny-local
      tandem dashboard smollm2-replicas --port 8481 --refresh 5s
      tandem dashboard tiny-local --host 0.0.0.0 --token-env TANDEM_DASHBOARD_TOKEN
      tandem dashboard tiny-local --once --out runs/page
    """
    page = PageOptions.model_validate(options)
    observer = Observer(name, refresh_s=page.refresh_s, window_s=page.window_s)
    if page.once:
        _write_once(observer, page.out_dir, page.force)
        return
    if page.out_dir:
        raise click.UsageError("--out goes with --once")
    access = Access.of(page.host, token_env=page.token_env, token_file=page.token_file)
    where = f"http://{'[' + page.host + ']' if ':' in page.host else page.host}:{page.port}/"
    guard = f" (token from {'$' + page.token_env if page.token_env else page.token_file})"
    screen.echo(
        f"serving the status page of {name or 'the deployment'} at {where}"
        + (guard if access.token else "")
    )
    screen.echo("read-only; Ctrl-C stops it")
    with suppress(KeyboardInterrupt):
        serve(observer, access, page.host, page.port)


def _write_once(observer: Observer, out_dir: str | None, force: bool) -> None:
    """Two observations a refresh apart (so the rates have a window), written as a page."""
    if not out_dir:
        raise click.UsageError("--once needs --out DIR")
    out = ownership.output_folder(Path(out_dir), force=force)
    first = observer.take()
    if first.status is None:
        raise StateError(first.error or "the observation failed")
    time.sleep(observer.refresh_s)
    view = observer.take()

    def link(group: str, kind: str, found: Evidence) -> str:
        return Path(found.report).as_uri() if found.report else ""

    files.write_text(out / PAGE_FILE, document(view, datetime.now(UTC), link, live=False))
    status = view.status or first.status
    files.write_text(out / STATUS_FILE, status.model_dump_json(indent=2) + "\n")
    screen.echo(f"wrote {out / PAGE_FILE} and {out / STATUS_FILE}")
