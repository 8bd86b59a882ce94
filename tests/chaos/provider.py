"""The chaos run's provider: an HTTP server on loopback, in a process of its own that the run
never kills, recording every write it receives.

``POST /write`` with ``{"key", "lane", "seq", "action_id", "epoch", "kind", "pid"}``: a share
``fail_rate`` is refused with 503 and records no effect; every other write records one effect,
holds ``hold_seconds`` (so that two writes of a lane that overlap in time can be seen to), and
then answers 200 ``{"effect": ...}``, except a share ``drop_rate`` whose connection is closed
without an answer (the effect exists; the writer cannot know). ``GET /effects?key=K&epoch=E``
lists the effects of a key (a read back). ``GET /record`` returns every write as
:class:`Write` fields, in the order they finished. ``POST /hold`` with ``{"key", "seconds"}`` holds
that key's next write that long before it answers (a provider call that outlasts the fence
margin). Pause points for the SIGSTOP tests: ``GET /gate?key=K&pid=P`` (an adapter before its
fence) and a write with ``"gate": true`` (a write in flight after the fence, not yet applied)
wait until ``POST /release`` with ``{"key"}`` (the first to arrive: later ones pass); ``GET
/arrivals`` names the pid that reached each gate.

A write is *late* when a read back or write of the same key with a higher epoch reached the
provider before it: a holder that passed its fence, stopped, and wrote after another holder of
a later claim had already read back (docs/reliability.md, "Paused after the fence").

Run it as ``python -m tests.chaos.provider --fail-rate 0.08 --drop-rate 0.05 --seed 1``; the
first line on stdout is the port.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import threading
import time
from dataclasses import asdict, dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

OK = "ok"
REFUSED = "refused"
DROPPED = "dropped"


@dataclass(frozen=True)
class Write:
    """One write as the provider received it."""

    n: int  # the order in which the provider finished them (answered or dropped)
    kind: str
    key: str
    lane: str
    seq: int
    action_id: int
    epoch: int
    pid: int
    outcome: str  # OK, REFUSED (503, no effect) or DROPPED (effect, no answer)
    t_start: float  # time.time() at receipt
    t_end: float  # when it answered or dropped
    late: bool = False

    @property
    def effect(self) -> bool:
        return self.outcome != REFUSED


@dataclass
class Faults:
    fail_rate: float = 0.08
    drop_rate: float = 0.05
    hold_seconds: float = 0.005
    seed: int = 1


class Provider:
    """The record and the faults, shared by the server's threads."""

    def __init__(self, faults: Faults) -> None:
        self.faults = faults
        self._rng = random.Random(faults.seed)
        self._lock = threading.Lock()
        self._writes: list[Write] = []
        self._effects: dict[str, list[str]] = {}
        self._epochs: dict[str, int] = {}
        self._holds: dict[str, float] = {}
        self._gates: dict[str, threading.Event] = {}
        self._arrivals: dict[str, int] = {}

    def _seen(self, key: str, epoch: int) -> bool:
        """Note an epoch of ``key``; whether a higher one came first (lock held)."""
        highest = self._epochs.get(key, 0)
        self._epochs[key] = max(highest, epoch)
        return epoch < highest

    def read_back(self, key: str, epoch: int) -> list[str]:
        with self._lock:
            self._seen(key, epoch)
            return list(self._effects.get(key, ()))

    def hold(self, key: str, seconds: float) -> None:
        with self._lock:
            self._holds[key] = seconds

    def _gate(self, key: str) -> threading.Event:
        with self._lock:
            return self._gates.setdefault(key, threading.Event())

    def wait_at_gate(self, key: str, pid: int) -> None:
        """Hold the first caller at the gate of ``key`` until it is released (a test's pause
        point); later callers (a later claim of the action) pass."""
        gate = self._gate(key)
        with self._lock:
            if key in self._arrivals:
                return
            self._arrivals[key] = pid
        gate.wait(300)

    def release(self, key: str) -> None:
        self._gate(key).set()

    def arrivals(self) -> dict[str, int]:
        with self._lock:
            return dict(self._arrivals)

    def receive(self, body: dict[str, Any]) -> tuple[str, str | None, float, dict[str, Any]]:
        """Decide and record the effect: (outcome, effect, hold, the fields of the write). A
        write with ``"gate": true`` waits at its key's gate first, unapplied (a write in flight
        from a holder that paused after its fence, applied after the gate opens)."""
        t_start = time.time()
        key = str(body["key"])
        if body.get("gate"):
            self.wait_at_gate(key, int(body["pid"]))
        with self._lock:
            late = self._seen(key, int(body["epoch"]))
            roll = self._rng.random()
            hold = self._holds.pop(key, self.faults.hold_seconds)
            if roll < self.faults.fail_rate:
                outcome, effect = REFUSED, None
            else:
                outcome = DROPPED if roll < self.faults.fail_rate + self.faults.drop_rate else OK
                effect = f"effect-{key}-{len(self._effects.get(key, ())) + 1}"
                self._effects.setdefault(key, []).append(effect)
        fields = {
            "kind": str(body["kind"]),
            "key": key,
            "lane": str(body["lane"]),
            "seq": int(body["seq"]),
            "action_id": int(body["action_id"]),
            "epoch": int(body["epoch"]),
            "pid": int(body["pid"]),
            "outcome": outcome,
            "t_start": t_start,
            "late": late,
        }
        return outcome, effect, (0.0 if outcome == REFUSED else hold), fields

    def finish(self, fields: dict[str, Any]) -> None:
        with self._lock:
            fields["n"] = len(self._writes) + 1
            self._writes.append(Write(t_end=time.time(), **fields))

    def record(self) -> list[dict[str, Any]]:
        with self._lock:
            return [asdict(w) for w in self._writes]


