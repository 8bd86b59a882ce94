"""A loopback HTTP provider for the benchmarks: answers every POST after a fixed delay.

It stands in for a provider's "post a message" endpoint: HTTP/1.1 with keep-alive, a JSON
request body, a small JSON answer (`{"ok": true, "id": N}`) written `--delay-ms` after the
request's last byte arrived. It runs in a process of its own, so that the harness can read its
CPU time from /proc beside the executor's and the server's, and tell when it, not the system
under test, is the limit.

Standard library only (asyncio protocols, no framework): the peers' benchmarks import it from
their own virtualenv too. It parses only what the benchmarks' clients send (a request line,
headers, a `Content-Length` body; no chunked bodies, no pipelining beyond answering in order).

    python bench/loopback_http.py serve --delay-ms 5          # prints `listening <port>`
    python bench/loopback_http.py load --delay-ms 5 --connections 100,500,1500
    python bench/loopback_http.py client --delay-ms 5 --concurrency 500 --requests 40000

`serve` prints one JSON line when it gets SIGTERM or SIGINT (requests answered, connections,
the most requests waiting at once, how late the answers went out). `load` starts a server and
loads it from a small load generator (asyncio protocols too, one keep-alive connection per
request in flight) for `--seconds`: what the server carries alone. `client` posts with aiohttp
from one process and no queue, as the benchmarks' handlers do: the ceiling of one process.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import time
from collections import deque
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

HERE = Path(__file__).resolve()

# A core's share above which the loopback server counts as the limit of a run: its one event
# loop then answers late (its timers wait for the loop) and so holds every client's request
# longer than the provider's latency.
SATURATED_CORE_SHARE = 0.85
# How much the server lowers its nice value (`serve --priority`, OUTBOX_BENCH_LOOPBACK_PRIORITY
# for the harnesses). 0 by default, the same priority as everything else: a higher one kept the
# answers on time when the system under test kept both cores busy, but its wake-ups preempted
# the executor, and cost it 8-24 % of its rate in three pairs (docs/benchmarks.md).
DEFAULT_PRIORITY = 0
PRIORITY_ENV = "OUTBOX_BENCH_LOOPBACK_PRIORITY"


# ---------------------------------------------------------------------------
# CPU time from /proc
# ---------------------------------------------------------------------------

TICKS = os.sysconf("SC_CLK_TCK")


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU time of the process `pid` (all its threads), from /proc/<pid>/stat."""
    text = Path(f"/proc/{pid}/stat").read_text()
    fields = text[text.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def named_processes_cpu_seconds(name: str) -> float:
    """CPU time of every running process called `name` (e.g. `postgres`), from /proc."""
    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        if text[text.index("(") + 1 : text.rindex(")")] != name:
            continue
        fields = text[text.rindex(")") + 2 :].split()
        total += int(fields[11]) + int(fields[12])
    return total / TICKS


# ---------------------------------------------------------------------------
# The server
# ---------------------------------------------------------------------------


class Stats:
    """What the server counts (one event loop: no locks)."""

    def __init__(self) -> None:
        self.requests = 0
        self.connections = 0
        self.waiting = 0
        self.max_waiting = 0
        self.late_total = 0.0
        self.late_max = 0.0
        self.late_samples: list[float] = []

    def report(self, delay: float) -> dict[str, Any]:
        late = sorted(self.late_samples)
        p99 = late[min(len(late) - 1, int(0.99 * len(late)))] if late else 0.0
        return {
            "requests": self.requests,
            "connections": self.connections,
            "max_waiting": self.max_waiting,
            "delay_ms": round(delay * 1000, 3),
            "late_mean_ms": round(self.late_total / max(1, self.requests) * 1000, 3),
            "late_p99_ms": round(p99 * 1000, 3),
            "late_max_ms": round(self.late_max * 1000, 3),
        }


class Answers:
    """Every waiting answer of the server, in the order they fall due. The delay is the same for
    every request, so the order they arrived in is the order they fall due: one deque and one
    timer for the server, instead of a timer per request."""

    def __init__(self, loop: asyncio.AbstractEventLoop, delay: float, stats: Stats) -> None:
        self.loop = loop
        self.delay = delay
        self.stats = stats
        self.waiting: deque[tuple[float, ProviderProtocol]] = deque()
        self.timer: asyncio.TimerHandle | None = None

    def add(self, protocol: ProviderProtocol) -> None:
        due = self.loop.time() + self.delay
        self.waiting.append((due, protocol))
        stats = self.stats
        stats.waiting += 1
        if stats.waiting > stats.max_waiting:
            stats.max_waiting = stats.waiting
        if self.timer is None:
            self.timer = self.loop.call_at(due, self.fire)

    def fire(self) -> None:
        """Write every answer that is due (the loop runs a timer up to a clock resolution
        early), then wait for the next one."""
        self.timer = None
        now = self.loop.time()
        horizon = now + self.loop._clock_resolution  # type: ignore[attr-defined]
        waiting = self.waiting
        stats = self.stats
        while waiting and waiting[0][0] <= horizon:
            due, protocol = waiting.popleft()
            stats.waiting -= 1
            if protocol.transport is None:
                continue
            stats.requests += 1
            late = now - due
            stats.late_total += late
            if late > stats.late_max:
                stats.late_max = late
            if stats.requests % 16 == 0:
                stats.late_samples.append(late)
            body = b'{"ok":true,"id":%d}' % stats.requests
            protocol.transport.write(RESPONSE_HEAD % len(body) + body)
        if waiting:
            self.timer = self.loop.call_at(waiting[0][0], self.fire)


class ProviderProtocol(asyncio.Protocol):
    """One keep-alive connection: each request is answered `delay` seconds after its body is
    complete (so in the order they arrived)."""

    def __init__(self, answers: Answers, stats: Stats) -> None:
        self.answers = answers
        self.stats = stats
        self.buffer = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.stats.connections += 1

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None

    def data_received(self, data: bytes) -> None:
        buffer = self.buffer + data if self.buffer else data
        while True:
            head_end = buffer.find(b"\r\n\r\n")
            if head_end < 0:
                break
            end = head_end + 4 + content_length(buffer[:head_end])
            if len(buffer) < end:
                break
            buffer = buffer[end:]
            self.answers.add(self)
        self.buffer = buffer


RESPONSE_HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: keep-alive\r\n"
    b"Content-Length: %d\r\n\r\n"
)


