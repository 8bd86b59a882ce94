"""Notices are registered through the hook; they become the EMAIL kind's variants."""

from __future__ import annotations

import inspect
import types
from typing import Any

import pytest
from pydantic import BaseModel

from outbox_core import ActionState, EgressViolation, RegistrationError, hookimpl
from outbox_core.plugins import build_host
from outbox_core.testing import OutboxTestDatabase
from outbox_email import EmailAdapter, EmailNotice, Mail, NoticeRegistry, hookspecs
from outbox_email.testing import SmtpTestServer, serve_email

from . import notices
from .conftest import action, enqueue


def _plugin(*registered: Any) -> types.SimpleNamespace:
    @hookimpl
    def outbox_register_email_notices(register: Any) -> None:
        for notice in registered:
            register(notice)

    return types.SimpleNamespace(outbox_register_email_notices=outbox_register_email_notices)


def test_an_application_plugin_registers_its_notices_as_the_kinds_variants() -> None:
    host = build_host(extra_plugins=[("app", notices)])

    entry = host.registry.get("EMAIL")
    assert entry.distribution == "outbox-email"
    assert entry.variants.describe()["bodies"] == {
        "account_welcome": "AccountCreated",
        "admin_alert": "AdminAlert",
        "welcome": "WelcomeEvent",
    }
    # The claim path admits the notices this build knows, and their enum values only.
    path = entry.variants.json_path()
    assert path is not None and '"welcome"' in path and '"high"' in path


def test_without_notices_the_email_kind_decodes_nothing() -> None:
    entry = build_host().registry.get("EMAIL")

    assert entry.variants.describe()["bodies"] == {"outbox_email:none": "NoNotice"}
    with pytest.raises(Exception, match="no email notice is registered"):
        entry.variants.decode({"notice": "outbox_email:none", "event": {}}, "k", kind="EMAIL")


def test_two_plugins_registering_one_notice_name_are_both_named() -> None:
    with pytest.raises(RegistrationError, match="'welcome' is registered twice.*first.*second"):
        build_host(
            extra_plugins=[
                ("first", _plugin(notices.Welcome())),
                ("second", _plugin(notices.Welcome())),
            ]
        )


@pytest.mark.parametrize(
    ("registered", "message"),
    [
        (notices.Welcome, "register an instance of the notice, register\\(Welcome\\(\\)\\)"),
        ("welcome", "register\\(\\) takes an EmailNotice"),
    ],
)
def test_a_bad_registration_names_the_plugin(registered: Any, message: str) -> None:
    with pytest.raises(RegistrationError, match=f"'sloppy'.*{message}"):
        build_host(extra_plugins=[("sloppy", _plugin(registered))])


class _Event(BaseModel):
    id: str


def test_a_notice_needs_a_name_an_event_model_and_prepare() -> None:
    class NoName(EmailNotice[_Event]):
        event = _Event

        def prepare(self, event: _Event, context: Any) -> Mail:
            raise AssertionError

    class BadName(NoName):
        name = "Has Spaces"

    class NoModel(EmailNotice[_Event]):
        name = "no_model"
        event = dict  # type: ignore[assignment]

    class NoPrepare(EmailNotice[_Event]):
        name = "no_prepare"
        event = _Event

    for notice, message in [
        (NoName(), "NoName.name must be"),
        (BadName(), "got 'Has Spaces'"),
        (NoModel(), "event must be a pydantic model"),
        (NoPrepare(), "neither prepare"),
    ]:
        with pytest.raises(RegistrationError, match=message):
            NoticeRegistry([notice])


def test_an_email_of_a_notice_this_build_lacks_is_never_claimed(
    outbox_db: OutboxTestDatabase, smtp_server: SmtpTestServer
) -> None:
    newer = NoticeRegistry([notices.Welcome(), notices.Later()])
    serve_email(outbox_db, smtp_server, notices=newer)
    enqueue(outbox_db, "later:1", "later", {"account_id": "ada"})

    serve_email(outbox_db, smtp_server, notices=[notices.Welcome()])  # the older replica
    outbox_db.drain()
    assert action(outbox_db, "later:1") == (ActionState.ADMITTED, None, 0)
    assert smtp_server.connections == 0

    serve_email(outbox_db, smtp_server, notices=newer)  # a replica of the newer build
    outbox_db.drain()
    assert action(outbox_db, "later:1")[0] is ActionState.DONE


def test_the_bound_adapter_class_reads_as_email_adapter() -> None:
    bound = EmailAdapter.bind(NoticeRegistry([notices.Welcome()]))
    assert issubclass(bound, EmailAdapter)
    assert f"{bound.__module__}.{bound.__qualname__}" == "outbox_email.adapter.EmailAdapter"
    assert bound.notices is not None and bound.notices.names == ["welcome"]
    assert EmailAdapter.notices is None


async def test_only_the_executor_may_call_execute() -> None:
    adapter = EmailAdapter.bind(NoticeRegistry())()
    with pytest.raises(EgressViolation):
        await adapter.execute(None)  # type: ignore[arg-type]


def test_every_hook_of_the_package_is_documented() -> None:
    hooks = [
        name
        for name, _ in inspect.getmembers(hookspecs, inspect.isfunction)
        if name.startswith("outbox_")
    ]
    assert hooks == ["outbox_register_email_notices"]
    for name in hooks:
        doc = inspect.getdoc(getattr(hookspecs, name)) or ""
        assert "register(" in doc and "RegistrationError" in doc


def test_each_host_keeps_the_notices_it_collected_in_the_plugins_own_state() -> None:
    with_app = build_host(extra_plugins=[("app", notices)])
    without = build_host()

    for host in (with_app, without):
        kept = host.plugin_state["email"]["notices"]
        assert host.registry.get("EMAIL").adapter.notices is kept
    assert "welcome" in with_app.plugin_state["email"]["notices"].names
    assert without.plugin_state["email"]["notices"].names == []
