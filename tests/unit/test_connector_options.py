"""The connector's options: spark-sql-kafka's names and rules, checked before connecting.

Spark hands a data source its options with lower-cased keys and string
values, so the tests pass them that way; error messages must still name
options as the documentation spells them (``startingOffsets``).
"""

from __future__ import annotations

import pytest
from shoal.connector.offsets import EARLIEST, LATEST, TopicPartition
from shoal.connector.options import (
    DEFAULT_POLL_TIMEOUT_MS,
    Mode,
    OptionError,
    ReadOptions,
    WriteOptions,
    parse_read_options,
    parse_write_options,
)

BOOTSTRAP = "gateway:9092"


def read(mode: Mode = Mode.BATCH, /, **options: str) -> ReadOptions:
    """A read of topic ``events`` unless the options say otherwise."""
    given = {"kafka.bootstrap.servers": BOOTSTRAP, **options}
    if not {"subscribe", "subscribepattern", "assign"} & given.keys():
        given["subscribe"] = "events"
    return parse_read_options(given, mode)


def read_error(mode: Mode = Mode.BATCH, /, **options: str) -> str:
    with pytest.raises(OptionError) as caught:
        read(mode, **options)
    return str(caught.value)


def write(**options: str) -> WriteOptions:
    return parse_write_options({"kafka.bootstrap.servers": BOOTSTRAP, **options})


def write_error(**options: str) -> str:
    with pytest.raises(OptionError) as caught:
        write(**options)
    return str(caught.value)


# -- what to read ----------------------------------------------------------------


def test_subscribe_takes_comma_separated_topics_ignoring_blanks() -> None:
    options = read(subscribe=" events, orders ,,audit ")
    assert options.subscription.topics == ("events", "orders", "audit")
    assert options.subscription.matches("orders")
    assert not options.subscription.matches("order")


@pytest.mark.parametrize("value", ["", " ", " , ,"])
def test_subscribe_without_a_topic_fails(value: str) -> None:
    assert "subscribe needs at least one topic" in read_error(subscribe=value)


def test_none_of_subscribe_pattern_and_assign_fails() -> None:
    with pytest.raises(OptionError, match=r"exactly one of .*\(given: none\)"):
        parse_read_options({"kafka.bootstrap.servers": BOOTSTRAP}, Mode.BATCH)


@pytest.mark.parametrize(
    ("ways", "named"),
    [
        ({"subscribe": "a", "assign": '{"a":[0]}'}, "subscribe, assign"),
        ({"subscribe": "a", "subscribepattern": "a.*"}, "subscribe, subscribePattern"),
        ({"subscribepattern": "a.*", "assign": '{"a":[0]}'}, "subscribePattern, assign"),
        (
            {"subscribe": "a", "subscribepattern": "a.*", "assign": '{"a":[0]}'},
            "subscribe, subscribePattern, assign",
        ),
    ],
)
def test_more_than_one_of_subscribe_pattern_and_assign_fails_naming_them(
    ways: dict[str, str], named: str
) -> None:
    message = read_error(**ways)
    assert "exactly one of subscribe, subscribePattern and assign" in message
    assert f"(given: {named})" in message


@pytest.mark.parametrize(
    ("pattern", "topic", "matches"),
    [
        ("events", "events", True),
        ("events", "events-eu", False),
        ("events", "old-events", False),
        ("ev.*", "events", True),
        ("ev.*", "my-events", False),
        ("a|b", "a", True),
        ("a|b", "ab", False),
        ("orders-[0-9]+", "orders-12", True),
        ("orders-[0-9]+", "orders-12x", False),
    ],
)
def test_subscribe_pattern_must_match_the_whole_topic_name(
    pattern: str, topic: str, matches: bool
) -> None:
    # Kafka's (Java's) Pattern.matches(), not re.search: a prefix is not enough.
    assert read(subscribepattern=pattern).subscription.matches(topic) is matches


