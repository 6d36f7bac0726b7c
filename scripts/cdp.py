"""Headless Chromium driven over the DevTools protocol, with aiohttp's websocket client.

Enough for the status page test and ``scripts/screenshot_status.py``: open a page, evaluate
JavaScript, wait for a condition, take a screenshot, and collect everything the browser
reports as a problem (console errors, uncaught exceptions, log entries such as a failed
resource or a CSP violation, and responses of status 400 and more).
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

BINARIES = ("chromium", "chromium-browser", "google-chrome")


def find_chromium() -> str | None:
    for name in BINARIES:
        path = shutil.which(name)
        if path is not None:
            return path
    return None


class CdpError(Exception):
    pass


class Browser:
    """One headless Chromium process and a CDP session on its first page."""

    def __init__(self, binary: str, width: int = 1440, height: int = 1000) -> None:
        self.binary = binary
        self.width = width
        self.height = height
        self.profile = tempfile.mkdtemp(prefix="gateway-chromium-")
        self.proc: subprocess.Popen[bytes] | None = None
        self.session: aiohttp.ClientSession | None = None
        self.ws: aiohttp.ClientWebSocketResponse | None = None
        self.ids = itertools.count(1)
        self.pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self.events: list[dict[str, Any]] = []
        self.reader: asyncio.Task[None] | None = None

    async def start(self) -> Browser:
        args = [
            self.binary,
            "--headless=new",
            "--disable-gpu",
            "--no-first-run",
            "--no-default-browser-check",
            "--disable-extensions",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--metrics-recording-only",
            "--password-store=basic",
            "--use-mock-keychain",
            f"--user-data-dir={self.profile}",
            "--remote-debugging-port=0",
            "--remote-allow-origins=*",
            f"--window-size={self.width},{self.height}",
            "about:blank",
        ]
        if os.geteuid() == 0:
            args.insert(1, "--no-sandbox")  # Chromium refuses to run as root with its sandbox
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        port_file = Path(self.profile) / "DevToolsActivePort"
        deadline = time.monotonic() + 30
        while not (port_file.exists() and port_file.read_text().strip()):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise CdpError("chromium did not start (no DevToolsActivePort)")
            await asyncio.sleep(0.05)
        port = int(port_file.read_text().split()[0])
        self.session = aiohttp.ClientSession()
        async with self.session.get(f"http://127.0.0.1:{port}/json/list") as resp:
            targets = await resp.json()
        page = next(t for t in targets if t["type"] == "page")
        self.ws = await self.session.ws_connect(page["webSocketDebuggerUrl"], max_msg_size=64 * 1024 * 1024)
        self.reader = asyncio.create_task(self._read())
        for domain in ("Page", "Runtime", "Log", "Network"):
            await self.send(f"{domain}.enable")
        await self.send(
            "Emulation.setDeviceMetricsOverride",
            {"width": self.width, "height": self.height, "deviceScaleFactor": 1, "mobile": False},
        )
        return self

    async def close(self) -> None:
        if self.reader is not None:
            self.reader.cancel()
        if self.ws is not None:
            await self.ws.close()
        if self.session is not None:
            await self.session.close()
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        shutil.rmtree(self.profile, ignore_errors=True)

    async def _read(self) -> None:
        assert self.ws is not None
        async for msg in self.ws:
            if msg.type != aiohttp.WSMsgType.TEXT:
                break
            data = json.loads(msg.data)
            if "id" in data:
                future = self.pending.pop(data["id"], None)
                if future is not None and not future.done():
                    future.set_result(data)
            else:
                self.events.append(data)

    async def send(self, method: str, params: dict[str, Any] | None = None, timeout: float = 30) -> dict[str, Any]:
        assert self.ws is not None
        ident = next(self.ids)
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self.pending[ident] = future
        await self.ws.send_str(json.dumps({"id": ident, "method": method, "params": params or {}}))
        answer = await asyncio.wait_for(future, timeout)
        if "error" in answer:
            raise CdpError(f"{method}: {answer['error']}")
        result: dict[str, Any] = answer.get("result", {})
        return result

    async def navigate(self, url: str, timeout: float = 20) -> None:
        mark = len(self.events)
        await self.send("Page.navigate", {"url": url})
        await self.wait_event("Page.loadEventFired", since=mark, timeout=timeout)

    async def wait_event(self, method: str, *, since: int = 0, timeout: float = 20) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for event in self.events[since:]:
                if event["method"] == method:
                    return event
            await asyncio.sleep(0.05)
        raise TimeoutError(f"no {method} within {timeout}s")

    async def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression (awaited when it is a promise)."""
        result = await self.send(
            "Runtime.evaluate", {"expression": expression, "returnByValue": True, "awaitPromise": True}
        )
        if "exceptionDetails" in result:
            raise CdpError(f"{expression!r} threw: {result['exceptionDetails']}")
        return result["result"].get("value")

    async def wait_for(self, expression: str, timeout: float = 15) -> Any:
        """Evaluate until the expression is truthy; returns its value."""
        deadline = time.monotonic() + timeout
        while True:
            value = await self.evaluate(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                state = await self.evaluate("document.body ? document.body.innerText.slice(0, 2000) : ''")
                raise TimeoutError(
                    f"{expression!r} still false after {timeout}s; browser problems: {self.problems()}; page: {state}"
                )
            await asyncio.sleep(0.1)

    async def screenshot(self, path: Path) -> None:
        data = await self.send("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True})
        path.write_bytes(base64.b64decode(data["data"]))

    def problems(self, since: int = 0) -> list[str]:
        """What the browser reported as wrong since event ``since``."""
        out = []
        for event in self.events[since:]:
            method, params = event["method"], event.get("params", {})
            if method == "Runtime.exceptionThrown":
                out.append(f"exception: {params['exceptionDetails']}")
            elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert", "warning"):
                out.append(f"console.{params['type']}: {[a.get('value') for a in params.get('args', [])]}")
            elif method == "Log.entryAdded" and params["entry"]["level"] in ("error", "warning"):
                entry = params["entry"]
                out.append(f"log {entry['level']} ({entry.get('source')}): {entry['text']} {entry.get('url', '')}")
            elif method == "Network.responseReceived" and params["response"]["status"] >= 400:
                out.append(f"HTTP {params['response']['status']} for {params['response']['url']}")
            elif method == "Network.loadingFailed" and not params.get("canceled"):
                out.append(f"loading failed: {params.get('errorText')} ({params.get('type')})")
        return out

    def responses(self, since: int = 0) -> list[tuple[str, int]]:
        return [
            (e["params"]["response"]["url"], e["params"]["response"]["status"])
            for e in self.events[since:]
            if e["method"] == "Network.responseReceived"
        ]
