"""``debate.as_handler()``: a debate as a bus handler (``handle(payload, ctx)``, see
``contract``) or, called directly, an async ``handler(payload) -> dict``.

Concurrent calls for one debate id share one run (single flight): the copies wait for it and get
its result marked ``debateReplayed: true``, with or without a checkpoint store.
"""

from __future__ import annotations

import asyncio
import logging
import math
import uuid
from collections.abc import Awaitable, Coroutine, Iterable, Mapping
from typing import TYPE_CHECKING, Any, TypedDict

from debatebus._retention import retention_ms
from debatebus.checkpoints import store_for_broker
from debatebus.checkpoints._base import CheckpointStore
from debatebus.engine._debate import Debate, serve_debates_with
from debatebus.engine._presets import PRESETS
from debatebus.engine._run import OnEvent
from debatebus.engine._subdebates import InProcessChildren
from debatebus.exceptions import ConfigError, InputError
from debatebus.handlers._children import BusChildren
from debatebus.handlers._contract import HandlerContext
from debatebus.handlers._durable import (
    DEFAULT_STORE_OUTAGE_S,
    Drift,
    DurableRunner,
)
from debatebus.handlers._inputs import (
    DEFAULT_MAX_INPUT_BYTES,
    Ask,
    read_debate_id,
    read_depth,
    read_max_rounds,
    read_question,
    read_replay,
)
from debatebus.handlers._people import BusPeople
from debatebus.handlers._results import answer, result_fields
from debatebus.handlers._streaming import DEFAULT_STREAM_INTERVAL_S, TurnStreams, check_interval
from debatebus.schemas.envelope import is_result_topic
from debatebus.schemas.result import HandlerResult

if TYPE_CHECKING:
    from debatebus.engine._result import DebateResult

log = logging.getLogger("debatebus.durable")

Fields = dict[str, Any]


class HandlerOptions(TypedDict, total=False):
    """``DebateHandler``'s keyword arguments, typed, for code that passes them on
    (``debate.as_handler(**options)``), without repeating their defaults (documented on
    ``DebateHandler``)."""

    store: CheckpointStore | None
    durable: bool
    lease_ttl_s: float
    store_outage_s: float
    owner: str | None
    max_input_bytes: int
    presets: Iterable[str]
    drift: Drift
    retention_s: float | None
    input_field: str | None
    stream_turns: bool
    stream_interval_s: float


class _SingleFlight:
    """One run per debate (its store key) at a time; the copies that arrive meanwhile share its
    result.

    A run is registered by ``turn`` and must be ended by ``end``. What a run holds is its ask
    only: the future its copies wait on is made by the first copy (rare), not by every run."""

    def __init__(self) -> None:
        self._running: dict[str, Ask] = {}
        self._waiting: dict[str, asyncio.Future[Fields | None]] = {}

    async def turn(self, ask: Ask) -> Fields | None:
        """Another run's fields for this very input (waited for), or None: ``ask``'s own run
        may start, and is registered."""
        key = ask.key
        while (running := self._running.get(key)) is not None:
            shared = self._waiting.get(key)
            if shared is None:
                shared = self._waiting[key] = asyncio.get_running_loop().create_future()
            # shield: a copy cancelled while waiting must not cancel what the others wait for.
            fields = await asyncio.shield(shared)
            if fields is not None and running.fingerprint == ask.fingerprint:
                return fields
            # That run ended without a result (crash, lost lease, shutdown), or it answered
            # another input (the store, if any, then refuses this one): go our own way.
        self._running[key] = ask
        return None

    def end(self, ask: Ask, fields: Fields | None) -> None:
        """``ask``'s run ended with ``fields`` (None: without a result); its copies get them."""
        key = ask.key
        del self._running[key]
        shared = self._waiting.pop(key, None)
        if shared is not None:
            shared.set_result(fields)


