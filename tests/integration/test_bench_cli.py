"""``shoal bench`` as a user runs it: the installed command, against a broker and the gateway.

Every case runs the real ``shoal`` script in a child process (its stdout is
a pipe, so there is no live display: JSON with ``-o json``, otherwise the
summary line) and checks the figures against the cluster: the records a
produce run reports are in the topic with the size asked for, a consume run
reads exactly what it was asked, ``--throughput`` holds the rate down, and
end-to-end percentiles are ordered. Through the gateway it uses a tenant's
client.properties; a wrong password ends the run quickly with the reason.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from gateway_env import TenantKey
from harness import BrokerProcess
from kafka_clients import confluent_consume, create_topic

SHOAL = str(Path(sys.executable).with_name("shoal"))
RUN_TIMEOUT_S = 60


def bench(
    *args: str, env: dict[str, str] | None = None, timeout: float = RUN_TIMEOUT_S
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [SHOAL, "bench", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def bench_json(*args: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    result = bench(*args, "-o", "json", env=env)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)  # type: ignore[no-any-return]


def assert_ordered(latency: dict[str, float]) -> None:
    figures = [latency[k] for k in ("p50_ms", "p95_ms", "p99_ms", "p99_9_ms", "max_ms")]
    assert figures[0] > 0, latency
    assert figures == sorted(figures), latency
    assert 0 < latency["avg_ms"] <= latency["max_ms"], latency


def watermarks(config: dict[str, Any], topic: str, partitions: int) -> dict[int, int]:
    """Records in each partition (high minus low watermark)."""
    consumer = Consumer({**config, "group.id": f"w-{uuid.uuid4().hex[:8]}"})
    try:
        counts = {}
        for p in range(partitions):
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
            counts[p] = high - low
        return counts
    finally:
        consumer.close()


# -- one broker -----------------------------------------------------------------------------


def test_produce_puts_the_reported_records_in_the_topic(broker: BrokerProcess) -> None:
    topic = create_topic(broker.bootstrap, partitions=3)
    result = bench_json(
        "produce", "--topic", topic, "--num-records", "3000", "--record-size", "300",
        "-b", broker.bootstrap, "--producer-props", "linger.ms=2",
    )  # fmt: skip
    assert result["workload"] == "produce"
    assert (result["records"], result["bytes"], result["failed"]) == (3000, 900_000, 0)
    assert result["interrupted"] is False
    assert result["records_per_s"] > 0 and result["mb_per_s"] > 0
    assert_ordered(result["latency"])

    counts = watermarks({"bootstrap.servers": broker.bootstrap}, topic, 3)
    assert sum(counts.values()) == 3000
    records = confluent_consume(broker.bootstrap, topic, counts)
    assert len(records) == 3000
    assert {len(r.value or b"") for r in records} == {300}


def test_warmup_records_are_produced_but_left_out_of_the_figures(broker: BrokerProcess) -> None:
    topic = create_topic(broker.bootstrap, partitions=1)
    result = bench_json(
        "produce", "-t", topic, "-n", "500", "--warmup-records", "200", "--record-size", "100",
        "-b", broker.bootstrap, "--producer-props", "acks=all",
        "--producer-props", "enable.idempotence=true",
    )  # fmt: skip
    assert (result["records"], result["bytes"], result["failed"]) == (500, 50_000, 0)
    assert result["latency"]["count"] == 500
    assert result["warmup_records"] == 200
    assert watermarks({"bootstrap.servers": broker.bootstrap}, topic, 1) == {0: 700}


def test_without_a_terminal_only_the_summary_line_is_printed(broker: BrokerProcess) -> None:
    topic = create_topic(broker.bootstrap, partitions=1)
    result = bench("produce", "-t", topic, "-n", "200", "--record-size", "10",
                   env={"SHOAL_BOOTSTRAP": broker.bootstrap})  # fmt: skip
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 1, result.stdout
    assert lines[0].startswith("produce: 200 records sent, ")
    assert "ms 99.9th." in lines[0]
    assert "\x1b" not in result.stdout + result.stderr


def test_throughput_holds_the_rate_down(broker: BrokerProcess) -> None:
    topic = create_topic(broker.bootstrap, partitions=1)
    started = time.monotonic()
    result = bench_json("produce", "-t", topic, "-n", "500", "--record-size", "100",
                        "--throughput", "250", "-b", broker.bootstrap)  # fmt: skip
    assert time.monotonic() - started >= 1.8
    assert result["records"] == 500
    assert result["throughput"] == 250
    # 500 records at 250/s: the last one is due 1.996 s after the first.
    assert result["seconds"] >= 1.8
    assert result["records_per_s"] <= 280


def test_consume_reads_exactly_what_it_is_asked(broker: BrokerProcess) -> None:
    topic = create_topic(broker.bootstrap, partitions=2)
    b = ("-b", broker.bootstrap)
    assert (
        bench_json("produce", "-t", topic, "-n", "1200", "--record-size", "50", *b)["records"]
        == 1200
    )
    some = bench_json("consume", "-t", topic, "--num-records", "1000", *b)
    assert (some["records"], some["bytes"], some["timed_out"]) == (1000, 50_000, False)
    everything = bench_json("consume", "-t", topic, *b)
    assert (everything["records"], everything["bytes"]) == (1200, 60_000)
    assert everything["target"] is None


def test_e2e_reports_ordered_percentiles(broker: BrokerProcess) -> None:
    topic = create_topic(broker.bootstrap, partitions=2)
    # Records already in the topic are not this run's and are skipped.
    bench_json("produce", "-t", topic, "-n", "100", "-b", broker.bootstrap)
    result = bench_json("e2e", "-t", topic, "-n", "300", "--record-size", "64",
                        "--throughput", "300", "-b", broker.bootstrap)  # fmt: skip
    assert (result["records"], result["bytes"], result["missing"]) == (300, 300 * 64, 0)
    assert_ordered(result["latency"])
    assert result["produce"]["records"] == 300
    assert_ordered(result["produce"]["latency"])


@pytest.mark.parametrize("command", ["produce", "consume", "e2e"])
def test_an_unknown_topic_is_named_and_exits_1(broker: BrokerProcess, command: str) -> None:
    topic = f"missing-{uuid.uuid4().hex[:8]}"
    result = bench(command, "-t", topic, "-n", "10", "-b", broker.bootstrap, "-o", "json")
    assert result.returncode == 1
    assert f"topic {topic} does not exist" in result.stderr
    assert result.stdout == ""


def test_ctrl_c_stops_and_prints_the_partial_result(broker: BrokerProcess) -> None:
    topic = create_topic(broker.bootstrap, partitions=1)
    process = subprocess.Popen(
        [SHOAL, "bench", "produce", "-t", topic, "-n", "1000000", "--record-size", "10",
         "--throughput", "200", "-b", broker.bootstrap, "-o", "json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        # Interrupted once it is producing: a fixed wait raced the CLI's own
        # start-up (its imports alone can take seconds on a busy machine).
        deadline = time.monotonic() + 60
        config = {"bootstrap.servers": broker.bootstrap}
        while watermarks(config, topic, 1)[0] == 0:
            assert process.poll() is None, process.communicate()[1]
            assert time.monotonic() < deadline, "the bench produced nothing in 60 s"
            time.sleep(0.2)
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=15)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 130, err
    result = json.loads(out)
    assert result["interrupted"] is True
    assert 0 < result["records"] < 1_000_000
    assert result["failed"] == 0
    assert "interrupted" in err


# -- through the gateway --------------------------------------------------------------------


@pytest.fixture(scope="module")
def key(gateway_cluster: Any) -> TenantKey:
    return gateway_cluster.tenant("bench")  # type: ignore[no-any-return]


def test_through_the_gateway_with_a_tenant_key(key: TenantKey, tmp_path: Path) -> None:
    properties = key.properties_file(tmp_path / "client.properties")
    topic = f"bench-{uuid.uuid4().hex[:8]}"
    admin = AdminClient(key.librdkafka())
    admin.create_topics([NewTopic(topic, 3)])[topic].result(30)

    produced = bench_json("produce", "-t", topic, "-n", "1000", "--record-size", "100",
                          "--config-file", str(properties))  # fmt: skip
    assert (produced["records"], produced["failed"]) == (1000, 0)
    assert sum(watermarks(key.librdkafka(), topic, 3).values()) == 1000

    env = {"SHOAL_CLIENT_CONFIG": str(properties)}
    group = f"bench-{uuid.uuid4().hex[:8]}"
    consumed = bench_json("consume", "-t", topic, "-n", "1000", "--group", group, env=env)
    assert (consumed["records"], consumed["bytes"]) == (1000, 100_000)

    e2e = bench_json("e2e", "-t", topic, "-n", "200", "--throughput", "400", env=env)
    assert (e2e["records"], e2e["missing"]) == (200, 0)
    assert_ordered(e2e["latency"])


@pytest.mark.parametrize("command", ["produce", "consume"])
def test_a_wrong_password_through_the_gateway_fails_fast(
    key: TenantKey, tmp_path: Path, command: str
) -> None:
    properties = tmp_path / "client.properties"
    config = key.librdkafka(**{"sasl.password": key.secret + "x"})
    properties.write_text("".join(f"{k}={v}\n" for k, v in config.items()))
    started = time.monotonic()
    result = bench(command, "-t", "anything", "-n", "10", "-F", str(properties), timeout=30)
    assert time.monotonic() - started < 10
    assert result.returncode == 1
    assert "error: " in result.stderr
    assert "authentication" in result.stderr.lower(), result.stderr
