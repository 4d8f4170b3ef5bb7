"""Three brokers, replication factor 3: failover without loss, ISR, controlled shutdown.

The promise under test is Kafka's: with replication factor N, up to N-1
broker failures lose no record that was acknowledged with acks=all.
"""

from __future__ import annotations

import contextlib
import datetime
import random
import signal
import sys
import time

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from conftest import BrokerFactory
from harness import wait_until
from raw_kafka import RawConnection, request_class
from replicated import (
    Cluster,
    SteadyProducer,
    failover_gap,
    random_victim,
    read_all,
    start_cluster,
)

from shoal.records import NewRecord, build_batch

pytestmark = pytest.mark.timeout(600)


@pytest.fixture
def cluster(broker_factory: BrokerFactory) -> Cluster:
    return start_cluster(broker_factory)


def test_topics_are_placed_on_three_brokers_with_every_replica_in_sync(cluster: Cluster) -> None:
    topic = cluster.create_topic("placed", 6)
    views = cluster.partitions(topic)
    assert all(len(set(v.replicas)) == 3 for v in views.values())
    # Leaders spread evenly: two partitions each.
    leaders = sorted(v.leader for v in views.values())
    assert leaders == [0, 0, 1, 1, 2, 2]
    cluster.wait_full_isr(topic)


@pytest.mark.parametrize("round_", range(5))
def test_acknowledged_records_survive_the_leader_killed_mid_stream(
    cluster: Cluster, round_: int
) -> None:
    rng = random.Random()
    topic = cluster.create_topic(f"failover-{round_}", 3)
    cluster.wait_full_isr(topic)
    partition, victim = random_victim(cluster.partitions(topic), rng)
    producer = SteadyProducer(cluster.bootstrap, topic).start()
    wait_until(lambda: producer.acked_count() > 400, 30, "steady acknowledgements")
    killed_at = time.monotonic()
    cluster.brokers[victim].kill()
    wait_until(lambda: cluster.leader_of(topic, partition) not in (-1, victim), 30, "a new leader")
    acked_before = producer.acked_count()
    wait_until(lambda: producer.acked_count() > acked_before + 400, 30, "writes after failover")
    producer.stop()

    assert not producer.errors, producer.errors[:3]
    gap = failover_gap([a for a in producer.acked if a[1] == partition], killed_at)
    print(f"round {round_}: killed broker {victim} (leader of {partition}); gap {gap:.2f}s")
    stored = read_all(cluster.live_bootstrap(), topic, 3)
    for p, records in stored.items():
        offsets = [o for o, _ in records]
        assert offsets == list(range(len(offsets))), f"partition {p} has gaps"
        sequences = [int(v.split(b"-")[1]) for _, v in records]
        assert len(sequences) == len(set(sequences)), f"partition {p} has duplicates"
        assert sequences == sorted(sequences), f"partition {p} is out of order"
    readable = {int(v.split(b"-")[1]): (p, o) for p, recs in stored.items() for o, v in recs}
    for seq, p, offset, _ in producer.acked:
        assert readable.get(seq) == (p, offset), f"acknowledged record {seq} lost or moved"

    cluster.restart(victim)
    cluster.wait_full_isr(topic)


def test_two_of_three_brokers_gone_refuses_acks_all_but_serves_reads(cluster: Cluster) -> None:
    topic = cluster.create_topic("two-down", 1)
    cluster.wait_full_isr(topic)
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all"})
    for i in range(100):
        producer.produce(topic, value=b"kept-%d" % i)
    assert producer.flush(30) == 0
    survivor = 2
    for node in (0, 1):
        cluster.brokers[node].kill()
    wait_until(
        lambda: cluster.partitions(topic)[0].isr == (survivor,), 30, "the ISR down to the survivor"
    )
    assert cluster.leader_of(topic, 0) == survivor

    # retries=0 shows the broker's answer; with retries librdkafka keeps
    # trying this retriable error and reports _MSG_TIMED_OUT at message.timeout.ms.
    failures: list[KafkaError] = []
    refused = Producer({"bootstrap.servers": cluster.live_bootstrap(), "acks": "all", "retries": 0})
    refused.produce(topic, value=b"not-enough", on_delivery=lambda err, _m: failures.append(err))
    started = time.monotonic()
    refused.flush(30)
    assert time.monotonic() - started < 15, "the write hung"
    assert [e.code() for e in failures] == [KafkaError.NOT_ENOUGH_REPLICAS]

    stored = read_all(cluster.live_bootstrap(), topic, 1)
    assert [v for _, v in stored[0]] == [b"kept-%d" % i for i in range(100)]


