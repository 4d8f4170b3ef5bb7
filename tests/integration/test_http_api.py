"""The HTTP door's Kafka-backed routes against a real gateway, brokers and kcat.

One gateway cluster for the module; tenants A and B each get a topic named
``events`` and see only their own. Records cross the two doors both ways and
are compared byte for byte: produced over HTTP and read by kcat through the
Kafka door, produced by kcat (gzip batches included) and read over HTTP.
Keyed records land where librdkafka's murmur2 partitioner puts them. The
last test runs schemathesis against the gateway's own OpenAPI document,
authenticated as a tenant, and requires no 5xx and answers that match it.
"""

from __future__ import annotations

import base64
import json
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from confluent_kafka import Consumer, Producer, TopicPartition
from gateway_env import TenantKey
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)
from shoal.gateway.http.app import build_api
from shoal.tenancy.acl import read_only_bindings
from shoal.tenancy.model import Quotas

TOPIC = "events"
PARTITIONS = 3


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@dataclass
class Tenant:
    key: TenantKey
    http: httpx.Client
    cluster: str

    def url(self, path: str) -> str:
        return f"/v3/clusters/{self.cluster}{path}"

    def get(self, path: str, **kwargs: Any) -> httpx.Response:
        return self.http.get(self.url(path), **kwargs)

    def post(self, path: str, **kwargs: Any) -> httpx.Response:
        return self.http.post(self.url(path), **kwargs)


def http_client(gateway_cluster: Any, key: TenantKey) -> httpx.Client:
    return httpx.Client(
        base_url=gateway_cluster.gateway.http_url, auth=(key.key_id, key.secret), timeout=60
    )


def as_tenant(gateway_cluster: Any, key: TenantKey) -> Tenant:
    client = http_client(gateway_cluster, key)
    clusters = client.get("/v3/clusters")
    assert clusters.status_code == 200, clusters.text
    return Tenant(key, client, clusters.json()["data"][0]["cluster_id"])


@pytest.fixture(scope="module")
def pair(gateway_cluster: Any) -> Iterator[tuple[Tenant, Tenant]]:
    a = as_tenant(gateway_cluster, gateway_cluster.tenant(unique("http-a")))
    b = as_tenant(gateway_cluster, gateway_cluster.tenant(unique("http-b")))
    for tenant in (a, b):
        created = tenant.post("/topics", json={"topic_name": TOPIC, "partitions_count": PARTITIONS})
        assert created.status_code == 201, created.text
    yield a, b
    a.http.close()
    b.http.close()


def kcat(key: TenantKey, tmp_path: Path, *args: str, stdin: bytes | None = None) -> Any:
    props = key.properties_file(tmp_path / f"{key.key_id}.properties")
    return subprocess.run(
        ["kcat", "-F", str(props), *args], input=stdin, capture_output=True, timeout=60
    )


def b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def parse_kcat_records(out: bytes) -> list[dict[str, Any]]:
    """kcat -f '%p|%o|%K|%k|%S|%s|%h\\n' output, split by the lengths it states."""
    records = []
    pos = 0
    while pos < len(out):
        fields = []
        for _ in range(3):
            end = out.index(b"|", pos)
            fields.append(out[pos:end])
            pos = end + 1
        partition, offset, key_len = (int(f) for f in fields)
        key = out[pos : pos + max(key_len, 0)]
        pos += max(key_len, 0) + 1
        end = out.index(b"|", pos)
        value_len = int(out[pos:end])
        pos = end + 1
        value = out[pos : pos + value_len]
        pos += value_len + 1
        end = out.index(b"\n", pos)
        headers = out[pos:end]
        pos = end + 1
        records.append(
            {
                "partition": partition,
                "offset": offset,
                "key": key,
                "value": value,
                "headers": headers,
            }
        )
    return records


KCAT_FORMAT = "%p|%o|%K|%k|%S|%s|%h\n"


# -- across the two doors ------------------------------------------------------------


