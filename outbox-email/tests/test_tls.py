"""STARTTLS and implicit TLS against the loopback server, with a certificate made for the test."""

from __future__ import annotations

import shutil
import subprocess
from typing import Literal

import pytest

from outbox_core import ActionState, StopReason
from outbox_core.testing import OutboxTestDatabase
from outbox_email.testing import SmtpTestServer, serve_email

from .conftest import action, enqueue


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed: cannot make a test certificate")
    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "2",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
    )
    return str(cert), str(key)


@pytest.mark.parametrize("tls", ["starttls", "implicit"])
def test_an_email_goes_over_tls_with_auth_and_a_verified_certificate(
    tls: Literal["starttls", "implicit"],
    certificate: tuple[str, str],
    outbox_db: OutboxTestDatabase,
) -> None:
    cert, key = certificate
    with SmtpTestServer(
        tls=tls,
        certfile=cert,
        keyfile=key,
        credentials=("mailer", "s3cret"),
    ) as server:
        serve_email(outbox_db, server)
        enqueue(outbox_db, "k")

        outbox_db.drain()

        assert action(outbox_db, "k") == (ActionState.DONE, StopReason.COMPLETED, 1)
        assert len(server.messages) == 1


def test_a_relay_whose_certificate_is_not_trusted_is_retried_and_gets_nothing(
    certificate: tuple[str, str], outbox_db: OutboxTestDatabase
) -> None:
    cert, key = certificate
    with SmtpTestServer(tls="starttls", certfile=cert, keyfile=key) as server:
        serve_email(outbox_db, server, cert_bundle=None)
        enqueue(outbox_db, "k")

        outbox_db.drain()

        assert action(outbox_db, "k") == (ActionState.ADMITTED, None, 1)
        assert server.mail_commands == 0
        assert outbox_db.rows("SELECT last_detail FROM {schema}.agent_action") == [
            ("connecting to the relay failed at the TLS handshake: SSLCertVerificationError",)
        ]


def test_starttls_is_never_skipped_when_the_relay_does_not_offer_it(
    outbox_db: OutboxTestDatabase, smtp_server: SmtpTestServer
) -> None:
    serve_email(outbox_db, smtp_server, tls="starttls")
    enqueue(outbox_db, "k")

    outbox_db.drain()

    assert action(outbox_db, "k") == (ActionState.ADMITTED, None, 1)
    assert smtp_server.mail_commands == 0
    # Why it waits, kept on the action for `outbox show` and `outbox status`.
    assert outbox_db.rows("SELECT last_detail FROM {schema}.agent_action") == [
        ("connecting to the relay failed at STARTTLS: SMTPException",)
    ]
