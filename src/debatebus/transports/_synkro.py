"""Synkro's wire dialect (``redis+pubsub://``): a debatebus worker as one member of a Synkro fleet.

What a Synkro handler instance does around each message, and so what this dialect does:

* **Claim.** A message whose ``synkro:dedupe:handler:<requestId>:<eventType>`` key holds ``1``
  was answered already; one whose ``synkro:lock:handler:<requestId>:<eventType>`` key another
  instance set (``SET … 1 EX <lockTtl> NX``) is being answered: both are left alone. A claimed
  message counts ``INCR synkro:metrics:<eventType>:received`` (not on ``workflow:`` channels).
  All of it runs as one script, so a Synkro instance and debatebus workers on one channel
  answer each request once.
* **Settle.** After the result is published: ``SET`` the dedupe key (``EX <dedupTtl>``),
  ``INCR …:completed`` or ``…:failed``, on failure ``LPUSH synkro:dlq:<eventType>`` the item
  ``{eventType, requestId, payload, errors, failedAt, attempts}`` (when the dead-letter queue is
  on; never for ``workflow:`` channels), then ``DEL`` the lock. A delivery released unsettled
  (a broker error, shutdown, requeue) deletes its lock, so it can be claimed again.
* **Results.** A handler that returns is completed, even when its debate failed: Synkro's debate
  handler returns ``debateStatus: "failed"`` and ``debateOutput: "LLM call failed: …"`` on
  ``event:<type>:completed``. ``debateSynthesis`` is left out when there is none, and the output
  of a debate without a synthesis is the last round's texts joined by a blank line. Bad input
  fails on ``event:<type>:failed`` as ``{"requestId", "payload": <the original payload, whatever
  its type>, "errors": [{"message", "name"}]}``; debatebus's envelope metadata stays beside them.
* **Events** each get their own requestId, ``<requestId>:<seq>``, with the event under
  ``payload``: Synkro's subscriber drops a second message of one requestId on a channel.

**Redis Cluster.** Synkro's key names are its protocol and carry no hash tag, so a request's lock,
dedupe key and counter live in different slots and no script may touch them together. There the
claim is single-key steps, in an order that keeps it exclusive: ``SET lock NX`` first; then
``GET dedupe``, and if it holds ``1`` the lock is deleted again and the message left alone; then the
``received`` count. Settling runs in steps too, each sent once the one before has been answered:
the result's ``PUBLISH``; the dedupe key, counters and dead-letter item; the lock's ``DEL``. So
whoever takes the lock after it is deleted finds the dedupe key set, as on one node. What is lost
is only the count's atomicity with the claim (a crash between the steps leaves the count one
short), and each claim and settle costs two or three round trips instead of one.

The lock, dedupe and metrics TTLs are Synkro's ``retention`` options (``lockTtl``, ``dedupTtl``,
``metricsTtl``), with Synkro's defaults: ``SynkroSettings``, a transport option of
``redis+pubsub://`` (``transport_options={"synkro": SynkroSettings(lock_ttl_s=900)}``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Final, Literal

import msgspec

from debatebus._loops import retrieved
from debatebus.exceptions import ConfigError, TransportError
from debatebus.schemas.envelope import ENVELOPE_ENCODER, Envelope, failed_topic, now_iso
from debatebus.schemas.result import HandlerResult
from debatebus.transports._dialect import WireDialect

if TYPE_CHECKING:  # the redis modules too: a worker importing step_channel needs no redis client
    from debatebus._redis import Batcher, Command
    from debatebus.transports._base import Delivery, Outgoing

#: Synkro's defaults for ``retention.lockTtl`` and ``retention.dedupTtl`` (seconds).
DEFAULT_LOCK_TTL_S: Final = 300
DEFAULT_DEDUPE_TTL_S: Final = 86400
#: What ``errors[].name`` says of a request refused as bad input.
_INPUT_ERROR: Final = "InputError"
#: Failure fields that do not apply to the whole payload a Synkro failure carries: the
#: settler's note of a truncated echo, and a synthesis there is none of (Synkro leaves it out).
_NOT_ON_A_FULL_ECHO: Final = frozenset({"debatePayloadTruncated", "debateSynthesis"})

Counter = Literal["received", "completed", "failed"]


@dataclass(frozen=True, slots=True)
class SynkroSettings:
    """Synkro's ``retention`` options and its ``deadLetterQueue`` switch (on here: debatebus
    keeps what failed). ``metrics_ttl_s`` None: counters never expire (Synkro's default)."""

    lock_ttl_s: int = DEFAULT_LOCK_TTL_S
    dedupe_ttl_s: int = DEFAULT_DEDUPE_TTL_S
    metrics_ttl_s: int | None = None
    dead_letter_queue: bool = True

    def __post_init__(self) -> None:
        for name in ("lock_ttl_s", "dedupe_ttl_s", "metrics_ttl_s"):
            value = getattr(self, name)
            if value is None and name == "metrics_ttl_s":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"SynkroSettings.{name} must be a whole number of seconds ≥ 1, "
                                  f"got {value!r}")