def test_a_record_produced_over_http_is_read_by_kcat_byte_exact(
    pair: tuple[Tenant, Tenant], tmp_path: Path
) -> None:
    a, _ = pair
    key, value = b"\x00\xffkey\x80", bytes(range(256)) * 3
    produced = a.post(
        f"/topics/{TOPIC}/records",
        json={
            "partition_id": 1,
            "key": {"type": "BINARY", "data": b64(key)},
            "value": {"type": "BINARY", "data": b64(value)},
            "headers": [{"name": "trace", "value": b64(b"t-1")}],
        },
    )
    assert produced.status_code == 200, produced.text
    report = produced.json()
    assert report["error_code"] == 200
    assert (report["topic_name"], report["partition_id"]) == (TOPIC, 1)
    assert report["key"] == {"type": "BINARY", "size": len(key)}
    assert report["value"] == {"type": "BINARY", "size": len(value)}

    read = kcat(
        a.key, tmp_path, "-C", "-t", TOPIC, "-p", "1", "-o", "beginning", "-e", "-f", KCAT_FORMAT
    )
    assert read.returncode == 0, read.stderr
    [record] = [r for r in parse_kcat_records(read.stdout) if r["offset"] == report["offset"]]
    assert (record["key"], record["value"], record["headers"]) == (key, value, b"trace=t-1")


def test_a_record_produced_by_kcat_is_read_over_http_byte_exact(
    pair: tuple[Tenant, Tenant], tmp_path: Path
) -> None:
    a, _ = pair
    values = [bytes([i]) * 50 + b"\x00\xfe" + bytes(range(i, 256)) for i in (3, 7)]
    files = []
    for i, value in enumerate(values):
        files.append(tmp_path / f"m{i}.bin")
        files[-1].write_bytes(value)
    # Each file is one message; gzip puts both in one compressed batch.
    produced = kcat(
        a.key, tmp_path, "-P", "-t", TOPIC, "-p", "2", "-z", "gzip", "-k", "k\u00e9y",
        "-H", "h1=v1", "-H", "h2=", *(str(f) for f in files),
    )  # fmt: skip
    assert produced.returncode == 0, produced.stderr

    read = a.get(f"/topics/{TOPIC}/partitions/2/records", params={"offset": 0})
    assert read.status_code == 200, read.text
    body = read.json()
    assert [base64.b64decode(r["value"]) for r in body["records"]] == values
    for record in body["records"]:
        assert base64.b64decode(record["key"]) == "k\u00e9y".encode()
        assert [(h["name"], h["value"]) for h in record["headers"]] == [
            ("h1", b64(b"v1")),
            ("h2", b64(b"")),
        ]
        assert record["timestamp_type"] == "CREATE_TIME"
    assert body["next_offset"] == body["records"][-1]["offset"] + 1

    # From the second record on, one at a time: inside the compressed batch.
    second = a.get(
        f"/topics/{TOPIC}/partitions/2/records",
        params={"offset": body["records"][1]["offset"], "max_records": 1},
    ).json()
    assert [base64.b64decode(r["value"]) for r in second["records"]] == values[1:]
    as_text = a.get(f"/topics/{TOPIC}/partitions/2/records", params={"format": "string"})
    assert as_text.status_code == 422, as_text.text
    assert as_text.json()["error_code"] == 42200