def test_a_broker_that_falls_silent_leaves_the_isr_and_rejoins_when_back(
    cluster: Cluster,
) -> None:
    topic = cluster.create_topic("rejoin", 3)
    cluster.wait_full_isr(topic)
    cluster.brokers[1].kill()
    wait_until(
        lambda: all(1 not in v.isr for v in cluster.partitions(topic).values()),
        30,
        "broker 1 out of every ISR",
    )
    producer = Producer({"bootstrap.servers": cluster.live_bootstrap(), "acks": "all"})
    for i in range(1000):
        producer.produce(topic, value=b"while-away-%d" % i, partition=i % 3)
    assert producer.flush(30) == 0
    cluster.restart(1)
    cluster.wait_full_isr(topic)
    # Preferred leadership comes back to broker 1 (partition 1 prefers it).
    wait_until(
        lambda: all(v.leader == v.replicas[0] for v in cluster.partitions(topic).values()),
        30,
        "preferred leaders back",
    )


def test_sigterm_moves_leadership_before_the_broker_stops(cluster: Cluster) -> None:
    topic = cluster.create_topic("controlled", 3)
    cluster.wait_full_isr(topic)
    victim = cluster.leader_of(topic, 0)
    producer = SteadyProducer(cluster.bootstrap, topic).start()
    wait_until(lambda: producer.acked_count() > 200, 30, "steady acknowledgements")
    stopped_at = time.monotonic()
    assert cluster.brokers[victim].stop() == 0
    log = cluster.brokers[victim].log_text()
    assert "event=controlled_shutdown_complete" in log
    assert all(v.leader != victim for v in cluster.partitions(topic).values())
    acked_before = producer.acked_count()
    wait_until(lambda: producer.acked_count() > acked_before + 200, 30, "writes continue")
    producer.stop()
    assert not producer.errors
    gap = failover_gap([a for a in producer.acked if a[1] == 0], stopped_at)
    print(f"controlled shutdown of broker {victim}: acknowledgement gap {gap:.2f}s")
    cluster.restart(victim)
    cluster.wait_full_isr(topic)


def test_a_follower_answers_not_leader_and_metadata_names_offline_replicas(
    cluster: Cluster,
) -> None:
    topic = cluster.create_topic("not-leader", 1)
    cluster.wait_full_isr(topic)
    view = cluster.partitions(topic)[0]
    follower = next(n for n in view.replicas if n != view.leader)
    produce = request_class(0, 9)
    module = sys.modules[produce.__module__]
    request = produce(
        transactional_id=None,
        acks=1,
        timeout=datetime.timedelta(seconds=5),
        topic_data=(
            module.TopicProduceData(
                name=topic,
                partition_data=(
                    module.PartitionProduceData(
                        index=0, records=build_batch([NewRecord(None, b"to-a-follower")])
                    ),
                ),
            ),
        ),
    )
    with RawConnection(cluster.brokers[follower].bootstrap) as conn:
        response = conn.call(request)
    code = response.responses[0].partition_responses[0].error_code
    assert code.name == "not_leader_or_follower"

    offline = next(n for n in view.replicas if n not in (view.leader, follower))
    cluster.brokers[offline].kill()
    metadata = request_class(3, 12)
    mmod = sys.modules[metadata.__module__]
    with RawConnection(cluster.brokers[view.leader].bootstrap) as conn:

        def offline_reported() -> bool:
            body = conn.call(
                metadata(
                    topics=(mmod.MetadataRequestTopic(topic_id=None, name=topic),),
                    allow_auto_topic_creation=False,
                    include_topic_authorized_operations=False,
                )
            )
            part = body.topics[0].partitions[0]
            return tuple(part.offline_replicas) == (offline,) and offline not in part.isr_nodes

        wait_until(offline_reported, 30, "the killed replica reported offline", interval=0.2)


