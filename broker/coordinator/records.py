"""Records of ``__consumer_offsets``: committed offsets and group metadata, in Kafka's format.

Each record's key starts with an int16 record type, each value with an
int16 version; strings are int16-length UTF-8 (-1 for null), bytes
int32-length, arrays int32-counted (Kafka's non-flexible encoding)::

    OffsetCommitKey    type 1:  group, topic, partition int32
    OffsetCommitValue  v3:      offset int64, leader_epoch int32, metadata, commit_timestamp int64
                       v1:      offset int64, metadata, commit_timestamp int64,
                                expire_timestamp int64 (when a commit carries its own expiry)
    GroupMetadataKey   type 2:  group
    GroupMetadataValue v3:      protocol_type, generation int32, protocol?, leader?,
                                current_state_timestamp int64,
                                [member_id, group_instance_id?, client_id, client_host,
                                 rebalance_timeout int32, session_timeout int32,
                                 subscription bytes, assignment bytes]

Transactional offset commits (TxnOffsetCommit) are ordinary offset records in
a transactional batch of the producer; its transaction's end is a control
batch of that producer (:mod:`shoal.broker.log.markers`).

A null value is a tombstone: the offset, or the whole group, is gone. Kafka
writes these same bytes, so its tools read our topic and ours read theirs;
kio carries no schema for these internal records, hence the hand codec.
Older record versions that Kafka may have written (offset values v0/v1,
group values v0-v2) are read too, and so are offset values v4 (Kafka's first
flexible version: compact metadata string, tagged fields skipped); a v0
group value has no rebalance timeout, and reads the session timeout there,
as Kafka's loader does.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Final

from shoal.wire.varint import VarintError, read_uvarint

OFFSET_COMMIT_KEY: Final = 1
GROUP_METADATA_KEY: Final = 2
OFFSET_VALUE_VERSION: Final = 3
GROUP_VALUE_VERSION: Final = 3

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")


class RecordFormatError(ValueError):
    """A key or value in __consumer_offsets that is not Kafka's format."""


@dataclass(frozen=True, slots=True)
class OffsetKey:
    group: str
    topic: str
    partition: int


@dataclass(frozen=True, slots=True)
class GroupKey:
    group: str


@dataclass(frozen=True, slots=True)
class OffsetValue:
    offset: int
    leader_epoch: int
    metadata: str
    commit_timestamp: int
    expire_timestamp: int = -1


@dataclass(frozen=True, slots=True)
class MemberValue:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout_ms: int
    session_timeout_ms: int
    subscription: bytes
    assignment: bytes


@dataclass(frozen=True, slots=True)
class GroupValue:
    protocol_type: str
    generation: int
    protocol: str | None
    leader: str | None
    current_state_timestamp: int
    members: tuple[MemberValue, ...]


class _Writer:
    def __init__(self) -> None:
        self.out = bytearray()

    def i16(self, value: int) -> None:
        self.out += _I16.pack(value)

    def i32(self, value: int) -> None:
        self.out += _I32.pack(value)

    def i64(self, value: int) -> None:
        self.out += _I64.pack(value)

    def string(self, value: str | None) -> None:
        if value is None:
            self.i16(-1)
            return
        data = value.encode()
        self.i16(len(data))
        self.out += data

    def bytes_(self, value: bytes) -> None:
        self.i32(len(value))
        self.out += value


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

    def i16(self) -> int:
        return int(_I16.unpack(self._take(2))[0])

    def i32(self) -> int:
        return int(_I32.unpack(self._take(4))[0])

    def i64(self) -> int:
        return int(_I64.unpack(self._take(8))[0])

    def _text(self, length: int) -> str | None:
        if length == -1:
            return None
        try:
            return self._take(length).decode()
        except UnicodeDecodeError as exc:
            raise RecordFormatError("string is not UTF-8") from exc

    def string(self) -> str | None:
        return self._text(self.i16())

    def required_string(self) -> str:
        value = self.string()
        if value is None:
            raise RecordFormatError("null where a string is required")
        return value

    def bytes_(self) -> bytes:
        length = self.i32()
        return b"" if length == -1 else self._take(length)

    def uvarint(self) -> int:
        try:
            value, self.pos = read_uvarint(memoryview(self.data), self.pos, len(self.data))
        except VarintError as exc:
            raise RecordFormatError(str(exc)) from exc
        return value

    def compact_string(self) -> str | None:
        return self._text(self.uvarint() - 1)

    def skip_tagged_fields(self) -> None:
        for _ in range(self.uvarint()):
            self.uvarint()
            self._take(self.uvarint())


