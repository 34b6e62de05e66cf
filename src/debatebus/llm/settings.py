"""The ``ALLOW_MODEL_REQUESTS`` switch and the paid-provider test it guards.

The flag itself lives in ``debatebus.llm`` (``debatebus.llm.ALLOW_MODEL_REQUESTS``) so that assigning
it there, as a test suite's conftest does, is what every provider reads at call time.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import urlsplit

from debatebus.exceptions import ModelRequestsNotAllowedError

__all__ = [
    "PAID_HOST_SUFFIXES",
    "check_model_requests_allowed",
    "is_loopback_url",
    "is_paid_url",
    "model_requests_allowed",
    "override_allow_model_requests",
]

# Hosts that bill per token. A base_url of None means the SDK's default, which is one of these.
PAID_HOST_SUFFIXES = ("openai.com", "anthropic.com")


def _host(url: str) -> str:
    return (urlsplit(url).hostname or "").lower().rstrip(".")


def is_loopback_url(url: str) -> bool:
    host = _host(url)
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def is_paid_url(url: str | None) -> bool:
    """True for api.openai.com, api.anthropic.com (and their subdomains) and for None."""
    if url is None:
        return True
    if is_loopback_url(url):
        return False
    host = _host(url)
    return any(host == suffix or host.endswith("." + suffix) for suffix in PAID_HOST_SUFFIXES)


def model_requests_allowed() -> bool:
    import debatebus.llm  # the package holds the flag; imported late to read its current value

    return bool(debatebus.llm.ALLOW_MODEL_REQUESTS)


def check_model_requests_allowed(model: str, base_url: str | None) -> None:
    """Raise before any network traffic when a paid provider is called with requests disallowed."""
    if is_paid_url(base_url) and not model_requests_allowed():
        where = _host(base_url) if base_url else "the provider's default endpoint"
        raise ModelRequestsNotAllowedError(
            f"{model}: requests to {where} are blocked because "
            "debatebus.llm.ALLOW_MODEL_REQUESTS is False (tests turn it off so that no test can "
            "reach a paid provider); point base_url at a local server or set it to True"
        )


@contextmanager
def override_allow_model_requests(allow: bool) -> Iterator[None]:
    """Temporarily set ``debatebus.llm.ALLOW_MODEL_REQUESTS``."""
    import debatebus.llm

    previous = debatebus.llm.ALLOW_MODEL_REQUESTS
    debatebus.llm.ALLOW_MODEL_REQUESTS = allow
    try:
        yield
    finally:
        debatebus.llm.ALLOW_MODEL_REQUESTS = previous
