"""The __consumer_offsets record codec: Kafka's bytes, its older versions, and its hashing.

Expected bytes are built here with :mod:`struct` from Kafka's schemas
(OffsetCommitKey/Value, GroupMetadataKey/Value in
group-coordinator/src/main/resources/common/message/), never with the codec
under test, so a test fails if the codec drifts from Kafka's layout.
"""

from __future__ import annotations

import struct

import pytest
from shoal.broker.coordinator.records import (
    GroupKey,
    GroupValue,
    MemberValue,
    OffsetKey,
    OffsetValue,
    RecordFormatError,
    group_key,
    group_value,
    java_string_hash,
    offset_key,
    offset_value,
    parse_group_value,
    parse_key,
    parse_offset_value,
    partition_for,
)


def i16(v: int) -> bytes:
    return struct.pack(">h", v)


def i32(v: int) -> bytes:
    return struct.pack(">i", v)


def i64(v: int) -> bytes:
    return struct.pack(">q", v)


def string(v: str | None) -> bytes:
    if v is None:
        return i16(-1)
    data = v.encode()
    return i16(len(data)) + data


def blob(v: bytes) -> bytes:
    return i32(len(v)) + v


def uvarint(v: int) -> bytes:
    out = bytearray()
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


def compact_string(v: str) -> bytes:
    data = v.encode()
    return uvarint(len(data) + 1) + data


MEMBER = MemberValue(
    member_id="consumer-1-4f6c",
    group_instance_id="instance-a",
    client_id="consumer-1",
    client_host="/10.0.0.7",
    rebalance_timeout_ms=300_000,
    session_timeout_ms=45_000,
    subscription=b"\x00\x00sub",
    assignment=b"\x00\x00assigned",
)


# -- keys -------------------------------------------------------------------------


def test_offset_key_is_kafkas_version_1_key() -> None:
    assert offset_key("g", "orders", 7) == i16(1) + string("g") + string("orders") + i32(7)


def test_offset_key_round_trips() -> None:
    assert parse_key(offset_key("group-é", "topic.a", 2**31 - 1)) == OffsetKey(
        "group-é", "topic.a", 2**31 - 1
    )


def test_offset_key_version_0_is_an_offset_key_too() -> None:
    assert parse_key(i16(0) + string("g") + string("t") + i32(3)) == OffsetKey("g", "t", 3)


def test_group_key_is_kafkas_version_2_key() -> None:
    assert group_key("my-group") == i16(2) + string("my-group")
    assert parse_key(group_key("my-group")) == GroupKey("my-group")


def test_keys_of_other_record_types_are_ignored() -> None:
    # Type 3 is ConsumerGroupMetadataKey (KIP-848): not a classic group's record.
    assert parse_key(i16(3) + string("g")) is None


def test_a_truncated_key_is_a_format_error() -> None:
    key = offset_key("g", "t", 0)
    with pytest.raises(RecordFormatError):
        parse_key(key[:-1])


def test_a_null_group_in_a_key_is_a_format_error() -> None:
    with pytest.raises(RecordFormatError):
        parse_key(i16(2) + i16(-1))


# -- offset values -----------------------------------------------------------------


def test_offset_value_is_kafkas_version_3_layout() -> None:
    value = OffsetValue(offset=42, leader_epoch=5, metadata="meta", commit_timestamp=1_000)
    assert offset_value(value) == i16(3) + i64(42) + i32(5) + string("meta") + i64(1_000)


def test_offset_value_round_trips() -> None:
    value = OffsetValue(2**40, 17, "ünïcode metadata", 1_700_000_000_000)
    assert parse_offset_value(offset_value(value)) == value


def test_an_offset_with_its_own_expiry_is_written_as_version_1() -> None:
    # Kafka's offsetCommitValueVersion: v1 is the only version with expire_timestamp,
    # so it is written whenever a commit carries one (its leader epoch is dropped).
    value = OffsetValue(42, 5, "meta", 1_000, 9_000)
    raw = offset_value(value)
    assert raw == i16(1) + i64(42) + string("meta") + i64(1_000) + i64(9_000)
    assert parse_offset_value(raw) == OffsetValue(42, -1, "meta", 1_000, 9_000)


def test_offset_value_version_0_has_no_leader_epoch_nor_expiry() -> None:
    raw = i16(0) + i64(10) + string("m") + i64(555)
    assert parse_offset_value(raw) == OffsetValue(10, -1, "m", 555, -1)


def test_offset_value_version_1_carries_an_explicit_expire_timestamp() -> None:
    raw = i16(1) + i64(10) + string("m") + i64(555) + i64(999)
    assert parse_offset_value(raw) == OffsetValue(10, -1, "m", 555, 999)


def test_offset_value_version_2_drops_the_expire_timestamp() -> None:
    raw = i16(2) + i64(10) + string("m") + i64(555)
    assert parse_offset_value(raw) == OffsetValue(10, -1, "m", 555, -1)


