"""Tenants are walled off from each other at the gateway, and each key stays inside its ACLs.

Two tenants, A and B, each create a topic named ``orders`` and write different
records to it. B then tries every way a Kafka client has to reach A's data or
learn of it, with confluent-kafka, kcat and raw requests: by name, by A's
broker-side spelling ``<a>.orders``, by regex and prefix subscriptions, by
topic id, by listing, describing, configuring and deleting topics, and
through consumer groups. Each attempt must reach only B's own namespace (or
nothing), and A's topic, data, configs and committed offsets must be as A
left them.

The ACL half checks Kafka's semantics for one tenant's keys: a refused topic
gets TOPIC_AUTHORIZATION_FAILED in its own slot while the rest of the request
is served, read-only and binding-less keys, DENY over ALLOW, and the
tenant-wide partition limit (POLICY_VIOLATION). Kafka's ACL APIs show and
change a tenant's own bindings only: listings and wildcard filters, patterns
spelling another tenant's names, and a delete by the broadest filter never
reach B's bindings, and a binding made through them applies within seconds.

The gateway cluster is shared by the module; every test makes its own tenants
(a uuid suffix), so no test sees another's topics or groups.
"""

from __future__ import annotations

import datetime
import subprocess
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    ConsumerGroupState,
    ConsumerGroupTopicPartitions,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AclBinding as AdminAclBinding
from confluent_kafka.admin import (
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewPartitions,
    NewTopic,
    ResourcePatternType,
)
from confluent_kafka.admin import ResourceType as AdminResourceType
from gateway_env import TenantKey, sasl_login
from harness import wait_until
from kio.schema.errors import ErrorCode
from raw_kafka import RawConnection, encode_request, request_class
from shoal.tenancy.acl import CLUSTER_NAME, default_bindings, read_only_bindings
from shoal.tenancy.model import (
    AclBinding,
    Operation,
    PatternType,
    Permission,
    Quotas,
    ResourceType,
)

from shoal.records import NewRecord, build_batch, iter_batches, iter_records

TOPIC = "orders"
PARTITIONS = 2
METADATA_V = 12
PRODUCE_V = 9
FETCH_BY_NAME_V = 12
FETCH_BY_ID_V = 13
DELETE_TOPICS_BY_ID_V = 6
LIST_OFFSETS_V = 7
ZERO_ID = uuid.UUID(int=0)
KEY = "KEY"
"""make_tenant gives bindings with this principal to the key it makes."""


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


# -- clients -------------------------------------------------------------------------


def new_key(gateway_cluster: Any, tenant: str, **kwargs: Any) -> TenantKey:
    """A key of ``tenant`` (made with the tenant if new), usable at once."""
    return gateway_cluster.tenant(tenant, **kwargs)


def admin_for(key: TenantKey) -> AdminClient:
    return AdminClient(key.librdkafka())


def create_topic(key: TenantKey, name: str, partitions: int = PARTITIONS) -> None:
    admin = admin_for(key)  # held: a collected client cancels its futures
    admin.create_topics([NewTopic(name, partitions)])[name].result(30)


def error_code(future: Any) -> int:
    """The Kafka error code a failed admin future carries."""
    with pytest.raises(KafkaException) as raised:
        future.result(30)
    return int(raised.value.args[0].code())


def produce(key: TenantKey, topic: str, values: Sequence[bytes]) -> None:
    """Write ``values`` round-robin over the partitions; every one must be acknowledged."""
    producer = Producer(key.librdkafka(acks="all", **{"message.timeout.ms": 20000}))
    failures: list[KafkaError] = []

    def delivered(err: KafkaError | None, _msg: Any) -> None:
        if err is not None:
            failures.append(err)

    for i, value in enumerate(values):
        producer.produce(topic, value=value, partition=i % PARTITIONS, on_delivery=delivered)
    assert producer.flush(30) == 0
    assert failures == []


def produce_refusal(key: TenantKey, topic: str) -> int | None:
    """The error of one produce that should be refused (None if it was written)."""
    producer = Producer(
        key.librdkafka(
            acks="all",
            # An unknown topic fails at once rather than when the message times out.
            **{"message.timeout.ms": 10000, "topic.metadata.propagation.max.ms": 500},
        )
    )
    outcome: list[KafkaError | None] = []
    producer.produce(topic, value=b"intruder", on_delivery=lambda err, _msg: outcome.append(err))
    assert producer.flush(20) == 0
    assert len(outcome) == 1
    err = outcome[0]
    return None if err is None else int(err.code())


def read_all(
    key: TenantKey, topic: str, partitions: Iterable[int] = range(PARTITIONS)
) -> list[bytes]:
    """Every value in the partitions, read from the beginning to their current end."""
    wanted = set(partitions)
    consumer = Consumer(
        key.librdkafka(
            **{
                "group.id": unique("reader"),
                "enable.auto.commit": False,
                "enable.partition.eof": True,
            }
        )
    )
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in sorted(wanted)])
    values: list[bytes] = []
    at_end: set[int] = set()
    deadline = time.monotonic() + 30
    try:
        while at_end != wanted:
            assert time.monotonic() < deadline, f"{topic}: only {at_end} of {wanted} read to end"
            message = consumer.poll(0.2)
            if message is None:
                continue
            err = message.error()
            if err is None:
                values.append(message.value())
            elif err.code() == KafkaError._PARTITION_EOF:
                at_end.add(message.partition())
            else:
                raise AssertionError(f"reading {topic}: {err}")
    finally:
        consumer.close()
    return values


def poll_for(consumer: Consumer, seconds: float) -> list[Any]:
    """Messages (and errors) that arrive within ``seconds``."""
    out = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        message = consumer.poll(0.1)
        if message is not None:
            out.append(message)
    return out