#: Synkro's own defaults: what ``redis+pubsub://`` speaks unless told otherwise.
SYNKRO_DEFAULTS: Final = SynkroSettings()


def step_channel(workflow: str, step: str) -> str:
    """The channel Synkro's orchestrator publishes a workflow step on; its completion comes back
    on ``event:<channel>:completed`` / ``…:failed``."""
    if not workflow or not step:
        raise ConfigError("a Synkro workflow step needs a workflow name and a step type")
    return f"workflow:{workflow}:{step}"


def lock_key(request_id: str, event_type: str) -> str:
    return f"synkro:lock:handler:{request_id}:{event_type}"


def dedupe_key(request_id: str, event_type: str) -> str:
    return f"synkro:dedupe:handler:{request_id}:{event_type}"


def metrics_key(event_type: str, counter: Counter) -> str:
    return f"synkro:metrics:{event_type}:{counter}"


def dlq_key(event_type: str) -> str:
    return f"synkro:dlq:{event_type}"


def tracks_metrics(event_type: str) -> bool:
    """Synkro counts metrics (and keeps dead letters) for events, not for workflow steps."""
    return not event_type.startswith("workflow:")


# KEYS: dedupe, lock[, received counter]. ARGV: lock TTL, counter TTL ('' for none).
# Returns 1 when claimed, 0 when answered already, -1 when another member holds the lock.
_CLAIM: Final = """
if redis.call('GET', KEYS[1]) == '1' then return 0 end
if not redis.call('SET', KEYS[2], '1', 'EX', ARGV[1], 'NX') then return -1 end
if KEYS[3] then
  redis.call('INCR', KEYS[3])
  if ARGV[2] ~= '' then redis.call('EXPIRE', KEYS[3], ARGV[2]) end
end
return 1
"""
_DECODER: Final = msgspec.json.Decoder(float_hook=float)


@dataclass(frozen=True, slots=True)
class _Claim:
    delivery: Delivery  # held, so its id() is not reused while the claim lives
    request_id: str


