"""The sink's exactly-once option: which writes may have it, and the transactional ids.

A transactional id must be the same for every attempt of one task (so that a
retry fences the attempt it replaces) and differ between the tasks of a write
and between writes (so that they never fence each other). What the brokers do
with it is tests/integration/test_spark_transactions.py's subject.
"""

from __future__ import annotations

import pickle

import pytest
from pyspark.sql.types import BinaryType, StringType, StructField, StructType
from shoal.connector.options import Mode, OptionError, parse_write_options
from shoal.connector.source import ShoalBatchWriter, ShoalDataSource
from shoal.connector.writing import transactional_id

BOOTSTRAP = "gateway:9092"
SCHEMA = StructType([StructField("key", StringType()), StructField("value", BinaryType())])


def options(**extra: str) -> dict[str, str]:
    return {"kafka.bootstrap.servers": BOOTSTRAP, "topic": "events", **extra}


def refused(given: dict[str, str], mode: Mode = Mode.BATCH) -> str:
    with pytest.raises(OptionError) as caught:
        parse_write_options(given, mode)
    return str(caught.value)


def batch_writer(**extra: str) -> ShoalBatchWriter:
    return ShoalDataSource(options(**extra)).writer(SCHEMA, overwrite=False)


def test_writes_are_at_least_once_unless_asked() -> None:
    parsed = parse_write_options(options())
    assert not parsed.exactly_once
    assert batch_writer().transactional_id_prefix is None


def test_exactly_once_takes_the_prefix_as_given_in_any_case() -> None:
    parsed = parse_write_options(
        options(exactlyonce="TRUE", TRANSACTIONALIDPREFIX="nightly-rollup")
    )
    assert parsed.exactly_once
    assert parsed.transactional_id_prefix == "nightly-rollup"
    writer = batch_writer(exactlyOnce="true", transactionalIdPrefix="nightly-rollup")
    assert writer.transactional_id_prefix == "nightly-rollup"


def test_exactly_once_must_be_true_or_false() -> None:
    assert refused(options(exactlyOnce="yes")) == "exactlyOnce must be true or false, not 'yes'"


def test_a_prefix_without_exactly_once_is_refused() -> None:
    message = refused(options(transactionalIdPrefix="nightly"))
    assert message == "transactionalIdPrefix applies only with exactlyOnce=true"
    assert "applies only" in refused(options(exactlyOnce="false", transactionalIdPrefix="x"))


def test_an_empty_prefix_is_refused() -> None:
    message = refused(options(exactlyOnce="true", transactionalIdPrefix=" "))
    assert message == "transactionalIdPrefix must not be empty"


def test_exactly_once_is_refused_on_a_stream_with_the_reason() -> None:
    message = refused(options(exactlyOnce="true"), Mode.STREAMING)
    assert message.startswith("exactlyOnce applies to batch writes only: ")
    assert "at-least-once" in message
    with pytest.raises(OptionError, match="batch writes only"):
        ShoalDataSource(options(exactlyOnce="true")).streamWriter(SCHEMA, overwrite=False)
    # Off, it is accepted on a stream like any other write option.
    assert not parse_write_options(options(exactlyOnce="false"), Mode.STREAMING).exactly_once


def test_a_transactional_id_of_the_users_is_refused() -> None:
    message = refused(options(exactlyOnce="true", **{"kafka.transactional.id": "mine"}))
    assert message.startswith("option kafka.transactional.id is not supported with exactlyOnce")
    assert "transactionalIdPrefix" in message
    # Without the option a transactional producer could not produce at all.
    message = refused(options(**{"kafka.transactional.id": "mine"}))
    assert message.startswith("option kafka.transactional.id is not supported: set exactlyOnce")


@pytest.mark.parametrize("value", ["false", "FALSE", " False "])
def test_idempotence_off_contradicts_exactly_once(value: str) -> None:
    message = refused(options(exactlyOnce="true", **{"kafka.enable.idempotence": value}))
    assert message.startswith("kafka.enable.idempotence=false contradicts exactlyOnce=true")
    # Without the option the user may turn idempotence off.
    parsed = parse_write_options(options(**{"kafka.enable.idempotence": value}))
    assert parsed.client["enable.idempotence"] == value


@pytest.mark.parametrize("acks", ["0", "1"])
def test_acks_other_than_all_contradict_exactly_once(acks: str) -> None:
    message = refused(options(exactlyOnce="true", **{"kafka.acks": acks}))
    assert message.startswith("exactlyOnce=true needs kafka.acks=all")


@pytest.mark.parametrize("acks", ["all", "-1", "ALL"])
def test_acks_all_and_idempotence_on_go_with_exactly_once(acks: str) -> None:
    parsed = parse_write_options(
        options(exactlyOnce="true", **{"kafka.acks": acks, "kafka.enable.idempotence": "true"})
    )
    assert parsed.exactly_once


def test_the_default_prefix_is_new_for_every_write() -> None:
    first = batch_writer(exactlyOnce="true").transactional_id_prefix
    second = batch_writer(exactlyOnce="true").transactional_id_prefix
    assert first is not None and second is not None
    assert first.startswith("spark-shoal-events-")
    assert second.startswith("spark-shoal-events-")
    assert first != second, "two writes, even to one topic, must not fence each other"


def test_the_default_prefix_keeps_only_name_characters_of_the_topic() -> None:
    writer = ShoalDataSource(
        {"kafka.bootstrap.servers": BOOTSTRAP, "topic": "a b/c", "exactlyOnce": "true"}
    ).writer(SCHEMA, overwrite=False)
    assert writer.transactional_id_prefix is not None
    assert writer.transactional_id_prefix.startswith("spark-shoal-abc-")


def test_every_attempt_of_a_task_gets_the_writers_prefix() -> None:
    # Spark pickles the writer once on the driver; each task attempt unpickles those bytes.
    writer = batch_writer(exactlyOnce="true")
    pickled = pickle.dumps(writer)
    attempts = [pickle.loads(pickled) for _ in range(3)]
    assert {a.transactional_id_prefix for a in attempts} == {writer.transactional_id_prefix}


def test_transactional_ids_differ_between_partitions_only() -> None:
    assert transactional_id("rollup", 0) == "rollup-0"
    assert transactional_id("rollup", 0) == transactional_id("rollup", 0)
    assert len({transactional_id("rollup", p) for p in range(100)}) == 100