def content_length(head: bytes) -> int:
    """The `Content-Length` of a request head (0 when there is none)."""
    at = head.find(b"ontent-Length:")
    if at < 0:
        at = head.lower().find(b"content-length:")
        if at < 0:
            return 0
        at += 1
    start = at + len(b"ontent-Length:")
    end = head.find(b"\r\n", start)
    return int(head[start : end if end >= 0 else len(head)])


async def serve(host: str, port: int, delay: float, priority: int) -> None:
    if priority:
        # The server stands in for a provider on machines of its own: a higher priority keeps
        # its answers on time when the system under test keeps both cores busy (see
        # DEFAULT_PRIORITY for what it costs that system).
        with contextlib.suppress(PermissionError):
            os.nice(-priority)
    loop = asyncio.get_running_loop()
    stats = Stats()
    answers = Answers(loop, delay, stats)
    server = await loop.create_server(
        lambda: ProviderProtocol(answers, stats), host, port, backlog=4096, reuse_address=True
    )
    bound = server.sockets[0].getsockname()[1]
    print(f"listening {bound}", flush=True)
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await stop.wait()
    server.close()
    report = stats.report(delay)
    report["cpu_s"] = round(process_cpu_seconds(os.getpid()), 3)
    print(json.dumps(report), flush=True)


# ---------------------------------------------------------------------------
# Starting and reading the server from a harness
# ---------------------------------------------------------------------------