def test_offset_value_null_metadata_reads_as_empty() -> None:
    raw = i16(3) + i64(1) + i32(0) + string(None) + i64(2)
    assert parse_offset_value(raw).metadata == ""


def test_offset_value_version_4_is_read_as_kafkas_first_flexible_version() -> None:
    # OffsetCommitValue v4 is flexible: compact string metadata and a tagged-field
    # section (tag 0 is the topic id in newer Kafka), which a reader must skip.
    topic_id = bytes(range(16))
    tagged = uvarint(1) + uvarint(0) + uvarint(len(topic_id)) + topic_id
    raw = i16(4) + i64(77) + i32(3) + compact_string("meta") + i64(1234) + tagged
    assert parse_offset_value(raw) == OffsetValue(77, 3, "meta", 1234, -1)


def test_offset_value_version_4_without_tagged_fields() -> None:
    raw = i16(4) + i64(77) + i32(-1) + compact_string("") + i64(1234) + uvarint(0)
    assert parse_offset_value(raw) == OffsetValue(77, -1, "", 1234, -1)


@pytest.mark.parametrize(
    "tail",
    [b"\x80", b"\xff\xff\xff\xff\xff\x01"],
    ids=["varint cut short", "varint of six bytes"],
)
def test_a_broken_varint_in_a_flexible_offset_value_is_a_format_error(tail: bytes) -> None:
    raw = i16(4) + i64(77) + i32(-1) + compact_string("") + i64(1234) + tail
    with pytest.raises(RecordFormatError):
        parse_offset_value(raw)


def test_offset_value_of_an_unknown_version_is_a_format_error() -> None:
    with pytest.raises(RecordFormatError):
        parse_offset_value(i16(5) + i64(1) + i32(0) + string("") + i64(2))


def test_a_truncated_offset_value_is_a_format_error() -> None:
    raw = offset_value(OffsetValue(1, 0, "metadata", 2))
    with pytest.raises(RecordFormatError):
        parse_offset_value(raw[:-3])


def test_offset_metadata_that_is_not_utf8_is_a_format_error() -> None:
    raw = i16(3) + i64(1) + i32(0) + i16(2) + b"\xff\xfe" + i64(2)
    with pytest.raises(RecordFormatError):
        parse_offset_value(raw)


# -- group values ------------------------------------------------------------------


def test_group_value_is_kafkas_version_3_layout() -> None:
    value = GroupValue("consumer", 4, "range", MEMBER.member_id, 1_000, (MEMBER,))
    expected = (
        i16(3)
        + string("consumer")
        + i32(4)
        + string("range")
        + string(MEMBER.member_id)
        + i64(1_000)
        + i32(1)
        + string(MEMBER.member_id)
        + string("instance-a")
        + string("consumer-1")
        + string("/10.0.0.7")
        + i32(300_000)
        + i32(45_000)
        + blob(MEMBER.subscription)
        + blob(MEMBER.assignment)
    )
    assert group_value(value) == expected


def test_group_value_round_trips_with_static_and_dynamic_members() -> None:
    dynamic = MemberValue("m-2", None, "c2", "/h2", 10, 20, b"", b"")
    value = GroupValue("consumer", 9, "roundrobin", "m-2", 123, (MEMBER, dynamic))
    assert parse_group_value(group_value(value)) == value


def test_empty_group_value_round_trips_with_null_protocol_and_leader() -> None:
    value = GroupValue("consumer", 3, None, None, 77, ())
    raw = group_value(value)
    assert raw == i16(3) + string("consumer") + i32(3) + i16(-1) + i16(-1) + i64(77) + i32(0)
    assert parse_group_value(raw) == value


def group_value_v0(subscription: bytes, assignment: bytes) -> bytes:
    """A v0 group value, with one member: no state timestamp, instance id or rebalance timeout."""
    return (
        i16(0)
        + string("consumer")
        + i32(2)
        + string("range")
        + string("m-1")
        + i32(1)
        + string("m-1")
        + string("client")
        + string("/host")
        + i32(30_000)
        + blob(subscription)
        + blob(assignment)
    )


def test_group_value_version_0_is_read() -> None:
    parsed = parse_group_value(group_value_v0(b"sub", b"assignment"))
    assert (parsed.protocol_type, parsed.generation, parsed.protocol, parsed.leader) == (
        "consumer",
        2,
        "range",
        "m-1",
    )
    assert parsed.current_state_timestamp == -1
    (member,) = parsed.members
    assert member.member_id == "m-1"
    assert member.group_instance_id is None
    assert (member.client_id, member.client_host) == ("client", "/host")
    assert member.session_timeout_ms == 30_000
    assert (member.subscription, member.assignment) == (b"sub", b"assignment")


