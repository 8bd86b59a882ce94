"""Loading the package's SQL: named statements from ``sql/queries.sql`` and migration files.

SQL files name the configured schema as ``{schema}``; it is replaced by a checked, quoted
identifier. Values are never formatted into SQL: statements take named parameters.
"""

from __future__ import annotations

import re
from functools import cache
from importlib import resources

# At most 56 characters: the schema's wake-up channel, ``outbox_<schema>``, must fit in
# PostgreSQL's names (63 bytes), or every enqueue's pg_notify() fails ("channel name too long").
SCHEMA_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,55}$")
_NAME_LINE = re.compile(r"^--\s*name:\s*(\w+)\s*$", re.MULTILINE)


def quote_schema(schema: str) -> str:
    """The schema as a quoted identifier, or ValueError if it is not a plain lower-case name."""
    if not SCHEMA_NAME.match(schema):
        raise ValueError(
            f"schema {schema!r}: use a lower-case name of letters, digits and underscores "
            "(at most 56 characters, not starting with a digit)"
        )
    return f'"{schema}"'


def channel_name(schema: str) -> str:
    """The LISTEN/NOTIFY channel of the schema's idle executors."""
    return f"outbox_{schema}"


def render(sql_text: str, schema: str) -> str:
    """Put the quoted schema where the text says ``{schema}``, and the schema's wake-up channel
    as a string literal where it says ``{channel}`` (one parameter fewer for every enqueue to
    adapt; the schema's name has no quote to escape, SCHEMA_NAME)."""
    text = sql_text.replace("{schema}", quote_schema(schema))
    return text.replace("{channel}", f"'{channel_name(schema)}'")


def parse_named(text: str) -> dict[str, str]:
    """Split a file of ``-- name: x`` sections into {name: statement}. The comment lines that
    open a section are for readers of the file and stay there: the statement sent is
    ``-- x`` and the SQL (the client encodes and hashes a statement's text at every execution,
    and a long comment costs that as much as SQL does; comments inside the SQL stay)."""
    parts = _NAME_LINE.split(text)
    named: dict[str, str] = {}
    for index in range(1, len(parts), 2):
        name, body = parts[index], parts[index + 1].strip()
        if name in named:
            raise ValueError(f"the statement name {name!r} is used twice")
        lines = body.splitlines()
        while lines and (not lines[0].strip() or lines[0].lstrip().startswith("--")):
            lines.pop(0)
        named[name] = "\n".join([f"-- {name}", *lines])
    return named


@cache
def package_queries(package: str, path: str, schema: str) -> dict[str, str]:
    """The named statements (``-- name: x``) of the SQL file ``path`` inside ``package``, with
    the schema filled in: how the core and every plugin read their one SQL file."""
    text = resources.files(package).joinpath(path).read_text("utf-8")
    return {name: render(body, schema) for name, body in parse_named(text).items()}


def core_queries(schema: str) -> dict[str, str]:
    """The core's named statements with the schema filled in."""
    return package_queries("outbox_core", "sql/queries.sql", schema)
