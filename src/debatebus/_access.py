"""Who may read what debatebus serves over HTTP (the live page, a worker's ``/metrics``): the one
home of these rules, which ``web/`` and ``observability/metrics`` apply.

- A bearer token, when one is set: ``Authorization: Bearer <token>`` or a ``?token=<token>``
  query (for a browser's address bar and ``EventSource``), compared in constant time. Without
  it, 401.
- The ``Host`` header, against DNS rebinding (a page on an attacker's domain that re-resolves
  the name to a loopback or private address, so the browser reads this server as that domain):
  only loopback names and addresses, the bind address and the hosts the operator allows are
  answered. Any other, or none, gets 421.
- A WARNING at start when a server binds beyond loopback with no token, saying what anyone who
  can reach the port reads and how to set a token.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Final
from urllib.parse import urlsplit

from debatebus.exceptions import ConfigError

#: The query parameter that may carry the token where a header cannot (EventSource, a link).
TOKEN_QUERY: Final = "token"
#: Shorter tokens are refused: they are guessable, and too short for redaction to mask.
MIN_TOKEN_CHARS: Final = 16
_TOKEN_SHAPE: Final = re.compile(r"[\x21-\x7e]+")  # printable ASCII, no spaces: fits a header
_LOOPBACK_NAMES: Final = frozenset({"localhost"})
_MAKE_TOKEN: Final = "python -c 'import secrets; print(secrets.token_urlsafe(32))'"


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or an address, IPv6 with or without brackets) is this machine
    only: ``localhost``, 127.0.0.0/8 or ::1."""
    name = host.strip().strip("[]").rstrip(".").lower()
    if name in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def _host_name(header: str) -> str | None:
    """The name in a ``Host`` header (lower case, without port or brackets, an IP address in its
    canonical form); None if it is not one (a path, user info, a bad port)."""
    try:
        parts = urlsplit(f"//{header}")
        parts.port  # noqa: B018 - raises ValueError on a port that is not a number in range
    except ValueError:
        return None
    if parts.netloc != header or parts.username is not None or not parts.hostname:
        return None
    return _canonical(parts.hostname.rstrip("."))


def _canonical(name: str) -> str:
    try:
        return str(ipaddress.ip_address(name))
    except ValueError:
        return name


def _allowed_name(pattern: str) -> str | None:
    """An allowed host as given by the operator: a name or address, with or without a port, an
    IPv6 address with or without brackets."""
    try:
        return str(ipaddress.ip_address(pattern.strip("[]")))
    except ValueError:
        return _host_name(pattern)


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a request is not answered: the status, a plain-text body and extra headers."""

    status: HTTPStatus
    message: str
    headers: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class Access:
    """The token and the ``Host`` names one server accepts. Build it with ``Access.of``."""

    token: bytes | None = field(repr=False)  # never in a repr, a log line or an error
    hosts: frozenset[str]
    suffixes: tuple[str, ...]
    any_host: bool
    host_option: str

    @classmethod
    def of(cls, token: str | None, allowed_hosts: Iterable[str] = (), *,
           host_option: str = "allowed_hosts") -> Access:
        """Access with ``token`` (None: none needed) for requests sent to loopback or to one of
        ``allowed_hosts`` (names or addresses, the bind address among them; ``*.example.com``
        for a domain's subdomains; ``*`` for any). ``host_option`` names the setting a refused
        request is told about."""
        if token is not None and not (len(token) >= MIN_TOKEN_CHARS
                                      and _TOKEN_SHAPE.fullmatch(token)):
            raise ConfigError(f"a token must be at least {MIN_TOKEN_CHARS} printable ASCII "
                              f"characters without spaces; make one with {_MAKE_TOKEN}")
        hosts: set[str] = set()
        suffixes: list[str] = []
        any_host = False
        for pattern in allowed_hosts:
            if pattern == "*":
                any_host = True
                continue
            wildcard = pattern.startswith("*.")
            name = _allowed_name(pattern[2:] if wildcard else pattern)
            if name is None or "*" in name:
                raise ConfigError(f"allowed host {pattern!r} is not a host name or address: give "
                                  "one like example.com, 10.0.0.5, [::1], *.example.com or *")
            if wildcard:
                suffixes.append(f".{name}")
            else:
                hosts.add(name)
        return cls(token.encode() if token is not None else None, frozenset(hosts),
                   tuple(suffixes), any_host, host_option)

    def host_allowed(self, header: str | None) -> bool:
        if self.any_host:
            return True
        name = _host_name(header) if header else None
        if name is None:
            return False
        return name in self.hosts or is_loopback(name) or name.endswith(self.suffixes)

    def token_given(self, authorization: str | None, query_token: str | None) -> bool:
        """Whether the request carries the token, in its header or its query (True if no token
        is set)."""
        if self.token is None:
            return True
        scheme, _, credentials = (authorization or "").partition(" ")
        offered = [credentials.strip()] if scheme.lower() == "bearer" else []
        if query_token is not None:
            offered.append(query_token)
        # Every offer is compared, so the time taken does not say which one came close.
        matched = [hmac.compare_digest(value.encode(), self.token) for value in offered]
        return any(matched)

    def refusal(self, host: str | None, authorization: str | None,
                query_token: str | None) -> Refusal | None:
        """None if the request may be answered, else how to refuse it."""
        if not self.host_allowed(host):
            return Refusal(HTTPStatus.MISDIRECTED_REQUEST,
                           "this server does not answer for the Host this request was sent to; "
                           f"its operator can allow that name ({self.host_option})\n")
        if not self.token_given(authorization, query_token):
            return Refusal(HTTPStatus.UNAUTHORIZED,
                           "a token is required: send 'Authorization: Bearer <token>' or add "
                           f"?{TOKEN_QUERY}=<token> to the URL\n",
                           (("WWW-Authenticate", 'Bearer realm="debatebus"'),))
        return None


def warn_if_exposed(log: logging.Logger, bind: str, port: int, token: str | None, *,
                    serves: str, exposes: str, set_token: str) -> bool:
    """Log a WARNING when ``bind`` reaches beyond loopback and no token is set; True if it did.
    ``serves`` names the server, ``exposes`` what anyone who can reach it reads, ``set_token``
    how to set a token."""
    if token is not None or is_loopback(bind):
        return False
    log.warning("%s listens on %s port %d, beyond loopback, with NO TOKEN: anyone who can reach "
                "that port reads %s. Set a token (%s) or bind 127.0.0.1.",
                serves, bind or "every interface", port, exposes, set_token)
    return True