def test_a_zstd_bomb_is_refused_by_an_http_read_not_inflated(
    pair: tuple[Tenant, Tenant],
) -> None:
    """Records of 20 MB of zeros through the Kafka door are a few KB of zstd; a read
    decodes at most 16 x max_bytes (16 MiB here): it stops before them, then refuses."""
    a, b = pair
    topic = unique("bomb")
    created = a.post("/topics", json={"topic_name": topic, "partitions_count": 1})
    assert created.status_code == 201, created.text
    honest = a.post(f"/topics/{topic}/records", json={"value": {"type": "STRING", "data": "ok"}})
    assert honest.status_code == 200, honest.text
    producer = Producer(
        a.key.librdkafka(**{"compression.type": "zstd", "message.max.bytes": 100_000_000})
    )
    zeros = bytes(20_000_000)
    for _ in range(3):
        producer.produce(topic, zeros, partition=0)
    assert producer.flush(30) == 0

    path = f"/topics/{topic}/partitions/0/records"
    first = a.get(path, params={"offset": 0})  # max_bytes 1 MiB: both batches fetched
    assert first.status_code == 200, first.text
    assert [base64.b64decode(r["value"]) for r in first.json()["records"]] == [b"ok"]
    assert first.json()["next_offset"] == 1
    bomb = a.get(path, params={"offset": 1, "max_bytes": 4096})
    assert bomb.status_code == 422, bomb.text
    assert bomb.json()["error_code"] == 42201
    assert (
        "the batch at offset 1 decompresses to more than 16777216 bytes" in (bomb.json()["message"])
    )

    # The gateway serves on, both tenants.
    assert a.get(f"/topics/{topic}").status_code == 200
    assert b.get(f"/topics/{TOPIC}").status_code == 200
    assert a.http.delete(a.url(f"/topics/{topic}")).status_code == 204


def test_keyed_records_land_where_librdkafka_puts_them(
    pair: tuple[Tenant, Tenant], tmp_path: Path
) -> None:
    a, _ = pair
    topic = "keyed"
    assert a.post("/topics", json={"topic_name": topic, "partitions_count": 7}).status_code == 201
    keys = [f"user-{i}" for i in range(24)] + ["", "\u00e9t\u00e9"]
    lines = "".join(f"{k}\t{i}\n" for i, k in enumerate(keys) if k).encode()
    produced = kcat(
        a.key, tmp_path, "-P", "-t", topic, "-K", "\t", "-X", "topic.partitioner=murmur2_random",
        stdin=lines,
    )  # fmt: skip
    assert produced.returncode == 0, produced.stderr
    by_kcat: dict[str, int] = {}
    for partition in range(7):
        read = a.get(
            f"/topics/{topic}/partitions/{partition}/records", params={"format": "string"}
        ).json()
        by_kcat.update({r["key"]: partition for r in read["records"]})
    assert set(by_kcat) == {k for k in keys if k}

    batch = a.post(
        f"/topics/{topic}/records:batch",
        json={
            "entries": [
                {"id": str(i), "key": {"type": "STRING", "data": k}, "value": {"data": i}}
                for i, k in enumerate(keys)
            ]
        },
    )
    assert batch.status_code == 207, batch.text
    placed = {keys[int(s["id"])]: s["partition_id"] for s in batch.json()["successes"]}
    assert batch.json()["failures"] == []
    assert {k: placed[k] for k in by_kcat} == by_kcat


def test_streamed_and_batched_produce_answer_each_record_in_order(
    pair: tuple[Tenant, Tenant],
) -> None:
    a, _ = pair
    records = [
        {"partition_id": 0, "value": {"type": "STRING", "data": "first"}},
        {"partition_id": 0, "value": {"type": "BINARY", "data": "not base64!"}},
        {"partition_id": 9, "value": {"data": {"n": 3}}},
        {"partition_id": 0, "value": {"data": {"n": 4}}, "key": {"type": "JSON", "data": [1]}},
        {"partition_id": 0, "bogus": True},
        {"partition_id": 0, "value": {"type": "STRING", "data": "last"}},
    ]
    texts = [json.dumps(r).encode() for r in records]

    def chunked() -> Iterator[bytes]:
        # Objects split across chunks, newline-delimited and concatenated.
        body = b"\n".join(texts[:3]) + b"\n" + b"".join(texts[3:])
        for start in range(0, len(body), 37):
            yield body[start : start + 37]

    for content in (chunked(), b" ".join(texts)):
        answered = a.post(f"/topics/{TOPIC}/records", content=content)
        assert answered.status_code == 200, answered.text
        reports = [json.loads(line) for line in answered.text.splitlines()]
        assert [r["error_code"] for r in reports] == [200, 40001, 40402, 200, 40001, 200]
        assert reports[2]["kafka_error"] == "UNKNOWN_TOPIC_OR_PARTITION"
        stored = [reports[i]["offset"] for i in (0, 3, 5)]
        assert stored == sorted(stored) and len(set(stored)) == 3

    read = a.get(
        f"/topics/{TOPIC}/partitions/0/records", params={"offset": stored[1], "format": "string"}
    ).json()
    # JSON data is stored compactly; STRING data as its UTF-8.
    assert [(r["key"], r["value"]) for r in read["records"]] == [("[1]", '{"n":4}'), (None, "last")]

    batch = a.post(
        f"/topics/{TOPIC}/records:batch",
        json={
            "entries": [
                {"id": "x", "value": {"data": 1}},
                {"id": "y", "partition_id": 7, "value": {"data": 2}},
                {"id": "z", "value": {"data": 3}},
            ]
        },
    ).json()
    assert [s["id"] for s in batch["successes"]] == ["x", "z"]
    assert [(f["id"], f["error_code"]) for f in batch["failures"]] == [("y", 40402)]


