"""`shoal dev`: a local cluster that starts, serves kcat, refuses a second copy,
keeps its data across runs and stops every child on SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from harness import free_port, wait_until


def start_dev(data_dir: Path, port: int, etcd_port: int) -> subprocess.Popen[bytes]:
    with open(data_dir.parent / "dev-output.log", "ab") as output:
        return subprocess.Popen(
            [sys.executable, "-P", "-m", "shoal", "dev", f"--data-dir={data_dir}",
             f"--port={port}", f"--etcd-port={etcd_port}"],
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
        check=True,
        timeout=60,
    )
    return result.stdout


def test_dev_cluster_lifecycle(tmp_path: Path) -> None:
    data_dir = tmp_path / "shoal"
    port, etcd_port = free_port(), free_port()
    dev = start_dev(data_dir, port, etcd_port)
    try:
        properties = data_dir / "client.properties"
        wait_until(properties.exists, 90, "client.properties")
        assert f"bootstrap.servers=127.0.0.1:{port}" in properties.read_text()
        env_file = (data_dir / "dev.env").read_text()
        assert f"SHOAL_BOOTSTRAP=127.0.0.1:{port}" in env_file
        assert f"SHOAL_ETCD=http://127.0.0.1:{etcd_port}" in env_file

        assert b"broker 0 at 127.0.0.1" in kcat(properties, "-L")
        # What the README tells a newcomer to do: source the file, then use the CLI.
        listed = subprocess.run(
            ["bash", "-c", f"source {data_dir / 'dev.env'} && {sys.executable} -P -m shoal "
             "topic list -o json"],
            capture_output=True,
            timeout=60,
            env={k: v for k, v in os.environ.items() if not k.startswith("SHOAL_")},
        )  # fmt: skip
        assert listed.returncode == 0, listed.stderr.decode()
        assert json.loads(listed.stdout) == []
        subprocess.run(
            [
                sys.executable,
                "-P",
                "-m",
                "shoal",
                "topic",
                "create",
                "dev-topic",
                "-F",
                str(properties),
            ],
            check=True,
            capture_output=True,
            timeout=60,
        )
        kcat(properties, "-P", "-t", "dev-topic", stdin=b"one\ntwo\n")
        assert kcat(properties, "-C", "-t", "dev-topic", "-e", "-q") == b"one\ntwo\n"

        second = subprocess.run(
            [sys.executable, "-P", "-m", "shoal", "dev", f"--data-dir={data_dir}",
             f"--port={free_port()}", f"--etcd-port={free_port()}"],
            capture_output=True,
            timeout=60,
        )  # fmt: skip
        assert second.returncode == 1
        assert b"in use by another process" in second.stderr

        children = child_pids(dev.pid)
        assert len(children) == 2, "etcd and one broker"
        dev.send_signal(signal.SIGTERM)
        assert dev.wait(60) == 0
        wait_until(lambda: not any(alive(pid) for pid in children), 10, "children to exit")
        assert (data_dir / "broker-0" / ".kafka_cleanshutdown").exists()
    finally:
        if dev.poll() is None:
            dev.kill()
            dev.wait()

    properties.unlink()
    again = start_dev(data_dir, port, etcd_port)
    try:
        wait_until(properties.exists, 90, "client.properties after restart")
        assert kcat(properties, "-C", "-t", "dev-topic", "-e", "-q") == b"one\ntwo\n"
    finally:
        again.send_signal(signal.SIGINT)
        assert again.wait(60) == 0
