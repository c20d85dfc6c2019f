"""The status page: one HTML document, nothing fetched from elsewhere, from one view. Pure.

``document`` is the whole page: its styles and (when ``live``) a script that fetches ``body``
again every refresh and swaps it in, keeping the page where it is; when the page server stops
answering the script says so at the top ("not answering since ..."). ``body`` is what changes:
the header with the verdict and the observation's age, the sections
(``tandem.dashboard.sections``), and the observation itself as JSON (``#observation``: exactly
what ``tandem status --json --nodes`` prints), so each tile can be held against it.

A view older than ``STALE_REFRESHES`` refreshes is stale: a badge says so and the verdicts are
greyed; no observation yet reads "no sample", never healthy. Every text goes through
``tandem.redact``: the page shows log lines and events, which may hold a secret.
"""

from __future__ import annotations

from datetime import datetime

from tandem.dashboard import sections
from tandem.dashboard.html import NO_SAMPLE, ago, clock, esc, observed
from tandem.dashboard.observe import View
from tandem.dashboard.sections import VERDICT_CLASS, Link
from tandem.redact import redact_text

STALE_REFRESHES = 3.0
"""A view older than this many refreshes (plus the time the observation takes) is stale."""

STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:0;background:#f6f7f9;color:#1d2330}
header{background:#1d2330;color:#fff;padding:10px 18px;display:flex;gap:18px;align-items:center;
flex-wrap:wrap}
header h1{font-size:18px;margin:0}header .meta{opacity:.8}
main{padding:8px 18px 30px}section{margin-top:14px}h2{font-size:15px;margin:0 0 6px}
h3{font-size:14px;margin:0 0 6px}small{opacity:.7;font-weight:normal}
table{border-collapse:collapse;background:#fff;width:100%}
th,td{border-bottom:1px solid #e3e6eb;padding:4px 8px;text-align:left;vertical-align:top}
th{font-weight:600;background:#eef0f4}
code{font-size:12px;white-space:pre-wrap;word-break:break-all}
.tiles{display:flex;flex-wrap:wrap;gap:8px;margin-bottom:8px}
.tile{background:#fff;border:1px solid #e3e6eb;border-radius:6px;padding:6px 10px;min-width:120px}
.tile .label{font-size:12px;opacity:.7}.tile .value{font-size:18px;font-weight:600}
.tile .note{font-size:11px;opacity:.6}
.cards{display:flex;flex-wrap:wrap;gap:8px}
.card{background:#fff;border:1px solid #e3e6eb;border-radius:6px;padding:8px 12px;min-width:260px}
.card.wide{min-width:420px}.card ul{margin:4px 0;padding-left:18px}
.verdict{font-weight:700;padding:1px 8px;border-radius:10px}
.ok{color:#137333}.verdict.ok{background:#e6f4ea}
.warn{color:#8a5a00}.verdict.warn{background:#fef7e0}
.bad{color:#b3261e}.verdict.bad{background:#fce8e6}
.starting{color:#0b6e99}.verdict.starting{background:#e1f3fb}
.stale,.verdict.stale{color:#5f6368;background:#e8eaed}
.badge{padding:2px 10px;border-radius:10px;font-weight:700}
.badge.fresh{background:#e6f4ea;color:#137333}.badge.stale{background:#fce8e6;color:#b3261e}
.none{color:#5f6368;font-style:italic}#link{display:none}#link.down{display:block;
background:#b3261e;color:#fff;padding:6px 18px;font-weight:700}
footer{padding:8px 18px;font-size:12px;opacity:.7}
"""

SCRIPT = """
(function () {
  var every = %d, since = null, link = document.getElementById("link");
  function tick() {
    fetch("body", {cache: "no-store", credentials: "same-origin"})
      .then(function (r) { if (!r.ok) { throw new Error("HTTP " + r.status); } return r.text(); })
      .then(function (text) {
        document.getElementById("body").innerHTML = text;
        since = null; link.className = ""; link.textContent = "";
      })
      .catch(function () {
        if (since === null) { since = new Date(); }
        link.className = "down";
        link.textContent = "the page server is not answering since " +
          since.toISOString().slice(11, 19) + " UTC: what is below is not current";
      })
      .then(function () { setTimeout(tick, every); });
  }
  setTimeout(tick, every);
})();
"""


def is_stale(view: View, now: datetime) -> bool:
    """No observation yet, or the newest is older than the refreshes allow."""
    if view.observed_at is None:
        return True
    allowed = STALE_REFRESHES * view.refresh_s + (view.took_s or 0.0)
    return (now - view.observed_at).total_seconds() > allowed


def _header(view: View, now: datetime, stale: bool) -> str:
    status = view.status
    title = esc(view.name or (status.name if status else "deployment"))
    if status is None:
        verdict = f'<span class="verdict stale">{NO_SAMPLE}</span>'
        facts = ""
    else:
        cls = "stale" if stale else VERDICT_CLASS.get(status.verdict.value, "")
        verdict = observed("verdict", status.verdict.value, cls=f"verdict {cls}")
        if stale:
            verdict = f'last seen {verdict} <span class="stale">(not current)</span>'
        facts = (
            f'<span class="meta">model {observed("model", status.model)} · '
            f"{observed('endpoint', status.endpoint)}/v1 · backend "
            f"{observed('backend', status.backend)}</span>"
        )
    age = ago(view.observed_at, now)
    badge = (
        f'<span class="badge stale" id="staleness">stale: observed {esc(age)}</span>'
        if stale
        else f'<span class="badge fresh" id="staleness">observed {esc(age)}</span>'
    )
    failed = (
        f'<span class="bad">last observation failed: {esc(view.error)}</span>' if view.error else ""
    )
    return f"<header><h1>{title}</h1>{verdict}{facts}{badge}{failed}</header>"


def body(view: View, now: datetime, link: Link) -> str:
    """The part of the page that changes at each refresh."""
    stale = is_stale(view, now)
    status = view.status
    observation = status.model_dump_json().replace("<", "\\u003c") if status is not None else "null"
    took = f"{view.took_s:.2f} s" if view.took_s is not None else "—"
    text = (
        _header(view, now, stale)
        + "<main>"
        + sections.verdicts(view, now, stale=stale)
        + sections.front_door(status)
        + sections.traffic(view)
        + sections.nodes(status)
        + sections.memory(status)
        + sections.ranks(status, stale=stale)
        + sections.identity(status, link)
        + sections.events(status, now)
        + "</main>"
        + f"<footer>one observation every {view.refresh_s:g} s (the last took {took}, "
        f"at {clock(view.observed_at)}); rates over {view.window_s:g} s; read-only; "
        f"drawn {clock(now)}</footer>"
        + f'<script type="application/json" id="observation">{observation}</script>'
    )
    return redact_text(text)


def document(view: View, now: datetime, link: Link, *, live: bool) -> str:
    """The whole page; ``live`` adds the script that refreshes it."""
    title = esc(f"tandem · {view.name or (view.status.name if view.status else '')}")
    script = f"<script>{SCRIPT % int(view.refresh_s * 1000)}</script>" if live else ""
    policy = (
        "default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; "
        "connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'"
    )
    return (
        "<!doctype html><html lang=en><head><meta charset=utf-8>"
        f'<meta http-equiv="Content-Security-Policy" content="{policy}">'
        '<meta name="viewport" content="width=device-width,initial-scale=1">'
        f'<link rel="icon" href="data:,"><title>{title}</title><style>{STYLE}</style></head>'
        f'<body><div id="link"></div><div id="body">{body(view, now, link)}</div>{script}'
        "</body></html>"
    )