class DebateHandler:
    """Reads ``payload["input"]`` as the question, runs the debate, returns the payload merged with the
    ``debate*`` result fields. Raises ``InputError`` for a malformed payload or a debate id already
    used for another input; never raises for a failed debate (``debateStatus`` says ``"failed"``).

    ``presets`` names the ``debatebus.engine._presets`` a request may pick with ``payload.preset``, each
    built on this debate's default llm; a request naming any other is an InputError.

    A ``BusHandler``: a bus calls ``handle(payload, ctx)``; a direct call ``handler(payload)``
    returns the fields as a dict.

    Durable (the default) with a ``store``; a durable handler without one runs store-less when
    called directly, and ``DebateBus`` gives it a store chosen from the broker URL (Redis → the
    same Redis; ``memory://`` → in memory; Kafka → none, with a warning): see
    ``wants_default_store`` / ``use_default_store``. ``durable=False`` turns checkpoints off.
    ``store_outage_s`` is how long a debate in flight waits for its store to come back;
    ``lease_ttl_s`` is how long a dead worker's debate stays locked; ``owner`` names this worker
    in leases. ``drift="strict"`` refuses to resume a checkpoint written by another definition of
    this debate; ``"loose"`` resumes it by round number. ``retention_s`` is how long this
    handler's checkpoints and results are kept (None: the store's ``retention_s``, 7 days unless
    the store says otherwise; ``math.inf``: forever). ``input_field`` is the payload field that
    holds the question (None: ``input``, or ``debateOutput`` on a result topic, where the handler
    is a hop of a chain and its payloads are another debate's results).

    ``stream_turns=True`` publishes each turn's text while the model writes it, as ``TurnDelta``
    events on the worker's events topic (``DebateBus(publish_events=True)``; without it there is
    nowhere to publish them), once a tick of ``stream_interval_s`` seconds per turn at most: see
    ``debatebus.handlers._streaming``.

    A debate is kept in the store under its id within the event type it was asked on (called
    directly: within the debate's name), so each hop of a chain owns its own debate."""

    def __init__(
        self,
        debate: Debate,
        *,
        store: CheckpointStore | None = None,
        durable: bool = True,
        lease_ttl_s: float = 30.0,
        store_outage_s: float = DEFAULT_STORE_OUTAGE_S,
        owner: str | None = None,
        max_input_bytes: int = DEFAULT_MAX_INPUT_BYTES,
        presets: Iterable[str] = (),
        drift: Drift = "strict",
        retention_s: float | None = None,
        input_field: str | None = None,
        stream_turns: bool = False,
        stream_interval_s: float = DEFAULT_STREAM_INTERVAL_S,
    ) -> None:
        if retention_s is not None:
            retention_ms(retention_s)  # ConfigError now, not at the first debate
        if store is not None and not durable:
            raise ConfigError("durable=False with a store: drop store= for a handler without "
                              "checkpoints, or drop durable=False to use the store")
        if drift not in ("strict", "loose"):
            raise ConfigError(f"unknown drift {drift!r}: use 'strict' or 'loose'")
        if input_field is not None and not (isinstance(input_field, str) and input_field):
            raise ConfigError(f"input_field must name a payload field (e.g. 'debateOutput'), "
                              f"got {input_field!r}")
        for name, value in (("lease_ttl_s", lease_ttl_s), ("store_outage_s", store_outage_s)):
            if not (value > 0 and math.isfinite(value)):  # also rejects NaN
                raise ConfigError(f"{name} must be a positive number of seconds, got {value!r}")
        self.debate = debate
        self.presets = _preset_debates(debate, presets)
        self._preset_runners: dict[str, DurableRunner] = {}
        self.durable = durable
        self.max_input_bytes = max_input_bytes
        self._lease_ttl_s = lease_ttl_s
        self._store_outage_s = store_outage_s
        self._owner = owner
        self._drift = drift
        self._retention_s = retention_s
        self.input_field = input_field
        self.stream_turns = stream_turns
        self.stream_interval_s = check_interval(stream_interval_s)
        self.runner: DurableRunner | None = None
        self._flights = _SingleFlight()
        if store is not None:
            self.runner = self._runner(store)

    def _runner(self, store: CheckpointStore, debate: Debate | None = None) -> DurableRunner:
        return DurableRunner(debate or self.debate, store, owner=self._owner,
                             lease_ttl_s=self._lease_ttl_s,
                             store_outage_s=self._store_outage_s, drift=self._drift,
                             retention_s=self._retention_s)

    @property
    def name(self) -> str:
        return self.debate.name

    @property
    def store(self) -> CheckpointStore | None:
        return self.runner.store if self.runner is not None else None

    @property
    def wants_default_store(self) -> bool:
        """Durable, but given no store: a bus should give it one (``use_default_store``)."""
        return self.durable and self.runner is None

    def use_default_store(self, store: CheckpointStore) -> None:
        """Give a durable handler without a store the bus's default one, before the bus starts."""
        if not self.wants_default_store:
            raise ConfigError(
                "use_default_store() is for a durable handler without a store: this one "
                + ("has a store already" if self.durable else "was made with durable=False")
            )
        self.runner = self._runner(store)

    def ask(self, payload: Mapping[str, Any], request_id: str | None,
            event_type: str | None = None) -> Ask:
        """What ``payload`` asks, validated (InputError says what to fix), on ``event_type``
        (None: called directly).

        On a result topic (a hop of a chain) the payload is the previous hop's result: the
        question is its ``input_field`` (``debateOutput`` unless given), and the request fields it
        echoes (``debateId``, ``maxRounds``, ``preset``, ``depth``, ``replay``) are that hop's,
        not this one's: this hop's debate id is the request id."""
        namespace = event_type if event_type is not None else self.debate.name
        if event_type is not None and is_result_topic(event_type):
            question = read_question(payload, self.max_input_bytes,
                                     self.input_field or "debateOutput")
            return Ask.of(question, None, request_id or uuid.uuid4().hex, "requestId",
                          request_id, namespace)
        question = read_question(payload, self.max_input_bytes, self.input_field or "input")
        chosen = _read_preset(payload, self.presets)
        debate = self.presets[chosen] if chosen is not None else self.debate
        max_rounds = read_max_rounds(payload, debate.spec.max_rounds)
        named = read_debate_id(payload)
        debate_id = named or request_id or uuid.uuid4().hex
        if read_replay(payload) == "rerun":
            debate_id = f"{debate_id}~rerun-{uuid.uuid4().hex[:8]}"
        id_field = "debateId" if named else "requestId"
        return Ask.of(question, max_rounds, debate_id, id_field, request_id, namespace, chosen,
                      read_depth(payload))

    async def __call__(
        self,
        payload: Mapping[str, Any],
        *,
        request_id: str | None = None,
        on_event: OnEvent | None = None,
    ) -> dict[str, Any]:
        """Run (or replay) the debate ``payload`` asks for: the payload merged with its
        ``debate*`` result fields."""
        return (await self._answer(payload, request_id, on_event, None)).fields

    def handle(self, payload: Mapping[str, Any],
               ctx: HandlerContext) -> Coroutine[Any, Any, HandlerResult]:
        """The bus's call: as ``__call__``, with the request id and event sink of ``ctx``, and
        sub-debates published on its transport. (It returns the answer's own coroutine: no frame
        of its own per debate in flight.)"""
        return self._answer(payload, ctx.request_id, ctx.on_event, ctx)

    async def _answer(self, payload: Mapping[str, Any], request_id: str | None,
                      on_event: OnEvent | None, bus: HandlerContext | None) -> HandlerResult:
        ask = self.ask(payload, request_id, bus.delivery.topic if bus is not None else None)
        shared = await self._flights.turn(ask)
        fields = shared
        if fields is None:  # this call runs it: copies arriving meanwhile wait for its fields
            try:
                fields = await self._run(ask, on_event, bus)
            finally:
                self._flights.end(ask, fields)
        # A stored result says so itself (the durable runner marks it); a shared one is marked here.
        return answer(payload, fields, shared=shared is not None)

    def _runner_for(self, ask: Ask) -> DurableRunner | None:
        """The durable runner of the debate ``ask`` picks: the handler's own, or its preset's
        (made on first use, on the same store)."""
        if self.runner is None or ask.preset is None:
            return self.runner
        runner = self._preset_runners.get(ask.preset)
        if runner is None:
            runner = self._runner(self.runner.store, self.presets[ask.preset])
            self._preset_runners[ask.preset] = runner
        return runner

    def _run(self, ask: Ask, on_event: OnEvent | None,
             bus: HandlerContext | None) -> Coroutine[Any, Any, Fields]:
        """The run's coroutine, awaited by ``_answer`` with no frame of this method's in
        between: the durable runner's, or (without a store) the debate's, read into fields."""
        debate = self.presets[ask.preset] if ask.preset is not None else self.debate
        children = _bus_children(debate, bus, on_event)
        people = _bus_people(debate, bus)
        event_types = bus.event_types if bus is not None else None
        streams = self._streams(ask, bus)
        runner = self._runner_for(ask)
        if runner is not None:
            return runner.run(ask, on_event, children, event_types, people, streams)
        return _fields_of(debate.run(
            ask.question, debate_id=ask.debate_id, max_rounds=ask.max_rounds, on_event=on_event,
            request_id=ask.request_id, children=children, depth=ask.depth,
            event_types=event_types, people=people,
            on_text=streams.for_run() if streams is not None else None,
        ))

    def _streams(self, ask: Ask, bus: HandlerContext | None) -> TurnStreams | None:
        """Where the run's turns stream to: None unless asked to, on a bus publishing events."""
        if not self.stream_turns or bus is None or bus.on_delta is None:
            return None
        return TurnStreams(bus.on_delta, ask.debate_id, ask.request_id, depth=ask.depth,
                           interval_s=self.stream_interval_s,
                           redelivered=bus.delivery.deliveries > 1)