def consume_group(
    consumer: Consumer,
    want: int,
    timeout: float = 30,
    settle: float = 1.0,
    expected_error: Callable[[KafkaError], bool] = lambda _err: False,
) -> list[bytes]:
    """Values until ``want`` have arrived, then for ``settle`` seconds more (to catch extras).

    Any error fails, unless ``expected_error`` says the client was bound to report it.
    """
    values: list[bytes] = []
    deadline = time.monotonic() + timeout
    settled = None
    while settled is None or time.monotonic() < settled:
        assert time.monotonic() < deadline, f"only {len(values)} of {want} records arrived"
        message = consumer.poll(0.1)
        if message is not None:
            err = message.error()
            assert err is None or expected_error(err), err
            if err is None:
                values.append(message.value())
        if settled is None and len(values) >= want:
            settled = time.monotonic() + settle
    return values


def kcat(key: TenantKey, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    properties = key.properties_file(tmp_path / f"{key.key_id}.properties")
    return subprocess.run(
        ["kcat", "-F", str(properties), *args], capture_output=True, timeout=60, check=False
    )


# -- raw protocol --------------------------------------------------------------------


class RecordingConnection(RawConnection):
    """A raw connection that keeps the bytes of the last response it read."""

    last_frame = b""

    def read_frame(self) -> bytes:
        self.last_frame = super().read_frame()
        return self.last_frame


def connect(key: TenantKey, address: str | None = None) -> RecordingConnection:
    conn = RecordingConnection(address or key.bootstrap())
    result = sasl_login(conn, key.key_id, key.secret)
    assert result.error_code == ErrorCode.none, result
    return conn


def metadata_request(names: Sequence[str] | None = None, ids: Sequence[uuid.UUID] = ()) -> Any:
    cls = request_class(3, METADATA_V)
    topic = request_class(3, METADATA_V, "MetadataRequestTopic")
    topics = None
    if names is not None or ids:
        topics = tuple(topic(topic_id=None, name=n) for n in names or ()) + tuple(
            topic(topic_id=i, name=None) for i in ids
        )
    # Asking for auto-creation on purpose: the gateway must never grant it (a
    # name B probes for must not come into being, in B's namespace or anywhere).
    return cls(
        topics=topics, allow_auto_topic_creation=True, include_topic_authorized_operations=False
    )


def topic_id_of(key: TenantKey, name: str) -> uuid.UUID:
    with connect(key) as conn:
        (topic,) = conn.call(metadata_request([name])).topics
    assert topic.error_code == ErrorCode.none, topic
    assert topic.topic_id not in (None, ZERO_ID)
    return topic.topic_id


def leader_address(key: TenantKey, topic: str, partition: int = 0) -> str:
    """The gateway port of the broker that leads the partition, as ``key`` is told it."""
    with connect(key) as conn:
        response = conn.call(metadata_request([topic]))
    (found,) = [t for t in response.topics if t.name == topic]
    leader = next(p.leader_id for p in found.partitions if p.partition_index == partition)
    broker = next(b for b in response.brokers if b.node_id == leader)
    return f"{broker.host}:{broker.port}"


def leader_connection(key: TenantKey, topic: str, partition: int = 0) -> RecordingConnection:
    return connect(key, leader_address(key, topic, partition))


def produce_request(topics: Sequence[str], value: bytes) -> Any:
    cls = request_class(0, PRODUCE_V)
    topic_data = request_class(0, PRODUCE_V, "TopicProduceData")
    partition_data = request_class(0, PRODUCE_V, "PartitionProduceData")
    return cls(
        transactional_id=None,
        acks=-1,
        timeout=datetime.timedelta(seconds=10),
        topic_data=tuple(
            topic_data(
                name=name,
                partition_data=(
                    partition_data(index=0, records=build_batch([NewRecord(None, value)])),
                ),
            )
            for name in topics
        ),
    )


def fetch_request(
    version: int,
    topics: Sequence[str | uuid.UUID],
    session_id: int = 0,
    epoch: int = -1,
    offset: int = 0,
) -> Any:
    """Fetch partition 0 of each topic from ``offset`` (names up to v12, ids from v13)."""
    cls = request_class(1, version)
    fetch_topic = request_class(1, version, "FetchTopic")
    fetch_partition = request_class(1, version, "FetchPartition")
    partitions = (
        fetch_partition(
            partition=0,
            current_leader_epoch=-1,
            fetch_offset=offset,
            last_fetched_epoch=-1,
            log_start_offset=-1,
            partition_max_bytes=1 << 20,
        ),
    )
    by_id = version >= 13
    return cls(
        cluster_id=None,
        replica_id=-1,
        max_wait=datetime.timedelta(milliseconds=100),
        min_bytes=0,
        max_bytes=1 << 20,
        isolation_level=0,
        session_id=session_id,
        session_epoch=epoch,
        topics=tuple(
            fetch_topic(topic_id=t, partitions=partitions)
            if by_id
            else fetch_topic(topic=t, partitions=partitions)
            for t in topics
        ),
        forgotten_topics_data=(),
        rack_id="",
    )


def list_offsets_request(topics: Sequence[str]) -> Any:
    """The latest offset of partition 0 of each topic."""
    cls = request_class(2, LIST_OFFSETS_V)
    topic = request_class(2, LIST_OFFSETS_V, "ListOffsetsTopic")
    partition = request_class(2, LIST_OFFSETS_V, "ListOffsetsPartition")
    latest = (partition(partition_index=0, current_leader_epoch=-1, timestamp=-1),)
    return cls(
        replica_id=-1,
        isolation_level=0,
        topics=tuple(topic(name=name, partitions=latest) for name in topics),
    )


def values_in(records: bytes | None) -> list[bytes | None]:
    if not records:
        return []
    buf = bytes(records)
    return [
        record.value
        for pos, header in iter_batches(buf)
        for record in iter_records(buf[pos : pos + header.size])
    ]


# -- two tenants ---------------------------------------------------------------------


@dataclass
class Pair:
    a: TenantKey
    b: TenantKey
    a_values: list[bytes]
    b_values: list[bytes]

    @property
    def a_broker_name(self) -> str:
        """How the brokers spell A's topic: what a curious B would try."""
        return f"{self.a.tenant}.{TOPIC}"


@pytest.fixture
def pair(gateway_cluster: Any) -> Pair:
    """Tenants A and B, each with its own ``orders`` holding its own records."""
    a = new_key(gateway_cluster, unique("iso-a"))
    b = new_key(gateway_cluster, unique("iso-b"))
    # Printable, so kcat's line-per-record output can be compared byte for byte.
    a_values = [b"A:%d:%s" % (i, uuid.uuid4().hex.encode()) for i in range(6)]
    b_values = [b"B:%d:%s" % (i, uuid.uuid4().hex.encode()) for i in range(6)]
    for key, values in ((a, a_values), (b, b_values)):
        create_topic(key, TOPIC)
        produce(key, TOPIC, values)
    return Pair(a, b, a_values, b_values)


def assert_a_untouched(pair: Pair) -> None:
    assert TOPIC in admin_for(pair.a).list_topics(timeout=10).topics
    assert sorted(read_all(pair.a, TOPIC)) == sorted(pair.a_values)


# -- isolation -----------------------------------------------------------------------


def test_both_tenants_own_a_topic_named_orders_and_read_only_their_records(pair: Pair) -> None:
    assert sorted(read_all(pair.a, TOPIC)) == sorted(pair.a_values)
    assert sorted(read_all(pair.b, TOPIC)) == sorted(pair.b_values)
    assert topic_id_of(pair.a, TOPIC) != topic_id_of(pair.b, TOPIC)


def test_a_s_broker_side_name_reaches_nothing_of_a(pair: Pair) -> None:
    spelled = pair.a_broker_name
    admin = admin_for(pair.b)
    listed = admin.list_topics(spelled, timeout=10).topics[spelled]
    assert listed.error is not None
    assert listed.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART
    assert not listed.partitions

    with connect(pair.b) as conn:
        (topic,) = conn.call(metadata_request([spelled])).topics
        assert (topic.name, topic.error_code) == (spelled, ErrorCode.unknown_topic_or_partition)
        produced = conn.call(produce_request([spelled], b"intruder")).responses
        assert [p.error_code for t in produced for p in t.partition_responses] == [
            ErrorCode.unknown_topic_or_partition
        ]
    # At the broker that leads A's partition 0 too, so a leak could not hide behind routing.
    with connect(pair.b, leader_address(pair.a, TOPIC)) as conn:
        produced = conn.call(produce_request([spelled], b"intruder")).responses
        assert [p.error_code for t in produced for p in t.partition_responses] == [
            ErrorCode.unknown_topic_or_partition
        ]
        fetched = conn.call(fetch_request(FETCH_BY_NAME_V, [spelled])).responses
        assert [(p.error_code, values_in(p.records)) for t in fetched for p in t.partitions] == [
            (ErrorCode.unknown_topic_or_partition, [])
        ]

    assert produce_refusal(pair.b, spelled) == KafkaError.UNKNOWN_TOPIC_OR_PART
    consumer = Consumer(pair.b.librdkafka(**{"group.id": unique("peek")}))
    consumer.assign([TopicPartition(spelled, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
    seen = poll_for(consumer, 3)
    consumer.close()
    assert [m.value() for m in seen if m.error() is None] == []
    assert_a_untouched(pair)
    assert spelled not in admin.list_topics(timeout=10).topics


def test_regex_and_prefix_subscriptions_match_only_b_s_topics(pair: Pair) -> None:
    group = unique("regex")
    consumer = Consumer(pair.b.librdkafka(**{"group.id": group, "auto.offset.reset": "earliest"}))
    consumer.subscribe(["^.*orders.*", f"^{pair.a.tenant}.*"])
    try:
        values = consume_group(
            consumer,
            len(pair.b_values),
            settle=2,
            # librdkafka reports a pattern that matches none of the topics it is shown.
            expected_error=lambda err: (
                err.code() == KafkaError.UNKNOWN_TOPIC_OR_PART
                and "Subscribed topic not available: ^" + pair.a.tenant in err.str()
            ),
        )
        assert {tp.topic for tp in consumer.assignment()} == {TOPIC}
        # The names the patterns were matched against: B's topics, nothing else.
        assert set(consumer.list_topics(timeout=10).topics) == {TOPIC}
    finally:
        consumer.close()
    assert sorted(values) == sorted(pair.b_values)

    # Only A's prefix: matches none of B's topics, so nothing is assigned or read.
    consumer = Consumer(
        pair.b.librdkafka(**{"group.id": unique("prefix"), "auto.offset.reset": "earliest"})
    )
    consumer.subscribe([f"^{pair.a.tenant}\\..*", f"^.*{pair.a.tenant}.*"])
    try:
        seen = poll_for(consumer, 4)
        assert consumer.assignment() == []
    finally:
        consumer.close()
    assert [m.value() for m in seen if m.error() is None] == []
    assert_a_untouched(pair)


def test_a_s_topic_id_is_unknown_to_b(pair: Pair) -> None:
    a_id = topic_id_of(pair.a, TOPIC)
    b_id = topic_id_of(pair.b, TOPIC)

    with connect(pair.b) as conn:
        (topic,) = conn.call(metadata_request(ids=[a_id])).topics
        assert topic.error_code == ErrorCode.unknown_topic_id
        assert topic.name is None
        assert not topic.partitions
        assert pair.a.tenant.encode() not in conn.last_frame

        fetched = conn.call(fetch_request(FETCH_BY_ID_V, [a_id]))
        assert fetched.error_code == ErrorCode.none
        assert [(t.topic_id, [p.error_code for p in t.partitions]) for t in fetched.responses] == [
            (a_id, [ErrorCode.unknown_topic_id])
        ]
        assert all(p.records is None for t in fetched.responses for p in t.partitions)

        request = request_class(20, DELETE_TOPICS_BY_ID_V)
        state = request_class(20, DELETE_TOPICS_BY_ID_V, "DeleteTopicState")
        deleted = conn.call(
            request(
                topics=(state(name=None, topic_id=a_id),),
                timeout=datetime.timedelta(seconds=10),
            )
        ).responses
        assert [(r.error_code, r.name) for r in deleted] == [(ErrorCode.unknown_topic_id, None)]
        assert pair.a.tenant.encode() not in conn.last_frame

    # B's own id does resolve, to B's own topic: the refusal above is about ownership.
    with leader_connection(pair.b, TOPIC) as conn:
        fetched = conn.call(fetch_request(FETCH_BY_ID_V, [b_id, a_id]))
        slots = {t.topic_id: t.partitions for t in fetched.responses}
        assert set(slots) == {a_id, b_id}
        assert [p.error_code for p in slots[a_id]] == [ErrorCode.unknown_topic_id]
        assert [p.error_code for p in slots[b_id]] == [ErrorCode.none]
        assert sorted(values_in(slots[b_id][0].records)) == sorted(pair.b_values[0::PARTITIONS])

    assert topic_id_of(pair.a, TOPIC) == a_id
    assert_a_untouched(pair)


def test_a_fetch_session_is_named_only_on_the_connection_that_opened_it(pair: Pair) -> None:
    """The gateway passes the broker's session id to the client, and accepts it only on
    the connection whose fetch opened it: another connection naming it, of the same
    tenant or of another, gets FETCH_SESSION_ID_NOT_FOUND, as Kafka answers a session
    it does not know, and the session goes on where it belongs."""
    with leader_connection(pair.b, TOPIC) as conn:
        opened = conn.call(fetch_request(FETCH_BY_NAME_V, [TOPIC], session_id=0, epoch=0))
        assert opened.error_code == ErrorCode.none
        assert opened.session_id != 0
        (topic,) = opened.responses
        assert sorted(values_in(topic.partitions[0].records)) == sorted(
            pair.b_values[0::PARTITIONS]
        )
        # The client moves its position to the end; then nothing has changed.
        end = topic.partitions[0].high_watermark
        moved = fetch_request(FETCH_BY_NAME_V, [TOPIC], opened.session_id, epoch=1, offset=end)
        assert conn.call(moved).responses == ()
        quiet = conn.call(fetch_request(FETCH_BY_NAME_V, [], opened.session_id, epoch=2))
        assert (quiet.error_code, quiet.session_id, quiet.responses) == (
            ErrorCode.none,
            opened.session_id,
            (),
        )
        for key in (pair.b, pair.a):
            with leader_connection(key, TOPIC) as other:
                stolen = other.call(fetch_request(FETCH_BY_NAME_V, [], opened.session_id, 3))
                assert stolen.error_code == ErrorCode.fetch_session_id_not_found
                assert (stolen.session_id, stolen.responses) == (0, ())
                # Nor can a full fetch naming it close it.
                other.call(fetch_request(FETCH_BY_NAME_V, [TOPIC], opened.session_id, epoch=-1))
        going_on = conn.call(fetch_request(FETCH_BY_NAME_V, [], opened.session_id, epoch=3))
        assert (going_on.error_code, going_on.session_id) == (ErrorCode.none, opened.session_id)


def test_pipelined_fetches_change_the_session_in_the_order_they_were_sent(pair: Pair) -> None:
    """A fetch that opens a session and a full fetch sent behind it before its answer:
    the second closes the session the first opened, as on a broker, so its id is not
    the connection's any more (the gateway rewrites a fetch only after the last one's
    answer, or the first answer would make the session the connection's again)."""
    with leader_connection(pair.b, TOPIC) as conn:
        opening = fetch_request(FETCH_BY_NAME_V, [TOPIC], session_id=0, epoch=0)
        closing = fetch_request(FETCH_BY_NAME_V, [TOPIC], session_id=0, epoch=-1)
        # In one write, so that the gateway reads the second before the first's answer.
        conn.send_raw(encode_request(opening, 1001) + encode_request(closing, 1002))
        _, opened = conn.receive(type(opening))
        _, closed = conn.receive(type(opening))
        assert opened.session_id != 0
        assert (closed.error_code, closed.session_id) == (ErrorCode.none, 0)

        late = conn.call(fetch_request(FETCH_BY_NAME_V, [], opened.session_id, epoch=1))
        assert late.error_code == ErrorCode.fetch_session_id_not_found


def test_b_s_listings_never_mention_a(pair: Pair, tmp_path: Path) -> None:
    # A group of A's makes __consumer_offsets exist, and gives A something else to hide.
    consumer = Consumer(pair.a.librdkafka(**{"group.id": "audit", "auto.offset.reset": "earliest"}))
    consumer.subscribe([TOPIC])
    consume_group(consumer, len(pair.a_values), settle=0)
    consumer.commit(asynchronous=False)
    consumer.close()

    for tls in (False, True):
        listed = AdminClient(pair.b.librdkafka(tls)).list_topics(timeout=10)
        assert set(listed.topics) == {TOPIC}, f"tls={tls}"

    with connect(pair.b) as conn:
        response = conn.call(metadata_request())
        assert [t.name for t in response.topics] == [TOPIC]
        assert [t.is_internal for t in response.topics] == [False]
        assert pair.a.tenant.encode() not in conn.last_frame
        assert b"__consumer_offsets" not in conn.last_frame

    result = kcat(pair.b, tmp_path, "-L")
    assert result.returncode == 0, result.stderr
    assert f'topic "{TOPIC}"'.encode() in result.stdout
    assert pair.a.tenant.encode() not in result.stdout + result.stderr
    assert b"__consumer_offsets" not in result.stdout


def test_configs_are_described_and_altered_per_tenant(pair: Pair) -> None:
    a_admin, b_admin = admin_for(pair.a), admin_for(pair.b)
    resource = ConfigResource("topic", TOPIC)

    def retention(admin: AdminClient) -> str:
        return str(admin.describe_configs([resource])[resource].result(30)["retention.ms"].value)

    def set_retention(admin: AdminClient, name: str, value: str) -> Any:
        target = ConfigResource(
            "topic",
            name,
            incremental_configs=[
                ConfigEntry("retention.ms", value, incremental_operation=AlterConfigOpType.SET)
            ],
        )
        return admin.incremental_alter_configs([target])[target]

    set_retention(a_admin, TOPIC, "7200000").result(30)
    assert retention(a_admin) == "7200000"
    assert retention(b_admin) != "7200000"

    set_retention(b_admin, TOPIC, "3600000").result(30)
    assert retention(b_admin) == "3600000"
    assert retention(a_admin) == "7200000"

    spelled = ConfigResource("topic", pair.a_broker_name)
    assert (
        error_code(b_admin.describe_configs([spelled])[spelled]) == KafkaError.UNKNOWN_TOPIC_OR_PART
    )
    assert error_code(set_retention(b_admin, pair.a_broker_name, "1000")) == (
        KafkaError.UNKNOWN_TOPIC_OR_PART
    )
    assert retention(a_admin) == "7200000"

    # Growing is configuring too: B's orders grows, A's keeps its partitions.
    b_admin.create_partitions([NewPartitions(TOPIC, PARTITIONS + 1)])[TOPIC].result(30)
    assert len(b_admin.list_topics(TOPIC, timeout=10).topics[TOPIC].partitions) == PARTITIONS + 1
    assert len(a_admin.list_topics(TOPIC, timeout=10).topics[TOPIC].partitions) == PARTITIONS
    grow_a = b_admin.create_partitions([NewPartitions(pair.a_broker_name, 8)])
    assert error_code(grow_a[pair.a_broker_name]) == KafkaError.UNKNOWN_TOPIC_OR_PART
    assert len(a_admin.list_topics(TOPIC, timeout=10).topics[TOPIC].partitions) == PARTITIONS


def test_b_deleting_orders_deletes_only_b_s_topic(pair: Pair) -> None:
    b_admin = admin_for(pair.b)
    spelled = pair.a_broker_name
    assert error_code(b_admin.delete_topics([spelled])[spelled]) == (
        KafkaError.UNKNOWN_TOPIC_OR_PART
    )
    assert_a_untouched(pair)

    b_admin.delete_topics([TOPIC])[TOPIC].result(30)
    deadline = time.monotonic() + 30
    while TOPIC in b_admin.list_topics(timeout=10).topics:
        assert time.monotonic() < deadline, "B's orders was not deleted"
        time.sleep(0.2)
    assert_a_untouched(pair)


def test_b_cannot_list_describe_join_or_delete_a_s_group(pair: Pair) -> None:
    group = "billing"
    a_admin, b_admin = admin_for(pair.a), admin_for(pair.b)
    everything = [TopicPartition(TOPIC, p) for p in range(PARTITIONS)]

    a_consumer = Consumer(
        pair.a.librdkafka(
            **{"group.id": group, "auto.offset.reset": "earliest", "enable.auto.commit": False}
        )
    )
    a_consumer.subscribe([TOPIC])
    assert sorted(consume_group(a_consumer, len(pair.a_values), settle=0)) == sorted(pair.a_values)
    a_consumer.commit(asynchronous=False)
    committed = {(tp.partition, tp.offset) for tp in a_consumer.committed(everything, 10)}
    assert committed == {(p, len(pair.a_values) // PARTITIONS) for p in range(PARTITIONS)}

    def a_offsets() -> set[tuple[str, int, int]]:
        request = ConsumerGroupTopicPartitions(group)
        result = a_admin.list_consumer_group_offsets([request])[group].result(30)
        return {(tp.topic, tp.partition, tp.offset) for tp in result.topic_partitions}

    a_committed = a_offsets()
    assert a_committed == {(TOPIC, p, o) for p, o in committed}

    # List: B has no groups, whatever A has.
    assert group in {g.group_id for g in a_admin.list_consumer_groups().result(30).valid}
    b_groups = b_admin.list_consumer_groups().result(30)
    assert [g.group_id for g in b_groups.valid] == []

    # Describe: the same id, seen by B, is B's (empty) group, not A's live one.
    a_described = a_admin.describe_consumer_groups([group])[group].result(30)
    assert len(a_described.members) == 1
    b_described = b_admin.describe_consumer_groups([group])[group].result(30)
    assert (b_described.state, b_described.members) == (ConsumerGroupState.DEAD, [])
    request = ConsumerGroupTopicPartitions(group)
    b_offsets = b_admin.list_consumer_group_offsets([request])[group].result(30)
    assert list(b_offsets.topic_partitions or []) == []

    # Join: B joining "billing" forms B's own group, over B's own topic.
    b_consumer = Consumer(
        pair.b.librdkafka(
            **{"group.id": group, "auto.offset.reset": "earliest", "enable.auto.commit": False}
        )
    )
    b_consumer.subscribe([TOPIC])
    try:
        assert sorted(consume_group(b_consumer, len(pair.b_values))) == sorted(pair.b_values)
        assert sorted(b_consumer.assignment(), key=lambda tp: tp.partition) == everything
        b_consumer.commit(asynchronous=False)
        b_described = b_admin.describe_consumer_groups([group])[group].result(30)
        assert [m.member_id for m in b_described.members] == [b_consumer.memberid()]
        # A's member was not rebalanced away from its partitions.
        assert [m for m in poll_for(a_consumer, 1) if m.error() is None] == []
        assert sorted(a_consumer.assignment(), key=lambda tp: tp.partition) == everything
        a_described = a_admin.describe_consumer_groups([group])[group].result(30)
        assert [m.member_id for m in a_described.members] == [a_consumer.memberid()]
    finally:
        b_consumer.close()
        a_consumer.close()

    # Delete: B deletes its "billing"; A's, with its offsets, stays.
    b_admin.delete_consumer_groups([group])[group].result(30)
    spelled = f"{pair.a.tenant}.{group}"
    assert error_code(b_admin.delete_consumer_groups([spelled])[spelled]) == (
        KafkaError.GROUP_ID_NOT_FOUND
    )
    assert group in {g.group_id for g in a_admin.list_consumer_groups().result(30).valid}
    assert a_offsets() == a_committed
    assert [g.group_id for g in b_admin.list_consumer_groups().result(30).valid] == []


def test_kcat_as_b_sees_nothing_of_a(pair: Pair, tmp_path: Path) -> None:
    listed = kcat(pair.b, tmp_path, "-L")
    assert listed.returncode == 0, listed.stderr
    assert pair.a.tenant.encode() not in listed.stdout + listed.stderr

    own = kcat(pair.b, tmp_path, "-C", "-t", TOPIC, "-o", "beginning", "-e", "-f", "%s\n")
    assert own.returncode == 0, own.stderr
    assert sorted(own.stdout.splitlines()) == sorted(pair.b_values)

    theirs = kcat(
        pair.b, tmp_path, "-C", "-t", pair.a_broker_name, "-o", "beginning", "-e", "-f", "%s\n"
    )
    assert theirs.stdout == b""
    assert b"Unknown topic" in theirs.stderr, theirs.stderr
    assert_a_untouched(pair)


# -- ACLs ----------------------------------------------------------------------------


def topic_binding(
    tenant: str,
    name: str,
    operation: Operation,
    permission: Permission = Permission.ALLOW,
    pattern: PatternType = PatternType.LITERAL,
) -> AclBinding:
    return AclBinding(tenant, KEY, ResourceType.TOPIC, pattern, name, operation, permission)


def test_a_denied_topic_fails_in_its_own_slot_and_the_rest_proceeds(gateway_cluster: Any) -> None:
    tenant = unique("acl-slot")
    owner = new_key(gateway_cluster, tenant)
    create_topic(owner, "open", 1)
    create_topic(owner, "closed", 1)
    key = new_key(gateway_cluster, tenant, bindings=[topic_binding(tenant, "open", Operation.ALL)])

    with connect(key) as conn:
        topics = {t.name: t for t in conn.call(metadata_request(["closed", "open"])).topics}
    assert topics["closed"].error_code == ErrorCode.topic_authorization_failed
    assert topics["closed"].partitions == ()
    assert topics["open"].error_code == ErrorCode.none
    assert len(topics["open"].partitions) == 1

    with leader_connection(key, "open") as conn:
        produced = {
            t.name: [p.error_code for p in t.partition_responses]
            for t in conn.call(produce_request(["closed", "open"], b"let in")).responses
        }
        assert produced == {
            "closed": [ErrorCode.topic_authorization_failed],
            "open": [ErrorCode.none],
        }
        fetched = {
            t.topic: [(p.error_code, values_in(p.records)) for p in t.partitions]
            for t in conn.call(fetch_request(FETCH_BY_NAME_V, ["closed", "open"])).responses
        }
        assert fetched == {
            "closed": [(ErrorCode.topic_authorization_failed, [])],
            "open": [(ErrorCode.none, [b"let in"])],
        }
        listed = {
            t.name: [(p.error_code, p.offset) for p in t.partitions]
            for t in conn.call(list_offsets_request(["closed", "open"])).topics
        }
        assert listed == {
            "closed": [(ErrorCode.topic_authorization_failed, -1)],
            "open": [(ErrorCode.none, 1)],
        }
        # By id the same: the id is the tenant's own, so it is known, and refused.
        closed_id, open_id = topic_id_of(owner, "closed"), topic_id_of(key, "open")
        by_id = {
            t.topic_id: [(p.error_code, values_in(p.records)) for p in t.partitions]
            for t in conn.call(fetch_request(FETCH_BY_ID_V, [closed_id, open_id])).responses
        }
        assert by_id == {
            closed_id: [(ErrorCode.topic_authorization_failed, [])],
            open_id: [(ErrorCode.none, [b"let in"])],
        }

    assert produce_refusal(key, "closed") == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert read_all(owner, "closed", [0]) == []
    assert read_all(owner, "open", [0]) == [b"let in"]


def test_a_read_only_key_consumes_but_cannot_produce_or_change_topics(
    gateway_cluster: Any,
) -> None:
    tenant = unique("acl-ro")
    owner = new_key(gateway_cluster, tenant)
    create_topic(owner, TOPIC)
    values = [b"ro-%d" % i for i in range(4)]
    produce(owner, TOPIC, values)
    reader = new_key(gateway_cluster, tenant, bindings=read_only_bindings(tenant, KEY))

    assert produce_refusal(reader, TOPIC) == KafkaError.TOPIC_AUTHORIZATION_FAILED
    consumer = Consumer(
        reader.librdkafka(**{"group.id": "readers", "auto.offset.reset": "earliest"})
    )
    consumer.subscribe([TOPIC])
    try:
        assert sorted(consume_group(consumer, len(values), settle=0)) == sorted(values)
        consumer.commit(asynchronous=False)
    finally:
        consumer.close()

    admin = admin_for(reader)
    assert set(admin.list_topics(timeout=10).topics) == {TOPIC}
    assert error_code(admin.create_topics([NewTopic("more", 1)])["more"]) == (
        KafkaError.TOPIC_AUTHORIZATION_FAILED
    )
    assert error_code(admin.delete_topics([TOPIC])[TOPIC]) == (
        KafkaError.TOPIC_AUTHORIZATION_FAILED
    )
    assert sorted(read_all(owner, TOPIC)) == sorted(values)


def test_a_key_without_bindings_sees_no_topics_and_cannot_create(gateway_cluster: Any) -> None:
    tenant = unique("acl-none")
    owner = new_key(gateway_cluster, tenant)
    create_topic(owner, TOPIC)
    key = new_key(gateway_cluster, tenant, bindings=[])

    admin = admin_for(key)
    assert set(admin.list_topics(timeout=10).topics) == set()
    named = admin.list_topics(TOPIC, timeout=10).topics[TOPIC]
    assert named.error is not None
    assert named.error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert error_code(admin.create_topics([NewTopic("mine", 1)])["mine"]) == (
        KafkaError.TOPIC_AUTHORIZATION_FAILED
    )
    assert set(admin_for(owner).list_topics(timeout=10).topics) == {TOPIC}


def test_a_deny_binding_wins_over_the_default_allow(gateway_cluster: Any) -> None:
    tenant = unique("acl-deny")
    owner = new_key(gateway_cluster, tenant)
    for name in (TOPIC, "other", "secret-plans"):
        create_topic(owner, name, 1)
    produce(owner, TOPIC, [b"written by the owner"])
    key = new_key(
        gateway_cluster,
        tenant,
        bindings=[
            *default_bindings(tenant, KEY),
            topic_binding(tenant, TOPIC, Operation.WRITE, Permission.DENY),
            topic_binding(tenant, "secret-", Operation.ALL, Permission.DENY, PatternType.PREFIXED),
        ],
    )

    assert produce_refusal(key, TOPIC) == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert produce_refusal(key, "secret-plans") == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert produce_refusal(key, "other") is None
    # Denying WRITE leaves READ and DESCRIBE alone; denying ALL hides the topic.
    assert read_all(key, TOPIC, [0]) == [b"written by the owner"]
    assert set(admin_for(key).list_topics(timeout=10).topics) == {TOPIC, "other"}
    assert read_all(owner, "secret-plans", [0]) == []


def test_the_partition_limit_refuses_with_policy_violation(gateway_cluster: Any) -> None:
    # A neighbour's partitions are its own business: they do not count against the limit.
    create_topic(new_key(gateway_cluster, unique("roomy")), "big", 8)
    key = new_key(gateway_cluster, unique("limit"), quotas=Quotas(max_partitions=4))
    admin = admin_for(key)
    admin.create_topics([NewTopic("first", 3)])["first"].result(30)

    assert error_code(admin.create_topics([NewTopic("second", 3)])["second"]) == (
        KafkaError.POLICY_VIOLATION
    )
    assert error_code(admin.create_partitions([NewPartitions("first", 5)])["first"]) == (
        KafkaError.POLICY_VIOLATION
    )
    # One request, checked in order: the first 1-partition topic still fits, the next not.
    created = admin.create_topics([NewTopic("third", 1), NewTopic("fourth", 1)])
    created["third"].result(30)
    assert error_code(created["fourth"]) == KafkaError.POLICY_VIOLATION
    # A topic with the brokers' default count (1) is counted as that, not as nothing.
    assert error_code(admin.create_topics([NewTopic("fifth")])["fifth"]) == (
        KafkaError.POLICY_VIOLATION
    )

    listed = admin.list_topics(timeout=10).topics
    assert {name: len(t.partitions) for name, t in listed.items()} == {"first": 3, "third": 1}


# -- ACL management (DescribeAcls, CreateAcls, DeleteAcls) ---------------------------


def acl_admin(gateway_cluster: Any, tenant: str) -> TenantKey:
    """A key with the default bindings and ALTER on its tenant's cluster."""
    alter = AclBinding(
        tenant, KEY, ResourceType.CLUSTER, PatternType.LITERAL, CLUSTER_NAME, Operation.ALTER
    )
    return new_key(gateway_cluster, tenant, bindings=[*default_bindings(tenant, KEY), alter])


EVERY_ACL = AclBindingFilter(
    AdminResourceType.ANY,
    None,
    ResourcePatternType.ANY,
    None,
    None,
    AclOperation.ANY,
    AclPermissionType.ANY,
)


def acls_of(key: TenantKey, selection: AclBindingFilter = EVERY_ACL) -> set[tuple[Any, ...]]:
    admin = admin_for(key)  # held: a collected client cancels its futures
    found = admin.describe_acls(selection, request_timeout=30).result(30)
    return {(b.restype, b.name, b.resource_pattern_type, b.principal, b.operation) for b in found}


def create_acls(key: TenantKey, *bindings: AdminAclBinding) -> None:
    admin = admin_for(key)
    for future in admin.create_acls(list(bindings), request_timeout=30).values():
        future.result(30)


def topic_acl(
    name: str,
    principal: str = "User:*",
    pattern: ResourcePatternType = ResourcePatternType.LITERAL,
    operation: AclOperation = AclOperation.ALL,
    permission: AclPermissionType = AclPermissionType.DENY,
) -> AdminAclBinding:
    return AdminAclBinding(
        AdminResourceType.TOPIC, name, pattern, principal, "*", operation, permission
    )


@pytest.fixture
def acl_pair(pair: Pair, gateway_cluster: Any) -> tuple[TenantKey, TenantKey]:
    """An ACL-managing key of A and one of B, each having made bindings of its own;
    A's name B's namespace, as a curious A would."""
    a, b = acl_admin(gateway_cluster, pair.a.tenant), acl_admin(gateway_cluster, pair.b.tenant)
    create_acls(
        a,
        topic_acl(TOPIC, principal=f"User:{pair.a.key_id}", permission=AclPermissionType.ALLOW),
        topic_acl(f"{pair.b.tenant}.", pattern=ResourcePatternType.PREFIXED),
        topic_acl(f"{pair.b.tenant}.{TOPIC}"),
        topic_acl("*", principal=f"User:{pair.b.key_id}"),
    )
    create_acls(b, topic_acl("b-only", operation=AclOperation.READ))
    return a, b


def test_acl_listings_and_filters_show_a_tenant_only_its_own_bindings(
    pair: Pair, acl_pair: tuple[TenantKey, TenantKey]
) -> None:
    a, b = acl_pair
    seen_by_b = acls_of(b)
    assert "b-only" in {name for _, name, *_ in seen_by_b}
    assert not [row for row in seen_by_b if row[1].startswith(pair.b.tenant)]
    assert not [row for row in seen_by_b if row[3] in (f"User:{pair.a.key_id}", f"User:{a.key_id}")]
    # B's key id named in A's binding is A's business: B does not see it.
    assert "b-only" not in {name for _, name, *_ in acls_of(a)}

    # Wildcard and MATCH filters select within the tenant only.
    orders = AclBindingFilter(
        AdminResourceType.TOPIC,
        TOPIC,
        ResourcePatternType.MATCH,
        None,
        None,
        AclOperation.ANY,
        AclPermissionType.ANY,
    )
    assert {(name, principal) for _, name, _, principal, _ in acls_of(b, orders)} == {
        ("*", f"User:{pair.b.key_id}"),
        ("*", f"User:{b.key_id}"),
    }
    everyone = AclBindingFilter(
        AdminResourceType.ANY,
        None,
        ResourcePatternType.ANY,
        "User:*",
        None,
        AclOperation.ANY,
        AclPermissionType.ANY,
    )
    assert {name for _, name, *_ in acls_of(b, everyone)} == {"b-only"}

    # A's bindings on "<b>." and "<b>.orders" are on A's own names: B's topic is untouched.
    produce(pair.b, TOPIC, [b"B:after"])
    assert b"B:after" in read_all(pair.b, TOPIC)
    # A's DENY for B's key id applies to no key of B's.
    assert sorted(read_all(pair.b, TOPIC)) == sorted([*pair.b_values, b"B:after"])


def test_a_broad_delete_removes_only_the_tenants_own_bindings(
    pair: Pair, acl_pair: tuple[TenantKey, TenantKey]
) -> None:
    a, b = acl_pair
    before_b = acls_of(b)
    admin = admin_for(a)
    deleted = admin.delete_acls([EVERY_ACL], request_timeout=30)
    [matched] = [future.result(30) for future in deleted.values()]
    assert len(matched) == 4
    assert acls_of(b) == before_b
    # A's declared bindings (its keys' roles) stay: only the operator changes them.
    assert (
        AdminResourceType.TOPIC,
        "*",
        ResourcePatternType.LITERAL,
        f"User:{pair.a.key_id}",
        AclOperation.ALL,
    ) in acls_of(a)
    assert_a_untouched(pair)


def test_a_binding_made_through_the_api_applies_within_seconds(gateway_cluster: Any) -> None:
    tenant = unique("acl-live")
    admin = acl_admin(gateway_cluster, tenant)
    create_topic(admin, "ledger", 1)
    produce(admin, "ledger", [b"entry"])
    reader = new_key(gateway_cluster, tenant)
    assert read_all(reader, "ledger", [0]) == [b"entry"]

    deny = topic_acl("ledger", f"User:{reader.key_id}", operation=AclOperation.READ)
    create_acls(admin, deny)

    def fetch_error() -> int:
        with leader_connection(reader, "ledger") as conn:
            (topic,) = conn.call(fetch_request(FETCH_BY_NAME_V, ["ledger"])).responses
        return int(topic.partitions[0].error_code)

    wait_until(
        lambda: fetch_error() == ErrorCode.topic_authorization_failed,
        5,
        "the new DENY to refuse the reader's fetch",
    )
    # DENY READ leaves DESCRIBE alone, as in Kafka: the reader still sees the topic.
    assert "ledger" in admin_for(reader).list_topics(timeout=10).topics

    client = admin_for(admin)
    for future in client.delete_acls([EVERY_ACL], request_timeout=30).values():
        future.result(30)
    wait_until(lambda: fetch_error() == ErrorCode.none, 5, "the reader to read again")


def test_a_binding_made_through_the_api_applies_within_a_fetch_session(
    gateway_cluster: Any,
) -> None:
    """A session's later requests need not name its partitions: the gateway judges them
    again when the tenant's ACLs change, as Kafka authorizes a session's every partition.
    The client here goes on as Kafka's clients do: incrementally while it has a session,
    with a full fetch that asks for one when the server closed it."""
    tenant = unique("acl-session")
    admin = acl_admin(gateway_cluster, tenant)
    create_topic(admin, "ledger", 1)
    create_topic(admin, "open", 1)
    produce(admin, "ledger", [b"entry"])
    reader = new_key(gateway_cluster, tenant)

    with leader_connection(reader, "ledger") as conn:
        session = {"id": 0, "epoch": 0}

        def fetch_next() -> dict[str, list[tuple[int, list[bytes | None]]]]:
            if session["id"]:
                session["epoch"] += 1
                request = fetch_request(FETCH_BY_NAME_V, [], session["id"], session["epoch"])
            else:
                request = fetch_request(FETCH_BY_NAME_V, ["ledger", "open"], 0, epoch=0)
            answer = conn.call(request)
            assert answer.error_code == ErrorCode.none
            session["id"] = answer.session_id
            return {
                topic.topic: [(int(p.error_code), values_in(p.records)) for p in topic.partitions]
                for topic in answer.responses
            }

        assert fetch_next()["ledger"] == [(ErrorCode.none, [b"entry"])]
        opened = session["id"]
        assert opened != 0

        create_acls(
            admin, topic_acl("ledger", f"User:{reader.key_id}", operation=AclOperation.READ)
        )
        wait_until(
            lambda: fetch_next().get("ledger") == [(ErrorCode.topic_authorization_failed, [])],
            5,
            "the new DENY to refuse the partition in the reader's session",
        )
        # Answered again and again, as Kafka answers an errored partition of a session,
        # which goes on for the topic still readable ("open", wherever its leader is).
        assert fetch_next()["ledger"] == [(ErrorCode.topic_authorization_failed, [])]
        assert session["id"] == opened

        client = admin_for(admin)
        for future in client.delete_acls([EVERY_ACL], request_timeout=30).values():
            future.result(30)
        # Granted back: read again from where the client left it, in the same session.
        wait_until(
            lambda: fetch_next().get("ledger") == [(ErrorCode.none, [b"entry"])],
            5,
            "the session to read the partition again",
        )
        assert session["id"] == opened