def test_committed_offsets_never_go_backwards_while_the_coordinator_dies(
    cluster: Cluster,
) -> None:
    topic = cluster.create_topic("group-failover", 3)
    cluster.wait_full_isr(topic)
    producer = SteadyProducer(cluster.bootstrap, topic, rate=300).start()
    group = "failover-group"
    consumer = Consumer(
        {
            "bootstrap.servers": cluster.bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    watcher = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": group})
    tps = [TopicPartition(topic, p) for p in range(3)]
    seen_commits: dict[int, list[int]] = {p: [] for p in range(3)}
    consumed: set[bytes] = set()

    def step(seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            message = consumer.poll(0.2)
            if message is not None and not message.error():
                consumed.add(message.value())
                # A commit may fail while the coordinator moves; the next one covers it.
                with contextlib.suppress(KafkaException):
                    consumer.commit(message=message, asynchronous=False)
            with contextlib.suppress(KafkaException):
                for tp in watcher.committed(tps, timeout=2):
                    if tp.offset >= 0:
                        seen_commits[tp.partition].append(tp.offset)

    step(4)
    coordinator = _coordinator_of(cluster, group)
    cluster.brokers[coordinator].kill()
    step(12)
    producer.stop()
    acked_values = {b"seq-%d" % seq for seq, *_ in producer.acked}
    # Each record costs this loop a synchronous commit and a committed() call, so
    # on a busy machine it drains the backlog slowly: read until every
    # acknowledged record is in, within a bound.
    deadline = time.monotonic() + 60
    while not acked_values <= consumed and time.monotonic() < deadline:
        step(1)
    consumer.close()
    watcher.close()

    assert any(len(s) > 5 for s in seen_commits.values()), seen_commits
    for p, offsets in seen_commits.items():
        assert offsets == sorted(offsets), f"committed offset of partition {p} went backwards"
    unread = sorted(int(v.split(b"-")[1]) for v in acked_values - consumed)
    assert not unread, f"{len(unread)} acknowledged records unread, seq {unread[0]}..{unread[-1]}"
    cluster.restart(coordinator)


def _coordinator_of(cluster: Cluster, group: str) -> int:
    find = request_class(10, 4)
    with RawConnection(cluster.live_bootstrap().split(",")[0]) as conn:
        body = conn.call(find(key_type=0, coordinator_keys=(group,)))
    return int(body.coordinators[0].node_id)


def test_an_uncommitted_tail_of_a_dead_leader_is_cut_when_it_returns(cluster: Cluster) -> None:
    """KIP-101: records only the old leader had are removed, never served, after failover."""
    topic = cluster.create_topic("divergent", 1, **{"min.insync.replicas": "1"})
    cluster.wait_full_isr(topic)
    old_leader = cluster.leader_of(topic, 0)
    followers = [n for n in cluster.brokers if n != old_leader]
    committed = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all"})
    for i in range(50):
        committed.produce(topic, value=b"committed-%d" % i)
    assert committed.flush(30) == 0

    # Freeze the followers, give the leader records only it has, then kill it:
    # acks=1 answers them, but no other replica ever copies them.
    for node in followers:
        cluster.brokers[node].pause()
    # A fetch the followers sent before the pause may still be parked at the
    # leader; it would carry the new records into their socket buffers. Parked
    # fetches end after replica.fetch.wait.max.ms (500 ms); the frozen
    # followers send no new ones. Their 3 s leases outlast all this.
    time.sleep(0.8)
    try:
        lonely = Producer({"bootstrap.servers": cluster.brokers[old_leader].bootstrap, "acks": "1"})
        for i in range(20):
            lonely.produce(topic, value=b"lost-%d" % i)
        assert lonely.flush(10) == 0
        cluster.brokers[old_leader].kill()
    finally:
        for node in followers:
            cluster.brokers[node].resume()

    wait_until(lambda: cluster.leader_of(topic, 0) in followers, 30, "a follower elected leader")
    after = Producer({"bootstrap.servers": cluster.live_bootstrap(), "acks": "all"})
    for i in range(30):
        after.produce(topic, value=b"after-%d" % i)
    assert after.flush(30) == 0

    cluster.restart(old_leader)
    cluster.wait_full_isr(topic)
    assert "event=log_truncated" in cluster.brokers[old_leader].log_text()
    expected = [b"committed-%d" % i for i in range(50)] + [b"after-%d" % i for i in range(30)]
    # Every replica serves the same log: ask each in turn as leader.
    for node in cluster.brokers:
        for other in cluster.brokers:
            if other != node:
                cluster.brokers[other].stop()
        stored = read_all(cluster.brokers[node].bootstrap, topic, 1)
        assert [v for _, v in stored[0]] == expected, f"broker {node} serves another log"
        for other in cluster.brokers:
            if other != node:
                cluster.restart(other)
        cluster.wait_full_isr(topic)


def test_every_broker_stopped_at_once_exits_cleanly(cluster: Cluster) -> None:
    """Each loses its leader while it stops; none may keep retrying forever."""
    topic = cluster.create_topic("all-stop", 3)
    cluster.wait_full_isr(topic)
    for broker in cluster.brokers.values():
        assert broker.process is not None
        broker.process.send_signal(signal.SIGTERM)
    for broker in cluster.brokers.values():
        assert broker.process.wait(45) == 0, broker.log_tail()


def test_a_broker_forwards_topic_creation_to_the_controller(cluster: Cluster) -> None:
    """The controller places replicas, whichever broker a client asks."""
    metadata = cluster.admin().list_topics(timeout=10)
    controller = metadata.controller_id
    other = next(n for n in cluster.brokers if n != controller)
    create = request_class(19, 7)
    module = sys.modules[create.__module__]
    request = create(
        topics=(
            module.CreatableTopic(
                name="forwarded", num_partitions=6, replication_factor=3, assignments=(), configs=()
            ),
        ),
        timeout=datetime.timedelta(seconds=30),
        validate_only=False,
    )
    with RawConnection(cluster.brokers[other].bootstrap) as conn:
        response = conn.call(request)
    assert response.topics[0].error_code.name == "none"
    assert response.topics[0].num_partitions == 6
    assert "event=topic_created topic=forwarded" in cluster.brokers[controller].log_text()
    assert "event=topic_created topic=forwarded" not in cluster.brokers[other].log_text()
    # The broker that was asked already knows the topic when it answers.
    listed = AdminClient({"bootstrap.servers": cluster.brokers[other].bootstrap}).list_topics(
        "forwarded", timeout=10
    )
    assert len(listed.topics["forwarded"].partitions) == 6
