"""Nothing leaks: a run with secrets in the Redis URL and in the model URL, then a grep of every
output and every stored value for them."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.support.processes import ROOT, WorkerProcess, env_for
from tests.support.servers import RedisServer, free_port

pytestmark = [pytest.mark.slow, pytest.mark.redis]

SECRETS = ("S3cretPw", "M0delPw", "K3yK3y")


@pytest.fixture
def secret_redis() -> Iterator[RedisServer]:
    server = RedisServer.start(password=SECRETS[0])
    yield server
    server.stop()


def _cli_start(*args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "debatebus", *args], cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def _output(proc: subprocess.Popen[bytes], timeout: float) -> str:
    """Everything ``proc`` printed (killed after ``timeout`` s), never echoing its arguments."""
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
    return f"(exit {proc.returncode})\n{out.decode(errors='replace')}"


def _cli(*args: str, timeout: float = 90) -> str:
    return _output(_cli_start(*args), timeout)


_READERS = {
    "string": lambda r, k: r.get(k),
    "hash": lambda r, k: r.hgetall(k),
    "list": lambda r, k: r.lrange(k, 0, -1),
    "set": lambda r, k: r.smembers(k),
    "zset": lambda r, k: r.zrange(k, 0, -1, withscores=True),
    "stream": lambda r, k: r.xrange(k),
}


def _stored_values(server: RedisServer) -> Iterator[tuple[str, bytes]]:
    """Every key of the server with a dump of its value, whatever its type."""
    with server.client() as r:
        for key in r.scan_iter(count=1000):
            kind = r.type(key).decode()
            value = _READERS[kind](r, key) if kind in _READERS else kind
            yield key.decode(errors="replace"), repr(value).encode() + key


def _leaks(where: str, text: str | bytes) -> list[str]:
    data = text.encode() if isinstance(text, str) else text
    return [f"{secret} in {where}" for secret in SECRETS if secret.encode() in data]


async def test_no_secret_in_any_output_or_stored_value(
        secret_redis: RedisServer, event_type: str, tmp_path: Path,
        workers: list[WorkerProcess]) -> None:
    url = secret_redis.url
    model = (f"openai:m@http://user:{SECRETS[1]}@127.0.0.1:{free_port()}/v1?api_key={SECRETS[2]}")
    env = env_for(url, event_type, tmp_path, DBB_MODEL=model, DBB_PUBLISH_EVENTS=1)
    worker = WorkerProcess(env, tmp_path / "worker.log")
    workers.append(worker)
    tail = _cli_start("tail", "--count", "3", "--broker", url, "debate:events")
    outputs = {
        "publish --wait": _cli("publish", event_type, "--input", "leak test", "--request-id", "leak",
                               "--wait", "--timeout", "90", "--broker", url, timeout=120),
        "check": _cli("check", "--broker", url, "--group", env["DBB_GROUP"]),
        "check with a mistyped scheme": _cli("check", "--broker", url.replace("redis://", "redis+pub://")),
        "publish with a mistyped scheme": _cli("publish", event_type, "--input", "x",
                                               "--broker", url.replace("redis://", "redis+pub://")),
    }
    outputs["tail debate:events"] = _output(tail, 10)
    assert "leak" in outputs["publish --wait"], f"the request was never answered:\n{outputs}"
    assert "debate_" in outputs["tail debate:events"], "no debate event was published to grep"
    worker.assert_alive("after the request failed against a dead model server")
    leaks = _leaks("the worker log", worker.log.read_bytes())
    for name, text in outputs.items():
        leaks += _leaks(f"`debatebus {name}` output", text)
    for key, value in _stored_values(secret_redis):
        leaks += _leaks(f"Redis key {key!r}", value)
    assert not leaks, "secrets leaked:\n" + "\n".join(leaks)