def test_invalid_subscribe_pattern_fails() -> None:
    assert "subscribePattern is not a valid regular expression" in read_error(
        subscribepattern="events[("
    )


def test_assign_lists_partitions_sorted_without_duplicates() -> None:
    options = read(assign='{"b":[1,0],"a":[2,2]}')
    assert options.subscription.assigned == (
        TopicPartition("a", 2),
        TopicPartition("b", 0),
        TopicPartition("b", 1),
    )
    assert options.subscription.matches("a")
    assert not options.subscription.matches("c")


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ('{"a":0}', "topic 'a' needs a list of partition numbers"),
        ('{"a":[-1]}', "topic 'a' needs a list of partition numbers"),
        ('{"a":[true]}', "topic 'a' needs a list of partition numbers"),
        ('{"a":["0"]}', "topic 'a' needs a list of partition numbers"),
        ('{"a":[1.5]}', "topic 'a' needs a list of partition numbers"),
        ('{"a":[]}', "assign names no partitions"),
        ("{}", "assign names no partitions"),
        ('[["a",0]]', "assign must be a JSON object keyed by topic"),
        ("a:0", "assign"),
    ],
)
def test_malformed_assign_fails(value: str, expected: str) -> None:
    assert expected in read_error(assign=value)


def test_assign_that_is_not_json_is_not_offered_earliest_or_latest() -> None:
    assert "earliest" not in read_error(assign="a:0")


# -- option names -----------------------------------------------------------------


def test_unknown_read_option_is_named_as_given() -> None:
    message = read_error(startingoffset="earliest")
    assert "unknown option 'startingoffset' for reading" in message
    assert "startingOffsets" in message  # the known options are listed


def test_unknown_write_option_is_named_as_given() -> None:
    message = write_error(topics="events")
    assert "unknown option 'topics' for writing" in message


def test_option_names_are_case_insensitive() -> None:
    options = parse_read_options(
        {"Kafka.Bootstrap.Servers": BOOTSTRAP, "subscribePattern": "e.*", "includeHeaders": "true"},
        Mode.BATCH,
    )
    assert options.subscription.matches("events")
    assert options.include_headers
    assert options.client == {"bootstrap.servers": BOOTSTRAP}


def test_write_option_on_a_read_says_it_applies_to_writing_only() -> None:
    assert read_error(topic="events") == "option topic does not apply to reading"


@pytest.mark.parametrize(
    ("option", "canonical"),
    [
        ("startingoffsets", "startingOffsets"),
        ("subscribe", "subscribe"),
        ("maxoffsetspertrigger", "maxOffsetsPerTrigger"),
        ("includeheaders", "includeHeaders"),
        ("kafkaconsumer.polltimeoutms", "kafkaConsumer.pollTimeoutMs"),
    ],
)
def test_read_option_on_a_write_says_it_applies_to_reading_only(
    option: str, canonical: str
) -> None:
    assert write_error(**{option: "1"}) == f"option {canonical} does not apply to writing"


# -- startingOffsets / endingOffsets ---------------------------------------------------


def test_batch_defaults_read_everything_there_is() -> None:
    options = read()
    assert options.starting.default == EARLIEST
    assert options.starting.offsets == {}
    assert options.starting.timestamp_ms is None
    assert options.ending.default == LATEST
    assert not options.starting.moves([TopicPartition("events", 0)])


def test_streaming_starts_at_latest_by_default() -> None:
    options = read(Mode.STREAMING)
    assert options.starting.default == LATEST
    assert options.starting.moves([TopicPartition("events", 0)])


@pytest.mark.parametrize(
    ("word", "expected"), [("earliest", EARLIEST), ("LATEST", LATEST), (" Latest ", LATEST)]
)
def test_starting_offsets_words_are_case_insensitive(word: str, expected: int) -> None:
    assert read(Mode.STREAMING, startingoffsets=word).starting.default == expected


