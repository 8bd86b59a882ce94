"""The loopback HTTP base of the packages' fakes (``outbox_core.testing.loopback_http``) and its
fault switches (``outbox_core.testing.faults``), on a real socket."""

from __future__ import annotations

import http.client
import json
import threading
from typing import Any

import pytest

from outbox_core.testing.faults import Fault, FaultQueue, NewWrites, Outage, retry_after
from outbox_core.testing.loopback_http import Answer, Exchange, LoopbackHTTPServer, Received


class EchoServer(LoopbackHTTPServer):
    """``/answer``: Answer raised; ``/drop``: dropped; ``/stall``: stalled, then 200."""

    def answer_headers(self, path: str) -> dict[str, str]:
        return {"x-server": "echo", "x-limit": "10"}

    def serve(self, request: Received, exchange: Exchange) -> None:
        match request.path:
            case "/answer":
                raise Answer(418, {"error": "teapot"}, {"X-Limit": "0", "retry-after": "2"})
            case "/drop":
                exchange.drop()
            case "/stall":
                self.stall_here(60)
                exchange.send(200, "stalled", content_type="text/plain")
            case _:
                exchange.send(200, {"query": request.query, "body": request.json()})


def ask(server: LoopbackHTTPServer, path: str, body: Any = None) -> http.client.HTTPResponse:
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    data = None if body is None else json.dumps(body).encode()
    connection.request("POST" if data else "GET", path, body=data)
    return connection.getresponse()


def test_an_answer_raised_in_serve_is_sent_with_its_headers_over_the_servers_own() -> None:
    with EchoServer() as server:
        answer = ask(server, "/answer")
        assert answer.status == 418
        assert json.loads(answer.read()) == {"error": "teapot"}
        assert answer.headers["x-limit"] == "0"  # the answer's, not the server's "10"
        assert answer.headers.get_all("x-limit") == ["0"]
        assert answer.headers["x-server"] == "echo"
        assert answer.headers["retry-after"] == "2"


def test_every_request_is_recorded_with_its_query_and_body_before_it_is_answered() -> None:
    with EchoServer() as server:
        answer = ask(server, "/echo?a=1&a=2&b=x", {"k": "v"})
        assert json.loads(answer.read()) == {"query": {"a": "2", "b": "x"}, "body": {"k": "v"}}
        with pytest.raises(http.client.RemoteDisconnected):
            ask(server, "/drop", {"written": True})
        assert [(r.method, r.path) for r in server.received] == [
            ("POST", "/echo"),
            ("POST", "/drop"),
        ]
        assert server.received[1].json() == {"written": True}
        assert server.received[1].content_type == ""


def test_a_stall_waits_until_released_and_stop_opens_every_gate() -> None:
    with EchoServer() as server:
        answers: list[int] = []
        asking = threading.Thread(target=lambda: answers.append(ask(server, "/stall").status))
        asking.start()
        assert server.wait_until(lambda s: len(s.received) == 1)
        assert answers == []
        server.release()
        asking.join(30)
        assert answers == [200]
        server.rearm()
        gate = server.gate(open=False)
    assert gate.is_open and server.stalls.is_open


def test_refused_connections_reach_nothing_until_accepted_again_on_the_same_port() -> None:
    with EchoServer() as server:
        port = server.port
        server.refuse_connections()
        with pytest.raises(ConnectionRefusedError):
            ask(server, "/echo")
        assert server.received == []
        server.accept_connections()
        assert server.port == port
        assert ask(server, "/echo").status == 200


def test_a_fault_is_taken_for_its_times_in_order_and_one_without_times_until_cleared() -> None:
    queue: FaultQueue[Fault] = FaultQueue()
    first, second = Fault("write", "drop", times=2), Fault("write", "stall", times=None)
    queue.add("write", first, first.times)
    queue.add("write", second, second.times)
    queue.add("read", Fault("read", "status"))
    assert [queue.take("write") for _ in range(4)] == [first, first, second, second]
    assert queue.take("read") is not None and queue.take("read") is None
    assert queue.pending() == [second]
    queue.clear()
    assert queue.take("write") is None and len(queue) == 0


def test_a_fault_for_no_request_is_refused_with_a_clear_error() -> None:
    with pytest.raises(ValueError, match="times=0: a fault is for one request or more"):
        FaultQueue[str]().add("write", "drop", 0)


def test_an_outage_refuses_only_its_operations_counts_them_and_ends() -> None:
    outage = Outage.lasting(None, ops=("read",), status=503)
    assert not outage.refuses("write")
    assert outage.refuses("read") and outage.refuses("read")
    assert outage.answered == 2
    outage.end()
    assert not outage.covers("read")
    assert not Outage.lasting(0).covers("anything")


def test_new_writes_are_hidden_for_the_seconds_asked_and_shown_again() -> None:
    hiding = NewWrites()
    assert hiding.hidden_until() == 0.0
    hiding.hide(reads=2, seconds=90)
    assert hiding.reads == 2 and hiding.hidden_until() > 0
    hiding.show()
    assert (hiding.reads, hiding.hidden_until(), hiding.until_revealed) == (0, 0.0, False)
    with pytest.raises(ValueError, match="neither can be negative"):
        hiding.hide(reads=-1)
    assert retry_after(1.5) == {"retry-after": "1.5"} and retry_after(None) == {}