async def _fields_of(run: Awaitable[DebateResult]) -> Fields:
    """A store-less run's result fields."""
    return result_fields(await run)


def _bus_children(debate: Debate, bus: HandlerContext | None,
                  on_event: OnEvent | None) -> BusChildren | None:
    """How ``debate``'s sub-debates run when it runs on a bus: event-type domains as requests
    on ``bus``'s transport, the others here. None: no sub-debates, or no bus."""
    if debate.sub_debates is None or bus is None or bus.transport is None or bus.answers is None:
        return None
    return BusChildren(bus.transport, bus.answers, bus.waiting,
                       InProcessChildren(debate, on_event))


def _bus_people(debate: Debate, bus: HandlerContext | None) -> BusPeople | None:
    """How ``debate``'s people are asked when it runs on a bus: turn requests on ``bus``'s
    transport. None: no people, or no bus."""
    if not debate.people or bus is None or bus.transport is None or bus.answers is None:
        return None
    return BusPeople(bus.transport, bus.answers, bus.waiting)


def _preset_debates(debate: Debate, names: Iterable[str]) -> dict[str, Debate]:
    """The presets a request may pick, each on ``debate``'s default llm."""
    if isinstance(names, str):
        raise ConfigError(f"presets= takes preset names, e.g. presets=[{names!r}], not a string")
    chosen = list(names)
    if chosen and debate.llm is None:
        raise ConfigError(f"presets={chosen} are built on the default llm of debate "
                          f"{debate.name!r}, which has none: pass llm=… to its Debate")
    return {name: Debate.from_preset(name, llm=debate.llm) for name in chosen}


