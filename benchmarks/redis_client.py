"""Why debatebus owns its Redis client: its command batcher against redis-py and valkey-glide on
one workload, side by side in one run.

    python benchmarks/redis_client.py [--tasks 1000] [--rounds 50] [--repeat 5] [--together]

``--tasks`` concurrent tasks each do ``--rounds`` rounds of ``XADD`` (one 100-byte field, to a
stream of its own) then ``HSET`` (the same bytes, to a hash of its own). By default each command is
its own call, awaited before the next; ``--together`` sends each round's two commands as one call
(the batcher's ``submit`` of two commands, a glide ``Batch``, a redis-py pipeline per round). The
clients:

* **debatebus batcher**: ``CommandBatcher`` built as the Redis transports build it
  (``build_client`` + ``make_batcher``): everything submitted in one loop tick is one pipeline on
  the batcher's own connection, replies parsed by hiredis as they arrive.
* **redis-py tick pipeline**: the same idea on redis-py's public API: one
  ``pipeline(transaction=False)`` per loop tick, shared by every task that sent in that tick
  (``TickPipeline`` below).
* **valkey-glide**: its asyncio ``GlideClient``, which multiplexes every task's calls onto one
  connection and pipelines them itself (its Rust core runs in threads of this process).
* **redis-py asyncio, one call per command**: the reference: each task awaits each command, on a
  connection of the pool's (as many connections as tasks: none waits for one; ``--together``:
  a ``pipeline(transaction=False)`` per round).

Each client is warmed up first (one round per task, so pools open their connections), then runs
are timed alternately, ``--repeat`` times, the order rotating each time; the database is flushed
between runs (untimed), and every run checks that all its entries are in the streams. Printed per
client: commands/s (wall clock) and µs of client CPU per command (``time.process_time`` of this
process, every thread included; redis-server runs in its own process), as medians with the range.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import importlib.util
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, Protocol

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PAYLOAD = b"x" * 100
FIELD = b"envelope"
Command = tuple[Any, ...]


def stream_key(task: int) -> bytes:
    return b"bench:stream:%d" % task


def hash_key(task: int) -> bytes:
    return b"bench:hash:%d" % task


def xadd(task: int) -> Command:
    return ("XADD", stream_key(task), "*", FIELD, PAYLOAD)


def hset(task: int) -> Command:
    return ("HSET", hash_key(task), FIELD, PAYLOAD)


class Client(Protocol):
    """One client under test: ``round`` sends one task's XADD and HSET and waits for both."""

    name: str

    async def open(self, url: str, port: int, tasks: int) -> None: ...

    async def round(self, task: int) -> None: ...

    async def close(self) -> None: ...


# ---- the debatebus batcher ----------------------------------------------------------------------


class Batcher:
    name = "debatebus batcher"

    def __init__(self, together: bool) -> None:
        self.together = together

    async def open(self, url: str, port: int, tasks: int) -> None:
        from debatebus._redis import build_client, make_batcher

        self.client = build_client(url, connect_timeout=5.0)
        self.batcher = make_batcher(self.client, "benchmark", timeout=30.0)
        self.batcher.start()

    async def round(self, task: int) -> None:
        if self.together:
            await self.batcher.submit((xadd(task), hset(task)))
        else:
            await self.batcher.submit((xadd(task),))
            await self.batcher.submit((hset(task),))

    async def close(self) -> None:
        await self.batcher.stop()
        await self.client.aclose()


# ---- redis-py, one pipeline per loop tick -------------------------------------------------------


