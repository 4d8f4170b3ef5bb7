"""`shoal dev`: a local three-broker cluster behind the gateway that starts, serves
kcat as tenant demo, refuses a second copy, keeps its data and its demo key
across runs and stops every child on SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
from harness import free_port_block, wait_until


def start_dev(
    data_dir: Path, port: int, broker_port: int, etcd_port: int, http_port: int, metrics_port: int
) -> subprocess.Popen[bytes]:
    with open(data_dir.parent / "dev-output.log", "ab") as output:
        return subprocess.Popen(
            [sys.executable, "-m", "shoal", "dev", f"--data-dir={data_dir}",
             f"--port={port}", f"--broker-port={broker_port}", f"--etcd-port={etcd_port}",
             f"--http-port={http_port}", f"--metrics-port={metrics_port}"],
            stdout=output,
            stderr=output,
        )  # fmt: skip


def child_pids(parent: int) -> list[int]:
    result = subprocess.run(["pgrep", "-P", str(parent)], capture_output=True, text=True)
    return [int(pid) for pid in result.stdout.split()]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return (
        Path(f"/proc/{pid}").exists()
        and "zombie" not in Path(f"/proc/{pid}/status").read_text().lower()
    )


def kcat(properties: Path, *args: str, stdin: bytes | None = None) -> bytes:
    result = subprocess.run(
        ["kcat", "-F", str(properties), *args],
        input=stdin,
        capture_output=True,
        timeout=60,
    )
    # kcat says on stderr why it failed; CalledProcessError alone would hide it.
    assert result.returncode == 0, f"kcat {' '.join(args)}: {result.stderr.decode()}"
    return result.stdout


def test_dev_cluster_lifecycle(tmp_path: Path) -> None:
    data_dir = tmp_path / "shoal"
    port, broker_port, etcd_port = free_port_block(4), free_port_block(3), free_port_block(2)
    # Brokers' /metrics at metrics_port + n, the gateway's at metrics_port + 3.
    http_port, metrics_port = free_port_block(1), free_port_block(4)
    dev = start_dev(data_dir, port, broker_port, etcd_port, http_port, metrics_port)
    try:
        properties = data_dir / "client.properties"
        wait_until(properties.exists, 90, "client.properties")
        settings = dict(
            line.split("=", 1) for line in properties.read_text().splitlines() if "=" in line
        )
        # Tenants reach the gateway, with SASL; the brokers are not theirs to see.
        assert settings["bootstrap.servers"] == f"127.0.0.1:{port}"
        assert settings["security.protocol"] == "SASL_PLAINTEXT"
        assert settings["sasl.mechanism"] == "PLAIN"
        key_id = settings["sasl.username"]
        assert settings["sasl.password"]
        env_file = (data_dir / "dev.env").read_text()
        assert f"SHOAL_BOOTSTRAP=127.0.0.1:{port}" in env_file
        brokers = ",".join(f"127.0.0.1:{broker_port + n}" for n in range(3))
        assert f"SHOAL_BROKERS={brokers}" in env_file
        assert f"SHOAL_ETCD=http://127.0.0.1:{etcd_port}" in env_file

        for node in range(3):
            scraped = httpx.get(f"http://127.0.0.1:{metrics_port + node}/metrics", timeout=10)
            assert "shoal_broker_partitions " in scraped.text
        scraped = httpx.get(f"http://127.0.0.1:{metrics_port + 3}/metrics", timeout=10)
        assert "shoal_gateway_connections" in scraped.text
        # Not on the tenants' HTTP door: there it is an unknown path like any other.
        answer = httpx.get(f"http://127.0.0.1:{http_port}/metrics", timeout=10)
        assert answer.status_code == 404
        assert answer.json()["error_code"] == 40400
        listing = kcat(properties, "-L")
        assert b"3 brokers:" in listing
        assert all(
            b"broker %d at 127.0.0.1:%d" % (node, port + 1 + node) in listing for node in range(3)
        )
        keys = subprocess.run(
            [sys.executable, "-m", "shoal", "key", "list", "demo",
             f"--etcd=http://127.0.0.1:{etcd_port}", "-o", "json"],
            check=True, capture_output=True, timeout=60,
        )  # fmt: skip
        assert [k["key_id"] for k in json.loads(keys.stdout)] == [key_id]
        # What the README tells a newcomer to do: source the file, then use the CLI.
        listed = subprocess.run(
            ["bash", "-c", f"source {data_dir / 'dev.env'} && {sys.executable} -m shoal "
             "topic list -o json"],
            capture_output=True,
            timeout=60,
            env={k: v for k, v in os.environ.items() if not k.startswith("SHOAL_")},
        )  # fmt: skip
        assert listed.returncode == 0, listed.stderr.decode()
        assert json.loads(listed.stdout) == []
        created = subprocess.run(
            [sys.executable, "-m", "shoal", "topic", "create", "dev-topic",
             "-F", str(properties), "-o", "json"],
            check=True,
            capture_output=True,
            timeout=60,
        )  # fmt: skip
        # Replication factor 3 and min.insync.replicas=2 by default, as in production.
        topic = json.loads(created.stdout)
        assert sorted(topic["partitions"][0]["replicas"]) == [0, 1, 2]
        assert topic["configs"]["min.insync.replicas"]["value"] == "2"
        kcat(properties, "-X", "acks=all", "-P", "-t", "dev-topic", stdin=b"one\ntwo\n")
        assert kcat(properties, "-C", "-t", "dev-topic", "-e", "-q") == b"one\ntwo\n"

        second = subprocess.run(
            [sys.executable, "-m", "shoal", "dev", f"--data-dir={data_dir}",
             f"--port={free_port_block(4)}", f"--broker-port={free_port_block(3)}",
             f"--etcd-port={free_port_block(2)}"],
            capture_output=True,
            timeout=60,
        )  # fmt: skip
        assert second.returncode == 1
        assert b"in use by another process" in second.stderr

        children = child_pids(dev.pid)
        assert len(children) == 5, "etcd, three brokers and the gateway"
        for pid in children:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            if b"broker" in argv:
                assert any(a.startswith(b"--listen=127.0.0.1:") for a in argv), "loopback only"
        # One broker dying is reported; the cluster carries on without it.
        (broker_2,) = [
            p for p in children if b"--node-id=2" in Path(f"/proc/{p}/cmdline").read_bytes()
        ]
        os.kill(broker_2, signal.SIGKILL)
        output = data_dir.parent / "dev-output.log"
        wait_until(lambda: b"broker 2 exited" in output.read_bytes(), 30, "the death reported")
        assert dev.poll() is None
        kcat(properties, "-X", "acks=all", "-P", "-t", "dev-topic", stdin=b"three\n")

        dev.send_signal(signal.SIGTERM)
        assert dev.wait(60) == 0
        wait_until(lambda: not any(alive(pid) for pid in children), 10, "children to exit")
        for node in (0, 1):
            assert (data_dir / f"broker-{node}" / ".kafka_cleanshutdown").exists()
    finally:
        if dev.poll() is None:
            dev.kill()
            dev.wait()

    properties.unlink()
    again = start_dev(data_dir, port, broker_port, etcd_port, http_port, metrics_port)
    try:
        wait_until(properties.exists, 90, "client.properties after restart")
        assert f"sasl.username={key_id}" in properties.read_text(), "the demo key is kept"
        assert kcat(properties, "-C", "-t", "dev-topic", "-e", "-q") == b"one\ntwo\nthree\n"
    finally:
        again.send_signal(signal.SIGINT)
        assert again.wait(60) == 0
