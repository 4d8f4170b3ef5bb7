"""One client role in its own process: ``python -m shoal.benchmarks.suite.worker SPEC-JSON``.

The suite starts workers rather than threads so that clients never share an
interpreter lock with each other or with the suite, as separate
applications would not. A worker waits until ``start_at`` (a wall-clock
time, so that several workers begin together), runs its role (a producer
first sends ``warmup`` unmeasured records with the same client), and
prints one JSON line:
the result (``shoal.cli.loadgen``'s fields), its wall-clock start and end, and
the CPU seconds the worker used during the measured run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import time
from collections.abc import Callable
from functools import partial
from types import ModuleType
from typing import Any

from shoal.cli import loadgen

SPREAD = {"sticky.partitioning.linger.ms": 0}
"""librdkafka sends each keyless record to a random partition instead of filling
one partition's batch at a time: many small batches, as many independent writers make."""
LINGER_MS = 5
"""librdkafka's default, in every workload: batches wait up to 5 ms to fill. The
latency workload keeps it too: half of the maximum rate was measured with it,
and without it every record is a request of its own, a load the maximum never
saw (Shoal RF=1 at 124,000 records/s: p50 1.7 s). A spec's ``linger_ms`` replaces it
(the latency workload's third measure, at a modest rate, sets 0)."""


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _kafka(spec: dict[str, Any], records: int) -> loadgen.Throughput:
    connection = spec["target"]["connection"]
    client = connection["client"]
    producer = {**connection["producer"], "linger.ms": spec.get("linger_ms", LINGER_MS)}
    if spec.get("spread"):
        producer.update(SPREAD)
    topic, size = spec["topic"], spec["size"]
    match spec["role"]:
        case "produce":
            return loadgen.produce(
                {**client, **producer}, topic, records, size, spec.get("rate"),
                run_id=_run_id(spec), warmup_records=spec.get("warmup", 0),
            )  # fmt: skip
        case "consume":
            return loadgen.consume(client, topic, records, spec.get("group"))
        case "read-latencies":
            run_id = _run_id(spec)
            assert run_id is not None
            return loadgen.read_latencies(client, topic, run_id, records, size, on_ready=_ready)
    raise ValueError(spec["role"])


def _peer(client: Any, spec: dict[str, Any], records: int) -> loadgen.Throughput:
    connection = spec["target"]["connection"]
    topic, size = spec["topic"], spec["size"]
    match spec["role"]:
        case "produce":
            run = client.produce(
                connection, topic, spec.get("partitions", 1), records, size, spec.get("rate"),
                _run_id(spec), spec.get("warmup", 0),
            )  # fmt: skip
        case "consume":
            run = client.consume(connection, topic, records, spec.get("group"))
        case "read-latencies":
            run = client.read_latencies(connection, topic, _run_id(spec), records, size, _ready)
        case _:
            raise ValueError(spec["role"])
    result: loadgen.Throughput = asyncio.run(run)
    return result


def _run_id(spec: dict[str, Any]) -> bytes | None:
    return bytes.fromhex(spec["run_id"]) if spec.get("run_id") else None


_marks: dict[str, float] = {}
"""Wall-clock moments a run reports besides its start and end."""


def _ready() -> None:
    """A latency reader is at the end of the topic: its producer may start."""
    _marks["ready_at"] = time.time()


def _http(http_client: ModuleType, spec: dict[str, Any], records: int) -> loadgen.Throughput:
    run = http_client.produce(
        spec["target"]["connection"], spec["topic"], records, spec["size"], spec.get("warmup", 0)
    )
    result: loadgen.Throughput = asyncio.run(run)
    return result


def _runner(spec: dict[str, Any]) -> Callable[[dict[str, Any], int], loadgen.Throughput]:
    """What runs the role, with its client imported.

    A peer's client (nats, redis, httpx) is imported by the workers that use it
    only: the three were most of every worker's start-up, about a second of
    CPU, and a workload starts up to ten workers at once on the machine it
    measures. :func:`run` calls this before its measured run, which the
    imports stay out of.
    """
    if spec["role"].startswith("http-"):
        from shoal.benchmarks.suite import http_client

        return partial(_http, http_client)
    if spec["target"]["kind"] == "kafka":
        return _kafka
    if spec["target"]["kind"] == "nats":
        from shoal.benchmarks.suite import nats_client

        return partial(_peer, nats_client)
    from shoal.benchmarks.suite import redis_client

    return partial(_peer, redis_client)


def run(spec: dict[str, Any]) -> dict[str, Any]:
    do = _runner(spec)
    start_at = spec.get("start_at")
    if start_at is not None:
        time.sleep(max(0.0, start_at - time.time()))
    cpu, wall_start = _cpu_seconds(), time.time()
    result = do(spec, spec["records"])
    wall_end = time.time()
    return {
        "result": result.as_dict(),
        "wall_start": wall_start,
        "wall_end": wall_end,
        "cpu_seconds": _cpu_seconds() - cpu,
        **_marks,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("spec", metavar="SPEC-JSON", type=json.loads, help="the role, as JSON")
    print(json.dumps(run(parser.parse_args().spec)), flush=True)


if __name__ == "__main__":
    main()
