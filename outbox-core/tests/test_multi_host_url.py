"""A database URL that names several hosts (a primary and its standbys, issue 35) must take only
the primary: libpq takes the first host that answers, and on a standby the executor's LISTEN and
every write fail. The settings refuse such a URL without target_session_attrs=read-write (or
primary), in one line that says what to add; the log names each host with its port."""

from __future__ import annotations

import pytest

from outbox_core import ConfigurationError, OutboxSettings
from outbox_core.observability import database_label

HOSTS = "postgresql://app@db-a:5432,db-b:5433/app"


@pytest.mark.parametrize(
    "query", ["", "?target_session_attrs=any", "?target_session_attrs=standby"]
)
def test_a_url_of_several_hosts_that_may_take_a_standby_is_refused(query: str) -> None:
    with pytest.raises(ConfigurationError) as refused:
        OutboxSettings(database_url=HOSTS + query)
    said = str(refused.value)
    assert "names 2 hosts" in said and "add target_session_attrs=read-write" in said
    assert "\n" not in said


@pytest.mark.parametrize("attrs", ["read-write", "primary"])
def test_a_url_of_several_hosts_that_takes_only_the_primary_is_accepted(attrs: str) -> None:
    url = f"{HOSTS}?target_session_attrs={attrs}"
    assert OutboxSettings(database_url=url).dsn() == url


def test_a_url_of_one_host_needs_no_target_session_attrs() -> None:
    url = "postgresql://app@db-a:5432/app"
    assert OutboxSettings(database_url=url).dsn() == url


def test_the_log_names_each_host_with_its_port() -> None:
    assert database_label(HOSTS + "?target_session_attrs=read-write") == "db-a:5432,db-b:5433/app"
    assert database_label("host=a,b port=6432 dbname=x") == "a:6432,b:6432/x"
    assert database_label("postgresql://u:secret@h:5432/db") == "h:5432/db"
