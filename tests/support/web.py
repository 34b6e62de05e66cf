"""An ASGI app served by uvicorn in the test's event loop, and the live page's test token."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import shutil
import signal
import subprocess
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import msgspec
import uvicorn

from debatebus._usage import TokenUsage
from debatebus.schemas import events as ev
from tests.support.servers import free_port

TIMEOUT = 60.0
TOKEN = "live-page-token-0123456789"


@contextlib.asynccontextmanager
async def serving(app: Any) -> AsyncIterator[str]:
    """``app`` on uvicorn on a free port, in this event loop."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                           timeout_graceful_shutdown=2))
    async with started(server):
        yield f"http://127.0.0.1:{port}"


@contextlib.asynccontextmanager
async def started(server: uvicorn.Server) -> AsyncIterator[None]:
    """``server`` serving in this event loop until the block ends."""
    task = asyncio.create_task(server.serve())
    async with asyncio.timeout(TIMEOUT):
        while not server.started:
            if task.done():
                task.result()  # raises what stopped it
                raise AssertionError("uvicorn exited before it started")
            await asyncio.sleep(0.05)
    try:
        yield
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, TIMEOUT)


PAGE_STATE = """(() => {
  const all = (s) => [...document.querySelectorAll(s)];
  const text = (id) => (document.getElementById(id) || {}).textContent || "";
  return {
    ready: document.readyState === "complete",
    turns: all('#timeline [data-kind="turn"]').length,
    turnCount: text("turn-count"),
    rounds: all('#timeline [data-kind="round"]').map((n) => n.firstChild.textContent),
    verdicts: all('#timeline [data-kind="verdict"]').length,
    finals: all('#timeline [data-kind="final"]').length,
    phiNotes: all('#timeline [data-kind="phi"]').length,
    speakers: all('#timeline [data-kind="turn"] .who').map((n) => n.textContent),
    turnTexts: all('#timeline [data-kind="turn"] .text').map((n) => n.textContent),
    verdictTexts: all('#timeline [data-kind="verdict"]').map((n) => n.textContent),
    status: text("status"), question: text("question"), tokens: text("tokens"), phi: text("phi"),
    cost: text("cost"), cached: text("cached"),
    markup: all("#debate b, #debate i, #debate img, #debate script").length,
    pwned: window.pwned === 1 || document.title === "pwned",
    listed: all("#debates a").map((a) => a.dataset.id),
    listedStatus: (document.querySelector("#debates a.selected .badge") || {}).textContent || "",
  };
})()"""


ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


CHROMIUM_FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--no-first-run", "--no-default-browser-check", "--mute-audio", "--remote-debugging-pipe",
)


def debate_events(debate_id: str = "d-1") -> list[ev.DebateEvent]:
    usage = TokenUsage.of(10, 5)
    ids = {"debate_id": debate_id, "request_id": f"req-{debate_id}"}
    return [
        ev.DebateStarted(**ids, seq=1, question="Tabs or spaces?", debate_name="style",
                         protocol="round-robin", participants=["tabs", "spaces"], max_rounds=2),
        ev.RoundStarted(**ids, seq=2, round=1, phase="opening"),
        ev.TurnCompleted(**ids, seq=3, speaker="tabs", round=1, text="Tabs.", usage=usage),
        ev.TurnCompleted(**ids, seq=4, speaker="spaces", round=1, text="Spaces.", usage=usage),
        ev.VerdictReached(**ids, seq=5, round=1, verdict={"consensus": True, "summary": "both"},
                          usage=usage),
        ev.RoundCompleted(**ids, seq=6, round=1, phase="opening", usage=TokenUsage.of(30, 15)),
        ev.PhiUpdate(**ids, seq=7, phi_hat=0.75, level="high"),
        ev.DebateCompleted(**ids, seq=8, rounds=1, satisfied=True, output="Spaces.",
                           token_usage=TokenUsage.of(31, 16)),
    ]


def encoded(events: list[ev.DebateEvent]) -> list[bytes]:
    return [msgspec.json.encode(e) for e in events]


async def wait_until(check: Callable[[], Any]) -> Any:
    async with asyncio.timeout(TIMEOUT):
        while not (result := await check()):  # noqa: ASYNC110 - polling a server
            await asyncio.sleep(0.05)
    return result


