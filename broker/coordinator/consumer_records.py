"""Records of KIP-848 consumer groups in ``__consumer_offsets``, in Kafka's format.

Keys are non-flexible (int16 record type, then int16-length strings); values
start with an int16 version and are Kafka's flexible encoding (compact
strings and arrays, uuids as 16 bytes, a tagged-field section at the end of
each struct). The types, from Kafka's group-coordinator message schemas::

    3  ConsumerGroupMetadata                 key: group         value v0: epoch int32
    5  ConsumerGroupMemberMetadata           key: group, member value v0: instance_id?, rack_id?,
                                             client_id, client_host, [subscribed topic names],
                                             regex?, rebalance_timeout int32, server_assignor?
    6  ConsumerGroupTargetAssignmentMetadata key: group         value v0: assignment_epoch int32
    7  ConsumerGroupTargetAssignmentMember   key: group, member value v0: [topic_id, [partition]]
    8  ConsumerGroupCurrentMemberAssignment  key: group, member value v0: member_epoch int32,
                                             previous_member_epoch int32, state int8,
                                             [assigned], [pending revocation]

In record 8 each topic's entry carries, as its tagged field 0 (Kafka 4.3's
AssignmentEpochs, KIP-1251), the assignment epoch of each of its partitions,
in the partitions' order. Without it (written by an older Kafka, or a count
that does not match), a partition counts as assigned at the member's epoch,
as Kafka reads it: stricter for commits, never looser.

A null value deletes: a member leaves with tombstones for 8, 7 and 5 (in
that order, as Kafka writes them), a group goes with 6 and 3. Type 4
(ConsumerGroupPartitionMetadata) is Kafka's subscription metadata; it is
read past and not written: the coordinator recomputes it from the cluster's
topics after loading. Unknown tagged fields are skipped, so values written
by a newer Kafka load too.
"""

from __future__ import annotations

import struct
import uuid
from dataclasses import dataclass, replace
from typing import Final

from shoal.broker.coordinator.assignors import Partitions
from shoal.broker.coordinator.consumer_group import ConsumerGroup, ConsumerMember, MemberState
from shoal.broker.coordinator.records import RecordFormatError

from shoal.wire.varint import VarintError, encode_uvarint, read_uvarint

GROUP_EPOCH_KEY: Final = 3
PARTITION_METADATA_KEY: Final = 4
MEMBER_METADATA_KEY: Final = 5
TARGET_METADATA_KEY: Final = 6
TARGET_MEMBER_KEY: Final = 7
CURRENT_ASSIGNMENT_KEY: Final = 8
ASSIGNMENT_EPOCHS_TAG: Final = 0
"""The tag of a current assignment's TopicPartitions.AssignmentEpochs (Kafka 4.3)."""
CONSUMER_KEYS: Final = frozenset(
    {
        GROUP_EPOCH_KEY,
        PARTITION_METADATA_KEY,
        MEMBER_METADATA_KEY,
        TARGET_METADATA_KEY,
        TARGET_MEMBER_KEY,
        CURRENT_ASSIGNMENT_KEY,
    }
)
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")

Entry = tuple[bytes, bytes | None]


@dataclass(frozen=True, slots=True)
class ConsumerKey:
    kind: int
    group: str
    member: str | None = None


# -- writing ----------------------------------------------------------------------


class _Writer:
    def __init__(self) -> None:
        self.out = bytearray()

    def i8(self, value: int) -> None:
        self.out += struct.pack(">b", value)

    def i16(self, value: int) -> None:
        self.out += _I16.pack(value)

    def i32(self, value: int) -> None:
        self.out += _I32.pack(value)

    def string(self, value: str) -> None:
        data = value.encode()
        self.i16(len(data))
        self.out += data

    def compact_string(self, value: str | None) -> None:
        if value is None:
            self.out += encode_uvarint(0)
            return
        data = value.encode()
        self.out += encode_uvarint(len(data) + 1)
        self.out += data

    def array_len(self, count: int) -> None:
        self.out += encode_uvarint(count + 1)

    def no_tags(self) -> None:
        self.out += encode_uvarint(0)

    def partitions(self, partitions: Partitions, member: ConsumerMember | None = None) -> None:
        """Kafka's TopicPartitions array; with ``member``, each topic's partitions'
        assignment epochs as its tagged field 0 (AssignmentEpochs)."""
        entries = sorted((t, sorted(ps)) for t, ps in partitions.items() if ps)
        self.array_len(len(entries))
        for topic_id, numbers in entries:
            self.out += topic_id.bytes
            self.array_len(len(numbers))
            for number in numbers:
                self.i32(number)
            if member is None:
                self.no_tags()
                continue
            epochs = _Writer()
            epochs.array_len(len(numbers))
            for number in numbers:
                epochs.i32(member.assignment_epoch(topic_id, number) or 0)
            self.out += encode_uvarint(1)  # one tagged field
            self.out += encode_uvarint(ASSIGNMENT_EPOCHS_TAG)
            self.out += encode_uvarint(len(epochs.out))
            self.out += epochs.out


