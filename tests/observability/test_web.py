"""The live debate page: its store, its API over a memory bus, and the page itself end to end in
headless Chromium following a real worker's debate on Redis.

Chromium is driven through the DevTools protocol over ``--remote-debugging-pipe`` (NUL-separated
JSON on file descriptors 3 and 4), which needs no websocket client and no port.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
from tests.support.bus import make_debate, running, transport_options
from tests.support.servers import free_port
from tests.support.web import (
    ARTIFACTS,
    CHROMIUM,
    PAGE_STATE,
    TIMEOUT,
    TOKEN,
    Browser,
    debate_events,
    encoded,
    serving,
    started,
    wait_until,
)

from debatebus._pricing import Price, Prices
from debatebus._redaction import REDACTED
from debatebus._worker import DebateBus
from debatebus.cli import main
from debatebus.client import BusClient
from debatebus.llm import LLMRequest
from debatebus.schemas.envelope import completed_topic
from debatebus.testing import FunctionLLM
from debatebus.transports import Outgoing
from debatebus.transports._memory import MemoryBroker, MemoryTransport
from debatebus.web import _app as web_app
from debatebus.web import build_server, create_app
from debatebus.web._store import DebateStore, Listener

# ---- the store ------------------------------------------------------------------------------------


def test_store_summarises_a_debate_from_its_events() -> None:
    store = DebateStore()
    bodies = encoded(debate_events())
    for body in bodies[:5]:
        store.ingest(body)
    (running_debate,) = store.recent()
    assert running_debate["status"] == "running"
    assert running_debate["turns"] == 2
    assert running_debate["tokens"]["totalTokens"] == 45  # summed from the three calls so far
    assert running_debate["verdict"] == {"consensus": True, "summary": "both"}
    for body in bodies[5:]:
        store.ingest(body)
    (done,) = store.recent()
    assert done["status"] == "completed"
    assert done["rounds"] == 1
    assert done["tokens"] == {"promptTokens": 31, "completionTokens": 16, "totalTokens": 47,
                              "cacheReadTokens": 0, "cacheWriteTokens": 0}
    assert (done["phiHat"], done["phiLevel"]) == (0.75, "high")
    assert (done["question"], done["participants"]) == ("Tabs or spaces?", ["tabs", "spaces"])
    record = store.get("d-1")
    assert record is not None
    assert [e["seq"] for e in record.events] == list(range(1, 9))


def test_store_ignores_what_is_not_an_event_and_keeps_unknown_types() -> None:
    store = DebateStore()
    for body in [b"not json", b"[]", b'{"type": "x"}', b'{"type": "x", "debateId": 5}',
                 b'{"type": "x", "debateId": ""}']:
        store.ingest(body)
    assert (store.received, store.ignored, len(store)) == (5, 5, 0)
    store.ingest(b'{"type": "from_the_future", "debateId": "d", "seq": 1}')
    record = store.get("d")
    assert record is not None
    assert record.events[0]["type"] == "from_the_future"


def test_store_forgets_the_least_recently_active_debate() -> None:
    store = DebateStore(history=2)
    for debate_id in ("a", "b", "a", "c"):
        store.ingest(json.dumps({"type": "round_started", "debateId": debate_id}).encode())
    assert {d["id"] for d in store.recent()} == {"a", "c"}


def test_a_listener_that_falls_behind_is_cut_off_not_waited_for() -> None:
    listener = Listener(backlog=2)
    for index in range(3):
        listener.push(index, {"seq": index})
    assert listener.overflowed
    assert [index for index, _ in listener.pending] == [0, 1]


# ---- the API on a memory bus ---------------------------------------------------------------------


async def sse_events(lines: AsyncIterator[str], count: int) -> list[tuple[int, dict[str, Any]]]:
    """The next ``count`` server-sent events as (id, data), skipping comments and retry lines."""
    events: list[tuple[int, dict[str, Any]]] = []
    event_id, data = None, None
    async with asyncio.timeout(TIMEOUT):
        async for line in lines:
            if line.startswith("id: "):
                event_id = int(line[4:])
            elif line.startswith("data: "):
                data = json.loads(line[6:])
            elif not line and event_id is not None and data is not None:
                events.append((event_id, data))
                event_id, data = None, None
                if len(events) == count:
                    break
    return events




async def test_api_lists_debates_and_streams_their_events_with_resume() -> None:
    broker, topic = MemoryBroker(), f"debate:events:{uuid.uuid4().hex[:8]}"
    bodies = encoded(debate_events("d-1"))
    async with serving(create_app(MemoryTransport(broker), events_topic=topic)) as base, \
            MemoryTransport(broker) as bus, httpx.AsyncClient(base_url=base, timeout=TIMEOUT) as http:
        health = (await http.get("/healthz")).json()
        assert (health["status"], health["topic"]) == ("ok", topic)

        # A page may open a debate before its first event: the stream waits for it.
        async with http.stream("GET", "/api/debates/d-1/stream") as early:
            assert early.headers["content-type"].startswith("text/event-stream")
            lines = early.aiter_lines()
            for body in bodies[:4]:
                await bus.publish(Outgoing(topic, body, key="req-d-1"))
            first = await sse_events(lines, 4)
            for body in bodies[4:]:
                await bus.publish(Outgoing(topic, body, key="req-d-1"))
            rest = await sse_events(lines, 4)
        assert [i for i, _ in first + rest] == list(range(8))
        assert [e["seq"] for _, e in first + rest] == list(range(1, 9))

        async def listed() -> Any:
            debates = (await http.get("/api/debates")).json()["debates"]
            return debates if debates and debates[0]["status"] == "completed" else None

        (summary,) = await wait_until(listed)
        assert (summary["id"], summary["requestId"], summary["turns"]) == ("d-1", "req-d-1", 2)
        detail = (await http.get("/api/debates/d-1")).json()
        assert [e["type"] for e in detail["events"]][-1] == "debate_completed"
        assert (await http.get("/api/debates/nope")).status_code == 404

        # EventSource reconnects with the last id it saw: only what came after is sent again.
        async with http.stream("GET", "/api/debates/d-1/stream",
                               headers={"Last-Event-ID": "5"}) as resumed:
            again = await sse_events(resumed.aiter_lines(), 2)
        assert [i for i, _ in again] == [6, 7]


async def test_page_is_served_with_a_policy_that_allows_only_its_own_inline_code() -> None:
    async with serving(create_app(MemoryTransport(MemoryBroker()))) as base, \
            httpx.AsyncClient(base_url=base, timeout=TIMEOUT) as http:
        response = await http.get("/")
    assert response.status_code == 200
    policy = response.headers["content-security-policy"]
    assert re.search(r"script-src 'sha256-[A-Za-z0-9+/=]+'(;|$)", policy)
    assert "unsafe-inline" not in policy
    assert "default-src 'none'" in policy
    for markup_sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write"):
        assert markup_sink not in response.text


async def test_health_says_when_the_broker_cannot_be_followed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(web_app, "STARTUP_WAIT_S", 0.2)
    nobody = f"redis://127.0.0.1:{free_port()}/0"
    async with serving(create_app(nobody)) as base, \
            httpx.AsyncClient(base_url=base, timeout=TIMEOUT) as http:

        async def unhealthy() -> Any:
            response = await http.get("/healthz")
            return response if response.json()["error"] else None

        response = await wait_until(unhealthy)
    assert response.status_code == 503
    assert "cannot reach Redis" in response.json()["error"]


async def test_an_empty_page_says_why_and_how_to_fix_it() -> None:
    async with serving(create_app(MemoryTransport(MemoryBroker()))) as base, \
            httpx.AsyncClient(base_url=base, timeout=TIMEOUT) as http:
        page = (await http.get("/")).text
        assert (await http.get("/api/debates")).json()["debates"] == []
    empty = page[page.index('id="no-debates"'):]
    empty = " ".join(empty[:empty.index("</div>")].split())
    assert "workers do not by default" in empty
    assert "DebateBus(…, publish_events=True)" in empty
    assert "--events-topic" in empty
    assert '$("no-debates").hidden = debates.length > 0' in page  # shown only while empty


def test_web_command_checks_its_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["web", "--broker", "memory://", "--history", "0"])
    assert exited.value.code == 2
    assert "--history: must be a whole number ≥ 1, not '0'" in capsys.readouterr().err


# ---- who may read the page: the token, the Host, the warning -------------------------------------

BEARER = {"Authorization": f"Bearer {TOKEN}"}
ROUTES = ["/", "/healthz", "/api/debates", "/api/debates/d-1", "/api/debates/d-1/stream"]


async def status_of(http: httpx.AsyncClient, path: str, **options: Any) -> httpx.Response:
    """GET ``path``, left as soon as the headers arrive (an event stream never ends)."""
    async with http.stream("GET", path, **options) as response:
        return response


def warnings_from(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "debatebus.web" and r.levelno >= logging.WARNING]


async def test_with_a_token_every_route_needs_it_in_the_header_or_the_query() -> None:
    broker, topic = MemoryBroker(), f"debate:events:{uuid.uuid4().hex[:8]}"
    app = create_app(MemoryTransport(broker), events_topic=topic, token=TOKEN)
    async with serving(app) as base, MemoryTransport(broker) as bus, \
            httpx.AsyncClient(base_url=base, timeout=TIMEOUT) as http:
        for body in encoded(debate_events("d-1")):
            await bus.publish(Outgoing(topic, body, key="req-d-1"))

        async def stored() -> bool:
            return (await http.get("/api/debates/d-1", headers=BEARER)).status_code == 200

        await wait_until(stored)
        for path in ROUTES:
            for refused in (await status_of(http, path),
                            await status_of(http, path, headers={"Authorization": "Bearer nope"}),
                            await status_of(http, path, headers={"Authorization": f"Basic {TOKEN}"}),
                            await status_of(http, path, params={"token": TOKEN[:-1]})):
                assert refused.status_code == 401, path
                assert refused.headers["www-authenticate"].startswith("Bearer")
            assert (await status_of(http, path, headers=BEARER)).status_code == 200, path
            assert (await status_of(http, path, params={"token": TOKEN})).status_code == 200, path
        page = await http.get("/", params={"token": TOKEN})
    assert "withToken(`/api/debates/" in page.text  # the page passes the token on to its stream


async def test_a_request_sent_to_another_host_is_refused() -> None:
    app = create_app(MemoryTransport(MemoryBroker()), token=TOKEN,
                     allowed_hosts=["debates.example.com", "*.corp.example"])
    async with serving(app) as base, \
            httpx.AsyncClient(base_url=base, timeout=TIMEOUT, headers=BEARER) as http:
        port = base.rsplit(":", 1)[1]
        for host in ("evil.example", f"evil.example:{port}", "debates.example.com.evil.example",
                     "corp.example", "0.0.0.0"):
            response = await http.get("/api/debates", headers={"Host": host})
            assert response.status_code == 421, host
            assert response.text.startswith("this server does not answer for the Host")
        for host in (f"localhost:{port}", f"127.0.0.1:{port}", f"[::1]:{port}", "127.0.0.2",
                     "debates.example.com", "live.corp.example:443"):
            assert (await http.get("/api/debates", headers={"Host": host})).status_code == 200, host


async def test_bound_to_every_interface_without_a_token_it_warns_and_still_checks_the_host(
        caplog: pytest.LogCaptureFixture) -> None:
    port = free_port()
    with caplog.at_level(logging.WARNING, "debatebus.web"):
        server = build_server(MemoryTransport(MemoryBroker()), host="0.0.0.0", port=port,
                              log_level="warning")
    (warning,) = warnings_from(caplog)
    assert f"listens on 0.0.0.0 port {port}, beyond loopback, with NO TOKEN" in warning
    assert "every debate's question, turns, verdicts and result" in warning
    assert "--token or $DEBATEBUS_WEB_TOKEN" in warning
    # Bound to every interface, but asked only on loopback.
    async with started(server), \
            httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=TIMEOUT) as http:
        assert (await http.get("/api/debates")).status_code == 200
        bind_address = await http.get("/api/debates", headers={"Host": f"0.0.0.0:{port}"})
        assert bind_address.status_code == 200
        assert (await http.get("/api/debates", headers={"Host": "evil.example"})).status_code == 421


async def test_with_a_token_on_every_interface_there_is_no_warning(
        caplog: pytest.LogCaptureFixture) -> None:
    port = free_port()
    with caplog.at_level(logging.WARNING, "debatebus.web"):
        server = build_server(MemoryTransport(MemoryBroker()), host="0.0.0.0", port=port,
                              token=TOKEN, log_level="warning")
    assert warnings_from(caplog) == []
    async with started(server), \
            httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=TIMEOUT) as http:
        assert (await http.get("/api/debates")).status_code == 401
        assert (await http.get("/api/debates", headers=BEARER)).status_code == 200


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "::1", "127.0.0.53"])
def test_on_loopback_there_is_no_warning(caplog: pytest.LogCaptureFixture, host: str) -> None:
    with caplog.at_level(logging.WARNING, "debatebus.web"):
        build_server(MemoryTransport(MemoryBroker()), host=host, port=free_port())
        build_server(MemoryTransport(MemoryBroker()), host="0.0.0.0", port=free_port())
    assert len(warnings_from(caplog)) == 1  # the 0.0.0.0 one only: the check does fire here


async def test_the_token_never_reaches_the_access_log(capsys: pytest.CaptureFixture[str]) -> None:
    port = free_port()
    server = build_server(MemoryTransport(MemoryBroker()), port=port, token=TOKEN,
                          log_level="info")
    async with started(server), \
            httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=TIMEOUT) as http:
        assert (await http.get("/", params={"token": TOKEN})).status_code == 200
        assert (await http.get("/api/debates", params={"x": "1", "token": TOKEN})).status_code == 200
        assert (await http.get("/healthz", headers=BEARER)).status_code == 200
    printed = capsys.readouterr()
    logged = printed.out + printed.err
    assert f'"GET /?token={REDACTED} HTTP/1.1" 200' in logged
    assert f'"GET /api/debates?x=1&token={REDACTED} HTTP/1.1" 200' in logged
    assert TOKEN not in logged


def test_web_command_checks_its_token_and_hosts(capsys: pytest.CaptureFixture[str],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DEBATEBUS_WEB_TOKEN", raising=False)
    assert main(["web", "--broker", "memory://", "--token", "short-one"]) == 2
    monkeypatch.setenv("DEBATEBUS_WEB_TOKEN", "short-two")  # read when --token is not given
    assert main(["web", "--broker", "memory://"]) == 2
    monkeypatch.delenv("DEBATEBUS_WEB_TOKEN")
    assert main(["web", "--broker", "memory://", "--allowed-host", "http://example.com"]) == 2
    err = capsys.readouterr().err
    assert err.count("a token must be at least 16 printable ASCII characters") == 2
    assert "short-one" not in err and "short-two" not in err
    assert "allowed host 'http://example.com' is not a host name or address" in err


# ---- the page in headless Chromium, following a real worker on Redis -----------------------------









TOPIC = 'Tabs <b>or</b> spaces? <img src=x onerror="document.title=\'pwned\'">'
CRITIC_SAYS = "<script>window.pwned = 1</script><b>not bold</b> & still text"


class Holds:
    """Keeps the worker before the first turn of the given rounds until the test lets it go, so
    the page is seen mid-debate whatever the machine's speed."""

    def __init__(self, *rounds: int) -> None:
        self.gates = {number: asyncio.Event() for number in rounds}
        self.reached = {number: asyncio.Event() for number in rounds}  # the worker waits there

    def release(self, number: int) -> None:
        self.gates[number].set()

    async def answer(self, request: LLMRequest) -> Any:
        gate = self.gates.get(request.round)
        if gate is not None and request.speaker == "optimist":
            self.reached[request.round].set()
            await gate.wait()
        await asyncio.sleep(0.4)  # a slow model: turns arrive one by one
        if request.purpose == "judge":
            return {"consensus": request.round >= 3, "summary": f"<i>after</i> round {request.round}",
                    "winner": "critic" if request.round >= 3 else None}
        if request.speaker == "critic":
            return f"critic, round {request.round}: {CRITIC_SAYS}"
        return f"{request.speaker}, round {request.round}: a considered view"


