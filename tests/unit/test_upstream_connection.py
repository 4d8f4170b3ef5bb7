"""The gateway's connection to a broker is never reused once a call on it was cut short."""

from __future__ import annotations

import asyncio

import pytest
from shoal.gateway.upstream import BrokerConnection

from shoal.wire import schema


async def test_a_call_cancelled_before_its_answer_closes_the_connection() -> None:
    received = asyncio.Event()

    async def silent_broker(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(4)
        received.set()
        await reader.read()  # never answers, as a broker slow to answer

    server = await asyncio.start_server(silent_broker, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    connection = await BrokerConnection.open("127.0.0.1", port)
    api = schema(18, 3)  # ApiVersions
    call = asyncio.create_task(
        connection.call(api, api.request(client_software_name="t", client_software_version="1"))
    )
    await asyncio.wait_for(received.wait(), 5)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    # Its answer could still arrive and be read as the next call's.
    assert connection.closed
    server.close()
