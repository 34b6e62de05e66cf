"""The live page and streamed turns: its store keeps the text of each turn being written, its
stream sends deltas (and the text so far to a page that connects mid-turn), it reads the events
topic's history when it starts, and in headless Chromium a streamed turn grows on screen and the
debates are still there after the page's process restarts."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
import redis.asyncio as redis
from tests.support.bus import make_debate, running, transport_options
from tests.support.servers import RedisServer, free_port
from tests.support.web import (
    ARTIFACTS,
    CHROMIUM,
    TIMEOUT,
    TOKEN,
    Browser,
    Page,
    debate_events,
    encoded,
    serving,
    wait_until,
)

from debatebus._worker import DebateBus
from debatebus.client import BusClient
from debatebus.exceptions import ConfigError
from debatebus.llm import LLMRequest
from debatebus.schemas import events as ev
from debatebus.testing import FunctionLLM
from debatebus.transports import Outgoing
from debatebus.transports._memory import MemoryBroker, MemoryTransport
from debatebus.web import create_app
from debatebus.web._store import DebateStore

ROOT = Path(__file__).resolve().parents[2]


def delta(seq: int, text: str, *, replace: bool = False, final: bool = False,
          speaker: str = "tabs", debate_id: str = "d-1") -> ev.TurnDelta:
    return ev.TurnDelta(debate_id=debate_id, request_id=f"req-{debate_id}", seq=seq, round=1,
                        speaker=speaker, purpose="opening", text=text,
                        replace=replace or seq == 1, final=final)


# ---- the store ------------------------------------------------------------------------------------


def test_the_store_keeps_the_text_being_written_not_the_deltas() -> None:
    store = DebateStore()
    started, round_started, tabs_done = encoded(debate_events())[:3]
    store.ingest(started)
    store.ingest(round_started)
    listener = store.listen("d-1")
    for body in encoded([delta(1, "Ta"), delta(2, "bs"), delta(2, "bs"), delta(3, ".")]):
        store.ingest(body)
    record = store.get("d-1")
    assert record is not None
    (writing,) = record.typing.values()
    assert (writing["text"], writing["seq"], writing["replace"]) == ("Tabs.", 3, True)
    assert [e["type"] for e in record.events] == ["debate_started", "round_started"]
    assert [index for index, _ in listener.pending] == [None] * 4  # every delta, unkept
    store.ingest(encoded([delta(1, "Tabs, again", replace=True)])[0])  # a new writing
    assert record.typing["1/tabs/opening"]["text"] == "Tabs, again"
    store.ingest(tabs_done)  # the turn is reported: no longer being written
    assert record.typing == {}
    store.ingest(encoded([delta(1, "x"), delta(2, "", final=True)])[1])
    assert record.typing == {}


# ---- the stream, on a memory bus ------------------------------------------------------------------


async def sse_messages(lines: AsyncIterator[str], count: int) -> list[tuple[str, dict[str, Any]]]:
    """The next ``count`` server-sent events as (kind, data): kind is ``message`` or ``delta``."""
    messages: list[tuple[str, dict[str, Any]]] = []
    kind = "message"
    async with asyncio.timeout(TIMEOUT):
        async for line in lines:
            if line.startswith("event: "):
                kind = line[7:]
            elif line.startswith("data: "):
                messages.append((kind, json.loads(line[6:])))
                kind = "message"
                if len(messages) == count:
                    break
    return messages


async def test_a_page_connecting_mid_turn_gets_the_text_so_far_then_each_delta() -> None:
    broker, topic = MemoryBroker(), f"debate:events:{uuid.uuid4().hex[:8]}"
    bodies = encoded(debate_events("d-1"))
    async with serving(create_app(MemoryTransport(broker), events_topic=topic)) as base, \
            MemoryTransport(broker) as bus, httpx.AsyncClient(base_url=base, timeout=TIMEOUT) as http:
        for body in [*bodies[:2], *encoded([delta(1, "Tabs "), delta(2, "win")])]:
            await bus.publish(Outgoing(topic, body, key="req-d-1"))

        async def writing() -> bool:
            record = (await http.get("/api/debates/d-1")).json()
            return record["debate"]["events"] == 2 and record["debate"]["typing"] == 1

        await wait_until(writing)
        async with http.stream("GET", "/api/debates/d-1/stream") as stream:
            lines = stream.aiter_lines()
            caught_up = await sse_messages(lines, 3)
            for body in [*encoded([delta(3, "s."), delta(4, "", final=True)]), bodies[2]]:
                await bus.publish(Outgoing(topic, body, key="req-d-1"))
            live = await sse_messages(lines, 3)
    assert [(kind, data["type"]) for kind, data in caught_up] == [
        ("message", "debate_started"), ("message", "round_started"), ("delta", "turn_delta")]
    so_far = caught_up[2][1]
    assert (so_far["text"], so_far["seq"], so_far["replace"]) == ("Tabs win", 2, True)
    assert [(kind, data.get("text")) for kind, data in live] == [
        ("delta", "s."), ("delta", ""), ("message", "Tabs.")]


# ---- catching up after a restart ------------------------------------------------------------------


async def listed_ids(http: httpx.AsyncClient) -> list[str]:
    return [d["id"] for d in (await http.get("/api/debates")).json()["debates"]]


async def test_a_page_started_after_its_debates_reads_them_from_the_topic() -> None:
    broker, topic = MemoryBroker(), f"debate:events:{uuid.uuid4().hex[:8]}"
    async with MemoryTransport(broker) as bus:
        for debate_id in ("d-1", "d-2"):
            for body in encoded(debate_events(debate_id)):
                await bus.publish(Outgoing(topic, body, key=debate_id))
    async with serving(create_app(MemoryTransport(broker), events_topic=topic,
                                  catch_up_s=None)) as base, \
            httpx.AsyncClient(base_url=base, timeout=TIMEOUT) as http:
        health = (await http.get("/healthz")).json()
        assert (health["status"], health["caughtUp"]) == ("ok", 16)
        assert sorted(await listed_ids(http)) == ["d-1", "d-2"]
        detail = (await http.get("/api/debates/d-2")).json()
    assert detail["debate"]["status"] == "completed"
    assert [e["seq"] for e in detail["events"]] == list(range(1, 9))


def test_the_catch_up_window_is_checked(capsys: pytest.CaptureFixture[str]) -> None:
    from debatebus.cli import main

    with pytest.raises(SystemExit) as exited:
        main(["web", "--broker", "memory://", "--catch-up", "soon"])
    assert exited.value.code == 2
    assert "--catch-up: must be a duration (30m, 24h, 7d), 0 or all, not 'soon'" in (
        capsys.readouterr().err)
    with pytest.raises(ConfigError, match="catch_up_s must be ≥ 0 seconds"):
        create_app(MemoryTransport(MemoryBroker()), catch_up_s=-1)


@pytest.mark.redis
async def test_on_redis_the_page_reads_the_window_it_is_given_once(redis_server: RedisServer) -> None:
    topic = f"debate:events:{uuid.uuid4().hex[:8]}"
    old, recent = encoded(debate_events("old")), encoded(debate_events("recent"))
    client = redis.Redis.from_url(redis_server.url)
    try:
        for index, body in enumerate(old):  # written in 1970: outside any window
            await client.xadd(topic, {"envelope": body}, id=f"{1000 + index}-0")
        for body in recent:
            await client.xadd(topic, {"envelope": body})
    finally:
        await client.aclose()
    app = create_app(redis_server.url, events_topic=topic, catch_up_s=3600)
    async with serving(app) as base, httpx.AsyncClient(base_url=base, timeout=TIMEOUT) as http:
        assert (await http.get("/healthz")).json()["caughtUp"] == len(recent)
        assert await listed_ids(http) == ["recent"]
        # What is published from now on is followed, and nothing read is counted twice.
        async with BusClient(redis_server.url) as bus:
            for body in encoded(debate_events("later")):
                await bus.transport.publish(Outgoing(topic, body, key="later"))

        async def both() -> Any:
            ids = await listed_ids(http)
            return ids if "later" in ids else None

        assert sorted(await wait_until(both)) == ["later", "recent"]
        detail = (await http.get("/api/debates/recent")).json()
    assert len(detail["events"]) == len(recent)


# ---- in headless Chromium: a turn typed on screen; the debates after a restart ---------------------


STATE = """(() => {
  const all = (s) => [...document.querySelectorAll(s)];
  const text = (id) => (document.getElementById(id) || {}).textContent || "";
  return {
    typing: all('#timeline [data-kind="typing"]').map((n) => ({
      who: n.querySelector(".who").textContent, text: n.querySelector(".text").textContent,
      writing: n.classList.contains("writing")})),
    turns: all('#timeline [data-kind="turn"] .text').map((n) => n.textContent),
    finals: all('#timeline [data-kind="final"]').length,
    status: text("status"),
    listed: all("#debates a").map((a) => a.dataset.id),
  };
})()"""


class WebProcess:
    """``debatebus web`` in its own process, so a test can kill it and start it again."""

    def __init__(self, url: str, port: int, events_topic: str, log: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "debatebus", "web", "--broker", url, "--port", str(port),
             "--events-topic", events_topic, "--catch-up", "1h"],
            cwd=ROOT, env={**os.environ, "DEBATEBUS_WEB_TOKEN": TOKEN,
                           "PYTHONPATH": os.pathsep.join((str(ROOT / "src"), str(ROOT)))},
            stdout=log.open("ab"), stderr=subprocess.STDOUT)
        self.base = f"http://127.0.0.1:{port}"

    async def ready(self) -> None:
        async with httpx.AsyncClient(base_url=self.base, timeout=5) as http:
            async def healthy() -> bool:
                if self.proc.poll() is not None:
                    raise AssertionError(f"debatebus web exited with {self.proc.returncode}")
                try:
                    response = await http.get("/healthz", params={"token": TOKEN})
                except httpx.TransportError:
                    return False
                return response.status_code == 200

            await wait_until(healthy)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)


def slowly_written(request: LLMRequest) -> Any:
    if request.purpose == "judge":
        return {"consensus": False, "summary": "still apart"}
    return f"{request.speaker} writes: " + " ".join(f"word{i}" for i in range(50))


async def follow_state(page: Page) -> dict[str, Any]:
    return dict(await page.evaluate(STATE) or {})


@pytest.mark.slow
@pytest.mark.redis
async def test_page_shows_a_turn_growing_and_past_debates_after_a_restart(
        redis_server: RedisServer, tmp_path: Path) -> None:
    if CHROMIUM is None:
        pytest.skip("chromium is not installed (scripts/bootstrap.sh test installs it)")
    url, suffix = redis_server.url, uuid.uuid4().hex[:8]
    event_type, events_topic = f"debate:request{suffix}", f"debate:events{suffix}"
    request_id = f"typed-{suffix}"
    worker = DebateBus(url, publish_events=True, events_topic=events_topic,
                       transport_options=transport_options(url), heartbeat_interval_s=None)
    # 52 words 60 ms apart: about 3 s a turn, typed on screen in about 30 deltas.
    llm = FunctionLLM(slowly_written, stream_pause_s=0.06)
    worker.subscribe(event_type, make_debate(llm, max_rounds=1).as_handler(stream_turns=True))
    port = free_port()
    web = WebProcess(url, port, events_topic, tmp_path / "web.log")
    try:
        await web.ready()
        async with running(worker), BusClient(url) as client, \
                Browser.launch(CHROMIUM, tmp_path / "profile") as browser:
            results = await client.transport.subscribe([f"event:{event_type}:completed"])
            page = await browser.open(f"{web.base}/?token={TOKEN}#debate={request_id}")
            await page.wait_for(lambda s: s.get("ready"))
            await client.publish(event_type, {"input": "Tabs or spaces?"}, request_id=request_id)

            def typed_optimist(state: dict[str, Any], longer_than: int) -> bool:
                return any(t["who"] == "optimist" and t["writing"]
                           and len(t["text"]) > longer_than for t in state["typing"])

            first = await wait_for_state(page, lambda s: typed_optimist(s, 0))
            seen = len(next(t["text"] for t in first["typing"] if t["who"] == "optimist"))
            grown = await wait_for_state(page, lambda s: typed_optimist(s, seen + 20))
            await page.screenshot(ARTIFACTS / "web-streamed-turn.png")
            done = await wait_for_state(page, lambda s: s["finals"] == 1)
            result = msgspec.json.decode((await asyncio.wait_for(anext(results), TIMEOUT)).body)
            errors = page.errors()

            # The page's process restarts: the new one reads the topic and shows the debate.
            web.kill()
            web = WebProcess(url, port, events_topic, tmp_path / "web.log")
            await web.ready()
            await page.send("Page.reload")
            after = await wait_for_state(
                page, lambda s: s["finals"] == 1 and request_id in s["listed"])
            await page.screenshot(ARTIFACTS / "web-after-restart.png", full_page=True)
    finally:
        web.kill()

    grown_text = next(t["text"] for t in grown["typing"] if t["who"] == "optimist")
    assert grown_text.startswith("optimist writes: word0 word1")
    assert len(grown_text) > seen + 20
    transcript = result["payload"]["debateTranscript"]
    assert done["turns"] == [turn["text"] for turn in transcript[0]["turns"]]
    assert done["typing"] == []  # each typed turn was replaced by its own card
    assert (done["status"], after["status"]) == ("completed", "completed")
    assert after["turns"] == done["turns"]
    assert errors == []


async def wait_for_state(page: Page, condition: Any) -> dict[str, Any]:
    state: dict[str, Any] = {}
    try:
        async with asyncio.timeout(TIMEOUT):
            while not condition(state := await follow_state(page)):  # noqa: ASYNC110
                await asyncio.sleep(0.05)  # polling another process's DOM
    except TimeoutError:
        raise AssertionError(f"the page never got there; it shows {state}") from None
    return state
