"""Every fenced ```python and ```bash block of README.md and docs/*.md runs as written.

The python blocks of one file run in order, in one namespace (a block may use the names an earlier
one defined), in a fresh interpreter whose working directory is a temporary one; top-level
``await`` is allowed. Each bash block runs in ``bash -eu -o pipefail`` with the venv's scripts on
PATH. Both get ``$DEBATEBUS_BROKER`` pointing at a private redis-server, which also replaces every
``redis://localhost:6379`` in the code (and ``redis-cli`` is pointed at it); no API key is passed on
and paid providers stay refused (``ALLOW_MODEL_REQUESTS``).

A block that cannot run as written carries a marker on the line right before its fence:

- ``<!-- docs-test: skip (why) -->``: not run; the reason is required.
- ``<!-- docs-test: setup=NAME (what it provides) -->``: ``PY_SETUPS[NAME]`` runs first in the
  block's namespace (python), or ``BASH_SETUPS[NAME]`` runs around the block (bash).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.servers import RedisServer

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\S*)\s*$")
MARKER = re.compile(r"^<!-- docs-test: (?:skip \((?P<why>[^)]+)\)|setup=(?P<setup>\w+)(?: \([^)]*\))?) -->$")
RUN = ("python", "bash")
TIMEOUT_S = 60

# What a setup gives a python block: names the prose assumes the reader already has.
PY_SETUPS = {
    "llm": """
        from debatebus.testing import FunctionLLM
        llm = FunctionLLM(lambda request: {"consensus": True, "summary": "agreed"}
                          if request.purpose == "judge" else f"{request.speaker}: a view")
    """,
    "bus": """
        from debatebus import Debate, DebateBus, Participant
        from debatebus.testing import FunctionLLM
        llm = FunctionLLM(lambda request: f"{request.speaker}: a view")
        house_debate = Debate("house", [Participant("pro", "For."), Participant("con", "Against.")],
                              llm=llm)
        bus = DebateBus("memory://")
    """,
}

# A worker serving ``debate:request`` with a FunctionLLM, for the shell blocks that talk to one.
WORKER_APP = """
from debatebus import Debate, DebateBus, Judge, Participant
from debatebus.testing import FunctionLLM

llm = FunctionLLM(lambda request: {"consensus": True, "summary": "agreed"}
                  if request.purpose == "judge" else f"{request.speaker}: a view")
debate = Debate("docs", [Participant("optimist", "For."), Participant("critic", "Against.")],
                llm=llm, judge=Judge())