def test_json_offsets_per_partition_keep_earliest_and_latest_sentinels() -> None:
    options = read(Mode.STREAMING, startingoffsets='{"events":{"0":23,"1":-2,"2":-1},"b":{"10":0}}')
    assert options.starting.offsets == {
        TopicPartition("events", 0): 23,
        TopicPartition("events", 1): EARLIEST,
        TopicPartition("events", 2): LATEST,
        TopicPartition("b", 10): 0,
    }
    # Partitions the JSON does not name take the mode's default.
    assert options.starting.default == LATEST
    assert options.starting.moves([TopicPartition("events", 2)])
    assert not options.starting.moves([TopicPartition("events", 0), TopicPartition("b", 10)])


def test_json_offsets_move_only_where_latest_applies() -> None:
    named = [TopicPartition("events", 0), TopicPartition("events", 1)]
    options = read(Mode.STREAMING, startingoffsets='{"events":{"0":23,"1":-2}}')
    assert not options.starting.moves(named)
    # The default (latest, for streams) applies to partitions not named.
    assert options.starting.moves([*named, TopicPartition("events", 2)])
    batch = read(startingoffsets='{"events":{"0":23,"1":-2}}')
    assert not batch.starting.moves([*named, TopicPartition("events", 2)])


def test_batch_ending_offsets_json() -> None:
    options = read(endingoffsets='{"events":{"0":100,"1":-1}}')
    assert options.ending.offsets == {
        TopicPartition("events", 0): 100,
        TopicPartition("events", 1): LATEST,
    }


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("{not json", "startingOffsets must be earliest, latest or JSON offsets; not JSON"),
        ("first", "startingOffsets must be earliest, latest or JSON offsets; not JSON"),
        ("[1, 2]", "startingOffsets must be a JSON object keyed by topic"),
        ('{"events": 5}', "startingOffsets: topic 'events' needs {\"partition\": offset}"),
        ('{"events": [5]}', "startingOffsets: topic 'events' needs {\"partition\": offset}"),
        ('{"events":{"a":5}}', "startingOffsets: 'a' is not a partition number"),
        ('{"events":{"-1":5}}', "startingOffsets: '-1' is not a partition number"),
        ('{"events":{" 1":5}}', "startingOffsets: ' 1' is not a partition number"),
        ('{"events":{"0":-3}}', "offset of events-0 must be an offset, -2 (earliest) or -1"),
        ('{"events":{"0":"5"}}', "offset of events-0 must be an offset"),
        ('{"events":{"0":1.5}}', "offset of events-0 must be an offset"),
        ('{"events":{"0":true}}', "offset of events-0 must be an offset"),
        ('{"events":{"0":null}}', "offset of events-0 must be an offset"),
    ],
)
def test_malformed_starting_offsets_fail(value: str, expected: str) -> None:
    assert expected in read_error(startingoffsets=value)


def test_malformed_ending_offsets_name_ending_offsets() -> None:
    assert "endingOffsets: offset of events-3 must be an offset" in read_error(
        endingoffsets='{"events":{"3":-7}}'
    )


def test_partition_written_with_a_superscript_digit_is_an_option_error() -> None:
    assert "is not a partition number" in read_error(startingoffsets='{"events":{"²":5}}')


def test_batch_cannot_start_at_latest() -> None:
    assert "startingOffsets can't be latest (-1) for batch reads" in read_error(
        startingoffsets="latest"
    )
    assert "startingOffsets can't be latest (-1) for batch reads" in read_error(
        startingoffsets='{"events":{"0":5,"1":-1}}'
    )


def test_batch_cannot_end_at_earliest() -> None:
    assert "endingOffsets can't be earliest (-2) for batch reads" in read_error(
        endingoffsets="earliest"
    )
    assert "endingOffsets can't be earliest (-2) for batch reads" in read_error(
        endingoffsets='{"events":{"0":-2}}'
    )


@pytest.mark.parametrize(
    ("option", "value"), [("endingOffsets", "latest"), ("endingTimestamp", "1700000000000")]
)
def test_streams_have_no_end(option: str, value: str) -> None:
    message = read_error(Mode.STREAMING, **{option.lower(): value})
    assert message == f"{option} applies to batch reads only, not to streaming queries"


