"""The shoal CLI as a person or a script uses it: topics, produce and consume."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid

import pytest
from harness import BrokerProcess, free_port


def shoal(
    *args: str, stdin: bytes | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "shoal", *args],
        input=stdin,
        capture_output=True,
        timeout=60,
        env={**os.environ, **(env or {})},
    )


def ok(result: subprocess.CompletedProcess[bytes]) -> str:
    assert result.returncode == 0, result.stderr.decode()
    return result.stdout.decode()


@pytest.fixture
def topic() -> str:
    return f"cli-{uuid.uuid4().hex[:8]}"


def test_topic_create_list_describe_alter_delete(broker: BrokerProcess, topic: str) -> None:
    b = ("-b", broker.bootstrap)
    created = json.loads(
        ok(
            shoal(
                "topic", "create", topic, "-p", "2", "-c", "retention.ms=86400000", "-o", "json", *b
            )
        )
    )
    assert [p["partition"] for p in created["partitions"]] == [0, 1]
    assert created["configs"]["retention.ms"] == {"value": "86400000", "default": False}

    listed = json.loads(ok(shoal("topic", "list", "-o", "json", *b)))
    assert {"name": topic, "partitions": 2} in listed

    ok(shoal("topic", "alter", topic, "--partitions", "3", "--config", "segment.ms=3600000", *b))
    ok(shoal("topic", "alter", topic, "--delete-config", "retention.ms", *b))
    described = json.loads(ok(shoal("topic", "describe", topic, "-o", "json", *b)))
    assert len(described["partitions"]) == 3
    assert described["configs"]["segment.ms"]["value"] == "3600000"
    assert described["configs"]["retention.ms"] == {"value": "604800000", "default": True}
    table = ok(shoal("topic", "describe", topic, *b))
    assert "segment.ms" in table and topic in table

    ok(shoal("topic", "delete", topic, *b))
    assert topic not in ok(shoal("topic", "list", *b))


def test_topic_errors_exit_non_zero_with_the_reason(broker: BrokerProcess, topic: str) -> None:
    b = ("-b", broker.bootstrap)
    ok(shoal("topic", "create", topic, *b))
    again = shoal("topic", "create", topic, *b)
    assert again.returncode == 1
    assert b"already exists" in again.stderr
    missing = shoal("topic", "describe", "no-such-topic", *b)
    assert missing.returncode == 1
    assert b"error" in missing.stderr


def test_produce_lines_and_consume_them_back(broker: BrokerProcess, topic: str) -> None:
    env = {"SHOAL_BOOTSTRAP": broker.bootstrap}
    ok(shoal("topic", "create", topic, "-p", "2", env=env))
    lines = b"".join(b"key-%d:value %d\n" % (i, i) for i in range(50))
    produced = shoal(
        "produce",
        topic,
        "-K",
        ":",
        "-H",
        "origin=cli",
        "--compression",
        "zstd",
        stdin=lines,
        env=env,
    )
    ok(produced)
    assert b"produced 50 of 50" in produced.stderr

    out = ok(shoal("consume", topic, "--exit", "-f", "%k=%s|%h\\n", env=env))
    got = sorted(out.splitlines())
    assert got == sorted(f"key-{i}=value {i}|origin=cli" for i in range(50))

    first = ok(shoal("consume", topic, "-p", "0", "--count", "3", "-f", "%o\\n", env=env))
    assert first.split() == ["0", "1", "2"]

    kcat = subprocess.run(
        ["kcat", "-b", broker.bootstrap, "-C", "-t", topic, "-e", "-q", "-f", "%s\n"],
        capture_output=True,
        check=True,
        timeout=60,
    )
    assert sorted(kcat.stdout.decode().splitlines()) == sorted(f"value {i}" for i in range(50))


def test_produce_to_an_unknown_topic_fails(broker: BrokerProcess) -> None:
    result = shoal(
        "produce",
        "no-such-topic",
        "-b",
        broker.bootstrap,
        "-X",
        "message.timeout.ms=3000",
        stdin=b"x\n",
    )
    assert result.returncode == 1
    assert b"produced 0 of 1" in result.stderr


def test_a_cluster_that_is_not_there_gets_one_warning_and_a_clean_failure() -> None:
    nobody = f"127.0.0.1:{free_port()}"
    result = shoal("produce", "t", "-b", nobody, "-X", "message.timeout.ms=2000", stdin=b"x\n")
    assert result.returncode == 1
    stderr = result.stderr.decode()
    assert "Traceback" not in stderr
    assert stderr.count("Connection refused") == 1, stderr
    assert "produced 0 of 1" in stderr


def test_broker_help_names_every_environment_variable() -> None:
    text = ok(shoal("broker", "--help"))
    for variable in ("SHOAL_NODE_ID", "SHOAL_DATA_DIR", "SHOAL_LISTEN", "SHOAL_ETCD"):
        assert variable in text


def test_group_list_describe_with_lag_and_reset_offsets(broker: BrokerProcess, topic: str) -> None:
    from confluent_kafka import Consumer

    env = {"SHOAL_BOOTSTRAP": broker.bootstrap}
    ok(shoal("topic", "create", topic, "-p", "2", env=env))
    ok(shoal("produce", topic, "-p", "0", stdin=b"".join(b"%d\n" % i for i in range(10)), env=env))
    group = f"cli-group-{uuid.uuid4().hex[:6]}"
    consumer = Consumer(
        {
            "bootstrap.servers": broker.bootstrap,
            "group.id": group,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    consumer.subscribe([topic])
    got = 0
    while got < 4:
        message = consumer.poll(1)
        if message is not None and message.error() is None:
            got += 1
            consumer.commit(message=message, asynchronous=False)
    consumer.close()

    assert {"group": group, "state": "empty"} in json.loads(
        ok(shoal("group", "list", "-o", "json", env=env))
    )
    described = json.loads(ok(shoal("group", "describe", group, "-o", "json", env=env)))
    assert described["state"] == "empty"
    lag = {row["partition"]: row for row in described["offsets"]}
    assert (lag[0]["committed"], lag[0]["end"], lag[0]["lag"]) == (4, 10, 6)

    dry = json.loads(
        ok(
            shoal(
                "group", "reset-offsets", group, "-t", topic, "--to-earliest", "-o", "json", env=env
            )
        )
    )
    assert dry["executed"] is False
    assert (
        json.loads(ok(shoal("group", "describe", group, "-o", "json", env=env)))["offsets"][0][
            "committed"
        ]
        == 4
    )
    ok(shoal("group", "reset-offsets", group, "-t", topic, "--shift-by", "3", "--execute", env=env))
    offsets = json.loads(ok(shoal("group", "describe", group, "-o", "json", env=env)))["offsets"]
    assert {row["partition"]: row["committed"] for row in offsets} == {0: 7, 1: 0}
