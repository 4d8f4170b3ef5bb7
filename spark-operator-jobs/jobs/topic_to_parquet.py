"""Copy a Shoal topic into Parquet, a few minutes behind: each run reads what
arrived since the last one and exits.

A Structured Streaming query with ``Trigger.AvailableNow``: it reads from the
offsets in its checkpoint (from the earliest offset on its first run) up to
the end of every partition as it was when the run started, in batches of at
most ``--max-offsets-per-trigger`` records, writes them and stops. The file
sink and the checkpoint commit together, so every record lands exactly once
across runs, failed ones included. Meant to be started every few minutes
(the Spark operator manifest does so every five); two runs must never share a
checkpoint at the same time.

Output columns: key, value, topic, partition, offset, timestamp, headers
(with ``--include-headers``) and ``date``, the record timestamp's UTC day,
which partitions the directory.

Run it::

    spark-submit topic_to_parquet.py --topic events --output /data/topics/events \\
        --checkpoint /data/checkpoints/events [--max-offsets-per-trigger 100000] \\
        [--include-headers] [--client-properties /etc/shoal/client.properties]

The client properties (librdkafka settings: bootstrap, SASL username and
password) default to $SHOAL_CLIENT_CONFIG, then /etc/shoal/client.properties,
where the Spark operator manifests mount the tenant's key Secret.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as sf
from shoal.connector import ShoalDataSource, client_options

DEFAULT_CLIENT_PROPERTIES = "/etc/shoal/client.properties"
DEFAULT_MAX_OFFSETS_PER_TRIGGER = 100_000
COLUMNS = ("key", "value", "topic", "partition", "offset", "timestamp")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--topic", required=True)
    parser.add_argument("--output", required=True, help="Parquet directory, partitioned by date")
    parser.add_argument(
        "--checkpoint", required=True, help="the query's checkpoint: its offsets live here"
    )
    parser.add_argument(
        "--max-offsets-per-trigger",
        type=int,
        default=DEFAULT_MAX_OFFSETS_PER_TRIGGER,
        help="most records per micro-batch (default: %(default)s)",
    )
    parser.add_argument("--include-headers", action="store_true", help="also copy record headers")
    parser.add_argument(
        "--client-properties",
        default=os.environ.get("SHOAL_CLIENT_CONFIG", DEFAULT_CLIENT_PROPERTIES),
        help="librdkafka properties file (default: $SHOAL_CLIENT_CONFIG, else %(default)s)",
    )
    args = parser.parse_args(argv)
    if args.max_offsets_per_trigger < 1:
        parser.error("--max-offsets-per-trigger must be at least 1")
    return args


def read_topic(
    spark: SparkSession,
    options: dict[str, str],
    topic: str,
    max_offsets_per_trigger: int,
    include_headers: bool,
) -> DataFrame:
    return (
        spark.readStream.format("shoal")
        .options(**options)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", str(max_offsets_per_trigger))
        .option("includeHeaders", str(include_headers).lower())
        .load()
    )


def to_rows(records: DataFrame, include_headers: bool) -> DataFrame:
    columns = [*COLUMNS, "headers"] if include_headers else list(COLUMNS)
    return records.select(*columns, sf.to_date("timestamp").alias("date"))


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    spark = (
        SparkSession.builder.appName(f"shoal-topic-to-parquet-{args.topic}")
        # The date partition is the UTC day whatever the machine's zone.
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    try:
        spark.dataSource.register(ShoalDataSource)
        records = read_topic(
            spark,
            client_options(args.client_properties),
            args.topic,
            args.max_offsets_per_trigger,
            args.include_headers,
        )
        query = (
            to_rows(records, args.include_headers)
            .writeStream.format("parquet")
            .option("path", args.output)
            .option("checkpointLocation", args.checkpoint)
            .partitionBy("date")
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
