"""`shoal broker` as a container runs it: configured by SHOAL_* variables, one per data
directory, one per node id, and stopped cleanly by SIGTERM."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from confluent_kafka.admin import AdminClient, NewTopic
from conftest import BrokerFactory
from harness import EtcdServer, free_port, wait_until


def test_every_setting_can_come_from_the_environment(etcd: EtcdServer, tmp_path: Path) -> None:
    port = free_port()
    log_path = tmp_path / "broker.log"
    env = {
        **os.environ,
        "SHOAL_NODE_ID": "7",
        "SHOAL_DATA_DIR": str(tmp_path / "data"),
        "SHOAL_LISTEN": f"127.0.0.1:{port}",
        "SHOAL_ETCD": etcd.chroot_url(),
        "SHOAL_RACK": "zone-a",
        "SHOAL_LOG_FORMAT": "json",
        "SHOAL_NUM_PARTITIONS": "4",
    }
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "shoal", "broker"], env=env, stdout=log, stderr=log
        )
    try:
        # JSON lines: the ready event is a field, not the text format's key=value.
        wait_until(lambda: b'"event": "broker_ready"' in log_path.read_bytes(), 60, "broker ready")
        admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{port}"})
        cluster = admin.describe_cluster(include_authorized_operations=False).result(30)
        assert [(n.id, n.port, n.rack) for n in cluster.nodes] == [(7, port, "zone-a")]
        admin.create_topics([NewTopic("defaults", -1, -1)])["defaults"].result(30)
        assert len(admin.list_topics("defaults", timeout=30).topics["defaults"].partitions) == 4
        process.terminate()
        assert process.wait(30) == 0
        assert (tmp_path / "data" / ".kafka_cleanshutdown").exists()
    finally:
        if process.poll() is None:
            process.kill()


def test_a_second_broker_on_the_same_data_dir_refuses_to_start(
    broker_factory: BrokerFactory,
) -> None:
    first = broker_factory()
    second = subprocess.run(
        [*first.command()[:-2], f"--listen=127.0.0.1:{free_port()}", f"--etcd={first.etcd_url}"],
        capture_output=True,
        timeout=60,
    )
    assert second.returncode == 1
    assert b"in use by another process" in second.stderr
    assert first.running


def test_a_data_dir_of_another_node_is_refused(broker_factory: BrokerFactory) -> None:
    first = broker_factory()
    assert first.stop() == 0
    other = subprocess.run(
        [sys.executable, "-m", "shoal", "broker", "--node-id=3",
         f"--data-dir={first.data_dir}", f"--listen=127.0.0.1:{free_port()}",
         f"--etcd={first.etcd_url}"],
        capture_output=True,
        timeout=60,
    )  # fmt: skip
    assert other.returncode == 1
    assert b"belongs to node.id 0" in other.stderr
