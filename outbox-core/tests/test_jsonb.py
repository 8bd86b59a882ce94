"""The executor's json loads gives what json.loads gives, and the same errors."""

from __future__ import annotations

import json

import pytest
from psycopg.pq import Format

from outbox_core.executor.jsonb import loads
from outbox_core.testing import OutboxTestDatabase

from .test_concurrency import executor_for

DOCUMENTS = [
    '{"n": 1}',
    "{}",
    "[]",
    "null",
    "true",
    "12345678901234567890123",
    "-0.5e-3",
    '"just a string"',
    '{"a": [1, 2.5, {"b": null}], "c": "\\u00e9t\\u00e9 \\ud83d\\ude00", "d": "tab\\tquote\\""}',
    '{"é": "ünïcödé", "emoji": "😀"}',
    '  {"padded": true}  ',
    '{"n": 1}\n',
]


@pytest.mark.parametrize("document", DOCUMENTS)
@pytest.mark.parametrize("as_type", [str, bytes, memoryview])
def test_it_loads_what_json_loads_loads(document: str, as_type: type) -> None:
    data = document if as_type is str else as_type(document.encode())
    assert loads(data) == json.loads(document)


@pytest.mark.parametrize("document", ["", "{", '{"a": 1} x', "[1,]", "NaNx"])
def test_it_refuses_what_json_loads_refuses(document: str) -> None:
    with pytest.raises(json.JSONDecodeError):
        json.loads(document)
    with pytest.raises(json.JSONDecodeError):
        loads(document.encode())


async def test_the_executors_connections_load_jsonb_with_it(db: OutboxTestDatabase) -> None:
    executor = executor_for(db)
    await executor.open()
    try:
        assert executor.pool is not None
        async with executor.pool.connection() as conn:
            cursor = await conn.execute("""SELECT '{"é": [1, 2.5, null]}'::jsonb""")
            assert await cursor.fetchone() == ({"é": [1, 2.5, None]},)
            loader = conn.adapters.get_loader(conn.adapters.types["jsonb"].oid, Format.TEXT)
            assert loader is not None and loader._loads is loads  # type: ignore[attr-defined]
    finally:
        await executor.close()
