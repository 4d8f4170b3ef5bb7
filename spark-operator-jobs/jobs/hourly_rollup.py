"""Roll up one hour of a Shoal topic into Parquet: per key, how many records,
how many value bytes, and the first and last record timestamp.

The hour is read as a batch bounded by record timestamps (Spark's Kafka
options ``startingTimestamp``/``endingTimestamp``), then filtered on the
timestamp again: the bounds are offsets, and a producer may write a record
with an older timestamp after newer ones. An hour with no records writes
nothing. Output rows carry an ``hour`` column (``2026-11-22T13``, UTC) that
partitions the Parquet directory; a run replaces its own hour's partition and
no other, so re-running an hour is safe.

Run it, for the last complete hour by default::

    spark-submit hourly_rollup.py --topic events --output /data/rollups/events \\
        [--hour 2026-11-22T13] [--client-properties /etc/shoal/client.properties]

The client properties (librdkafka settings: bootstrap, SASL username and
password) default to $SHOAL_CLIENT_CONFIG, then /etc/shoal/client.properties,
where the Spark operator manifests mount the tenant's key Secret.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as sf
from shoal.connector import ShoalDataSource, client_options

DEFAULT_CLIENT_PROPERTIES = "/etc/shoal/client.properties"
HOUR_FORMAT = "%Y-%m-%dT%H"


def last_complete_hour(now: datetime) -> datetime:
    return now.astimezone(UTC).replace(minute=0, second=0, microsecond=0) - timedelta(hours=1)


def parse_hour(text: str) -> datetime:
    try:
        return datetime.strptime(text, HOUR_FORMAT).replace(tzinfo=UTC)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an hour like 2026-11-22T13: {text!r}") from None


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--topic", required=True)
    parser.add_argument("--output", required=True, help="Parquet directory, partitioned by hour")
    parser.add_argument(
        "--hour",
        type=parse_hour,
        default=last_complete_hour(datetime.now(UTC)),
        help="UTC hour to roll up, like 2026-11-22T13 (default: the last complete hour)",
    )
    parser.add_argument(
        "--client-properties",
        default=os.environ.get("SHOAL_CLIENT_CONFIG", DEFAULT_CLIENT_PROPERTIES),
        help="librdkafka properties file (default: $SHOAL_CLIENT_CONFIG, else %(default)s)",
    )
    return parser.parse_args(argv)


def epoch_ms(moment: datetime) -> int:
    return int(moment.timestamp() * 1000)


def read_hour(
    spark: SparkSession, options: dict[str, str], topic: str, hour: datetime
) -> DataFrame:
    start, end = hour, hour + timedelta(hours=1)
    records = (
        spark.read.format("shoal")
        .options(**options)
        .option("subscribe", topic)
        .option("startingTimestamp", str(epoch_ms(start)))
        .option("endingTimestamp", str(epoch_ms(end)))
        # A partition with nothing at or after the start has nothing to roll up.
        .option("startingOffsetsByTimestampStrategy", "latest")
        .load()
    )
    return records.where(
        (sf.col("timestamp") >= sf.lit(start)) & (sf.col("timestamp") < sf.lit(end))
    )


def rollup(records: DataFrame, hour: datetime) -> DataFrame:
    return (
        records.groupBy("key")
        .agg(
            sf.count(sf.lit(1)).alias("records"),
            # Tombstones (null values) count as records of zero bytes.
            sf.sum(sf.coalesce(sf.length("value"), sf.lit(0))).alias("value_bytes"),
            sf.min("timestamp").alias("first_timestamp"),
            sf.max("timestamp").alias("last_timestamp"),
        )
        .withColumn("hour", sf.lit(hour.strftime(HOUR_FORMAT)))
    )


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    spark = (
        SparkSession.builder.appName(f"shoal-hourly-rollup-{args.topic}")
        # Hours are UTC whatever the machine's zone.
        .config("spark.sql.session.timeZone", "UTC")
        # Overwrite the partitions this run writes, not the whole directory.
        .config("spark.sql.sources.partitionOverwriteMode", "dynamic")
        .getOrCreate()
    )
    try:
        spark.dataSource.register(ShoalDataSource)
        records = read_hour(spark, client_options(args.client_properties), args.topic, args.hour)
        (
            rollup(records, args.hour)
            .write.mode("overwrite")
            .partitionBy("hour")
            .parquet(args.output)
        )
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
