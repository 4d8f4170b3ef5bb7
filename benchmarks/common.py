"""What the benchmarks share: a local cluster, the machine's limits, process CPU time."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from shoal.etcd_process import etcd_command

HERE = Path(__file__).resolve().parent
LIMITS = Path(os.environ.get("SHOAL_LIMITS", HERE.parent.parent / "shared" / "tools" / "limits"))


def cpu_seconds(pid: int | None) -> float:
    """User plus system CPU time of a process, from /proc."""
    if pid is None:
        return float("nan")
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def measure_limits(directory: Path) -> dict[str, float]:
    if not LIMITS.exists():
        print(f"note: {LIMITS} not found; figures are printed without ratios", file=sys.stderr)
        return {}
    output = subprocess.run(
        [sys.executable, str(LIMITS), "--dir", str(directory), "--mb", "1024"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return {k: float(v) for k, v in json.loads(output).items() if isinstance(v, int | float)}


class LocalCluster:
    """etcd and one broker as child processes, for a benchmark run."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.port = free_port()
        self.processes: list[subprocess.Popen[bytes]] = []

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def broker_pid(self) -> int:
        return self.processes[-1].pid

    def __enter__(self) -> LocalCluster:
        client, peer = free_port(), free_port()
        with open(self.root / "etcd.log", "ab") as log:
            etcd = etcd_command(self.root / "etcd", client, peer)
            self.processes.append(subprocess.Popen(etcd, stdout=log, stderr=log))
        broker_log = self.root / "broker.log"
        with open(broker_log, "ab") as out:
            self.processes.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        "-P",
                        "-m",
                        "shoal",
                        "broker",
                        f"--data-dir={self.root / 'broker'}",
                        f"--listen={self.bootstrap}",
                        f"--etcd=http://127.0.0.1:{client}",
                    ],
                    stdout=out,
                    stderr=out,
                    # One broker: the offsets topic cannot have three replicas.
                    env={**os.environ, "SHOAL_OFFSETS_TOPIC_REPLICATION_FACTOR": "1"},
                )
            )
        deadline = time.monotonic() + 60
        while b"event=broker_ready" not in broker_log.read_bytes():
            if time.monotonic() > deadline or self.processes[-1].poll() is not None:
                raise RuntimeError(f"broker did not start:\n{broker_log.read_text()[-3000:]}")
            time.sleep(0.1)
        return self

    def __exit__(self, *exc: object) -> None:
        for process in reversed(self.processes):
            process.terminate()
            process.wait(30)
