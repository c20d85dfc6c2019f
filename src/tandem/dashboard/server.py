"""The page server: a read-only ASGI app over one ``Observer``, run by uvicorn.

Starlette and uvicorn are what vLLM's own API server runs on, so every machine with the engine
has them; tandem itself does not depend on them (``pip install 'tandem[dashboard]'`` brings them
where vLLM is not installed), and they are imported only here, when a page is served.

Routes, all ``GET``: ``/`` the page, ``/body`` the part that changes (the page's script fetches
it every refresh), ``/status.json`` the observation, ``/evidence/GROUP/KIND`` the report file
of a bench, smoke or eval run the observation names (only those files). Each request renders
the observer's latest view: a page open in ten browsers still costs one observation a refresh.

Access: on a loopback address anyone on this machine may read it. On any other address a token
is required (``Access``): given by reference (an environment variable or a file), never
printed; a browser passes it once as ``?token=...`` and gets a cookie (HttpOnly, SameSite
Strict) and a redirect to the bare URL, a script sends ``Authorization: Bearer ...``.
"""

from __future__ import annotations

import hmac
import os
import socket
import threading
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tandem.dashboard.observe import Observer
from tandem.dashboard.page import body, document
from tandem.errors import SpecError, StateError
from tandem.operations.evidence import Evidence
from tandem.spec.addresses import is_loopback, port_fault

COOKIE = "tandem_dashboard"
INSTALL_HINT = "pip install 'tandem[dashboard]' (vLLM's install brings both)"


@dataclass(frozen=True)
class Access:
    """Who may read the page: anyone (``token`` None, loopback only) or a token holder."""

    token: str | None = None

    @classmethod
    def of(cls, host: str, *, token_env: str | None, token_file: Path | None) -> Access:
        """The token by its reference; refused beyond loopback without one.

        Raises:
            SpecError: no token for a non-loopback address, an empty or unreadable one.
        """
        token = None
        if token_env and token_file:
            raise SpecError("give the token one way", field="--token-env", hint="or --token-file")
        if token_env:
            token = os.environ.get(token_env, "").strip()
            if not token:
                raise SpecError(
                    f"the environment variable {token_env} is empty or unset",
                    field="--token-env",
                    hint=f"export {token_env}=... (a long random string) before the command",
                )
        elif token_file:
            try:
                token = Path(token_file).read_text().strip()
            except OSError as exc:
                raise SpecError(
                    f"cannot read the token file {token_file}: {exc.strerror}",
                    field="--token-file",
                ) from exc
            if not token:
                raise SpecError(f"the token file {token_file} is empty", field="--token-file")
        if token is None and not is_loopback(host):
            raise SpecError(
                f"--host {host} serves the page beyond this machine, which needs a token",
                field="--host",
                hint="give one by reference: --token-env VAR or --token-file PATH; or keep "
                "127.0.0.1 and open an ssh tunnel (`ssh -L 8480:127.0.0.1:8480 HOST`)",
            )
        return cls(token=token)

    def allows(self, headers: dict[str, str], cookies: dict[str, str], query: str | None) -> bool:
        if self.token is None:
            return True
        given = [cookies.get(COOKIE), query]
        auth = headers.get("authorization", "")
        if auth.lower().startswith("bearer "):
            given.append(auth[7:].strip())
        return any(g and hmac.compare_digest(g, self.token) for g in given)


def _starlette() -> Any:
    try:
        import starlette.applications as applications
        import starlette.responses as responses
        import starlette.routing as routing
    except ImportError as exc:
        raise SpecError(
            "the dashboard needs starlette and uvicorn, which are not installed here",
            hint=INSTALL_HINT,
        ) from exc
    return applications, responses, routing


def app(observer: Observer, access: Access) -> Any:
    """The ASGI app over ``observer``'s latest view."""
    applications, responses, routing = _starlette()

    def evidence_href(group: str, kind: str, found: Evidence) -> str:
        return f"evidence/{group}/{kind}"

    def guarded(handler):
        async def endpoint(request):
            query = request.query_params.get("token")
            if not access.allows(dict(request.headers), dict(request.cookies), query):
                return responses.PlainTextResponse("a token is needed", status_code=401)
            if query and access.token is not None:  # a browser's first visit: keep it in a cookie
                back = responses.RedirectResponse(request.url.path, status_code=303)
                back.set_cookie(COOKIE, query, httponly=True, samesite="strict")
                return back
            return handler(request)

        return endpoint

    def page(request):
        now = datetime.now(UTC)
        return responses.HTMLResponse(document(observer.view, now, evidence_href, live=True))

    def fragment(request):
        return responses.HTMLResponse(body(observer.view, datetime.now(UTC), evidence_href))

    def observation(request):
        status = observer.view.status
        text = status.model_dump_json(indent=2) if status is not None else "null"
        return responses.Response(text, media_type="application/json")

    def report(request):
        group, kind = request.path_params["group"], request.path_params["kind"]
        status = observer.view.status
        for g in status.groups if status else []:
            found = g.overview.identity.evidence.get(kind) if g.overview else None
            if g.name == group and found is not None and found.report:
                return responses.FileResponse(found.report)
        return responses.PlainTextResponse("no such report", status_code=404)

    headers = {"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"}

    async def no_store(scope, receive, send):
        async def send_with(message):
            if message["type"] == "http.response.start":
                message["headers"] = list(message.get("headers", [])) + [
                    (k.lower().encode(), v.encode()) for k, v in headers.items()
                ]
            await send(message)

        await inner(scope, receive, send_with)

    inner = applications.Starlette(
        routes=[
            routing.Route("/", guarded(page)),
            routing.Route("/body", guarded(fragment)),
            routing.Route("/status.json", guarded(observation)),
            routing.Route("/evidence/{group}/{kind}", guarded(report)),
        ]
    )
    return no_store


def serve(observer: Observer, access: Access, host: str, port: int) -> None:
    """Observe in a thread and serve the page until interrupted."""
    try:
        import uvicorn
    except ImportError as exc:
        raise SpecError(
            "the dashboard needs uvicorn, not installed here", hint=INSTALL_HINT
        ) from exc
    check_port(host, port)
    if observer.take().status is None:  # the first one before any page: no such deployment?
        raise StateError(observer.view.error or "the first observation failed")
    stop = threading.Event()
    worker = threading.Thread(target=observer.run, args=(stop,), name="observer", daemon=True)
    worker.start()
    try:
        uvicorn.run(
            app(observer, access),
            host=host,
            port=port,
            log_level="warning",
            access_log=False,  # a first visit's URL holds the token
            server_header=False,
        )
    finally:
        stop.set()
        worker.join(timeout=30)


def check_port(host: str, port: int) -> None:
    """Refuse a port in use (or privileged) or an address not of this machine, before any
    observation.

    Raises:
        SpecError: the address cannot be bound.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            fix = port_fault(exc, port)
            raise SpecError(
                f"cannot serve the page on {host}:{port}: {exc.strerror}",
                field="--port" if fix else "--host",
                hint=fix or "bind an address of this machine, e.g. 127.0.0.1",
            ) from exc
