"""What the benchmarks share: local brokers, a gateway and a tenant, machine limits, CPU time."""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaError, Producer
from shoal.tenancy.acl import default_bindings
from shoal.tenancy.model import ApiKey, Quotas, Tenant
from shoal.tenancy.secrets import hash_secret, new_key_id, new_secret
from shoal.tenancy.store import TenancyStore

from shoal.etcd_process import etcd_command

HERE = Path(__file__).resolve().parent
STOP_TIMEOUT_S = 20.0
"""How long brokers and the gateway may take to stop on SIGTERM before they are killed."""
GATEWAY_READY_EVENT = b"event=gateway_ready"
LIMITS = Path(os.environ.get("SHOAL_LIMITS", HERE.parent.parent / "shared" / "tools" / "limits"))


def cpu_seconds(pid: int | None) -> float:
    """User plus system CPU time of a process, from /proc."""
    if pid is None:
        return float("nan")
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _ephemeral_floor() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port_block(size: int) -> int:
    """A port with the ``size - 1`` ports after it free too (bootstrap + one per broker).

    From below the kernel's ephemeral range: a free port inside it can become
    an outgoing connection's local port before the server meant for it binds.
    """
    floor = _ephemeral_floor()
    for _ in range(500):
        base = random.randrange(10_000 if floor > 12_000 else 1024, floor - size)
        sockets: list[socket.socket] = []
        try:
            for port in range(base, base + size):
                s = socket.socket()
                sockets.append(s)
                s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for s in sockets:
                s.close()
    raise RuntimeError(f"no free block of {size} ports below {floor}")


def free_port() -> int:
    return free_port_block(1)


def produce_flat_out(
    producer: Producer, topic: str, value: bytes, records: int
) -> tuple[float, list[float]]:
    """Produce ``records`` copies of ``value`` as fast as the client takes them.

    Returns the seconds until the last acknowledgement and each record's
    latency from produce() to its delivery report; RuntimeError if any
    record failed or was still undelivered after two minutes.
    """
    latencies: list[float] = []
    failures: list[str] = []

    def delivered(err: KafkaError | None, _msg: Any, sent: float) -> None:
        if err is not None:
            failures.append(err.str())
        else:
            latencies.append(time.perf_counter() - sent)

    started = time.perf_counter()
    for _ in range(records):
        sent = time.perf_counter()
        produce_waiting(producer, topic, value, on_delivery=lambda e, m, s=sent: delivered(e, m, s))
    elapsed = flush_or_raise(producer, failures, started)
    return elapsed, latencies


def produce_waiting(producer: Producer, topic: str, value: bytes, **kwargs: Any) -> None:
    """produce(), waiting while the client's queue is full, then serving callbacks."""
    while True:
        try:
            producer.produce(topic, value, **kwargs)
            break
        except BufferError:
            producer.poll(0.001)
    producer.poll(0)


def flush_or_raise(producer: Producer, failures: list[str], started: float) -> float:
    """Seconds from ``started`` to the last acknowledgement; RuntimeError if any record
    failed or was still undelivered after two minutes."""
    remaining = producer.flush(120)
    elapsed = time.perf_counter() - started
    if failures or remaining:
        raise RuntimeError(f"{len(failures)} failed, {remaining} undelivered: {failures[:3]}")
    return elapsed


def write_results(name: str, document: Any) -> None:
    """Write a benchmark's JSON to ``benchmarks/results/<name>-<time>.json`` (not
    committed) and say where."""
    out = HERE / "results" / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(document, indent=2))
    print(f"wrote {out}")


