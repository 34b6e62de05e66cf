"""``debatebus fork DEBATE_ID --from-round K --app module:app``: a new debate from a stored
debate's first K committed rounds, with changes (docs/forks.md).

The app is the one the workers serve (``debatebus worker module:app``): its handler of ``--type``
gives the debate's definition, and its store (else ``--store``, else the broker's default store)
the parent. The fork runs here, on the models this process can reach, and is stored next to its
parent, so a worker replays it like any other debate of that event type.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from debatebus._worker import DebateBus
from debatebus.checkpoints import store_for_broker, store_from_url
from debatebus.checkpoints._base import CheckpointStore
from debatebus.cli._bus_cmds import load_app
from debatebus.cli._common import positive_int
from debatebus.engine._definition import Participant
from debatebus.exceptions import ConfigError
from debatebus.handlers._forks import changed, fork
from debatebus.handlers._handler import DebateHandler
from debatebus.llm._registry import resolve_llm


def _round(value: str) -> int:
    try:
        number = int(value.strip())
    except ValueError:
        number = -1
    if number < 0:
        raise argparse.ArgumentTypeError(f"must be a round number ≥ 0, not {value!r}")
    return number


def add_parser(sub: Any) -> None:
    parser = sub.add_parser(
        "fork", help="start a new debate from a stored debate's first rounds, with changes",
        description="Run a new debate that starts from the first K committed rounds of a stored "
        "debate (its result, or the checkpoint of one still running or failed), with other "
        "models, participants, judge model or round cap. Rounds 1..K cost no call.")
    parser.add_argument("debate_id", help="the debate to fork (its debate id)")
    parser.add_argument("--from-round", type=_round, required=True, metavar="K",
                        help="keep its framing and rounds 1..K (0: the framing only)")
    parser.add_argument("--app", required=True, metavar="MODULE:ATTR",
                        help="the DebateBus the workers serve (as for debatebus worker)")
    parser.add_argument("--type", default="debate:request",
                        help="the event type the debate was asked on; the fork is kept there too")
    parser.add_argument("--store", help="checkpoint store URL (default: the handler's store, else "
                                        "the app broker's default store)")
    parser.add_argument("--id", dest="fork_id", metavar="ID",
                        help="the fork's debate id (default DEBATE_ID~fork-XXXXXXXX); the same "
                             "id again resumes or replays that fork")
    parser.add_argument("--model", action="append", metavar="NAME=MODEL",
                        help="run participant NAME on MODEL (a model string, as for debatebus "
                             "run --llm); repeatable")
    parser.add_argument("--judge-model", metavar="MODEL", help="run the judge on MODEL")
    parser.add_argument("--drop", action="append", metavar="NAME",
                        help="leave participant NAME out from round K+1 on; repeatable")
    parser.add_argument("--add", action="append", metavar="NAME=PERSONA",
                        help="add participant NAME with this system prompt, on the debate's "
                             "default model unless --model NAME=… ; repeatable")
    parser.add_argument("--rounds", type=positive_int, metavar="N", help="the fork's round cap")
    parser.add_argument("--json", action="store_true", help="print the result document only")
    parser.set_defaults(func=run)


def _pairs(values: Sequence[str], option: str, what: str) -> dict[str, str]:
    pairs = {}
    for value in values:
        name, sep, rest = value.partition("=")
        if not sep or not name.strip() or not rest.strip():
            raise ConfigError(f"{option} takes NAME={what}, got {value!r}")
        pairs[name.strip()] = rest.strip()
    return pairs


def _handler(app: DebateBus, event_type: str) -> DebateHandler:
    handler = app.handlers().get(event_type)
    if not isinstance(handler, DebateHandler):
        served = sorted(t for t, h in app.handlers().items() if isinstance(h, DebateHandler))
        raise ConfigError(f"the app serves no debate on {event_type!r}: pass --type, one of "
                          f"{served}")
    return handler


def _store(args: argparse.Namespace, app: DebateBus, handler: DebateHandler) -> CheckpointStore:
    if args.store:
        return store_from_url(args.store)
    store = handler.store or store_for_broker(app.broker_url)
    if store is None:
        raise ConfigError("no checkpoint store to read the debate from: pass --store URL")
    return store


async def run(args: argparse.Namespace) -> int:
    """Exit code: 0 when the fork completed, 1 when it failed."""
    app = load_app(args.app)
    handler = _handler(app, args.type)
    models = {name: resolve_llm(spec) for name, spec in
              _pairs(args.model or [], "--model", "MODEL").items()}
    added = [Participant(name, persona) for name, persona in
             _pairs(args.add or [], "--add", "PERSONA").items()]
    debate = changed(handler.debate, models=models, add=added, drop=args.drop or [],
                     judge_llm=resolve_llm(args.judge_model) if args.judge_model else None,
                     max_rounds=args.rounds)
    async with _store(args, app, handler) as store:
        fields = await fork(debate, store, args.debate_id, from_round=args.from_round,
                            namespace=args.type, debate_id=args.fork_id)
    if args.json:
        print(json.dumps(fields, indent=2, ensure_ascii=False))
    else:
        _summary(fields, args.from_round)
    return 0 if fields.get("debateStatus") == "completed" else 1


def _summary(fields: dict[str, Any], from_round: int) -> None:
    out = sys.stdout
    origin = fields.get("debateForkOf") or {}
    out.write(f"fork {fields['debateId']} of {origin.get('debateId')} from round {from_round}: "
              f"{fields['debateStatus']}, {fields['debateRounds']} rounds\n")
    for rnd in fields.get("debateTranscript") or []:
        if rnd["number"] > from_round:
            for turn in rnd["turns"]:
                said = turn["error"] if turn["failed"] else turn["text"]
                out.write(f"  round {rnd['number']} {turn['speaker']}: {said}\n")
    if fields.get("debateError"):
        out.write(f"error: {fields['debateError']}\n")
    out.write(f"output: {fields.get('debateOutput', '')}\n"
              f"tokens (the fork's own): {fields['debateTokenUsage']['totalTokens']}\n")
