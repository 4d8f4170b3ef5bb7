"""The machine's floor for latency, next to the bandwidth ceilings of ``limits``.

``../shared/tools/limits`` measures bandwidth only. End-to-end latency is
bounded below by how long one message takes to cross loopback and come back
between two processes, so the suite measures that too, in the same run: a
1 KiB ping-pong between this process and an echo process, both Python, as
every client here is.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time

from shoal.cli.loadgen import percentile

ECHO = """
import socket, sys
server = socket.socket()
server.bind(("127.0.0.1", 0))
server.listen(1)
print(server.getsockname()[1], flush=True)
conn, _ = server.accept()
conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
while True:
    data = conn.recv(65536)
    if not data:
        break
    conn.sendall(data)
"""


def loopback_round_trip(size: int = 1024, samples: int = 20_000) -> dict[str, float]:
    """Percentiles, in milliseconds, of a ``size``-byte round trip to another process."""
    echo = subprocess.Popen([sys.executable, "-c", ECHO], stdout=subprocess.PIPE, text=True)
    try:
        assert echo.stdout is not None
        port = int(echo.stdout.readline())
        with socket.create_connection(("127.0.0.1", port)) as conn:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            message = b"x" * size
            times = []
            for _ in range(samples):
                start = time.perf_counter()
                conn.sendall(message)
                got = 0
                while got < size:
                    got += len(conn.recv(size - got))
                times.append(time.perf_counter() - start)
        times.sort()
        return {
            "rtt_p50_ms": percentile(times, 0.5) * 1e3,
            "rtt_p99_ms": percentile(times, 0.99) * 1e3,
            "rtt_p99_9_ms": percentile(times, 0.999) * 1e3,
        }
    finally:
        echo.kill()
        echo.wait()