def test_group_value_version_0_takes_the_session_timeout_as_rebalance_timeout() -> None:
    # Kafka's loader (GroupMetadataManager.readGroupMessageValue) does this for v0,
    # which has no rebalance timeout: a -1 would end every later rebalance at once.
    raw = group_value_v0(b"", b"")
    assert parse_group_value(raw).members[0].rebalance_timeout_ms == 30_000


def test_group_value_version_1_adds_the_rebalance_timeout() -> None:
    raw = (
        i16(1)
        + string("consumer")
        + i32(2)
        + i16(-1)
        + i16(-1)
        + i32(1)
        + string("m-1")
        + string("client")
        + string("/host")
        + i32(60_000)
        + i32(30_000)
        + blob(b"")
        + blob(b"")
    )
    (member,) = parse_group_value(raw).members
    assert (member.rebalance_timeout_ms, member.session_timeout_ms) == (60_000, 30_000)


def test_group_value_version_2_adds_the_state_timestamp() -> None:
    raw = i16(2) + string("consumer") + i32(5) + i16(-1) + i16(-1) + i64(4242) + i32(0)
    assert parse_group_value(raw) == GroupValue("consumer", 5, None, None, 4242, ())


def test_group_value_null_bytes_read_as_empty() -> None:
    raw = (
        i16(3)
        + string("consumer")
        + i32(1)
        + string("range")
        + string("m")
        + i64(0)
        + i32(1)
        + string("m")
        + i16(-1)
        + string("c")
        + string("h")
        + i32(1)
        + i32(1)
        + i32(-1)
        + i32(-1)
    )
    (member,) = parse_group_value(raw).members
    assert (member.subscription, member.assignment) == (b"", b"")


def test_group_value_of_an_unknown_version_is_a_format_error() -> None:
    with pytest.raises(RecordFormatError):
        parse_group_value(i16(9) + string("consumer") + i32(0))


def test_a_truncated_group_value_is_a_format_error() -> None:
    raw = group_value(GroupValue("consumer", 1, "range", "m", 0, (MEMBER,)))
    with pytest.raises(RecordFormatError):
        parse_group_value(raw[:-1])


# -- Java's String.hashCode and the partition of a group -----------------------------


def reference_hash(text: str) -> int:
    """String.hashCode written out from its definition: s[0]*31^(n-1) + ... + s[n-1],
    over UTF-16 code units (a code point above U+FFFF is two surrogates), in int32."""
    units: list[int] = []
    for char in text:
        point = ord(char)
        if point > 0xFFFF:
            point -= 0x10000
            units += [0xD800 + (point >> 10), 0xDC00 + (point & 0x3FF)]
        else:
            units.append(point)
    n = len(units)
    total = sum(unit * 31 ** (n - 1 - i) for i, unit in enumerate(units)) % 2**32
    return total - 2**32 if total >= 2**31 else total


@pytest.mark.parametrize(
    ("text", "java"),
    [
        ("", 0),
        ("a", 97),
        ("hello", 99162322),
        ("Aa", 2112),
        ("BB", 2112),
        ("polygenelubricants", -(2**31)),
    ],
)
def test_java_string_hash_matches_known_java_values(text: str, java: int) -> None:
    assert java_string_hash(text) == java
    assert reference_hash(text) == java


@pytest.mark.parametrize(
    "text",
    [
        "my-group",
        "consumer-group-with-a-rather-long-name-0123456789",
        "groupe-é",
        "群组",
        "\U0001f600",
        "a\U0001f600b\U00010348",
    ],
)
def test_java_string_hash_follows_the_polynomial_over_utf16_code_units(text: str) -> None:
    assert java_string_hash(text) == reference_hash(text)


def test_java_string_hash_counts_a_non_bmp_character_as_two_surrogates() -> None:
    # U+1F600 is the surrogate pair D83D DE00 in UTF-16.
    assert java_string_hash("\U0001f600") == 0xD83D * 31 + 0xDE00


def test_partition_for_masks_the_sign_bit_like_kafkas_utils_abs() -> None:
    # hashCode is Integer.MIN_VALUE: Math.abs would stay negative; Utils.abs gives 0.
    assert partition_for("polygenelubricants", 50) == 0


def test_partition_for_a_negative_hash_is_not_the_absolute_value() -> None:
    group = "my-group"
    code = reference_hash(group)
    assert code < 0
    expected = (code + 2**31) % 50
    assert expected != abs(code) % 50
    assert partition_for(group, 50) == expected


@pytest.mark.parametrize("partitions", [1, 3, 50])
def test_partition_for_is_always_in_range(partitions: int) -> None:
    groups = ["", "a", "polygenelubricants", "my-group", "群组", "\U0001f600"]
    groups += [f"group-{i}" for i in range(200)]
    for group in groups:
        chosen = partition_for(group, partitions)
        assert 0 <= chosen < partitions
        assert chosen == (reference_hash(group) & 0x7FFFFFFF) % partitions
