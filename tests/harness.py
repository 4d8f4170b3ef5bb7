"""Real processes for tests: etcd and brokers on loopback, started and killed for real.

Each broker runs as ``python -m shoal broker`` with its output in a log file
next to its data, which failing tests print.
"""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path

import zygote

from shoal.etcd_process import etcd_command

READY_EVENT = "event=broker_ready"

# JVM flags for the Spark drivers tests start: each runs seconds of work on a few
# thousand records, which C2's compiler threads and G1's workers never pay back.
# Measured on a SparkSession start plus a small job: 37 s of CPU down to 21 s.
SHORT_LIVED_SPARK_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


_handed_out: set[int] = set()
"""Ports this process has handed out: free until their owner starts, so a
later block must not take them again (a test asks for several blocks before
it starts anything, and two of them once overlapped)."""


def free_port_block(size: int) -> int:
    """A port with the ``size - 1`` ports after it free too (bootstrap + per-broker ports).

    Blocks come from below the kernel's ephemeral range: a port in that range
    that is free now can be handed to any outgoing connection a moment later,
    and a process told to listen on it then fails to start. A block never
    overlaps one handed out before by this process.
    """
    low, _ = _ephemeral_range()
    floor = 10_000 if low > 12_000 else 1024
    for _ in range(500):
        base = random.randrange(floor, low - size)
        if _handed_out.intersection(range(base, base + size)):
            continue
        sockets = []
        try:
            for port in range(base, base + size):
                s = socket.socket()
                sockets.append(s)
                s.bind(("127.0.0.1", port))
            _handed_out.update(range(base, base + size))
            return base
        except OSError:
            continue
        finally:
            for s in sockets:
                s.close()
    raise RuntimeError(f"no free block of {size} ports below {low}")


def free_port() -> int:
    return free_port_block(1)


ShoalProcess = subprocess.Popen[bytes] | zygote.ZygoteChild
"""A ``shoal`` command's process: forked by this test process's zygote, or spawned."""

_ZYGOTE_LOGS = Path(tempfile.gettempdir()) / "shoal-test-zygotes"


def launch(command: Sequence[str], env: Mapping[str, str], log_path: Path) -> ShoalProcess:
    """Start ``command`` with its output appended to ``log_path``: a ``python -m shoal``
    command from the zygote (:mod:`zygote`), which has its modules imported already,
    anything else (a network namespace's ``ip netns exec``) as a new process."""
    if list(command[:3]) == [sys.executable, "-m", "shoal"] and zygote.enabled():
        return zygote.zygote(_ZYGOTE_LOGS).spawn(["shoal", *command[3:]], env, Path.cwd(), log_path)
    with open(log_path, "ab") as log:
        return subprocess.Popen(list(command), stdout=log, stderr=log, env=dict(env))


def wait_until(predicate, timeout: float, what: str, interval: float = 0.05):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout}s waiting for {what}")


def etcd_healthy(url: str) -> bool:
    """Whether the etcd at ``url`` answers its /health as healthy."""
    import json
    import urllib.request

    try:
        with urllib.request.urlopen(f"{url}/health", timeout=1) as response:
            return bool(json.loads(response.read()).get("health") == "true")
    except OSError:
        return False


class EtcdServer:
    """One etcd for the whole test session; clusters use their own chroot in it."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.client_port = free_port()
        self.peer_port = free_port()
        self.log_path = directory / "etcd.log"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.client_port}"

    def start(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                etcd_command(self.directory / "data", self.client_port, self.peer_port),
                stdout=log,
                stderr=log,
            )
        wait_until(self._healthy, 30, "etcd to become healthy")

    def _healthy(self) -> bool:
        assert self.process is not None
        if self.process.poll() is not None:
            raise RuntimeError(f"etcd exited: {self.log_path.read_text()[-2000:]}")
        return etcd_healthy(self.url)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(10)

    def chroot_url(self) -> str:
        return f"{self.url}/t-{uuid.uuid4().hex[:12]}"


class BrokerProcess:
    """A `shoal broker` child process."""

    def __init__(
        self,
        etcd_url: str,
        data_dir: Path,
        node_id: int = 0,
        port: int | None = None,
        extra_args: Sequence[str] = (),
        env: dict[str, str] | None = None,
    ) -> None:
        self.etcd_url = etcd_url
        self.data_dir = data_dir
        self.node_id = node_id
        self.port = port or free_port()
        self.extra_args = list(extra_args)
        self.env = env or {}
        self.log_path = data_dir.parent / f"{data_dir.name}.log"
        self.process: ShoalProcess | None = None
        self._ready_offset = 0

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "shoal",
            "broker",
            f"--node-id={self.node_id}",
            f"--data-dir={self.data_dir}",
            f"--listen=127.0.0.1:{self.port}",
            f"--etcd={self.etcd_url}",
            *self.extra_args,
        ]

    def start(self, timeout: float = 60) -> BrokerProcess:
        """Launch the process and wait until it is ready (also a restart after kill or stop)."""
        self.launch()
        return self.wait_ready(timeout)

    def launch(self) -> BrokerProcess:
        """Spawn the process without waiting; :meth:`wait_ready` waits.

        Apart, so that a cluster's brokers import and start side by side (about
        two seconds of CPU each) rather than one after another: see :func:`start_all`.
        """
        # Readiness is looked for only after this point: an earlier run's
        # broker_ready line in the same log must not count.
        self._ready_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        env = {
            **os.environ,
            "PYTHONUNBUFFERED": "1",
            # Test clusters have fewer brokers than Kafka's default three offsets replicas.
            "SHOAL_OFFSETS_TOPIC_REPLICATION_FACTOR": "1",
            **self.env,
        }
        self.process = launch(self.command(), env, self.log_path)
        return self

    def wait_ready(self, timeout: float = 60) -> BrokerProcess:
        """Wait for the broker_ready line the last :meth:`launch` logs."""
        offset = self._ready_offset
        wait_until(lambda: self._ready(offset), timeout, f"broker {self.node_id} to be ready")
        return self

    def _ready(self, offset: int) -> bool:
        assert self.process is not None
        if self.process.poll() is not None:
            raise RuntimeError(f"broker exited with {self.process.returncode}:\n{self.log_tail()}")
        with open(self.log_path, "rb") as log:
            log.seek(offset)
            return READY_EVENT.encode() in log.read()

    def log_text(self) -> str:
        """The broker's whole log, for tests that look for an event in it."""
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def log_tail(self, chars: int = 4000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:] if self.log_path.exists() else ""

    def stop(self, timeout: float = 30) -> int:
        """SIGTERM and wait: a clean shutdown."""
        assert self.process is not None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout)

    def kill(self) -> None:
        """SIGKILL: no chance to flush, checkpoint or deregister."""
        assert self.process is not None
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(10)

    def pause(self) -> None:
        """SIGSTOP: alive but silent (no fetches, no lease renewals) until :meth:`resume`."""
        assert self.process is not None
        self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGCONT)

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None


def start_all(brokers: Sequence[BrokerProcess], timeout: float = 60) -> list[BrokerProcess]:
    """Launch every broker, then wait for each: a cluster starts in the time of its
    slowest broker, not the sum of them. Brokers do not wait for each other to
    become ready (each registers in etcd on its own), so the order is free.

    If one never becomes ready, all are killed before the error propagates, so no
    process outlives a fixture that never got them.
    """
    try:
        for broker in brokers:
            broker.launch()
        for broker in brokers:
            broker.wait_ready(timeout)
    except BaseException:
        for broker in brokers:
            if broker.running:
                broker.kill()
        raise
    return list(brokers)