class TickPipeline:
    """redis-py's ``pipeline(transaction=False)``, one per event-loop tick, shared by every task
    that sends in that tick: what the batcher does, on redis-py's public API. Each pipeline is
    executed by a task of its own (``execute`` is a coroutine) on a connection of the pool's."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self._queue: list[tuple[Sequence[Command], asyncio.Future[list[Any]]]] = []
        self._scheduled = False
        self._running: set[asyncio.Task[None]] = set()

    def submit(self, commands: Sequence[Command]) -> asyncio.Future[list[Any]]:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[list[Any]] = loop.create_future()
        self._queue.append((commands, future))
        if not self._scheduled:
            self._scheduled = True
            loop.call_soon(self._flush)
        return future

    def _flush(self) -> None:
        self._scheduled = False
        batch, self._queue = self._queue, []
        task = asyncio.create_task(self._send(batch))
        self._running.add(task)
        task.add_done_callback(self._running.discard)

    async def _send(self, batch: list[tuple[Sequence[Command], asyncio.Future[list[Any]]]]) -> None:
        pipe = self._client.pipeline(transaction=False)
        for commands, _ in batch:
            for command in commands:
                pipe.execute_command(*command)
        try:
            replies = await pipe.execute(raise_on_error=False)
        except Exception as e:  # the whole pipeline failed: every caller hears
            for _, future in batch:
                if not future.done():
                    future.set_exception(e)
            return
        start = 0
        for commands, future in batch:
            mine = replies[start:start + len(commands)]
            start += len(commands)
            failed = next((r for r in mine if isinstance(r, Exception)), None)
            if future.done():
                continue
            if failed is not None:
                future.set_exception(failed)
            else:
                future.set_result(mine)


class RedisPyTick:
    name = "redis-py, pipeline per tick"

    def __init__(self, together: bool) -> None:
        self.together = together

    async def open(self, url: str, port: int, tasks: int) -> None:
        from redis.asyncio import Redis

        self.client = Redis.from_url(url)
        self.tick = TickPipeline(self.client)

    async def round(self, task: int) -> None:
        if self.together:
            await self.tick.submit((xadd(task), hset(task)))
        else:
            await self.tick.submit((xadd(task),))
            await self.tick.submit((hset(task),))

    async def close(self) -> None:
        await self.client.aclose()


# ---- redis-py, one call per command -------------------------------------------------------------


class RedisPyPlain:
    name = "redis-py, call per command"

    def __init__(self, together: bool) -> None:
        self.together = together

    async def open(self, url: str, port: int, tasks: int) -> None:
        from redis.asyncio import Redis

        # redis-py's pool refuses more than 100 connections by default: one for every task.
        self.client = Redis.from_url(url, max_connections=max(100, tasks))

    async def round(self, task: int) -> None:
        if self.together:
            async with self.client.pipeline(transaction=False) as pipe:
                pipe.xadd(stream_key(task), {FIELD: PAYLOAD})
                pipe.hset(hash_key(task), FIELD, PAYLOAD)
                await pipe.execute()
        else:
            await self.client.xadd(stream_key(task), {FIELD: PAYLOAD})
            await self.client.hset(hash_key(task), FIELD, PAYLOAD)

    async def close(self) -> None:
        await self.client.aclose()


# ---- valkey-glide -------------------------------------------------------------------------------


class Glide:
    name = "valkey-glide"

    def __init__(self, together: bool) -> None:
        self.together = together

    async def open(self, url: str, port: int, tasks: int) -> None:
        from glide import GlideClient, GlideClientConfiguration, NodeAddress

        # Glide refuses calls beyond its in-flight limit (1,000 by default): room for every task.
        config = GlideClientConfiguration([NodeAddress("127.0.0.1", port)],
                                          inflight_requests_limit=max(1000, 2 * tasks))
        self.client = await GlideClient.create(config)

    async def round(self, task: int) -> None:
        if self.together:
            from glide import Batch

            batch = Batch(is_atomic=False)
            batch.xadd(stream_key(task), [(FIELD, PAYLOAD)])
            batch.hset(hash_key(task), {FIELD: PAYLOAD})
            await self.client.exec(batch, raise_on_error=True)
        else:
            await self.client.xadd(stream_key(task), [(FIELD, PAYLOAD)])
            await self.client.hset(hash_key(task), {FIELD: PAYLOAD})

    async def close(self) -> None:
        await self.client.close()


#: Each client and the packages it needs (import names), in the order they are first run.
CLIENTS: list[tuple[Callable[[bool], Client], tuple[str, ...]]] = [
    (Batcher, ("redis", "hiredis")),
    (RedisPyTick, ("redis",)),
    (Glide, ("glide",)),
    (RedisPyPlain, ("redis",)),
]
INSTALL = {"redis": "debatebus[redis]", "hiredis": "debatebus[redis]", "glide": "debatebus[bench]"}


# ---- measuring ----------------------------------------------------------------------------------


@dataclass
class Figures:
    per_s: list[float] = field(default_factory=list)
    cpu_us: list[float] = field(default_factory=list)


def spread(values: list[float], fmt: str, width: int) -> str:
    """The median (right-aligned in ``width``) and, in brackets, the range."""
    median = format(statistics.median(values), fmt)
    return f"{median:>{width}} [{format(min(values), fmt)}–{format(max(values), fmt)}]"


async def run_tasks(client: Client, tasks: int, rounds: int) -> None:
    async def one(task: int) -> None:
        for _ in range(rounds):
            await client.round(task)

    await asyncio.gather(*(one(task) for task in range(tasks)))


def check_entries(server: Any, tasks: int, rounds: int, name: str) -> None:
    """Every XADD landed: the streams hold ``tasks × rounds`` entries (flushed before each run)."""
    with server.client() as sync:
        pipe = sync.pipeline(transaction=False)
        for task in range(tasks):
            pipe.xlen(stream_key(task))
        total = sum(pipe.execute())
    if total != tasks * rounds:
        raise RuntimeError(f"{name}: {total} stream entries, expected {tasks * rounds}")


async def measure(clients: list[Client], server: Any, url: str, args: argparse.Namespace
                  ) -> dict[str, Figures]:
    figures = {client.name: Figures() for client in clients}
    commands = 2 * args.tasks * args.rounds
    opened: list[Client] = []
    try:
        for client in clients:
            await client.open(url, server.port, args.tasks)
            opened.append(client)
            await run_tasks(client, args.tasks, 1)  # warm-up: connections opened, code paths hot
        for repeat in range(args.repeat):
            shift = repeat % len(clients)
            for client in clients[shift:] + clients[:shift]:
                with server.client() as sync:
                    sync.flushall()
                gc.collect()
                cpu0, t0 = time.process_time(), time.perf_counter()
                await run_tasks(client, args.tasks, args.rounds)
                elapsed, cpu = time.perf_counter() - t0, time.process_time() - cpu0
                check_entries(server, args.tasks, args.rounds, client.name)
                figures[client.name].per_s.append(commands / elapsed)
                figures[client.name].cpu_us.append(1e6 * cpu / commands)
                print(f"  run {repeat + 1}: {client.name:<28} {commands / elapsed:>9,.0f} commands/s"
                      f"  {1e6 * cpu / commands:6.1f} µs CPU/command", flush=True)
    finally:
        for client in opened:
            with contextlib.suppress(Exception):
                await client.close()
    return figures


def available(together: bool) -> list[Client]:
    clients = []
    for make, needs in CLIENTS:
        client = make(together)  # nothing is imported until open()
        missing = [module for module in needs if importlib.util.find_spec(module) is None]
        if missing:
            extras = sorted({INSTALL[module] for module in missing})
            print(f"{client.name}: skipped, {', '.join(missing)} not installed "
                  f"(pip install {' '.join(repr(e) for e in extras)})")
            continue
        clients.append(client)
    return clients


def versions() -> str:
    out = []
    for dist in ("redis", "hiredis", "valkey-glide"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            out.append(f"{dist} {metadata.version(dist)}")
    server = subprocess.run(["redis-server", "--version"], capture_output=True, text=True,
                            check=False).stdout.split()
    out += [f"redis-server {word[2:]}" for word in server if word.startswith("v=")]
    return ", ".join(out)


def load() -> str:
    return ", ".join(f"{x:.2f}" for x in os.getloadavg())


def runner(use_uvloop: bool) -> tuple[str, Callable[[Coroutine[Any, Any, Any]], Any]]:
    if use_uvloop:
        try:
            import uvloop
        except ImportError:
            pass
        else:
            return f"uvloop {metadata.version('uvloop')}", uvloop.run
    return "asyncio (default loop)", asyncio.run


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=1000, help="concurrent tasks")
    parser.add_argument("--rounds", type=int, default=50, help="XADD + HSET rounds per task")
    parser.add_argument("--repeat", type=int, default=5, help="timed runs per client, alternating")
    parser.add_argument("--together", action="store_true",
                        help="send each round's two commands as one call")
    parser.add_argument("--no-uvloop", action="store_true", help="use the default asyncio loop")
    args = parser.parse_args()
    if args.tasks < 1 or args.rounds < 1 or args.repeat < 1:
        parser.error("--tasks, --rounds and --repeat must be at least 1")
    if importlib.util.find_spec("redis") is None:
        print("redis-py is not installed: the benchmark's server helper and every client but "
              "glide need it (pip install 'debatebus[redis]')")
        return 1
    from tests.support.servers import RedisServer

    clients = available(args.together)
    if not clients:
        return 1
    loop_name, run = runner(not args.no_uvloop)
    shape = "both in one call" if args.together else "one call per command, awaited in turn"
    print(f"python {sys.version.split()[0]}, event loop: {loop_name}, {os.cpu_count()} CPUs, "
          f"load average {load()}\n{versions()}\n"
          f"{args.tasks} tasks × {args.rounds} rounds of XADD + HSET ({shape}), "
          f"timed runs per client: {args.repeat}")
    server = RedisServer.start(appendonly=False)
    try:
        figures = run(measure(clients, server, f"redis://127.0.0.1:{server.port}/0", args))
    finally:
        server.stop()
    print(f"\nmedian [range] of the runs; load average after {load()}")
    for name, fig in figures.items():
        print(f"{name:<28} {spread(fig.per_s, ',.0f', 7):<24} commands/s   "
              f"{spread(fig.cpu_us, '.1f', 5):<18} µs client CPU/command")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
