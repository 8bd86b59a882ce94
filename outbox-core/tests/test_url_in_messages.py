"""A database URL's password is never in an error: libpq quotes a malformed URI whole, and the
settings' and the command's messages say it without the URL."""

from __future__ import annotations

import pytest

from outbox_core import ConfigurationError, OutboxSettings
from outbox_core.settings_section import hide_url

SECRET = "pw-9d2c"


@pytest.mark.parametrize(
    "url",
    [
        f"postgresql://u:{SECRET}@[::1/db",
        f"postgresql://u:{SECRET}%zz@127.0.0.1/db",
        f"postgresql://u:{SECRET}@127.0.0.1/db?sslmode",
    ],
)
def test_a_malformed_url_is_refused_without_its_password(url: str) -> None:
    # Built directly, as an application does (and may print the error), or loaded as the
    # commands load it: the same one line, with the input hidden.
    with pytest.raises(ConfigurationError) as refused:
        OutboxSettings(database_url=url)
    assert "malformed" in str(refused.value)
    assert SECRET not in str(refused.value)
    assert SECRET not in repr(refused.value.__cause__) and refused.value.__suppress_context__
    with pytest.raises(ConfigurationError) as said:
        OutboxSettings.load(database_url=url)
    assert "malformed" in str(said.value) and SECRET not in str(said.value)


def test_hide_url_takes_out_the_url_and_any_credentials_left() -> None:
    url = f"postgresql://u:{SECRET}@h/db"
    assert SECRET not in hide_url(f'bad URI: "{url}"', url)
    assert hide_url(f"at postgresql://x:{SECRET}@other/db", url) == "at postgresql://***@other/db"
    assert hide_url(f"password = '{SECRET} x' host=h", "") == "password = *** host=h"


def test_hide_url_keeps_the_user_name_that_a_refusal_names() -> None:
    url = f"postgresql://postgres:{SECRET}@h/db"
    said = 'FATAL:  password authentication failed for user "postgres"'
    assert hide_url(said, url) == said