class LoopbackServer:
    """The server in a child process: `url` to post to, `cpu_seconds()` read from /proc, and
    its own counts when it stops.

        with LoopbackServer(delay_ms=5) as server:
            ...  # clients post to server.url
        server.report  # requests, connections, max_waiting, lateness, cpu_s
    """

    def __init__(
        self, delay_ms: float, python: str = sys.executable, priority: int | None = None
    ) -> None:
        self.delay_ms = delay_ms
        self.python = python
        self.priority = (
            int(os.environ.get(PRIORITY_ENV, DEFAULT_PRIORITY)) if priority is None else priority
        )
        self.process: subprocess.Popen[str] | None = None
        self.url = ""
        self.report: dict[str, Any] = {}

    def __enter__(self) -> LoopbackServer:
        self.process = subprocess.Popen(
            [
                *(self.python, str(HERE), "serve", "--delay-ms", str(self.delay_ms)),
                *("--priority", str(self.priority)),
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.process.stdout is not None
        ready, _, _ = select.select([self.process.stdout], [], [], 30)
        line = self.process.stdout.readline().split() if ready else []
        if len(line) != 2 or line[0] != "listening":
            self.process.kill()
            raise RuntimeError("the loopback HTTP server did not start")
        self.url = f"http://127.0.0.1:{line[1]}/post"
        return self

    def cpu_seconds(self) -> float:
        assert self.process is not None
        return process_cpu_seconds(self.process.pid)

    def __exit__(self, *exc: object) -> None:
        if self.process is None:
            return
        self.process.terminate()
        out, _ = self.process.communicate(timeout=30)
        lines = out.strip().splitlines()
        self.report = json.loads(lines[-1]) if lines else {}


def server_figures(
    report: dict[str, Any], cpu_s: float, seconds: float, actions: int
) -> dict[str, Any]:
    """The loopback server's part of a run's result: its CPU over the timed window (seconds and
    share of one core), per request, and whether it was the limit."""
    share = cpu_s / seconds if seconds > 0 else 0.0
    return {
        **report,
        "window_cpu_s": round(cpu_s, 3),
        "core_share": round(share, 3),
        "cpu_us_per_request": round(cpu_s / actions * 1e6, 1) if actions else None,
        "saturated": share >= SATURATED_CORE_SHARE,
    }


# ---------------------------------------------------------------------------
# A load generator: what the server carries alone
# ---------------------------------------------------------------------------

REQUEST = (
    b"POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    b"Content-Length: %d\r\n\r\n%s"
)


class LoadProtocol(asyncio.Protocol):
    """One keep-alive connection that posts again as soon as an answer is complete."""

    def __init__(self, request: bytes, counter: list[int]) -> None:
        self.request = request
        self.counter = counter
        self.deadline = 0.0
        self.buffer = b""
        self.transport: asyncio.Transport | None = None
        self.closed = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def start(self, deadline: float) -> None:
        assert self.transport is not None
        self.deadline = deadline
        self.transport.write(self.request)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        head_end = self.buffer.find(b"\r\n\r\n")
        if head_end < 0:
            return
        end = head_end + 4 + content_length(self.buffer[:head_end])
        if len(self.buffer) < end:
            return
        self.buffer = self.buffer[end:]
        self.counter[0] += 1
        assert self.transport is not None
        if time.monotonic() < self.deadline:
            self.transport.write(self.request)
        else:
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(None)


async def load(url: str, connections: int, seconds: float) -> dict[str, Any]:
    parts = urlsplit(url)
    body = json.dumps({"channel": "C1", "text": "hello"}).encode()
    request = REQUEST % (parts.path.encode(), len(body), body)
    loop = asyncio.get_running_loop()
    counter = [0]
    protocols = []
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    for _ in range(connections):
        _, protocol = await loop.create_connection(
            lambda: LoadProtocol(request, counter), host, port
        )
        protocols.append(protocol)
    started = time.monotonic()
    for protocol in protocols:
        protocol.start(started + seconds)
    await asyncio.gather(*(p.closed for p in protocols))
    elapsed = time.monotonic() - started
    return {
        "connections": connections,
        "seconds": round(elapsed, 3),
        "requests": counter[0],
        "rate_per_s": round(counter[0] / elapsed),
    }


def measure_alone(delay_ms: float, connections: int, seconds: float) -> dict[str, Any]:
    """Start a server, load it from this process for `seconds`, report both sides."""
    with LoopbackServer(delay_ms) as server:
        before = server.cpu_seconds()
        client_before = time.process_time()
        result = asyncio.run(load(server.url, connections, seconds))
        client_cpu = time.process_time() - client_before
        server_cpu = server.cpu_seconds() - before
    return {
        "bench": "loopback_alone",
        **result,
        "load_generator_cpu_s": round(client_cpu, 3),
        "server": server_figures(server.report, server_cpu, result["seconds"], result["requests"]),
    }


# ---------------------------------------------------------------------------
# The client alone: what one process carries with aiohttp and no queue
# ---------------------------------------------------------------------------


async def post_all(url: str, concurrency: int, requests: int) -> None:
    """`requests` posts of the benchmarks' body, `concurrency` at a time, by as many tasks
    looping over one aiohttp session (pool: `concurrency` connections), as the queues'
    handlers post (bench/harness.py BenchHttp, bench/peers/pgqueuer_bench.py)."""
    import aiohttp

    left = requests

    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=concurrency),
        timeout=aiohttp.ClientTimeout(total=30.0),
    ) as session:

        async def poster() -> None:
            nonlocal left
            while left > 0:
                left -= 1
                body = {"channel": f"mlane{left % 10_000}", "text": f"message {left}"}
                async with session.post(url, json=body) as response:
                    await response.read()
                    if not 200 <= response.status < 300:
                        raise RuntimeError(f"HTTP {response.status}")

        await asyncio.gather(*(poster() for _ in range(concurrency)))