# -- isolation and access --------------------------------------------------------------


def test_b_cannot_see_read_or_write_a_s_topic_through_either_door(
    pair: tuple[Tenant, Tenant], tmp_path: Path
) -> None:
    a, b = pair
    secret = a.post("/topics", json={"topic_name": "a-only", "partitions_count": 1})
    assert secret.status_code == 201, secret.text
    assert a.post("/topics/a-only/records", json={"value": {"data": "secret"}}).status_code == 200

    names = [t["topic_name"] for t in b.get("/topics").json()["data"]]
    assert "a-only" not in names and TOPIC in names
    broker_side = f"{a.key.tenant}.a-only"
    for name in ("a-only", broker_side):
        for response in (
            b.get(f"/topics/{name}"),
            b.get(f"/topics/{name}/partitions/0/records"),
            b.post(f"/topics/{name}/records", json={"value": {"data": "intruder"}}),
            b.get(f"/topics/{name}/configs"),
        ):
            assert response.status_code == 404, response.text
            assert response.json()["error_code"] == 40403
    kafka = kcat(b.key, tmp_path, "-C", "-t", "a-only", "-o", "beginning", "-e")
    assert kafka.stdout == b""
    assert b"Unknown topic" in kafka.stderr, kafka.stderr

    # B's own "events" is not A's: what A wrote is not there.
    a_values = {
        r["value"] for r in a.get(f"/topics/{TOPIC}/partitions/0/records").json()["records"]
    }
    b_values = {
        r["value"] for r in b.get(f"/topics/{TOPIC}/partitions/0/records").json()["records"]
    }
    assert a_values and not (a_values & b_values)
    assert b.get("/consumer-groups").json()["data"] == []


def test_acls_deny_with_403_and_bad_credentials_get_401_json(
    gateway_cluster: Any, pair: tuple[Tenant, Tenant]
) -> None:
    a, _ = pair
    reader = as_tenant(
        gateway_cluster,
        gateway_cluster.tenant(a.key.tenant, bindings=read_only_bindings(a.key.tenant, "KEY")),
    )
    assert reader.get(f"/topics/{TOPIC}/partitions/0/records").status_code == 200
    for refused in (
        reader.post(f"/topics/{TOPIC}/records", json={"value": {"data": 1}}),
        reader.post("/topics", json={"topic_name": "nope"}),
        reader.http.delete(reader.url(f"/topics/{TOPIC}")),
    ):
        assert refused.status_code == 403, refused.text
        assert refused.json()["error_code"] == 40301
    assert a.get(f"/topics/{TOPIC}").status_code == 200

    base = gateway_cluster.gateway.http_url
    for auth in ((a.key.key_id, "wrong"), ("nobody", "nothing"), None):
        answer = httpx.get(f"{base}/v3/clusters", auth=auth)
        assert answer.status_code == 401
        assert answer.json()["error_code"] == 40100
        assert "WWW-Authenticate" in answer.headers


