"""A broker's CPU per request, for the small requests a latency-bound load is made of.

    python -m shoal.benchmarks.request_cost [--systems shoal,kafka] [--requests N]
                                            [--runs R] [--keep]

Issue 23's latency and the noisy-neighbour victim's ceiling both come down
to what one small request costs a broker: a record produced with
``acks=all`` and ``linger.ms=0`` at RF=3, then read, is about a dozen
requests and answers between the processes. This benchmark sends one kind
of request at a time to one broker from a raw socket (the frames are
encoded once, eight in flight, so the client costs little) and divides the
broker's CPU time (user and system, every thread) by the requests answered:

- ``ApiVersions`` v3;
- ``Metadata`` v12 for one topic;
- ``Produce`` v9, ``acks=1``, one batch of one 200-byte record (a
  ``linger.ms=0`` producer's request);
- ``Fetch`` v12 of one such batch (a consumer's or follower's read);
- ``Fetch`` v12 at the log end with ``max_wait_ms=0`` (an empty answer).

Shoal runs one broker and etcd; Apache Kafka (``make kafka``) its KRaft
controller and three brokers, measured at the leader of a one-partition,
one-replica topic, after a warm-up of its JIT. Each kind is sent
``--requests`` (20,000) times after a warm-up of 5,000, ``--runs`` (3) times;
the medians are printed. The floor, measured in the same run, is a Python
asyncio server (the broker's kind of loop) answering each frame with four
bytes: what any request costs such a server before it does any work. Each
figure is also given as a ratio to the floor and to Kafka's. The machine's
limits (``../shared/tools/limits``) are printed beside them; the JSON
lands in ``benchmarks/results/``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Final

from confluent_kafka.admin import AdminClient, NewTopic
from shoal.benchmarks.apache_kafka import ApacheKafka
from shoal.benchmarks.common import (
    GatewayProcess,
    LocalCluster,
    cpu_seconds,
    create_tenant,
    free_port,
    measure_limits,
    write_results,
)

from shoal.records.records import NewRecord, build_batch
from shoal.wire import ApiSchema, schema
from shoal.wire.codec import encode_request

SYSTEMS: Final = ("shoal", "shoal-gw", "kafka")
TENANT: Final = "bench"
TOPIC: Final = "request-cost"
IN_FLIGHT: Final = 8
"""Requests sent before the first answer is awaited, by default (``--in-flight``)."""
WARM_UP: Final = 5_000
KAFKA_WARM_UP: Final = 60_000
"""Kafka's JIT compiles its hot paths after some thousands of calls."""
VALUE_BYTES: Final = 200
CLIENT_ID: Final = "request-cost"

ECHO_SERVER: Final = """
import asyncio, struct, sys

class Echo(asyncio.Protocol):
    def connection_made(self, transport):
        self.transport, self.buffer = transport, bytearray()

    def data_received(self, data):
        self.buffer += data
        while len(self.buffer) >= 4:
            (size,) = struct.unpack_from(">i", self.buffer)
            if len(self.buffer) < 4 + size:
                break
            correlation = bytes(self.buffer[8:12])
            del self.buffer[: 4 + size]
            self.transport.write(b"\\0\\0\\0\\4" + correlation)

async def main():
    server = await asyncio.get_running_loop().create_server(Echo, "127.0.0.1", int(sys.argv[1]))
    print("ready", flush=True)
    await server.serve_forever()

asyncio.run(main())
"""
"""The floor: an asyncio server that answers each frame with its correlation id."""


@dataclass(frozen=True, slots=True)
class Kind:
    name: str
    frame: Callable[[], bytes]


def _frames(sock: socket.socket) -> Iterator[bytes]:
    """Each frame the socket delivers (without its size), until it closes."""
    buffer = bytearray()
    while True:
        chunk = sock.recv(1 << 20)
        if not chunk:
            return
        buffer += chunk
        start = 0
        while len(buffer) - start >= 4:
            (size,) = struct.unpack_from(">i", buffer, start)
            if len(buffer) - start < 4 + size:
                break
            yield bytes(buffer[start + 4 : start + 4 + size])
            start += 4 + size
        del buffer[:start]


@dataclass(frozen=True, slots=True)
class Target:
    """Where the requests go, what signs a connection in, and whose CPU counts."""

    address: str
    pids: dict[str, int]
    warm_up: int
    login: tuple[bytes, ...] = ()
    """Frames sent one at a time, each answered, before the measured ones (SASL)."""


class Connection:
    """A connection to ``target``, signed in (its login's cost is left out of every figure)."""

    def __init__(self, target: Target, in_flight: int = IN_FLIGHT) -> None:
        self.in_flight = in_flight
        host, port = target.address.rsplit(":", 1)
        self.address = target.address
        self.sock = socket.create_connection((host, int(port)), timeout=60)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.answers = _frames(self.sock)
        for step in target.login:
            self.sock.sendall(step)
            _check_login_answer(next(self.answers))

    def close(self) -> None:
        self.sock.close()

    def drive(self, frame: bytes, count: int) -> float:
        """Send ``frame`` ``count`` times, ``in_flight`` at a time; the seconds it took."""
        started = time.perf_counter()
        sent = min(self.in_flight, count)
        self.sock.sendall(frame * sent)
        answered = 0
        for _ in self.answers:
            answered += 1
            if sent < count:
                self.sock.sendall(frame)
                sent += 1
            if answered == count:
                return time.perf_counter() - started
        raise RuntimeError(f"{self.address} closed the connection after {answered} of {count}")