def client_alone(delay_ms: float, concurrency: int, requests: int) -> dict[str, Any]:
    """The ceiling of one process: the same posts with no queue, timed, with its CPU and the
    server's."""
    with LoopbackServer(delay_ms) as server:
        before = server.cpu_seconds()
        client_before = time.process_time()
        started = time.perf_counter()
        asyncio.run(post_all(server.url, concurrency, requests))
        seconds = time.perf_counter() - started
        client_cpu = time.process_time() - client_before
        server_cpu = server.cpu_seconds() - before
    return {
        "bench": "client_alone",
        "client": "aiohttp",
        "concurrency": concurrency,
        "actions": requests,
        "seconds": round(seconds, 3),
        "rate_per_s": round(requests / seconds),
        "worker_cpu_us_per_action": round(client_cpu / requests * 1e6, 1),
        "worker_core_share": round(client_cpu / seconds, 3),
        "http": {
            "latency_ms": delay_ms,
            "loopback": server_figures(server.report, server_cpu, seconds, requests),
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("mode", choices=["serve", "load", "client"])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--delay-ms", type=float, default=5.0)
    parser.add_argument(
        "--priority",
        type=int,
        default=DEFAULT_PRIORITY,
        help="serve: lower the server's nice value by this much (needs the right; 0: leave it)",
    )
    parser.add_argument("--connections", default="100,500,1500", help="load: one run each")
    parser.add_argument("--seconds", type=float, default=5.0, help="load: each run's length")
    parser.add_argument("--concurrency", type=int, default=100, help="client: posts in flight")
    parser.add_argument("--requests", type=int, default=20_000, help="client: posts in all")
    args = parser.parse_args()
    if args.mode == "serve":
        asyncio.run(serve(args.host, args.port, args.delay_ms / 1000, args.priority))
        return
    if args.mode == "client":
        print(json.dumps(client_alone(args.delay_ms, args.concurrency, args.requests)), flush=True)
        return
    for connections in (int(n) for n in args.connections.split(",")):
        print(json.dumps(measure_alone(args.delay_ms, connections, args.seconds)), flush=True)


if __name__ == "__main__":
    main()