def test_topic_admin_round_trip(pair: tuple[Tenant, Tenant]) -> None:
    a, _ = pair
    assert a.http.get("/v3/clusters/not-this-one/topics").json()["error_code"] == 40401
    created = a.post(
        "/topics",
        json={
            "topic_name": "admin",
            "partitions_count": 2,
            "configs": [{"name": "retention.ms", "value": "3600000"}],
        },
    )
    assert created.status_code == 201, created.text
    assert created.json()["partitions_count"] == 2
    assert a.post("/topics", json={"topic_name": "admin"}).json()["error_code"] == 40901

    grown = a.http.patch(a.url("/topics/admin"), json={"partitions_count": 4})
    assert grown.status_code == 200, grown.text
    assert grown.json()["partitions_count"] == 4
    assert [p["partition_id"] for p in a.get("/topics/admin/partitions").json()["data"]] == [
        0, 1, 2, 3,
    ]  # fmt: skip
    shrink = a.http.patch(a.url("/topics/admin"), json={"partitions_count": 1})
    assert shrink.status_code == 400

    retention = a.get("/topics/admin/configs/retention.ms").json()
    assert (retention["value"], retention["source"]) == ("3600000", "DYNAMIC_TOPIC_CONFIG")
    put = a.http.put(a.url("/topics/admin/configs/cleanup.policy"), json={"value": "compact"})
    assert put.status_code == 204, put.text
    assert a.get("/topics/admin/configs/cleanup.policy").json()["value"] == "compact"
    assert a.http.delete(a.url("/topics/admin/configs/retention.ms")).status_code == 204
    assert a.get("/topics/admin/configs/retention.ms").json()["is_default"] is True
    altered = a.post(
        "/topics/admin/configs:alter",
        json={
            "data": [
                {"name": "cleanup.policy", "operation": "DELETE"},
                {"name": "retention.ms", "value": "60000"},
            ]
        },
    )
    assert altered.status_code == 204, altered.text
    configs = {c["name"]: c for c in a.get("/topics/admin/configs").json()["data"]}
    assert configs["retention.ms"]["value"] == "60000"
    assert configs["cleanup.policy"]["is_default"] is True
    assert a.get("/topics/admin/configs/no.such.config").status_code == 404

    assert a.http.delete(a.url("/topics/admin")).status_code == 204
    assert a.get("/topics/admin").status_code == 404


def test_compression_type_is_checked_like_kafkas_and_applies_to_http_produce(
    pair: tuple[Tenant, Tenant], tmp_path: Path
) -> None:
    a, _ = pair
    name = unique("squeezed")
    created = a.post(
        "/topics",
        json={
            "topic_name": name,
            "partitions_count": 1,
            "configs": [{"name": "compression.type", "value": "zstd"}],
        },
    )
    assert created.status_code == 201, created.text
    for config, bad in [("compression.type", "brotli"), ("compression.zstd.level", "23")]:
        put = a.http.put(a.url(f"/topics/{name}/configs/{config}"), json={"value": bad})
        assert put.status_code == 400, put.text
        assert put.json()["error_code"] == 40002
    put = a.http.put(a.url(f"/topics/{name}/configs/compression.zstd.level"), json={"value": "7"})
    assert put.status_code == 204, put.text
    assert a.get(f"/topics/{name}/configs/compression.type").json()["value"] == "zstd"

    value = b"squeeze me " * 200
    produced = a.post(
        f"/topics/{name}/records",
        json={"partition_id": 0, "value": {"type": "BINARY", "data": b64(value)}},
    )
    assert produced.json()["error_code"] == 200, produced.text
    read = kcat(
        a.key, tmp_path, "-C", "-t", name, "-p", "0", "-o", "beginning", "-e", "-f", KCAT_FORMAT
    )
    assert read.returncode == 0, read.stderr
    assert [r["value"] for r in parse_kcat_records(read.stdout)] == [value]


