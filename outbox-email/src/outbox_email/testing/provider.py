"""The loopback SMTP server as the conformance suite reads and steers it
(:class:`outbox_core.testing.conformance.LoopbackProvider`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..message import message_id
from .server import SmtpTestServer

if TYPE_CHECKING:
    from outbox_core import ActionRequest
    from outbox_core.testing.conformance import Fault


class SmtpProvider:
    """``server`` as a conformance provider: every connection and command is a request, a write
    is a message received in full whose Message-ID is the action's (derived from its
    idempotency key), and the faults strike the next message: ``refuse`` answers its MAIL FROM
    with 451 (the relay holds nothing), ``drop`` hangs up after its content arrived, ``stall``
    never answers its content."""

    def __init__(
        self, server: SmtpTestServer, *, message_id_domain: str = "outbox.example.test"
    ) -> None:
        self.server = server
        self.message_id_domain = message_id_domain

    def requests(self) -> int:
        return self.server.connections + self.server.commands

    def writes(self, request: ActionRequest) -> int:
        wanted = message_id(request.idempotency_key, self.message_id_domain)
        return sum(1 for message in self.server.messages if message.message_id == wanted)

    def fault(self, fault: Fault) -> None:
        match fault:
            case "refuse":
                self.server.reply("mail", 451)
            case "drop":
                self.server.drop("content")
            case "stall":
                self.server.stall("content")

    def clear_faults(self) -> None:
        self.server.clear_faults()