def _key(kind: int, group: str, member: str | None = None) -> bytes:
    w = _Writer()
    w.i16(kind)
    w.string(group)
    if member is not None:
        w.string(member)
    return bytes(w.out)


def group_epoch_record(group_id: str, epoch: int) -> Entry:
    w = _Writer()
    w.i16(0)
    w.i32(epoch)
    w.no_tags()
    return _key(GROUP_EPOCH_KEY, group_id), bytes(w.out)


def member_metadata_record(group_id: str, member: ConsumerMember) -> Entry:
    w = _Writer()
    w.i16(0)
    w.compact_string(member.instance_id)
    w.compact_string(member.rack_id)
    w.compact_string(member.client_id)
    w.compact_string(member.client_host)
    w.array_len(len(member.subscribed_topic_names))
    for name in member.subscribed_topic_names:
        w.compact_string(name)
    w.compact_string(member.subscribed_topic_regex)
    w.i32(member.rebalance_timeout_ms)
    w.compact_string(member.server_assignor)
    w.no_tags()
    return _key(MEMBER_METADATA_KEY, group_id, member.member_id), bytes(w.out)


def target_epoch_record(group_id: str, epoch: int) -> Entry:
    w = _Writer()
    w.i16(0)
    w.i32(epoch)
    w.no_tags()
    return _key(TARGET_METADATA_KEY, group_id), bytes(w.out)


def target_member_record(group_id: str, member_id: str, partitions: Partitions) -> Entry:
    w = _Writer()
    w.i16(0)
    w.partitions(partitions)
    w.no_tags()
    return _key(TARGET_MEMBER_KEY, group_id, member_id), bytes(w.out)


def current_assignment_record(group_id: str, member: ConsumerMember) -> Entry:
    w = _Writer()
    w.i16(0)
    w.i32(member.member_epoch)
    w.i32(member.previous_member_epoch)
    w.i8(int(member.state))
    w.partitions(member.assigned, member)
    w.partitions(member.pending_revocation, member)
    w.no_tags()
    return _key(CURRENT_ASSIGNMENT_KEY, group_id, member.member_id), bytes(w.out)


def member_tombstones(group_id: str, member_id: str) -> list[Entry]:
    return [
        (_key(CURRENT_ASSIGNMENT_KEY, group_id, member_id), None),
        (_key(TARGET_MEMBER_KEY, group_id, member_id), None),
        (_key(MEMBER_METADATA_KEY, group_id, member_id), None),
    ]


def group_tombstones(group_id: str) -> list[Entry]:
    return [
        (_key(TARGET_METADATA_KEY, group_id), None),
        (_key(GROUP_EPOCH_KEY, group_id), None),
    ]


# -- reading ------------------------------------------------------------------------


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def _take(self, size: int) -> bytes:
        if size < 0 or self.pos + size > len(self.data):
            raise RecordFormatError("record ends early")
        chunk = self.data[self.pos : self.pos + size]
        self.pos += size
        return chunk

    def i8(self) -> int:
        return int(struct.unpack(">b", self._take(1))[0])

    def i16(self) -> int:
        return int(_I16.unpack(self._take(2))[0])

    def i32(self) -> int:
        return int(_I32.unpack(self._take(4))[0])

    def uvarint(self) -> int:
        try:
            value, self.pos = read_uvarint(memoryview(self.data), self.pos, len(self.data))
        except VarintError as exc:
            raise RecordFormatError(str(exc)) from exc
        return value

    def string(self) -> str:
        return self._decode(self._take(self.i16()))

    def compact_string(self) -> str | None:
        length = self.uvarint() - 1
        return None if length < 0 else self._decode(self._take(length))

    def array_len(self) -> int:
        return max(self.uvarint() - 1, 0)

    def topic_id(self) -> uuid.UUID:
        return uuid.UUID(bytes=self._take(16))

    def skip_tags(self) -> None:
        for _ in range(self.uvarint()):
            self.uvarint()
            self._take(self.uvarint())

    def partitions(self) -> dict[uuid.UUID, frozenset[int]]:
        return {topic_id: frozenset(numbers) for topic_id, numbers, _ in self.topic_partitions()}

    def topic_partitions(self) -> list[tuple[uuid.UUID, list[int], list[int] | None]]:
        """Kafka's TopicPartitions array: each topic's id, partitions, and assignment
        epochs (its tagged field 0; None if absent, or null)."""
        out: list[tuple[uuid.UUID, list[int], list[int] | None]] = []
        for _ in range(self.array_len()):
            topic_id = self.topic_id()
            numbers = [self.i32() for _ in range(self.array_len())]
            epochs: list[int] | None = None
            for _ in range(self.uvarint()):
                tag = self.uvarint()
                size = self.uvarint()
                if tag != ASSIGNMENT_EPOCHS_TAG:
                    self._take(size)
                    continue
                field = _Reader(self._take(size))
                count = field.uvarint() - 1
                epochs = None if count < 0 else [field.i32() for _ in range(count)]
            out.append((topic_id, numbers, epochs))
        return out

    @staticmethod
    def _decode(raw: bytes) -> str:
        try:
            return raw.decode()
        except UnicodeDecodeError as exc:
            raise RecordFormatError("string is not UTF-8") from exc


