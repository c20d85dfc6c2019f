"""A headless Chromium driven over the DevTools protocol: open a page, read what it logs, run
JavaScript in it, take a screenshot.

Debian's ``chromium`` with ``--remote-debugging-port=0`` prints the port it chose; the page's
target is then driven over one WebSocket (``websockets``' sync client, which uvicorn brings).
The browser gets a proxy that answers nothing (``127.0.0.1:9``): loopback is reached directly,
anything else fails, so a page that needs the internet shows it as an error.
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def keep(shot: Path) -> None:
    """A screenshot copied into the folder ``TANDEM_DASHBOARD_SHOTS`` names, when it is set:
    the test's artifact (``docs/dashboard.png`` was taken so)."""
    folder = os.environ.get("TANDEM_DASHBOARD_SHOTS")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, Path(folder) / shot.name)


class Browser:
    """One headless Chromium with one page.

    Usage:
        with Browser() as browser:
            browser.open("http://127.0.0.1:8480/")
            browser.evaluate("document.title"), browser.errors
    """

    def __init__(self, width: int = 1400, height: int = 2200) -> None:
        from websockets.sync.client import connect

        assert CHROMIUM, "no chromium (apt-get install chromium)"
        self._profile = tempfile.TemporaryDirectory(prefix="tandem-chromium-")
        self._process = subprocess.Popen(
            [
                CHROMIUM,
                "--headless",
                "--no-sandbox",  # as root
                "--disable-gpu",
                "--proxy-server=127.0.0.1:9",
                f"--user-data-dir={self._profile.name}",
                f"--window-size={width},{height}",
                "--remote-debugging-port=0",
                "about:blank",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        port = self._port()
        pages = httpx.get(f"http://127.0.0.1:{port}/json/list", timeout=10).json()
        page = next(p for p in pages if p["type"] == "page")
        self._stack = contextlib.ExitStack()
        self._socket = self._stack.enter_context(
            connect(page["webSocketDebuggerUrl"], max_size=2**26)
        )
        self._ids = itertools.count(1)
        self.errors: list[str] = []
        for domain in ("Runtime", "Log", "Page"):
            self.call(f"{domain}.enable")

    def _port(self) -> int:
        assert self._process.stderr is not None
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            line = self._process.stderr.readline()
            found = re.search(r"DevTools listening on ws://[^:]+:(\d+)/", line)
            if found:
                return int(found.group(1))
        raise AssertionError("chromium did not say where DevTools listens")

    def _note(self, message: dict) -> None:
        method, params = message.get("method"), message.get("params", {})
        if method == "Runtime.exceptionThrown":
            details = params["exceptionDetails"]
            self.errors.append(f"exception: {details.get('text')} {details.get('exception', {})}")
        elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            self.errors.append("console: " + " ".join(str(a.get("value")) for a in params["args"]))
        elif method == "Log.entryAdded" and params["entry"]["level"] == "error":
            entry = params["entry"]
            self.errors.append(f"log: {entry['text']} {entry.get('url', '')}")

    def call(self, method: str, **params: Any) -> dict:
        number = next(self._ids)
        self._socket.send(json.dumps({"id": number, "method": method, "params": params}))
        while True:
            message = json.loads(self._socket.recv(timeout=60))
            if message.get("id") == number:
                if "error" in message:
                    raise AssertionError(f"{method}: {message['error']}")
                return message.get("result", {})
            self._note(message)

    def drain(self, seconds: float) -> None:
        """Read what the page logs for ``seconds``."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            try:
                self._note(json.loads(self._socket.recv(timeout=left)))
            except TimeoutError:
                return

    def open(self, url: str, *, settle_s: float = 2.0) -> None:
        self.call("Page.navigate", url=url)
        self.drain(settle_s)

    def evaluate(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in result:
            raise AssertionError(f"{expression[:80]}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def screenshot(self, path: Path) -> Path:
        data = self.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)
        path.write_bytes(base64.b64decode(data["data"]))
        return path

    def close(self) -> None:
        try:
            self._stack.close()
        finally:
            self._process.terminate()
            try:
                self._process.wait(20)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait(10)
            self._profile.cleanup()

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
