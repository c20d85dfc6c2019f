"""The status page drawn from a view: every observed tile equals the status it was drawn from,
nothing is fetched from elsewhere, no sample is never healthy, idle is "no traffic"."""

from __future__ import annotations

import json
import re
from datetime import timedelta
from html.parser import HTMLParser

from status_factory import NOW, fleet_status, group, reading

from tandem.dashboard.observe import Observer, View
from tandem.dashboard.page import body, document, is_stale
from tandem.operations.health import Verdict
from tandem.operations.overview import Event
from tandem.plan.ledger import HostLedger, NodeHold


class _Tiles(HTMLParser):
    """Every element with a data-path, its data-value and its text; the embedded observation."""

    def __init__(self) -> None:
        super().__init__()
        self.tiles: list[dict] = []
        self.observation = ""
        self._open: list[dict | None] = []
        self._in_observation = False

    def handle_starttag(self, tag, attrs):
        found = dict(attrs)
        self._in_observation = found.get("id") == "observation"
        item = (
            {"path": found["data-path"], "value": found["data-value"], "text": ""}
            if ("data-path" in found)
            else None
        )
        self._open.append(item)
        if item:
            self.tiles.append(item)

    def handle_endtag(self, tag):
        if self._open:
            self._open.pop()
        self._in_observation = False

    def handle_data(self, data):
        if self._in_observation:
            self.observation += data
        for item in self._open:
            if item:
                item["text"] += data


def at(data, path: str):
    for part in path.split("."):
        data = data[int(part)] if isinstance(data, list) else data[part]
    return data


def view_of(status, **update) -> View:
    base = View(
        name="demo",
        status=status,
        observed_at=NOW,
        took_s=0.2,
        refresh_s=2,
        window_s=30,
        started_at=NOW - timedelta(minutes=5),
    )
    return base.model_copy(update=update)


def link(group, kind, found):
    return f"evidence/{group}/{kind}"


def test_every_observed_tile_equals_the_status_it_was_drawn_from():
    status = fleet_status(group(0, serving=reading()), group(1, Verdict.DOWN, member=False))
    tiles = _Tiles()
    tiles.feed(body(view_of(status), NOW, link))
    observation = json.loads(tiles.observation)
    assert observation == json.loads(status.model_dump_json())
    assert len(tiles.tiles) > 30
    for tile in tiles.tiles:
        assert at(observation, tile["path"]) == json.loads(tile["value"]), tile
    shown = {t["path"]: t["text"] for t in tiles.tiles}
    assert shown["groups.0.verdict"] == "healthy" and shown["groups.1.verdict"] == "down"
    assert shown["groups.1.member"] in ("out", "out of rotation")
    assert shown["router.models"] == "smollm2"


def test_the_page_fetches_nothing_from_elsewhere():
    page = document(view_of(fleet_status(group(0), group(1))), NOW, link, live=True)
    assert not re.search(r"(src|href)=\"(https?:)?//", page)
    assert not re.search(r"@import|<link (?!rel=\"icon\" href=\"data:,\")", page)
    assert "Content-Security-Policy" in page and "connect-src 'self'" in page
    assert 'fetch("body"' in page
    static = document(view_of(fleet_status(group(0))), NOW, link, live=False)
    assert "<script>" not in static


def test_no_sample_is_never_shown_healthy():
    empty = View(name="demo", refresh_s=2, window_s=30, started_at=NOW)
    text = body(empty, NOW, link)
    assert "no sample" in text and "healthy" not in text and is_stale(empty, NOW)
    fresh = view_of(fleet_status(group(0), group(1)))
    old = NOW + timedelta(seconds=30)
    assert not is_stale(fresh, NOW + timedelta(seconds=5)) and is_stale(fresh, old)
    stale = body(fresh, old, link)
    assert "stale: observed 30 s ago" in stale and "last seen" in stale
    assert 'class="verdict ok"' not in stale  # greyed, not green
    failed = body(fresh.model_copy(update={"error": "node0 could not be asked"}), NOW, link)
    assert "last observation failed: node0 could not be asked" in failed


def test_idle_is_no_traffic_and_a_leader_without_metrics_no_sample():
    after = reading()
    status = fleet_status(group(0, serving=after), group(1, serving=None))
    observer = Observer(
        "demo", clock=iter([0.0, 0.0, 1.0, 10.0, 11.0]).__next__, look=lambda *a, **k: status
    )
    observer.take()
    view = observer.take()
    assert view.groups[0].traffic is not None and view.groups[0].traffic.idle
    assert view.groups[1].traffic is None
    text = body(view, NOW, link)
    assert 'data-derived="requests_per_s" class="">no traffic' in text
    assert text.count("no sample") >= 3  # the group without /metrics: running, waiting, KV


def test_event_lines_are_escaped_and_secrets_redacted(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_abcdefghijklmnopqrstuvwxyz0123")
    evil = Event(time=NOW, text="<script>alert(1)</script> token hf_abcdefghijklmnopqrstuvwxyz0123")
    text = body(view_of(fleet_status(group(0, events=[evil]))), NOW, link)
    assert "<script>alert" not in text and "&lt;script&gt;alert(1)" in text
    assert "hf_abcdefghijklmnopqrstuvwxyz0123" not in text


def test_the_observer_derives_last_token_and_keeps_its_window():
    before, after = reading("before"), reading("after")
    pages = iter([before, after, after])
    clock = iter([0.0, 0.0, 0.1, 2.0, 2.1, 40.0, 40.1]).__next__

    def look(*args, **kwargs):
        return fleet_status(group(0, serving=next(pages)))

    observer = Observer("demo", clock=clock, look=look, window_s=30)
    observer.take()
    second = observer.take()
    assert second.groups[0].traffic.output_tok_s == 16 / 2.0
    assert second.groups[0].last_token_at is not None
    assert second.total is not None and second.total.requests_per_s == 1.0
    text = body(second, NOW, link)
    assert 'data-derived="requests_per_s" class="">1.00 req/s' in text
    assert 'data-derived="spec_acceptance" class="">not drafting' in text  # no draft counters
    assert 'data-derived="prefix_hit_rate" class="">caching off' in text  # cache_config_info
    third = observer.take()  # 38 s later, the window holds the last two only
    assert third.groups[0].traffic.idle and third.groups[0].last_token_at == second.observed_at
    assert third.groups[0].last_canary_at == NOW


def test_the_memory_of_each_node_shows_every_deployment_on_it():
    holds = [
        NodeHold(deployment=name, node="node0", host="this machine", budget_bytes=budget,
                 kv_pool_bytes=2**30, weights_bytes=budget - 2**30, total_bytes=16 * 2**30,
                 term="VLLM_CPU_KVCACHE_SPACE")
        for name, budget in (("demo", 5 * 2**28), ("other", 6 * 2**28))
    ]  # fmt: skip
    status = fleet_status(group(0), group(1)).model_copy(
        update={"ledger": [HostLedger(host="this machine", total_bytes=16 * 2**30, holds=holds)]}
    )
    tiles = _Tiles()
    tiles.feed(body(view_of(status), NOW, link))
    observation = json.loads(tiles.observation)
    for tile in tiles.tiles:
        assert at(observation, tile["path"]) == json.loads(tile["value"]), tile
    shown = {t["path"]: t["text"] for t in tiles.tiles}
    assert shown["ledger.0.holds.1.deployment"] == "other"
    assert shown["ledger.0.holds.0.budget_bytes"] == "1.2 GiB"
    assert "13.2 GiB</span> of 16.0 GiB" in body(view_of(status), NOW, link)
