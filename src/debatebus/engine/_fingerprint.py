"""A stable hash of what a debate *is*, recorded in checkpoints to detect drift on resume.

It covers the name, participants (names, system prompts, utilities, model names; a person's event
type), roles, string prompts, protocol, PROTOCOL_VERSION, round cap and minimum, window, word
limits and the judge schema. Callables (``until``, callable prompts) count by qualified name only:
their bodies can't be hashed stably.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from debatebus.engine._definition import DebateSpec, Judge, Participant
from debatebus.engine._prompts import PROTOCOL_VERSION
from debatebus.llm._base import model_name


def _callable_name(fn: Any) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', type(fn).__name__)}"


def _role(spec: DebateSpec, role: Participant | None) -> Any:
    if role is None:
        return None
    utility = [role.utility.maximizes, role.utility.penalizes] if role.utility else None
    person = spec.people.get(role.name)
    model = person.model if person is not None else model_name(spec.llm_for(role))
    return [role.name, role.system_prompt, model, utility]


def _judge(spec: DebateSpec, judge: Judge | None) -> Any:
    if judge is None:
        return None
    schema = judge.schema
    fields = sorted((n, repr(f.annotation)) for n, f in schema.model_fields.items())
    return [
        judge.name,
        judge.system_prompt,
        model_name(spec.llm_for(judge)),
        schema.__name__,
        fields,
    ]


def _prompts(spec: DebateSpec) -> dict[str, str]:
    out = {}
    for name in (
        "opening",
        "rebuttal",
        "judge",
        "synthesis",
        "framing",
        "audience",
        "position",
        "revision",
    ):
        template = spec.templates.get(name)
        out[name] = template if isinstance(template, str) else _callable_name(template)
    return out


def definition_hash(spec: DebateSpec) -> str:
    document = {
        "name": spec.name,
        "protocolVersion": PROTOCOL_VERSION,
        "protocol": spec.protocol,
        "participants": [_role(spec, p) for p in spec.participants],
        "moderator": _role(spec, spec.moderator),
        "synthesizer": _role(spec, spec.synthesizer),
        "judge": _judge(spec, spec.judge),
        "prompts": _prompts(spec),
        "maxRounds": spec.max_rounds,
        "window": spec.transcript_window,
        "wordLimits": dict(sorted(spec.limits.items())),
        "audience": spec.audience,
        "until": _callable_name(spec.until) if spec.until else None,
        "failurePolicy": spec.failure_policy,
    }
    if spec.min_rounds != 1:  # absent at the default: the hashes of debates without it stand
        document["minRounds"] = spec.min_rounds
    encoded = json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(encoded.encode()).hexdigest()[:16]