def _read_preset(payload: Mapping[str, Any], served: Mapping[str, Debate]) -> str | None:
    """``payload.preset``: None, or a preset this handler serves; InputError says what to send."""
    name = payload.get("preset")
    if name is None:
        return None
    if not isinstance(name, str):
        raise InputError(f"payload.preset must be a preset name (a string), got "
                         f"{type(name).__name__}: send one of {sorted(served)} or no preset")
    if name not in served:
        what = "is not a preset" if name not in PRESETS else "is not served by this worker"
        offer = (f"send one of {sorted(served)}" if served else
                 "this worker serves none (enable them with as_handler(presets=[...]))")
        raise InputError(f"payload.preset {name!r:.60} {what}: {offer}, or drop payload.preset "
                         "to get this handler's own debate")
    return name


def no_default_store_warning(why: str) -> str:
    """The WARNING a worker logs once when its durable handlers get no store; ``why`` says what
    the bus runs on (e.g. "the broker is Kafka")."""
    return (
        f"{why}, so no shared checkpoint store can be guessed and debates on this worker are not "
        "durable: a redelivered or duplicated request re-runs its debate from round 1, and a "
        "replayed one pays for every LLM call again. Fix: give the handler a store shared by all "
        'workers, e.g. debate.as_handler(store=RedisCheckpointStore("redis://host:6379/0")), or '
        'SQLiteCheckpointStore("/var/lib/debatebus/checkpoints.db") when every worker is on one '
        "host; or as_handler(durable=False) to run without checkpoints on purpose"
    )


def attach_default_stores(
    handlers: Iterable[object], broker_url: str | None
) -> CheckpointStore | None:
    """Give each durable DebateHandler in ``handlers`` that has no store the default one for
    ``broker_url`` (None: the bus was built on a Transport object, with no URL to go by); call
    before connecting. Returns the store it made, shared by those handlers, or None; logs
    ``no_default_store_warning`` once when a handler wanted a store and none can be chosen."""
    wanting = {id(h): h for h in handlers if isinstance(h, DebateHandler) and h.wants_default_store}
    if not wanting:
        return None
    store = store_for_broker(broker_url) if broker_url is not None else None
    if store is None:
        log.warning(no_default_store_warning(
            "the broker is Kafka" if broker_url is not None else "the bus was given a transport"))
        return None
    for handler in wanting.values():
        handler.use_default_store(store)
    return store


serve_debates_with(DebateHandler)  # what Debate.as_handler builds (the engine does not import us)