def test_each_answered_change_is_seen_by_the_next_read(pair: tuple[Tenant, Tenant]) -> None:
    """Read-your-writes across three brokers: each broker sees a write a moment after
    the one that took it, so a read sent elsewhere could still show the old value."""
    a, _ = pair
    created = a.post("/topics", json={"topic_name": "settled", "partitions_count": 1})
    assert created.status_code == 201, created.text
    for partitions in range(2, 12):
        grown = a.http.patch(a.url("/topics/settled"), json={"partitions_count": partitions})
        assert grown.status_code == 200, grown.text
        listed = a.get("/topics/settled/partitions").json()["data"]
        assert len(listed) == partitions
        retention = str(60_000 * partitions)
        put = a.http.put(a.url("/topics/settled/configs/retention.ms"), json={"value": retention})
        assert put.status_code == 204, put.text
        assert a.get("/topics/settled/configs/retention.ms").json()["value"] == retention
    assert a.http.delete(a.url("/topics/settled")).status_code == 204
    assert a.get("/topics/settled").status_code == 404


def test_group_lag_is_the_end_minus_the_committed_offset(pair: tuple[Tenant, Tenant]) -> None:
    a, _ = pair
    for i in range(5):
        a.post(f"/topics/{TOPIC}/records", json={"partition_id": 1, "value": {"data": i}})
    consumer = Consumer(a.key.librdkafka(**{"group.id": "lagging", "enable.auto.commit": False}))
    consumer.commit(offsets=[TopicPartition(TOPIC, 1, 2)], asynchronous=False)
    consumer.close()

    groups = a.get("/consumer-groups").json()["data"]
    assert [g["consumer_group_id"] for g in groups] == ["lagging"]
    lags = a.get("/consumer-groups/lagging/lags").json()["data"]
    [lag] = lags
    assert (lag["topic_name"], lag["partition_id"], lag["current_offset"]) == (TOPIC, 1, 2)
    assert lag["lag"] == lag["log_end_offset"] - 2 >= 3
    summary = a.get("/consumer-groups/lagging/lag-summary").json()
    assert (summary["max_lag"], summary["total_lag"]) == (lag["lag"], lag["lag"])
    assert a.get("/consumer-groups/nobody").json()["error_code"] == 40404


# -- the OpenAPI document, fuzzed ------------------------------------------------------


@pytest.fixture(scope="module")
def fuzzed_tenant(gateway_cluster: Any) -> Tenant:
    # A partition limit, as tenants have: the brokers cannot yet create thousands of
    # partitions in one request (etcd refuses the transaction).
    tenant = as_tenant(
        gateway_cluster,
        gateway_cluster.tenant(unique("http-fuzz"), quotas=Quotas(max_partitions=64)),
    )
    assert (
        tenant.post("/topics", json={"topic_name": "fuzz", "partitions_count": 2}).status_code
        == 201
    )
    tenant.post("/topics/fuzz/records", json={"key": {"data": "k"}, "value": {"data": "v"}})
    return tenant


# The document the gateway serves is built without any service (build_api), so it
# is known at collection time; test_the_served_document_is_this_one checks that
# the gateway serves exactly it.
DOCUMENT = build_api().openapi()
schema = schemathesis.openapi.from_dict(DOCUMENT)


def test_the_served_document_is_this_one(gateway_cluster: Any) -> None:
    served = httpx.get(f"{gateway_cluster.gateway.http_url}/openapi.json")
    assert served.json() == json.loads(json.dumps(DOCUMENT))


@schema.parametrize()
@settings(
    max_examples=40,
    derandomize=True,
    deadline=None,
    suppress_health_check=list(HealthCheck),
)
def test_the_openapi_document_holds_for_generated_requests(
    case: Any, fuzzed_tenant: Tenant
) -> None:
    # Aim most requests at the tenant's real cluster and topic, so they reach the brokers.
    if "cluster_id" in case.path_parameters:
        case.path_parameters["cluster_id"] = fuzzed_tenant.cluster
    if "topic_name" in case.path_parameters and len(str(case.path_parameters["topic_name"])) % 2:
        case.path_parameters["topic_name"] = "fuzz"
    case.call_and_validate(
        base_url=fuzzed_tenant.http.base_url.__str__().rstrip("/"),
        auth=(fuzzed_tenant.key.key_id, fuzzed_tenant.key.secret),
        checks=[
            not_a_server_error,
            status_code_conformance,
            content_type_conformance,
            response_schema_conformance,
        ],
    )