def offset_key(group: str, topic: str, partition: int) -> bytes:
    w = _Writer()
    w.i16(OFFSET_COMMIT_KEY)
    w.string(group)
    w.string(topic)
    w.i32(partition)
    return bytes(w.out)


def group_key(group: str) -> bytes:
    w = _Writer()
    w.i16(GROUP_METADATA_KEY)
    w.string(group)
    return bytes(w.out)


def offset_value(value: OffsetValue) -> bytes:
    """Version 3, or version 1 (the only one with an expire timestamp) when the
    commit carries its own expiry, as Kafka's offsetCommitValueVersion picks."""
    w = _Writer()
    if value.expire_timestamp >= 0:
        w.i16(1)
        w.i64(value.offset)
        w.string(value.metadata)
        w.i64(value.commit_timestamp)
        w.i64(value.expire_timestamp)
        return bytes(w.out)
    w.i16(OFFSET_VALUE_VERSION)
    w.i64(value.offset)
    w.i32(value.leader_epoch)
    w.string(value.metadata)
    w.i64(value.commit_timestamp)
    return bytes(w.out)


def group_value(value: GroupValue) -> bytes:
    w = _Writer()
    w.i16(GROUP_VALUE_VERSION)
    w.string(value.protocol_type)
    w.i32(value.generation)
    w.string(value.protocol)
    w.string(value.leader)
    w.i64(value.current_state_timestamp)
    w.i32(len(value.members))
    for member in value.members:
        w.string(member.member_id)
        w.string(member.group_instance_id)
        w.string(member.client_id)
        w.string(member.client_host)
        w.i32(member.rebalance_timeout_ms)
        w.i32(member.session_timeout_ms)
        w.bytes_(member.subscription)
        w.bytes_(member.assignment)
    return bytes(w.out)


def parse_key(data: bytes) -> OffsetKey | GroupKey | None:
    """The key of a record; None for record types this coordinator does not use."""
    r = _Reader(data)
    kind = r.i16()
    if kind in (0, OFFSET_COMMIT_KEY):
        return OffsetKey(r.required_string(), r.required_string(), r.i32())
    if kind == GROUP_METADATA_KEY:
        return GroupKey(r.required_string())
    return None


def parse_offset_value(data: bytes) -> OffsetValue:
    r = _Reader(data)
    version = r.i16()
    if not 0 <= version <= 4:
        raise RecordFormatError(f"offset value version {version}")
    offset = r.i64()
    leader_epoch = r.i32() if version >= 3 else -1
    # Version 4 is Kafka's first flexible version: a compact string, then tagged fields.
    metadata = (r.compact_string() if version >= 4 else r.string()) or ""
    commit_timestamp = r.i64()
    expire_timestamp = r.i64() if version == 1 else -1
    if version >= 4:
        r.skip_tagged_fields()
    return OffsetValue(offset, leader_epoch, metadata, commit_timestamp, expire_timestamp)


def parse_group_value(data: bytes) -> GroupValue:
    r = _Reader(data)
    version = r.i16()
    if not 0 <= version <= 3:
        raise RecordFormatError(f"group metadata value version {version}")
    protocol_type = r.required_string()
    generation = r.i32()
    protocol = r.string()
    leader = r.string()
    state_timestamp = r.i64() if version >= 2 else -1
    members: list[MemberValue] = []
    for _ in range(r.i32()):
        member_id = r.required_string()
        instance_id = r.string() if version >= 3 else None
        client_id = r.required_string()
        client_host = r.required_string()
        rebalance_timeout = r.i32() if version >= 1 else -1
        session_timeout = r.i32()
        if version == 0:
            # As Kafka's loader does: v0 predates the rebalance timeout.
            rebalance_timeout = session_timeout
        members.append(
            MemberValue(
                member_id,
                instance_id,
                client_id,
                client_host,
                rebalance_timeout,
                session_timeout,
                r.bytes_(),
                r.bytes_(),
            )
        )
    return GroupValue(protocol_type, generation, protocol, leader, state_timestamp, tuple(members))


def java_string_hash(text: str) -> int:
    """Java's String.hashCode: 31-polynomial over UTF-16 code units, as a signed int32."""
    value = 0
    for unit in struct.unpack(f">{len(text.encode('utf-16-be')) // 2}H", text.encode("utf-16-be")):
        value = (31 * value + unit) & 0xFFFFFFFF
    return value - 2**32 if value >= 2**31 else value


def partition_for(group: str, partitions: int) -> int:
    """Kafka's choice: Utils.abs(groupId.hashCode) % the offsets topic's partition count.

    Utils.abs masks the sign bit (it is not Math.abs), so the same group lands
    on the same partition number here as in Kafka.
    """
    return (java_string_hash(group) & 0x7FFFFFFF) % partitions