def _check_login_answer(frame: bytes) -> None:
    # SaslHandshake v1 and SaslAuthenticate v2 both begin with an int16 error code
    # after the correlation id (neither has a flexible response header).
    (code,) = struct.unpack_from(">h", frame, 4)
    if code != 0:
        raise RuntimeError(f"the gateway refused the benchmark's login: error {code}")


def sasl_plain(username: str, password: str) -> tuple[bytes, ...]:
    handshake, authenticate = schema(17, 1), schema(36, 2)
    token = b"\0" + username.encode() + b"\0" + password.encode()
    return (
        _frame(handshake, handshake.request(mechanism="PLAIN")),
        _frame(authenticate, authenticate.request(auth_bytes=token)),
    )


def request_kinds(topic: str) -> list[Kind]:
    """The requests measured, as whole frames (the correlation id never changes: the
    client counts answers, it does not match them)."""
    versions, metadata, produce, fetch = schema(18, 3), schema(3, 12), schema(0, 9), schema(1, 12)
    batch = build_batch([NewRecord(None, b"v" * VALUE_BYTES)])

    def fetch_at(offset: int, max_bytes: int) -> bytes:
        partition = fetch.make_request(
            "FetchPartition",
            partition=0,
            current_leader_epoch=-1,
            fetch_offset=offset,
            last_fetched_epoch=-1,
            log_start_offset=-1,
            partition_max_bytes=max_bytes,
        )
        body = fetch.request(
            replica_id=-1,
            max_wait=timedelta(0),
            min_bytes=0,
            max_bytes=max_bytes,
            isolation_level=0,
            session_id=0,
            session_epoch=-1,
            topics=(fetch.make_request("FetchTopic", topic=topic, partitions=(partition,)),),
            forgotten_topics_data=(),
            rack_id="",
        )
        return _frame(fetch, body)

    produce_body = produce.request(
        transactional_id=None,
        acks=1,
        timeout=timedelta(seconds=30),
        topic_data=(
            produce.make_request(
                "TopicProduceData",
                name=topic,
                partition_data=(
                    produce.make_request("PartitionProduceData", index=0, records=batch),
                ),
            ),
        ),
    )
    metadata_body = metadata.request(
        topics=(metadata.make_request("MetadataRequestTopic", name=topic, topic_id=None),),
        allow_auto_topic_creation=False,
        include_topic_authorized_operations=False,
    )
    versions_body = versions.request(client_software_name=CLIENT_ID, client_software_version="1")
    return [
        Kind("ApiVersions v3", lambda: _frame(versions, versions_body)),
        Kind("Metadata v12, 1 topic", lambda: _frame(metadata, metadata_body)),
        Kind("Produce v9, acks=1, 1 record", lambda: _frame(produce, produce_body)),
        # The log holds the warm-up's and the runs' single-record batches by then:
        # a budget of one batch reads exactly one.
        Kind("Fetch v12, 1 batch", lambda: fetch_at(1_000, len(batch))),
        Kind("Fetch v12, empty (log end)", lambda: fetch_at(10**12, 1 << 20)),
    ]


def _frame(api: ApiSchema, body: Any) -> bytes:
    return bytes(encode_request(api, 1, CLIENT_ID, body))


def measure(
    target: Target, frame: bytes, requests: int, runs: int, in_flight: int = IN_FLIGHT
) -> dict[str, Any]:
    """Each process's CPU per request (median over ``runs``), and requests a second."""
    connection = Connection(target, in_flight)
    try:
        connection.drive(frame, target.warm_up)
        cpu_us: dict[str, list[float]] = {name: [] for name in target.pids}
        rates = []
        for _ in range(runs):
            before = {name: cpu_seconds(pid) for name, pid in target.pids.items()}
            seconds = connection.drive(frame, requests)
            for name, pid in target.pids.items():
                cpu_us[name].append(1e6 * (cpu_seconds(pid) - before[name]) / requests)
            rates.append(requests / seconds)
    finally:
        connection.close()
    return {
        "cpu_us": {name: statistics.median(runs) for name, runs in cpu_us.items()},
        "cpu_us_runs": cpu_us,
        "requests_per_s": statistics.median(rates),
    }


def _create_topic(bootstrap: str, name: str = TOPIC) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, 1, 1)])[name].result(60)


def _kafka_leader(kafka: ApacheKafka) -> Target:
    """The broker leading the topic's one partition."""
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
    for _ in range(100):
        topic = admin.list_topics(TOPIC, timeout=10).topics.get(TOPIC)
        if topic is not None and topic.partitions and topic.partitions[0].leader >= 0:
            leader = topic.partitions[0].leader
            node = next(b for b in kafka.brokers if b.node_id == leader)
            assert node.process is not None
            return Target(node.address, {"broker": node.process.pid}, KAFKA_WARM_UP)
        time.sleep(0.1)
    raise RuntimeError(f"no leader for {TOPIC} on Apache Kafka")