app = DebateBus(group="docs-test")
app.subscribe("debate:request", debate.as_handler())
"""

# Runs the python blocks handed to it on stdin; says on stderr which block it is in.
DRIVER = """
import ast, asyncio, inspect, json, sys
import debatebus.llm
debatebus.llm.ALLOW_MODEL_REQUESTS = False
namespace = {"__name__": "__main__"}
for block in json.load(sys.stdin):
    print(f"docs-test block {block['where']}", file=sys.stderr, flush=True)
    for filename, first_line, source in block["parts"]:
        code = compile("\\n" * (first_line - 1) + source, filename, "exec",
                       flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
        result = eval(code, namespace)
        if inspect.iscoroutine(result):
            asyncio.run(result)
"""


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # of the opening fence
    lang: str
    code: str
    skip: str | None = None
    setup: str | None = None

    @property
    def where(self) -> str:
        return f"{shown(self.path)}:{self.line}"


def shown(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else path.name


def blocks(path: Path) -> list[Block]:
    """The fenced blocks of ``path`` in the languages run here, with their markers."""
    found: list[Block] = []
    lines = path.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if opening is None:
            if lines[i].startswith("<!-- docs-test") and not (
                    i + 1 < len(lines) and FENCE.match(lines[i + 1])):
                raise AssertionError(f"{shown(path)}:{i + 1}: a docs-test marker must "
                                     "be on the line right before a fence")
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == "```")
        marker = MARKER.match(lines[i - 1]) if i and lines[i - 1].startswith("<!--") else None
        if i and lines[i - 1].startswith("<!-- docs-test") and marker is None:
            raise AssertionError(f"{shown(path)}:{i}: cannot read the marker "
                                 f"{lines[i - 1]!r}: use 'skip (why)' or 'setup=NAME'")
        if opening[1] in RUN:
            found.append(Block(path, i + 1, opening[1], "\n".join(lines[i + 1:end]) + "\n",
                               skip=marker["why"] if marker else None,
                               setup=marker["setup"] if marker else None))
        i = end + 1
    return found


def localized(code: str, redis: RedisServer) -> str:
    """The code pointed at the private Redis instead of one on localhost:6379."""
    code = re.sub(r"redis://localhost:6379", f"redis://127.0.0.1:{redis.port}", code)
    return re.sub(r"\bredis-cli ", f"redis-cli -p {redis.port} ", code)


def environment(redis: RedisServer) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.endswith(("_API_KEY", "_TOKEN")) and k != "DEBATEBUS_LLM"}
    env["DEBATEBUS_BROKER"] = redis.url
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = str(ROOT / "src")
    return env


def failure(block: Block, proc: subprocess.CompletedProcess[str]) -> str:
    output = (proc.stdout + proc.stderr)[-4000:]
    return f"{block.where}: the {block.lang} block fails as written:\n{output}"


def run_python(found: list[Block], redis: RedisServer, cwd: Path) -> None:
    todo = [b for b in found if b.lang == "python" and b.skip is None]
    if not todo:
        return
    payload = []
    for block in todo:
        parts = []
        if block.setup is not None:
            assert block.setup in PY_SETUPS, f"{block.where}: no python setup {block.setup!r}"
            parts.append(("tests/test_docs.py", 1, textwrap.dedent(PY_SETUPS[block.setup])))
        parts.append((block.where.rsplit(":", 1)[0], block.line + 1, localized(block.code, redis)))
        payload.append({"where": block.where, "parts": parts})
    proc = subprocess.run([sys.executable, "-c", DRIVER], input=json.dumps(payload), text=True,
                          capture_output=True, cwd=cwd, env=environment(redis), timeout=TIMEOUT_S)
    if proc.returncode != 0:
        started = re.findall(r"docs-test block (\S+)", proc.stderr)
        block = next(b for b in todo if b.where == started[-1])
        pytest.fail(failure(block, proc), pytrace=False)


@contextlib.contextmanager
def docs_worker(redis: RedisServer, cwd: Path) -> Iterator[None]:
    """``debatebus worker`` serving debate:request (group docs-test), beating before it yields."""
    from debatebus.observability._heartbeat import latest_heartbeat

    (cwd / "docs_worker.py").write_text(WORKER_APP, encoding="utf-8")
    log = cwd / "worker.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "debatebus", "worker", "docs_worker:app"],
                                cwd=cwd, env=environment(redis), stdout=out, stderr=out)
    try:
        async def beating() -> None:
            async with asyncio.timeout(30):
                while await latest_heartbeat(redis.url, "docs-test") is None:
                    assert proc.poll() is None, log.read_text()
                    await asyncio.sleep(0.1)

        asyncio.run(beating())
        yield
    finally:
        proc.terminate()
        proc.wait(30)


BASH_SETUPS: dict[str, Callable[[RedisServer, Path], contextlib.AbstractContextManager[None]]] = {
    "worker": docs_worker,
}


def run_bash(block: Block, redis: RedisServer, cwd: Path) -> None:
    around: contextlib.AbstractContextManager[None] = contextlib.nullcontext()
    if block.setup is not None:
        assert block.setup in BASH_SETUPS, f"{block.where}: no bash setup {block.setup!r}"
        around = BASH_SETUPS[block.setup](redis, cwd)
    with around:
        proc = subprocess.run(["bash", "-eu", "-o", "pipefail", "-c", localized(block.code, redis)],
                              text=True, capture_output=True, cwd=cwd, env=environment(redis),
                              timeout=TIMEOUT_S)
    if proc.returncode != 0:
        pytest.fail(failure(block, proc), pytrace=False)


@pytest.fixture(scope="module")
def docs_redis() -> Iterator[RedisServer]:
    """A Redis of the docs' own: the blocks use fixed ids (r-1) and the default group."""
    server = RedisServer.start(appendonly=False)
    yield server
    server.stop()


def test_every_file_with_blocks_is_checked() -> None:
    assert ROOT / "README.md" in DOCS
    assert sum(len(blocks(path)) for path in DOCS) >= 10


@pytest.mark.redis
@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_blocks_run_as_written(path: Path, docs_redis: RedisServer, tmp_path: Path) -> None:
    found = blocks(path)
    run_python(found, docs_redis, tmp_path)
    for block in found:
        if block.lang == "bash" and block.skip is None:
            run_bash(block, docs_redis, tmp_path)


def test_the_runner_reports_the_failing_block_with_its_file_and_line(
        docs_redis: RedisServer, tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("# Page\n\n```python\nx = 1\n```\n\n```python\nassert x == 2, 'x is 1'\n```\n"
                    "\n<!-- docs-test: skip (not a real command) -->\n```bash\nfalse\n```\n")
    found = blocks(page)
    assert [(b.line, b.skip) for b in found] == [(3, None), (7, None),
                                                 (12, "not a real command")]
    with pytest.raises(pytest.fail.Exception) as failed:
        run_python(found, docs_redis, tmp_path)
    message = str(failed.value)
    assert message.startswith("page.md:7: the python block fails as written")
    assert "x is 1" in message and 'line 8' in message


def test_a_marker_without_a_reason_or_a_fence_is_refused(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("<!-- docs-test: skip -->\n```bash\ntrue\n```\n")
    with pytest.raises(AssertionError, match="cannot read the marker"):
        blocks(page)
    page.write_text("<!-- docs-test: skip (why) -->\n\n```bash\ntrue\n```\n")
    with pytest.raises(AssertionError, match="right before a fence"):
        blocks(page)
