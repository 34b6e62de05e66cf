"""The one set of redaction rules: key shapes, name = value pairs, URL passwords and secret query
parameters, explicit secrets; and the pre-screen that lets most text through untouched."""

from __future__ import annotations

import pytest

from debatebus._redaction import REDACTED, redact, url_secrets


@pytest.mark.parametrize(("url", "shown"), [
    ("redis://:hunter2hunter2@redis:6379/0", "redis://:***@redis:6379/0"),
    ("rediss+pubsub://default:pw@h:6380/1", "rediss+pubsub://default:***@h:6380/1"),
    ("redis://:p@ss@host/0", "redis://:***@host/0"),  # an unencoded "@" in the password
    ("http://user:pw@127.0.0.1:8080/v1?api_key=K3Y&model=x",
     "http://user:***@127.0.0.1:8080/v1?api_key=***&model=x"),
    ("https://h/v1?token=abc&access_token=def&password=ghi&secret=jkl&key=mno&Signature=pq",
     "https://h/v1?token=***&access_token=***&password=***&secret=***&key=***&Signature=***"),
    ("https://h/cb#access_token=abc&state=1", "https://h/cb#access_token=***&state=1"),
    ("kafka://user:pw@b1:9092,b2:9092", "kafka://user:***@b1:9092,b2:9092"),
])
def test_urls_lose_passwords_and_secret_query_values(url: str, shown: str) -> None:
    assert redact(f"unsupported broker URL {url!r}: use redis://") == (
        f"unsupported broker URL {shown!r}: use redis://")


@pytest.mark.parametrize("text", [
    "http://localhost:8080/v1?model=gpt&limit=3",
    "redis://localhost:6379/0",
    "redis://user@host:6379/0",
    "see https://example.com/a@b for the docs",
])
def test_urls_without_secrets_are_unchanged(text: str) -> None:
    assert redact(text) == text


@pytest.mark.parametrize("key", [
    "sk-abcdef",  # six characters after sk-: the shorter of the two old rules won
    "sk-proj-abcdefghijklmnop",
    "sk-ant-api03-XYZxyz123456",
])
def test_key_shapes(key: str) -> None:
    clean = redact(f"key {key} end")
    assert key not in clean
    assert clean.startswith("key sk-") and REDACTED in clean and clean.endswith(" end")


def test_bearer_tokens_and_name_value_pairs() -> None:
    clean = redact('Authorization: Bearer tok_1234567890, {"api_key": "abc123def456"}')
    assert "tok_1234567890" not in clean and "abc123def456" not in clean
    assert clean.count(REDACTED) == 2


def test_explicit_secrets_are_masked_even_without_clues() -> None:
    assert redact("custom my-own-secret-value", ["my-own-secret-value", None, "ab"]) == (
        f"custom {REDACTED}")


def test_ordinary_text_is_returned_as_is() -> None:
    for text in ("use sk-learn for the key idea: a password-free design", "bearer of bad news",
                 "no clues here at all", "max_tokens=100 token: 5"):
        assert redact(text) == text


def test_url_secrets_lists_what_a_library_may_print_apart_from_the_url() -> None:
    url = "http://user:p%40ssw0rd@h/v1?api_key=KEYVALUE&model=gpt&token=abc"
    assert url_secrets(url) == ["p%40ssw0rd", "p@ssw0rd", "KEYVALUE"]  # "abc" is too short
    assert url_secrets("http://h/v1") == []
    assert url_secrets(None) == []
    assert url_secrets("http://[::1/v1") == []  # unparseable: the URL rule still applies



def test_token_query_values_are_masked_in_urls_and_by_value_in_paths() -> None:
    token = "live-page-token-0123456789"
    assert redact(f"open http://0.0.0.0:8000/api/debates/d/stream?token={token}&x=1") == (
        "open http://0.0.0.0:8000/api/debates/d/stream?token=***&x=1")
    # A server's access line holds the path alone: its token is masked as an explicit secret.
    assert redact(f'"GET /?token={token} HTTP/1.1" 200', [token]) == (
        f'"GET /?token={REDACTED} HTTP/1.1" 200')


def test_an_ellipsis_is_a_placeholder_not_a_value() -> None:
    hint = "set OPENAI_API_KEY or pass api_key=... or api_key=… here"
    assert redact(hint) == hint
    for text in ("api_key=...abcdef123", "api_key=....", "password: ...x", "api_key=...)"):
        assert redact(text).endswith(REDACTED), text