@pytest.mark.parametrize(
    ("offsets", "timestamp"),
    [("startingOffsets", "startingTimestamp"), ("endingOffsets", "endingTimestamp")],
)
def test_offsets_and_timestamp_together_fail(offsets: str, timestamp: str) -> None:
    message = read_error(**{offsets.lower(): "earliest", timestamp.lower(): "1700000000000"})
    assert message == f"give {offsets} or {timestamp}, not both"


# -- timestamps ---------------------------------------------------------------------


def test_timestamps_are_epoch_milliseconds() -> None:
    options = read(startingtimestamp="1700000000000", endingtimestamp=" 1700000060000 ")
    assert options.starting.timestamp_ms == 1_700_000_000_000
    assert options.ending.timestamp_ms == 1_700_000_060_000
    assert options.starting.moves([])
    streaming = read(Mode.STREAMING, startingtimestamp="0")
    assert streaming.starting.timestamp_ms == 0
    assert streaming.starting.moves([])


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("yesterday", "startingTimestamp must be a whole number, not 'yesterday'"),
        ("1.5", "startingTimestamp must be a whole number"),
        ("", "startingTimestamp must be a whole number"),
        ("-1", "startingTimestamp must not be negative"),
    ],
)
def test_malformed_timestamp_fails(value: str, expected: str) -> None:
    assert expected in read_error(startingtimestamp=value)


@pytest.mark.parametrize(
    ("value", "is_error"), [(None, True), ("error", True), ("ERROR", True), ("latest", False)]
)
def test_timestamp_strategy_decides_what_a_missing_record_means(
    value: str | None, is_error: bool
) -> None:
    extra = {} if value is None else {"startingoffsetsbytimestampstrategy": value}
    options = read(startingtimestamp="1700000000000", **extra)
    assert options.timestamp_not_found_is_error is is_error


def test_unknown_timestamp_strategy_fails() -> None:
    assert "startingOffsetsByTimestampStrategy must be error or latest, not 'earliest'" in (
        read_error(startingoffsetsbytimestampstrategy="earliest")
    )


# -- flags and limits -------------------------------------------------------------------


def test_flag_and_limit_defaults() -> None:
    options = read()
    assert options.include_headers is False
    assert options.fail_on_data_loss is True
    assert options.max_offsets_per_trigger is None
    assert options.min_partitions is None
    assert options.poll_timeout_ms == DEFAULT_POLL_TIMEOUT_MS == 120_000


@pytest.mark.parametrize(
    ("value", "expected"), [("true", True), ("FALSE", False), (" True ", True)]
)
def test_booleans_are_true_or_false_in_any_case(value: str, expected: bool) -> None:
    options = read(includeheaders=value, failondataloss=value)
    assert options.include_headers is expected
    assert options.fail_on_data_loss is expected


@pytest.mark.parametrize("option", ["includeHeaders", "failOnDataLoss"])
@pytest.mark.parametrize("value", ["yes", "1", ""])
def test_other_booleans_fail(option: str, value: str) -> None:
    assert read_error(**{option.lower(): value}) == (
        f"{option} must be true or false, not {value!r}"
    )


def test_positive_ints_are_parsed() -> None:
    options = read(
        Mode.STREAMING,
        maxoffsetspertrigger="1000",
        minpartitions=" 8 ",
        **{"kafkaconsumer.polltimeoutms": "5000"},
    )
    assert options.max_offsets_per_trigger == 1000
    assert options.min_partitions == 8
    assert options.poll_timeout_ms == 5000


@pytest.mark.parametrize(
    "option", ["maxOffsetsPerTrigger", "minPartitions", "kafkaConsumer.pollTimeoutMs"]
)
@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("0", "{} must be positive"),
        ("-5", "{} must not be negative"),
        ("ten", "{} must be a whole number, not 'ten'"),
        ("2.5", "{} must be a whole number, not '2.5'"),
    ],
)
def test_non_positive_or_non_numeric_limits_fail(option: str, value: str, expected: str) -> None:
    assert read_error(**{option.lower(): value}) == expected.format(option)


