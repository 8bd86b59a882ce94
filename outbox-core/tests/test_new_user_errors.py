"""What a new user mistypes, answered in words about the mistake: an action id that is not a
number, a database URL that is not one."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from outbox_core import ConfigurationError, OutboxSettings
from outbox_core.cli import main


@pytest.mark.parametrize("command", ["show", "cancel", "run-now"])
def test_an_action_id_that_is_not_a_number_says_what_an_action_id_is(command: str) -> None:
    result = CliRunner().invoke(main, [command, "abc"])
    assert result.exit_code == 2
    assert (
        "Invalid value for 'ACTION_ID': 'abc' is not a valid integer: an action id is a whole "
        "number from 1." in result.output
    )


def test_a_malformed_database_url_says_what_a_url_looks_like() -> None:
    with pytest.raises(ConfigurationError) as refused:
        OutboxSettings(database_url="garbage")
    assert str(refused.value).endswith(
        "; expected a URL such as postgresql://user:password@host:5432/dbname"
    )
