"""Seeded fault schedules, and applying them to a cluster of real processes.

A schedule is a list of faults drawn from one seed, so a failure replays with
``SHOAL_FAULT_SEED=<seed>``. Each fault picks its victim when it starts (the
leader of a random partition of the topic under test, as the brokers say at
that moment), lasts a while, is healed, and is followed by a calm spell in
which the cluster may recover.

Kinds here: ``kill`` (SIGKILL a partition leader, start it again when the
fault ends), ``pause`` (SIGSTOP a partition leader, SIGCONT it), and
``gateway`` (restart the gateway); test_fault_network.py adds links cut in
network namespaces, etcd isolated and restarted, and a full log directory.
"""

from __future__ import annotations

import logging
import os
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

log = logging.getLogger(__name__)

KINDS = ("kill", "pause", "gateway")


@dataclass(frozen=True)
class Fault:
    kind: str
    partition: int
    """Whose leader is the victim (for broker faults)."""
    lasts_s: float
    calm_s: float
    """How long the cluster is left alone after the fault is healed."""


def fault_seed() -> int:
    given = os.environ.get("SHOAL_FAULT_SEED")
    return int(given) if given else random.SystemRandom().randrange(1 << 32)


def schedule(
    seed: int, seconds: float, partitions: int, kinds: Sequence[str] = KINDS
) -> list[Fault]:
    """Every kind once (in a seeded order), then more until about ``seconds`` are filled."""
    rng = random.Random(seed)
    faults: list[Fault] = []
    order = list(kinds)
    rng.shuffle(order)
    total = 0.0
    while total < seconds or len(faults) < len(order):
        kind = order[len(faults)] if len(faults) < len(order) else rng.choice(list(kinds))
        fault = Fault(kind, rng.randrange(partitions), rng.uniform(3, 12), rng.uniform(3, 6))
        faults.append(fault)
        total += fault.lasts_s + fault.calm_s
    return faults


@dataclass
class Applied:
    fault: Fault
    victim: str
    began_s: float
    healed_s: float


class FaultInjector:
    """Applies faults to the brokers and gateway of a GatewayCluster."""

    def __init__(self, cluster: Any, broker_topic: str, clock: Callable[[], float]) -> None:
        self.cluster = cluster
        self.broker_topic = broker_topic
        self.clock = clock
        self.applied: list[Applied] = []
        self.failovers = 0
        """Partition leaders that moved, counted from the leaders seen before each fault,
        when it was healed, and after the last one's calm spell."""
        self._last_leaders: dict[int, int] = {}

    def leader_of(self, partition: int) -> int:
        admin = AdminClient({"bootstrap.servers": self.live_bootstrap()})
        found = admin.list_topics(self.broker_topic, timeout=10).topics[self.broker_topic]
        return int(found.partitions[partition].leader)

    def leaders(self) -> dict[int, int]:
        """Each partition's leader as the brokers say now; {} if they cannot say."""
        admin = AdminClient({"bootstrap.servers": self.live_bootstrap()})
        try:
            found = admin.list_topics(self.broker_topic, timeout=5).topics[self.broker_topic]
        except KafkaException:
            return {}
        return {p: int(m.leader) for p, m in found.partitions.items() if m.leader >= 0}

    def _count_failovers(self) -> None:
        now = self.leaders()
        self.failovers += sum(
            1 for p, leader in now.items() if self._last_leaders.get(p, leader) != leader
        )
        self._last_leaders.update(now)

    def live_bootstrap(self) -> str:
        return ",".join(b.bootstrap for b in self.cluster.brokers if b.running)

    def broker(self, node: int) -> Any:
        [found] = [b for b in self.cluster.brokers if b.node_id == node]
        return found

    def leader_broker(self, partition: int) -> Any:
        node = self.leader_of(partition)
        return self.broker(node if node >= 0 else self.cluster.brokers[0].node_id)

    def apply(self, fault: Fault) -> None:
        """Break, wait ``lasts_s``, heal, then leave the cluster alone for ``calm_s``."""
        self._count_failovers()
        began = self.clock()
        victim = getattr(self, f"fault_{fault.kind}")(fault)
        healed = self.clock()
        log.warning("fault %s on %s from %.1f s to %.1f s", fault.kind, victim, began, healed)
        self.applied.append(Applied(fault, victim, began, healed))
        self._count_failovers()
        time.sleep(fault.calm_s)

    def fault_gateway(self, fault: Fault) -> str:
        self.cluster.gateway.stop()
        time.sleep(fault.lasts_s)
        self.cluster.gateway.start()
        return "gateway"

    def fault_kill(self, fault: Fault) -> str:
        broker = self.leader_broker(fault.partition)
        broker.kill()
        time.sleep(fault.lasts_s)
        broker.start()
        return f"broker {broker.node_id}"

    def fault_pause(self, fault: Fault) -> str:
        broker = self.leader_broker(fault.partition)
        broker.pause()
        time.sleep(fault.lasts_s)
        broker.resume()
        return f"broker {broker.node_id}"

    def run(self, faults: Sequence[Fault]) -> None:
        for fault in faults:
            self.apply(fault)
        self._count_failovers()