# -- kafka.* settings and the bootstrap address ---------------------------------------------


def test_kafka_settings_go_to_the_client_without_the_prefix() -> None:
    options = read(
        **{
            "kafka.security.protocol": "SASL_SSL",
            "kafka.sasl.mechanism": "PLAIN",
            "kafka.sasl.username": "key",
            "kafka.sasl.password": "Secret=Value",
            "kafka.group.id": "mine",
        }
    )
    assert options.client == {
        "bootstrap.servers": BOOTSTRAP,
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "PLAIN",
        "sasl.username": "key",
        "sasl.password": "Secret=Value",
        "group.id": "mine",
    }
    assert write(**{"kafka.acks": "1"}).client == {"bootstrap.servers": BOOTSTRAP, "acks": "1"}


@pytest.mark.parametrize(
    ("setting", "reason"),
    [
        ("auto.offset.reset", "set the source option startingOffsets instead"),
        ("enable.auto.commit", "offsets live in Spark's checkpoint"),
        ("enable.auto.offset.store", "offsets live in Spark's checkpoint"),
        ("enable.partition.eof", "the reader needs end-of-partition events"),
        ("key.deserializer", "keys and values are returned as bytes"),
        ("value.deserializer", "keys and values are returned as bytes"),
        ("key.serializer", "key and value columns must be string or binary"),
        ("value.serializer", "key and value columns must be string or binary"),
        ("sasl.jaas.config", "use kafka.sasl.mechanism, kafka.sasl.username"),
    ],
)
def test_settings_the_connector_owns_are_refused_with_a_reason(setting: str, reason: str) -> None:
    for message in (
        read_error(**{f"kafka.{setting}": "x"}),
        write_error(**{f"kafka.{setting}": "x"}),
    ):
        assert message.startswith(f"option kafka.{setting} is not supported: ")
        assert reason in message


def test_shoal_bootstrap_is_kafka_bootstrap_servers() -> None:
    read_options = parse_read_options(
        {"shoal.bootstrap": "gw:9092", "subscribe": "events"}, Mode.STREAMING
    )
    assert read_options.client == {"bootstrap.servers": "gw:9092"}
    write_options = parse_write_options({"shoal.bootstrap": "gw:9092", "topic": "events"})
    assert write_options.client == {"bootstrap.servers": "gw:9092"}


def test_shoal_bootstrap_may_repeat_kafka_bootstrap_servers() -> None:
    options = read(**{"shoal.bootstrap": BOOTSTRAP})
    assert options.client == {"bootstrap.servers": BOOTSTRAP}


def test_shoal_bootstrap_disagreeing_with_kafka_bootstrap_servers_fails() -> None:
    message = read_error(**{"shoal.bootstrap": "other:9092"})
    assert message == "shoal.bootstrap and kafka.bootstrap.servers disagree; give only one of them"
    assert "disagree" in write_error(**{"shoal.bootstrap": "other:9092"})


@pytest.mark.parametrize("options", [{}, {"kafka.bootstrap.servers": ""}, {"shoal.bootstrap": ""}])
def test_missing_bootstrap_fails(options: dict[str, str]) -> None:
    for parse in (
        lambda: parse_read_options({"subscribe": "events", **options}, Mode.BATCH),
        lambda: parse_write_options({"topic": "events", **options}),
    ):
        with pytest.raises(OptionError, match=r"kafka.bootstrap.servers \(or shoal.bootstrap\)"):
            parse()


# -- writes -------------------------------------------------------------------------------


def test_write_topic_option_is_optional() -> None:
    assert write().topic is None
    assert write(topic="events").topic == "events"


def test_empty_write_topic_fails() -> None:
    assert write_error(topic="") == "topic must not be empty"
