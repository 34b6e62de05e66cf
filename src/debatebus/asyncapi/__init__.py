"""The AsyncAPI 3.0 document of a debatebus app: ``build_asyncapi(app)``, or ``debatebus asyncapi
module:app`` from a shell. It documents the app's own routes, with message schemas taken from the
wire structs (``debatebus.schemas``)."""

from debatebus.asyncapi._document import ASYNCAPI_VERSION, build_asyncapi
from debatebus.asyncapi._payloads import (
    DeadLetterHeaders,
    RedisDeadLetterEntry,
    RequestPayload,
    ResultPayload,
    schema_components,
)

__all__ = [
    "ASYNCAPI_VERSION",
    "DeadLetterHeaders",
    "RedisDeadLetterEntry",
    "RequestPayload",
    "ResultPayload",
    "build_asyncapi",
    "schema_components",
]