@pytest.mark.slow
@pytest.mark.redis
async def test_page_shows_a_debate_arriving_live_in_chromium(redis_server: Any, tmp_path: Path) -> None:
    if CHROMIUM is None:
        pytest.skip("chromium is not installed (scripts/bootstrap.sh test installs it)")
    url, suffix = redis_server.url, uuid.uuid4().hex[:8]
    event_type, events_topic = f"debate:request{suffix}", f"debate:events{suffix}"
    request_id = f"web-{suffix}"
    holds = Holds(2, 3)
    worker = DebateBus(url, publish_events=True, events_topic=events_topic,
                       transport_options=transport_options(url))
    prices = Prices({"function": Price(input=3.0, cached_input=0.3, cache_write=3.75, output=15.0)})
    worker.subscribe(event_type, make_debate(FunctionLLM(holds.answer), max_rounds=3,
                                             prices=prices).as_handler())
    web = create_app(url, events_topic=events_topic, token=TOKEN)

    async with serving(web) as base, running(worker), BusClient(url) as client, \
            Browser.launch(CHROMIUM, tmp_path / "profile") as browser:
        results = await client.transport.subscribe([completed_topic(event_type)])
        await client.publish(event_type, {"input": TOPIC}, request_id=request_id)
        page = await browser.open(f"{base}/?token={TOKEN}#debate={request_id}")

        round_one = await page.wait_for(lambda s: s.get("turns") == 2 and s["verdicts"] == 1)
        # The worker is held before round 2's first turn, and the page shows round 2's start
        # (events arrive in order): it has everything the worker published, and no more can come.
        await asyncio.wait_for(holds.reached[2].wait(), TIMEOUT)
        await page.wait_for(lambda s: s.get("rounds") == ["Round 1", "Round 2"])
        held = await page.evaluate(PAGE_STATE)
        await page.screenshot(ARTIFACTS / "web-live-debate-round-1.png")
        holds.release(2)
        round_two = await page.wait_for(lambda s: s.get("turns") == 4 and s["verdicts"] == 2)
        holds.release(3)
        final = await page.wait_for(
            lambda s: s.get("finals") == 1 and s["listedStatus"] == "completed" and s["phi"] != "–")
        await page.screenshot(ARTIFACTS / "web-live-debate.png", full_page=True)
        result = msgspec.json.decode((await asyncio.wait_for(anext(results), TIMEOUT)).body)
        errors = page.errors()

    assert (round_one["status"], round_one["finals"], round_one["turnCount"]) == ("running", 0, "2")
    assert (held["turns"], held["finals"]) == (2, 0)
    assert round_two["finals"] == 0
    assert (final["turns"], final["turnCount"]) == (6, "6")
    assert final["speakers"] == ["optimist", "critic"] * 3
    assert final["rounds"] == ["Round 1", "Round 2", "Round 3"]
    assert (final["verdicts"], final["status"]) == (3, "completed")
    assert request_id in final["listed"]

    payload = result["payload"]
    assert (payload["debateStatus"], payload["debateRounds"]) == ("completed", 3)
    assert final["tokens"] == f"{payload['debateTokenUsage']['totalTokens']:,}"
    assert final["cached"] == "0"  # a FunctionLLM reads nothing from a cache
    assert final["cost"] == f"{payload['debateCost']['total']:.4f} USD"
    phi, level = final["phi"].split()
    assert phi == f"{payload['debatePhiHat']:.2f}"
    assert level in ("low", "medium", "high")
    assert final["phiNotes"] == 1
    assert "consensusyes" in final["verdictTexts"][-1]
    assert "<i>after</i> round 3" in final["verdictTexts"][-1]

    # Model output and user input are shown as text, never run or rendered as markup.
    assert final["question"] == TOPIC
    assert all(CRITIC_SAYS in text for text in final["turnTexts"][1::2])
    assert "<i>after</i> round 1" in final["verdictTexts"][0]
    assert final["markup"] == 0
    assert not final["pwned"]
    assert errors == []
