"""End-to-end latency split over two processes: ``produce(run_id=)`` and ``read_latencies``.

The benchmark suite runs the producer and the reader in separate processes;
their stamps are ``perf_counter_ns``, which only works if both processes read
one clock. The producer here is a real child process, and the reader must
count exactly its stamped records and nothing else.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

from harness import BrokerProcess
from kafka_clients import create_topic

from shoal.cli import loadgen

PRODUCER = """
import sys
from shoal.cli import loadgen
config = {"bootstrap.servers": sys.argv[1]}
result = loadgen.produce(config, sys.argv[2], 200, 64, 400, run_id=bytes.fromhex(sys.argv[3]))
assert result.records == 200, result
"""


def test_read_latencies_measures_a_producer_in_another_process(broker: BrokerProcess) -> None:
    topic = create_topic(broker.bootstrap, partitions=2)
    config = {"bootstrap.servers": broker.bootstrap}
    loadgen.produce(config, topic, 50, 64)  # before the reader: not read at all
    run_id = os.urandom(8)
    ready = threading.Event()
    results: list[loadgen.LatencyResult] = []
    reader = threading.Thread(
        target=lambda: results.append(
            loadgen.read_latencies(config, topic, run_id, 200, 64, on_ready=ready.set)
        )
    )
    reader.start()
    assert ready.wait(30), "the reader never reached the topic's end"
    loadgen.produce(config, topic, 30, 64)  # unstamped: read and ignored
    before_ns = time.perf_counter_ns()
    subprocess.run(
        [sys.executable, "-c", PRODUCER, broker.bootstrap, topic, run_id.hex()],
        check=True,
        timeout=60,
    )
    reader.join(60)
    elapsed_ms = (time.perf_counter_ns() - before_ns) / 1e6

    assert results, "the reader did not finish"
    result = results[0]
    assert (result.records, result.bytes, result.missing) == (200, 200 * 64, 0)
    latency = result.latency
    assert latency is not None and latency.count == 200
    # One clock across the two processes: every latency is positive and
    # shorter than the whole exchange, which began before the child started.
    assert 0 < latency.cdf_ms[0] <= latency.p50_ms <= latency.max_ms < elapsed_ms
