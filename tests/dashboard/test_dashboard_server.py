"""The page server's routes and access rule, through Starlette's test client (no socket)."""

from __future__ import annotations

import json
import socket

import pytest
from status_factory import NOW, fleet_status, group

from tandem.dashboard.observe import Observer
from tandem.dashboard.server import COOKIE, Access, app, check_port
from tandem.errors import SpecError
from tandem.spec.addresses import is_loopback

testclient = pytest.importorskip("starlette.testclient")


def served(access: Access, tmp_path=None):
    status = fleet_status(group(0), group(1))
    if tmp_path is not None:  # the bench run of group 0 has a report on disk
        report = tmp_path / "report.html"
        report.write_text("<html>bench</html>")
        evidence = status.groups[0].overview.identity.evidence["bench"]
        evidence.report = str(report)
    observer = Observer("demo", look=lambda *a, **k: status, clock=lambda: NOW.timestamp())
    observer.take()
    return testclient.TestClient(app(observer, access), follow_redirects=False), status


def test_loopback_needs_no_token_and_every_route_answers(tmp_path):
    client, status = served(Access(), tmp_path)
    page = client.get("/")
    assert page.status_code == 200 and "demo-g1" in page.text
    assert page.headers["cache-control"] == "no-store"
    assert "demo-g0" in client.get("/body").text
    assert json.loads(client.get("/status.json").text) == json.loads(status.model_dump_json())
    assert client.get("/evidence/demo-g0/bench").text == "<html>bench</html>"
    assert client.get("/evidence/demo-g0/smoke").status_code == 404
    assert client.get("/evidence/demo-g1/..%2F..%2Fetc%2Fpasswd").status_code == 404
    assert client.post("/").status_code == 405  # read-only


def test_a_token_guards_every_route_and_a_first_visit_keeps_it_in_a_cookie():
    client, _ = served(Access(token="s3cret-token"))
    for route in ("/", "/body", "/status.json"):
        assert client.get(route).status_code == 401
    assert client.get("/?token=wrong").status_code == 401
    first = client.get("/?token=s3cret-token")
    assert first.status_code == 303 and first.headers["location"] == "/"
    cookie = first.headers["set-cookie"]
    assert f"{COOKIE}=s3cret-token" in cookie and "httponly" in cookie.lower()
    assert "samesite=strict" in cookie.lower()
    assert client.get("/body").status_code == 200  # the cookie, from now on
    fresh, _ = served(Access(token="s3cret-token"))
    assert fresh.get("/status.json", headers={"Authorization": "Bearer s3cret-token"}).is_success


def test_beyond_loopback_a_token_is_given_by_reference(tmp_path, monkeypatch):
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.0.0.1")
    assert Access.of("127.0.0.1", token_env=None, token_file=None).token is None
    with pytest.raises(SpecError) as refused:
        Access.of("0.0.0.0", token_env=None, token_file=None)
    assert refused.value.field == "--host" and "ssh -L" in refused.value.hint
    monkeypatch.setenv("PAGE_TOKEN", "")
    with pytest.raises(SpecError) as empty:
        Access.of("0.0.0.0", token_env="PAGE_TOKEN", token_file=None)
    assert empty.value.field == "--token-env" and "PAGE_TOKEN" in empty.value.message
    monkeypatch.setenv("PAGE_TOKEN", "from-env")
    assert Access.of("0.0.0.0", token_env="PAGE_TOKEN", token_file=None).token == "from-env"
    (tmp_path / "token").write_text("from-file\n")
    assert Access.of("0.0.0.0", token_env=None, token_file=tmp_path / "token").token == "from-file"


def test_a_port_in_use_is_refused_with_the_fix():
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        with pytest.raises(SpecError) as refused:
            check_port("127.0.0.1", port)
    assert refused.value.field == "--port" and "ss -ltnp" in refused.value.hint


def test_a_view_the_observer_stopped_refreshing_is_served_as_stale():
    """The fixture's observation was taken at NOW, long before this test runs: whatever asks
    for the page now is told how old it is, and the verdicts are not green."""
    client, _ = served(Access())
    page = client.get("/body").text
    assert "stale: observed" in page and 'class="verdict ok"' not in page


def test_the_command_refuses_before_serving_anything(tandem_here, tmp_path):
    home = str(tmp_path / "home")
    wide = tandem_here("dashboard", "nope", "--host", "0.0.0.0", TANDEM_HOME=home)
    assert wide.code == 2 and "needs a token" in wide.err and "ssh -L" in wide.err
    missing = tandem_here("dashboard", "nope", "--once", "--out", str(tmp_path / "p"))
    assert missing.code == 2 and "nope" in missing.err
    assert not (tmp_path / "p" / "index.html").exists()
    stray = tandem_here("dashboard", "nope", "--out", str(tmp_path / "q"))
    assert stray.code == 2 and "--out goes with --once" in stray.err