class SynkroDialect(WireDialect):
    """Synkro's rules (see the module docstring), on the Redis behind ``batcher``: a callable
    giving the transport's batcher (raising ``TransportError`` when not connected). ``cluster``:
    the claim and settle in single-key steps (a Redis Cluster)."""

    name = "synkro"

    def __init__(self, settings: SynkroSettings, batcher: Callable[[], Batcher], *,
                 cluster: bool = False) -> None:
        # Here, not at the top: importing step_channel or SynkroSettings needs no redis client.
        from debatebus._redis import Script

        self.settings = settings
        self._batcher = batcher
        self._cluster = cluster
        self._claim_script = Script(_CLAIM)
        self._claims: dict[int, _Claim] = {}

    async def claim(self, delivery: Delivery, request_id: str) -> bool:
        topic = delivery.topic
        keys = [dedupe_key(request_id, topic), lock_key(request_id, topic)]
        if tracks_metrics(topic):
            keys.append(metrics_key(topic, "received"))
        ttl = self.settings.metrics_ttl_s
        if self._cluster:
            taken = await self._claim_in_steps(keys, "" if ttl is None else ttl)
        else:
            taken = await self._claim_script.run(self._batcher(), keys,
                                                 [self.settings.lock_ttl_s, "" if ttl is None else ttl])
        if taken == 1:
            self._claims[id(delivery)] = _Claim(delivery, request_id)
        return bool(taken == 1)

    async def _claim_in_steps(self, keys: list[str], ttl: int | str) -> int:
        """``_CLAIM``'s answer, one key at a time (a cluster): lock first, then the dedupe check."""
        batcher = self._batcher()
        (locked,) = await batcher.submit((("SET", keys[1], "1", "EX", self.settings.lock_ttl_s,
                                           "NX"),))
        if locked is None:
            return -1
        try:
            (answered,) = await batcher.submit((("GET", keys[0]),))
            if answered != b"1" and len(keys) > 2:
                count: list[Command] = [("INCR", keys[2])]
                await batcher.submit(count + ([("EXPIRE", keys[2], ttl)] if ttl != "" else []))
        except BaseException:
            # Not claimed after all: let the lock go (should that fail too, it expires).
            with contextlib.suppress(TransportError):
                batcher.enqueue((("DEL", keys[1]),)).add_done_callback(retrieved)
            raise
        if answered == b"1":
            await batcher.submit((("DEL", keys[1]),))
            return 0
        return 1

    def settle_commands(self, delivery: Delivery, results: Sequence[Outgoing]) -> list[Command]:
        """What Redis must do after ``results`` are published, for a claimed ``delivery`` (none
        for one not claimed); ``settled`` forgets the claim once they ran."""
        claim = self._claims.get(id(delivery))
        if claim is None:
            return []
        topic, settings = delivery.topic, self.settings
        failure = next((r for r in results if r.topic == failed_topic(topic)), None)
        commands: list[Command] = [
            ("SET", dedupe_key(claim.request_id, topic), "1", "EX", settings.dedupe_ttl_s)]
        if tracks_metrics(topic):
            counter = metrics_key(topic, "failed" if failure else "completed")
            commands.append(("INCR", counter))
            if settings.metrics_ttl_s is not None:
                commands.append(("EXPIRE", counter, settings.metrics_ttl_s))
            if failure is not None and settings.dead_letter_queue:
                commands.append(("LPUSH", dlq_key(topic), _dlq_item(delivery, failure)))
        commands.append(("DEL", lock_key(claim.request_id, topic)))
        return commands

    def settle_steps(self, delivery: Delivery, results: Sequence[Outgoing],
                     publishes: list[Command]) -> list[list[Command]]:
        """What ``ack`` sends, ``publishes`` (the results) first, as steps each sent once the one
        before is answered: one pipeline on one node (it keeps the order), else (a cluster) the
        publishes, then the dedupe key and counters, then the lock's ``DEL``."""
        settle = self.settle_commands(delivery, results)
        if not self._cluster:
            return [publishes + settle]
        return [publishes, settle[:-1], settle[-1:]] if settle else [publishes]

    def settled(self, delivery: Delivery) -> None:
        self._claims.pop(id(delivery), None)

    def let_go(self, delivery: Delivery) -> None:
        """Delete the lock of a claimed ``delivery`` that is released unsettled (in the
        background: a release never waits or raises). Should the delete fail, the lock expires
        after ``lock_ttl_s``."""
        claim = self._claims.pop(id(delivery), None)
        if claim is None:
            return
        with contextlib.suppress(TransportError):
            done = self._batcher().enqueue((("DEL", lock_key(claim.request_id, delivery.topic)),))
            done.add_done_callback(retrieved)

    def answered(self, result: HandlerResult) -> HandlerResult:
        """Completed, whatever the debate's status, with Synkro's output and synthesis rules."""
        fields = dict(result.fields)
        if "debateSynthesis" in fields and fields["debateSynthesis"] is None:
            del fields["debateSynthesis"]
        error = fields.get("debateError")
        if result.status == "failed" and isinstance(error, str) and error:
            fields["debateOutput"] = f"LLM call failed: {error}"
        elif result.status == "completed" and "debateSynthesis" not in fields:
            texts = _last_round_texts(fields.get("debateTranscript"))
            if texts is not None:
                fields["debateOutput"] = "\n\n".join(texts)
        return replace(result, status="completed", fields=fields)

    def result_body(self, request_body: bytes, envelope: Envelope, failed: bool) -> bytes:
        """A failure is Synkro's ``{requestId, payload, errors}``: the payload as sent, whatever
        its type; an object keeps its keys untouched and gets the failure fields it lacks
        (``debateError``, ``debateStatus``…) beside them, as extras Synkro ignores."""
        if not failed:
            return ENVELOPE_ENCODER.encode(envelope)
        error = envelope.payload.get("debateError")
        document: dict[str, Any] = {"requestId": envelope.request_id}
        present, payload = _original_payload(request_body)
        if isinstance(payload, dict):
            payload = {**payload, **{k: v for k, v in envelope.payload.items()
                                     if k not in payload and k not in _NOT_ON_A_FULL_ECHO}}
        if present:
            document["payload"] = payload
        document["errors"] = [{"message": error if isinstance(error, str) else "request failed",
                               "name": _INPUT_ERROR}]
        metadata = msgspec.to_builtins(msgspec.structs.replace(envelope, payload={}))
        for name in ("requestId", "payload"):
            metadata.pop(name, None)
        return ENVELOPE_ENCODER.encode({**document, **metadata})

    def event_body(self, request_id: str, seq: int, event: bytes) -> bytes:
        own_id = ENVELOPE_ENCODER.encode(f"{request_id}:{seq}")
        return b'{"requestId":' + own_id + b',"payload":' + event + b"}"


def _original_payload(body: bytes) -> tuple[bool, Any]:
    """The request's ``payload`` as sent, whatever its type, and whether it was there at all."""
    try:
        data = _DECODER.decode(body)
    except (msgspec.DecodeError, RecursionError):
        return False, None
    if not isinstance(data, dict) or "payload" not in data:
        return False, None
    return True, data["payload"]


def _dlq_item(delivery: Delivery, failure: Outgoing) -> bytes:
    """Synkro's dead-letter item for ``delivery``, failed with the event ``failure`` (whose own
    body gives the request id and the errors): the payload is the request's, exactly as sent."""
    event = _DECODER.decode(failure.body)
    item: dict[str, Any] = {"eventType": delivery.topic, "requestId": event["requestId"]}
    present, payload = _original_payload(delivery.body)
    if present:
        item["payload"] = payload
    item.update(errors=event["errors"], failedAt=now_iso(), attempts=delivery.deliveries)
    return ENVELOPE_ENCODER.encode(item)


def _last_round_texts(transcript: Any) -> list[str] | None:
    """The texts of the last round's turns that did not fail, from ``debateTranscript``; None
    when there is no round to read."""
    if not isinstance(transcript, list) or not transcript or not isinstance(transcript[-1], dict):
        return None
    turns = transcript[-1].get("turns")
    if not isinstance(turns, list):
        return None
    return [t["text"] for t in turns
            if isinstance(t, dict) and not t.get("failed") and isinstance(t.get("text"), str)]