def run_system(
    system: str, root: Path, kinds: list[Kind], args: argparse.Namespace
) -> dict[str, Any]:
    with ExitStack() as stack:
        if system == "kafka":
            kafka = stack.enter_context(ApacheKafka(root / "kafka"))
            _create_topic(kafka.bootstrap)
            target = _kafka_leader(kafka)
        else:
            cluster = stack.enter_context(LocalCluster(root / system, brokers=1))
            broker = {"broker": cluster.broker_pid}
            if system == "shoal":
                _create_topic(cluster.bootstrap)
                target = Target(cluster.address(0), broker, WARM_UP)
            else:
                key_id, secret = create_tenant(cluster.etcd_url, TENANT)
                _create_topic(cluster.bootstrap, f"{TENANT}.{TOPIC}")
                gateway = stack.enter_context(
                    GatewayProcess(root / system, cluster.etcd_url, cluster.bootstrap, 1)
                )
                target = Target(
                    gateway.bootstrap,
                    {"gateway": gateway.pid, **broker},
                    WARM_UP,
                    sasl_plain(key_id, secret),
                )
        figures = {}
        for kind in kinds:
            figures[kind.name] = measure(
                target, kind.frame(), args.requests, args.runs, args.in_flight
            )
            spent = ", ".join(
                f"{name} {us:.1f} us" for name, us in figures[kind.name]["cpu_us"].items()
            )
            print(f"{system:8s} {kind.name:32s} {spent}", flush=True)
        return figures


def floor(args: argparse.Namespace) -> dict[str, Any]:
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-c", ECHO_SERVER, str(port)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert server.stdout is not None
        server.stdout.readline()
        frame = request_kinds(TOPIC)[0].frame()
        target = Target(f"127.0.0.1:{port}", {"echo": server.pid}, WARM_UP)
        return measure(target, frame, args.requests, args.runs, args.in_flight)
    finally:
        server.terminate()
        server.wait(10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument("--requests", type=int, default=20_000, help="of each kind, each run")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument(
        "--in-flight",
        type=int,
        default=IN_FLIGHT,
        help="requests sent before waiting for an answer (1: every request wakes the server)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = parser.parse_args()
    systems = [s for s in args.systems.split(",") if s]
    if unknown := set(systems) - set(SYSTEMS):
        parser.error(f"unknown systems {sorted(unknown)}; choose from {', '.join(SYSTEMS)}")
    root = Path(tempfile.mkdtemp(prefix="shoal-bench-", dir=os.environ.get("SHOAL_BENCH_DIR")))
    keep = args.keep
    kinds = request_kinds(TOPIC)
    try:
        limits = measure_limits(root)
        base = floor(args)
        print(f"floor    {'asyncio echo':32s} {base['cpu_us']['echo']:.1f} us", flush=True)
        results = {}
        for system in systems:
            (root / system).mkdir()
            results[system] = run_system(system, root, kinds, args)
    except BaseException:
        keep = True
        raise
    finally:
        if keep:
            print(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    _report(kinds, results, base, limits, args)
    write_results(
        "request_cost",
        {
            "limits": limits,
            "floor": base,
            "results": results,
            "requests": args.requests,
            "runs": args.runs,
            "in_flight": args.in_flight,
        },
    )


def _report(
    kinds: list[Kind],
    results: dict[str, dict[str, Any]],
    base: dict[str, Any],
    limits: dict[str, float],
    args: argparse.Namespace,
) -> None:
    floor_us = base["cpu_us"]["echo"]
    print(
        f"\nCPU per request, us (median of {args.runs} runs of {args.requests:,},"
        f" {args.in_flight} in flight);"
        f" floor: an asyncio server answering each frame, {floor_us:.1f} us"
    )
    columns = [
        ("shoal", "broker", "shoal"),
        ("kafka", "broker", "kafka"),
        ("shoal-gw", "gateway", "gateway"),
        ("shoal-gw", "broker", "behind gw"),
    ]
    shown = [c for c in columns if c[0] in results]
    print(f"{'request':32s}" + "".join(f" {title:>10s} {'/ floor':>8s}" for *_, title in shown))
    for kind in kinds:
        line = f"{kind.name:32s}"
        for system, process, _ in shown:
            us = results[system][kind.name]["cpu_us"][process]
            line += f" {us:10.1f} {us / floor_us:8.1f}"
        print(line)
    if "shoal" in results and "kafka" in results:
        print("\nshoal's broker / kafka's broker, CPU per request:")
        for kind in kinds:
            shoal = results["shoal"][kind.name]["cpu_us"]["broker"]
            kafka = results["kafka"][kind.name]["cpu_us"]["broker"]
            print(f"{kind.name:32s} {shoal / kafka:6.2f}")
    print(f"\nmachine limits: {limits}")


if __name__ == "__main__":
    main()
