"""The clients of a login storm, for a process of their own (test_gateway_connection_storm.py).

A module apart from the test: a spawned process imports its target's module,
and this one needs neither pytest's conftest nor the test's fixtures.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from gateway_env import sasl_login
from raw_kafka import RawConnection

STORM = 1000
"""Logins, from 32 threads at once."""


def open_connections(
    bootstrap: str,
    key_id: str,
    secret: str,
    answered: multiprocessing.Queue[tuple[float, list[tuple[int, str | None]]]],
    go: Any,
    release: Any,
) -> None:
    """In a process of its own: once ``go`` is set, :data:`STORM` logins from 32 threads
    at once; puts how long they took and each answer's error code and message, then
    holds the accepted connections open until ``release`` is set.

    At the lowest CPU priority: a crowd's clients run on machines of their own,
    and on this one their threads would otherwise take the cores from the gateway
    and the neighbour, which is the machine's limit, not the gateway's."""
    os.nice(19)
    go.wait(120)

    def one(_: int) -> tuple[RawConnection, int, str | None]:
        connection = RawConnection(bootstrap)
        answer = sasl_login(connection, key_id, secret)
        return connection, answer.error_code, answer.error_message

    started = time.monotonic()
    with ThreadPoolExecutor(32) as pool:
        logins = list(pool.map(one, range(STORM)))
    answered.put((time.monotonic() - started, [(code, message) for _, code, message in logins]))
    release.wait(120)
    for connection, _, _ in logins:
        connection.close()