def handler_for(provider: Provider) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _json(self, status: int, value: object) -> None:
            data = json.dumps(value).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _body(self) -> dict[str, Any] | None:
            """The JSON body; None when the client went away before sending all of it (a
            killed executor): that request never arrived."""
            length = int(self.headers.get("Content-Length") or 0)
            data = self.rfile.read(length)
            if len(data) < length:
                self.close_connection = True
                return None
            value: dict[str, Any] = json.loads(data or b"{}")
            return value

        def do_GET(self) -> None:
            url = urlsplit(self.path)
            query = parse_qs(url.query)
            if url.path == "/effects":
                key = query["key"][0]
                epoch = int(query.get("epoch", ["0"])[0])
                self._json(200, {"effects": provider.read_back(key, epoch)})
            elif url.path == "/gate":
                provider.wait_at_gate(query["key"][0], int(query["pid"][0]))
                self._json(200, {})
            elif url.path == "/arrivals":
                self._json(200, {"arrivals": provider.arrivals()})
            elif url.path == "/record":
                self._json(200, {"writes": provider.record()})
            else:
                self._json(404, {"error": "no such path"})

        def do_POST(self) -> None:
            url = urlsplit(self.path)
            body = self._body()
            if body is None:
                return
            if url.path == "/release":
                provider.release(str(body["key"]))
                self._json(200, {})
                return
            if url.path == "/hold":
                provider.hold(str(body["key"]), float(body["seconds"]))
                self._json(200, {})
                return
            if url.path != "/write":
                self._json(404, {"error": "no such path"})
                return
            outcome, effect, hold, fields = provider.receive(body)
            if hold:
                time.sleep(hold)
            try:
                if outcome == REFUSED:
                    self._json(503, {"error": "unavailable"})
                elif outcome == DROPPED:
                    self.close_connection = True  # no answer: the effect exists all the same
                else:
                    self._json(200, {"effect": effect})
            finally:
                provider.finish(fields)

    return Handler


class QuietServer(ThreadingHTTPServer):
    """A killed executor resets its connections: nothing to report."""

    daemon_threads = True
    # A deep listen queue: with http.server's 5, a crowd of new connections (an executor's
    # first attempts) overflows it and the connects wait out SYN retransmissions.
    request_queue_size = 1024

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1", help="a test network's own address")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--fail-rate", type=float, default=0.08)
    parser.add_argument("--drop-rate", type=float, default=0.05)
    parser.add_argument("--hold-seconds", type=float, default=0.005)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    faults = Faults(args.fail_rate, args.drop_rate, args.hold_seconds, args.seed)
    server = QuietServer((args.host, args.port), handler_for(Provider(faults)))
    print(server.server_address[1], flush=True)
    try:
        server.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        sys.stdout.flush()


if __name__ == "__main__":
    main()
