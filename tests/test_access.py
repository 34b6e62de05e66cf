"""The access rules the live page and the metrics server share: loopback, the Host check against
DNS rebinding, the bearer token, and the warning for a bind beyond loopback without one. The
servers themselves are tested in tests/observability (test_web.py, test_metrics_server.py)."""

from __future__ import annotations

import logging
from http import HTTPStatus

import pytest

from debatebus._access import Access, is_loopback, warn_if_exposed
from debatebus.exceptions import ConfigError

TOKEN = "t0ken-for-the-access-tests"


@pytest.mark.parametrize(("host", "loopback"), [
    ("127.0.0.1", True), ("127.8.9.10", True), ("localhost", True), ("LOCALHOST.", True),
    ("::1", True), ("[::1]", True), ("0:0:0:0:0:0:0:1", True),
    ("0.0.0.0", False), ("::", False), ("", False), ("10.0.0.5", False),
    ("localhost.evil.example", False), ("128.0.0.1", False),
])
def test_loopback_is_127_0_0_0_8_ipv6_1_and_localhost(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


@pytest.mark.parametrize(("header", "allowed"), [
    ("127.0.0.1:8000", True), ("localhost", True), ("[::1]:8000", True), ("127.3.2.1", True),
    ("0.0.0.0:8000", True),  # the bind address
    ("debates.example.com", True), ("DEBATES.example.com.:443", True),
    ("a.b.corp.example", True),  # *.corp.example
    ("10.0.0.5:9108", True), ("[fd00::0:1]", True),  # addresses, written either way
    ("evil.example", False), ("corp.example", False), ("example.com", False),
    ("10.0.0.6", False), (None, False), ("", False),
    ("evil.example@localhost", False), ("localhost/x", False), ("[::1", False),
    ("localhost:port", False),
])
def test_only_loopback_the_bind_address_and_allowed_hosts_pass(header: str | None,
                                                               allowed: bool) -> None:
    access = Access.of(None, ["debates.example.com", "*.corp.example", "10.0.0.5", "fd00::1",
                              "0.0.0.0"])
    assert access.host_allowed(header) is allowed


def test_a_star_allows_every_host() -> None:
    assert Access.of(None, ["*"]).host_allowed("anything.example")


@pytest.mark.parametrize("pattern", ["http://example.com", "a/b", "*example.com", "a.*.com", ""])
def test_an_allowed_host_that_is_no_host_says_what_to_give(pattern: str) -> None:
    with pytest.raises(ConfigError, match="is not a host name or address: give one like"):
        Access.of(None, [pattern])


@pytest.mark.parametrize("token", ["short", "has a space in it here", "x" * 15, "ünïcode" * 4])
def test_a_weak_or_unsendable_token_is_refused_with_how_to_make_one(token: str) -> None:
    with pytest.raises(ConfigError, match="token_urlsafe") as info:
        Access.of(token)
    assert token not in str(info.value)


@pytest.mark.parametrize(("authorization", "query", "given"), [
    (f"Bearer {TOKEN}", None, True), (f"bearer {TOKEN}", None, True), (None, TOKEN, True),
    ("Bearer wrong", TOKEN, True), (f"Bearer {TOKEN}", "wrong", True),
    (None, None, False), (f"Basic {TOKEN}", None, False), (TOKEN, None, False),
    (f"Bearer {TOKEN}x", None, False), (None, TOKEN[:-1], False), ("Bearer ", "", False),
    (None, "ünïcode", False),
])
def test_the_token_is_taken_from_the_header_or_the_query(authorization: str | None,
                                                         query: str | None, given: bool) -> None:
    assert Access.of(TOKEN).token_given(authorization, query) is given


def test_without_a_token_any_request_to_an_allowed_host_passes() -> None:
    access = Access.of(None)
    assert access.refusal("localhost", None, None) is None


def test_a_foreign_host_is_refused_before_the_token_is_looked_at() -> None:
    access = Access.of(TOKEN, host_option="--allowed-host")
    refused = access.refusal("evil.example", f"Bearer {TOKEN}", None)
    assert refused is not None and refused.status == HTTPStatus.MISDIRECTED_REQUEST
    assert "--allowed-host" in refused.message
    missing = access.refusal("localhost", None, None)
    assert missing is not None and missing.status == HTTPStatus.UNAUTHORIZED
    assert ("WWW-Authenticate", 'Bearer realm="debatebus"') in missing.headers
    assert TOKEN not in refused.message + missing.message


def test_the_token_is_not_in_the_repr() -> None:
    assert TOKEN not in repr(Access.of(TOKEN))


@pytest.mark.parametrize(("bind", "token", "warns"), [
    ("0.0.0.0", None, True), ("::", None, True), ("", None, True), ("10.0.0.5", None, True),
    ("0.0.0.0", TOKEN, False), ("127.0.0.1", None, False), ("localhost", None, False),
    ("::1", None, False),
])
def test_a_bind_beyond_loopback_without_a_token_warns(caplog: pytest.LogCaptureFixture, bind: str,
                                                      token: str | None, warns: bool) -> None:
    log = logging.getLogger("debatebus.test-access")
    with caplog.at_level(logging.WARNING, log.name):
        warned = warn_if_exposed(log, bind, 8000, token, serves="the test server",
                                 exposes="the secrets of the test", set_token="--test-token")
    assert warned is warns
    assert len(caplog.records) == int(warns)
    if warns:
        line = caplog.records[0].getMessage()
        assert "the test server listens on" in line and "port 8000" in line
        assert "NO TOKEN" in line and "the secrets of the test" in line
        assert "--test-token" in line