def measure_limits(directory: Path, mb: int = 1024) -> dict[str, float]:
    """The machine's ceilings (``shared/tools/limits``), ``mb`` MiB per disk test."""
    if not LIMITS.exists():
        print(f"note: {LIMITS} not found; figures are printed without ratios", file=sys.stderr)
        return {}
    output = subprocess.run(
        [sys.executable, str(LIMITS), "--dir", str(directory), "--mb", str(mb)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return {k: float(v) for k, v in json.loads(output).items() if isinstance(v, int | float)}


class CpuMeter:
    """Shares of one core that processes used since the last ``lap``."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = pids
        self._start = self._sample()

    def _sample(self) -> tuple[float, dict[str, float]]:
        return time.perf_counter(), {name: cpu_seconds(pid) for name, pid in self.pids.items()}

    def lap(self) -> dict[str, float]:
        (t0, before), (t1, after) = self._start, self._sample()
        self._start = (t1, after)
        return {name: (after[name] - before[name]) / (t1 - t0) for name in self.pids}


class LocalCluster:
    """etcd and N brokers as child processes, for a benchmark run.

    Broker ``i`` has node id ``i``, listens on its own loopback port, keeps
    its data in ``root/broker-i`` and logs to ``root/broker-i.log``. It can be
    killed with SIGKILL and started again with the same id, port and data
    directory, as a crashed machine that comes back. ``env`` is added to every
    broker's environment (``SHOAL_*`` settings); by default
    ``__consumer_offsets`` has as many replicas as there are brokers, up to
    Kafka's three. Leaving the ``with`` block stops the brokers (SIGTERM, all
    at once), then etcd.
    """

    def __init__(self, root: Path, brokers: int = 1, env: dict[str, str] | None = None) -> None:
        self.root = root
        self.ports = [free_port() for _ in range(brokers)]
        self.env = {"SHOAL_OFFSETS_TOPIC_REPLICATION_FACTOR": str(min(brokers, 3)), **(env or {})}
        self.etcd_url = ""
        self.etcd: subprocess.Popen[bytes] | None = None
        self.brokers: list[subprocess.Popen[bytes] | None] = [None] * brokers

    @property
    def bootstrap(self) -> str:
        """Every broker's address, dead or alive: clients try them in turn."""
        return ",".join(self.address(i) for i in range(len(self.ports)))

    def live_bootstrap(self) -> str:
        return ",".join(self.address(i) for i in range(len(self.ports)) if self.running(i))

    def address(self, node: int) -> str:
        return f"127.0.0.1:{self.ports[node]}"

    @property
    def broker_pid(self) -> int:
        """The first broker's process id (the only one's, in a one-broker cluster)."""
        return self.pid(0)

    def pid(self, node: int) -> int:
        process = self.brokers[node]
        assert process is not None
        return process.pid

    def log_path(self, node: int) -> Path:
        return self.root / f"broker-{node}.log"

    def running(self, node: int) -> bool:
        process = self.brokers[node]
        return process is not None and process.poll() is None

    def __enter__(self) -> LocalCluster:
        client, peer = free_port(), free_port()
        self.etcd_url = f"http://127.0.0.1:{client}"
        with open(self.root / "etcd.log", "ab") as log:
            etcd = etcd_command(self.root / "etcd", client, peer)
            self.etcd = subprocess.Popen(etcd, stdout=log, stderr=log)
        try:
            offsets = [self._spawn(i) for i in range(len(self.ports))]
            for node, offset in enumerate(offsets):
                self._wait_ready(node, offset)
        except BaseException:
            self.__exit__()
            raise
        return self

    def start(self, node: int) -> None:
        """Start broker ``node`` (again) and wait until its log says it is ready."""
        self._wait_ready(node, self._spawn(node))

    def kill(self, node: int) -> None:
        """SIGKILL: no flush, no checkpoint, no controlled shutdown, no deregistration."""
        process = self.brokers[node]
        assert process is not None
        process.kill()
        process.wait(10)

    def _spawn(self, node: int) -> int:
        """Start broker ``node``; returns the size its log had, where this start's lines begin."""
        log_path = self.log_path(node)
        offset = log_path.stat().st_size if log_path.exists() else 0
        with open(log_path, "ab") as out:
            self.brokers[node] = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "shoal",
                    "broker",
                    f"--node-id={node}",
                    f"--data-dir={self.root / f'broker-{node}'}",
                    f"--listen={self.address(node)}",
                    f"--etcd={self.etcd_url}",
                ],
                stdout=out,
                stderr=out,
                env={**os.environ, "PYTHONUNBUFFERED": "1", **self.env},
            )
        return offset

    def _wait_ready(self, node: int, offset: int, timeout: float = 60) -> None:
        log_path = self.log_path(node)
        deadline = time.monotonic() + timeout
        while True:
            with open(log_path, "rb") as log:
                log.seek(offset)
                if b"event=broker_ready" in log.read():
                    return
            if time.monotonic() > deadline or not self.running(node):
                tail = log_path.read_text(errors="replace")[-3000:]
                raise RuntimeError(f"broker {node} did not start:\n{tail}")
            time.sleep(0.1)

    def __exit__(self, *exc: object) -> None:
        running = [n for n in range(len(self.brokers)) if self.running(n)]
        for node in running:
            process = self.brokers[node]
            assert process is not None
            process.terminate()
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for node in running:
            process = self.brokers[node]
            assert process is not None
            try:
                process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                print(
                    f"note: broker {node} still running {STOP_TIMEOUT_S:.0f} s after SIGTERM;"
                    f" killed (see {self.log_path(node)})",
                    file=sys.stderr,
                )
                process.kill()
                process.wait(10)
        if self.etcd is not None:
            self.etcd.terminate()
            self.etcd.wait(30)


def create_tenant(etcd_url: str, name: str) -> tuple[str, str]:
    """A tenant with no quotas and a key with the default bindings: (key id, secret)."""

    async def go() -> tuple[str, str]:
        async with TenancyStore(etcd_url) as store:
            now_ms = int(time.time() * 1000)
            await store.create_tenant(Tenant(name, now_ms, Quotas()))
            key_id, secret = new_key_id(), new_secret()
            await store.add_key(
                ApiKey(key_id, name, hash_secret(secret), now_ms), default_bindings(name, key_id)
            )
            return key_id, secret

    return asyncio.run(go())


class GatewayProcess:
    """``shoal gateway`` as a child process; broker n is at its port + 1 + n."""

    def __init__(
        self, root: Path, etcd_url: str, upstream: str, brokers: int, metrics: bool = False
    ) -> None:
        self.port = free_port_block(brokers + 1)
        self.http_port = free_port_block(1)
        self.metrics_port = free_port_block(1) if metrics else None
        """Where the gateway serves its Prometheus metrics, if asked to."""
        self.log_path = root / "gateway.log"
        self.command = [
            sys.executable, "-m", "shoal", "gateway",
            f"--etcd={etcd_url}",
            f"--listen=127.0.0.1:{self.port}",
            f"--http-listen=127.0.0.1:{self.http_port}",
            f"--upstream={upstream}",
            "--gateway-id=bench",
        ]  # fmt: skip
        if self.metrics_port is not None:
            self.command.append(f"--metrics-listen=127.0.0.1:{self.metrics_port}")
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def __enter__(self) -> GatewayProcess:
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                self.command,
                stdout=log,
                stderr=log,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        deadline = time.monotonic() + 60
        while GATEWAY_READY_EVENT not in self.log_path.read_bytes():
            if time.monotonic() > deadline or self.process.poll() is not None:
                self.__exit__()
                tail = self.log_path.read_text(errors="replace")[-3000:]
                raise RuntimeError(f"the gateway did not start:\n{tail}")
            time.sleep(0.1)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            print(f"note: gateway still running {STOP_TIMEOUT_S:.0f} s after SIGTERM; killed")
            self.process.kill()
            self.process.wait(10)