class Browser:
    """A headless Chromium driven over the DevTools protocol on pipes."""

    def __init__(self, proc: asyncio.subprocess.Process, reader: asyncio.StreamReader,
                 writer: asyncio.WriteTransport) -> None:
        self.proc, self._reader, self._writer = proc, reader, writer
        self._next_id = 0
        self._replies: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self.events: list[dict[str, Any]] = []
        self._pump = asyncio.create_task(self._read())

    @classmethod
    @contextlib.asynccontextmanager
    async def launch(cls, binary: str, profile: Path) -> AsyncIterator[Browser]:
        commands_r, commands_w = os.pipe()
        replies_r, replies_w = os.pipe()

        def wire_pipes() -> None:  # in the child: the protocol's fixed descriptors 3 and 4
            command, reply = os.dup(commands_r), os.dup(replies_w)
            os.dup2(command, 3)
            os.dup2(reply, 4)

        proc = await asyncio.create_subprocess_exec(
            binary, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "about:blank",
            preexec_fn=wire_pipes, close_fds=False, start_new_session=True,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(commands_r)
        os.close(replies_w)
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=64 * 1024 * 1024)  # screenshots arrive in one message
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader),
                                     os.fdopen(replies_r, "rb", 0))
        writer, _ = await loop.connect_write_pipe(asyncio.Protocol, os.fdopen(commands_w, "wb", 0))
        browser = cls(proc, reader, writer)
        try:
            yield browser
        finally:
            await browser.close()

    async def _read(self) -> None:
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            while True:
                message = json.loads((await self._reader.readuntil(b"\0"))[:-1])
                reply = self._replies.pop(message.get("id", -1), None)
                if reply is not None and not reply.done():
                    reply.set_result(message)
                elif "method" in message:
                    self.events.append(message)

    async def send(self, method: str, params: dict[str, Any] | None = None,
                   session: str | None = None) -> dict[str, Any]:
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session is not None:
            message["sessionId"] = session
        reply = self._replies[self._next_id] = asyncio.get_running_loop().create_future()
        self._writer.write(json.dumps(message).encode() + b"\0")
        answer = await asyncio.wait_for(reply, TIMEOUT)
        if "error" in answer:
            raise RuntimeError(f"{method}: {answer['error']}")
        return dict(answer["result"])

    async def open(self, url: str, width: int = 1280, height: int = 900) -> Page:
        target = await self.send("Target.createTarget", {"url": "about:blank"})
        attached = await self.send("Target.attachToTarget",
                                   {"targetId": target["targetId"], "flatten": True})
        page = Page(self, attached["sessionId"])
        for domain in ("Page", "Runtime", "Log"):
            await page.send(f"{domain}.enable")
        await page.send("Emulation.setDeviceMetricsOverride",
                        {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False})
        await page.send("Page.navigate", {"url": url})
        return page

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.send("Browser.close"), 10)
        try:
            await asyncio.wait_for(self.proc.wait(), 20)
        except TimeoutError:
            os.killpg(self.proc.pid, signal.SIGKILL)  # the group this test started, nothing else
            await asyncio.wait_for(self.proc.wait(), 20)
        self._pump.cancel()
        self._writer.close()


class Page:
    def __init__(self, browser: Browser, session: str) -> None:
        self.browser, self.session = browser, session

    async def send(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        return await self.browser.send(method, params, self.session)

    async def evaluate(self, expression: str) -> Any:
        result = await self.send("Runtime.evaluate",
                                 {"expression": expression, "returnByValue": True})
        if "exceptionDetails" in result:
            raise RuntimeError(f"page script failed: {result['exceptionDetails']}")
        return result["result"].get("value")

    async def wait_for(self, condition: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
        """Polls the page's state until ``condition`` holds; the last state on timeout."""
        state: dict[str, Any] = {}
        try:
            async with asyncio.timeout(TIMEOUT):
                while not condition(state := await self.evaluate(PAGE_STATE) or {}):  # noqa: ASYNC110
                    await asyncio.sleep(0.1)  # polling another process's DOM
        except TimeoutError:
            raise AssertionError(f"the page never got there; it shows {state}") from None
        return state

    async def screenshot(self, path: Path, *, full_page: bool = False) -> None:
        if full_page:
            metrics = await self.send("Page.getLayoutMetrics")
            height = int(metrics["cssContentSize"]["height"])
            await self.send("Emulation.setDeviceMetricsOverride",
                            {"width": 1280, "height": height, "deviceScaleFactor": 1, "mobile": False})
        shot = await self.send("Page.captureScreenshot", {"format": "png"})
        await asyncio.to_thread(write_png, path, base64.b64decode(shot["data"]))

    def errors(self) -> list[dict[str, Any]]:
        """Uncaught exceptions and error-level log entries (CSP refusals among them)."""
        return [e for e in self.browser.events if e.get("sessionId") == self.session and (
            e["method"] == "Runtime.exceptionThrown"
            or (e["method"] == "Log.entryAdded" and e["params"]["entry"]["level"] == "error"))]


def write_png(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