def parse_consumer_key(data: bytes) -> ConsumerKey | None:
    """The key of a consumer group record, or None for other record types."""
    r = _Reader(data)
    kind = r.i16()
    if kind not in CONSUMER_KEYS:
        return None
    group = r.string()
    member = (
        r.string()
        if kind in (MEMBER_METADATA_KEY, TARGET_MEMBER_KEY, CURRENT_ASSIGNMENT_KEY)
        else None
    )
    return ConsumerKey(kind, group, member)


class ConsumerReplay:
    """Consumer groups rebuilt from their records, in log order (the latest record wins)."""

    def __init__(self) -> None:
        self.groups: dict[str, ConsumerGroup] = {}
        self._members: dict[str, dict[str, ConsumerMember]] = {}

    def _group(self, group_id: str) -> ConsumerGroup:
        group = self.groups.get(group_id)
        if group is None:
            group = self.groups[group_id] = ConsumerGroup(group_id)
        return group

    def record(self, key: ConsumerKey, value: bytes | None) -> None:
        if key.kind == PARTITION_METADATA_KEY:
            return
        if key.kind == GROUP_EPOCH_KEY:
            if value is None:
                self.groups.pop(key.group, None)
                return
            self._group(key.group).group_epoch = _versioned(value).i32()
            return
        group = self._group(key.group)
        if key.kind == TARGET_METADATA_KEY:
            group.assignment_epoch = 0 if value is None else _versioned(value).i32()
            return
        member_id = key.member or ""
        if key.kind == TARGET_MEMBER_KEY:
            if value is None:
                group.target.pop(member_id, None)
            else:
                group.target[member_id] = _versioned(value).partitions()
            return
        if value is None:
            if key.kind == MEMBER_METADATA_KEY:
                group.members.pop(member_id, None)
            return
        member = group.members.get(member_id) or ConsumerMember(member_id)
        r = _versioned(value)
        if key.kind == MEMBER_METADATA_KEY:
            member = _with_metadata(member, r)
        elif key.kind == CURRENT_ASSIGNMENT_KEY:
            member = _with_assignment(member, r)
        group.members[member_id] = member

    def result(self) -> dict[str, ConsumerGroup]:
        # A group whose epoch record is gone (tombstoned) was dropped above;
        # one that only has leftovers of members is not a group either.
        return {
            g: group for g, group in self.groups.items() if group.group_epoch > 0 or group.members
        }


def _versioned(value: bytes) -> _Reader:
    r = _Reader(value)
    version = r.i16()
    if version != 0:
        raise RecordFormatError(f"consumer group record value version {version}")
    return r


def _with_metadata(member: ConsumerMember, r: _Reader) -> ConsumerMember:
    instance_id = r.compact_string()
    rack_id = r.compact_string()
    client_id = r.compact_string() or ""
    client_host = r.compact_string() or ""
    topics = tuple(r.compact_string() or "" for _ in range(r.array_len()))
    regex = r.compact_string()
    rebalance_timeout = r.i32()
    assignor = r.compact_string()
    r.skip_tags()
    return replace(
        member,
        instance_id=instance_id,
        rack_id=rack_id,
        client_id=client_id,
        client_host=client_host,
        subscribed_topic_names=topics,
        subscribed_topic_regex=regex,
        rebalance_timeout_ms=rebalance_timeout,
        server_assignor=assignor,
    )


def _with_assignment(member: ConsumerMember, r: _Reader) -> ConsumerMember:
    epoch = r.i32()
    previous = r.i32()
    raw_state = r.i8()
    epochs: dict[tuple[uuid.UUID, int], int] = {}
    assigned: dict[uuid.UUID, frozenset[int]] = {}
    revoking: dict[uuid.UUID, frozenset[int]] = {}
    for into in (assigned, revoking):
        for topic_id, numbers, assigned_at in r.topic_partitions():
            into[topic_id] = frozenset(numbers)
            if assigned_at is not None and len(assigned_at) == len(numbers):
                epochs.update(((topic_id, n), e) for n, e in zip(numbers, assigned_at, strict=True))
    r.skip_tags()
    try:
        state = MemberState(raw_state)
    except ValueError:
        state = MemberState.UNKNOWN
    return replace(
        member,
        member_epoch=epoch,
        previous_member_epoch=previous,
        state=state,
        assigned=assigned,
        pending_revocation=revoking,
        partition_epochs=epochs,
    )
