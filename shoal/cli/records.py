"""``shoal produce`` and ``shoal consume``: lines in, lines out, as kcat does.

``produce`` sends each stdin line as one record (optionally ``key<sep>value``)
and waits for every acknowledgement; the exit status says whether all were
delivered. ``consume`` prints records with a kcat-style ``--format``.
"""

from __future__ import annotations

import sys
import uuid
from typing import Annotated, Any, Final

import typer
from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_END,
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)

from shoal.cli.client import (
    BootstrapOption,
    ConfigFileOption,
    PropertyOption,
    client_config,
    fail,
    parse_pairs,
)

_POLL_S: Final = 0.5
_METADATA_TIMEOUT_S: Final = 30
_ESCAPES: Final = {"\\n": "\n", "\\t": "\t", "\\r": "\r", "\\0": "\0"}


def produce(
    topic: str,
    key_separator: Annotated[
        str | None,
        typer.Option("--key-separator", "-K", help="Split each line into key and value."),
    ] = None,
    partition: Annotated[
        int | None, typer.Option("--partition", "-p", help="Partition (default: by key).")
    ] = None,
    header: Annotated[
        list[str] | None, typer.Option("--header", "-H", help="Header KEY=VALUE on every record.")
    ] = None,
    compression: Annotated[str, typer.Option(help="none, gzip, snappy, lz4 or zstd.")] = "none",
    acks: Annotated[str, typer.Option(help="0, 1 or all.")] = "all",
    bootstrap: BootstrapOption = None,
    config_file: ConfigFileOption = None,
    properties: PropertyOption = None,
) -> None:
    """Produce stdin lines as records."""
    config = client_config(bootstrap, config_file, properties)
    config.setdefault("compression.type", compression)
    config.setdefault("acks", acks)
    headers = [(k, v.encode()) for k, v in parse_pairs(header, "--header").items()]
    producer = Producer(config)
    failures: list[str] = []
    sent = 0

    def delivered(error: KafkaError | None, _message: Any) -> None:
        if error is not None:
            failures.append(error.str())

    separator = key_separator.encode() if key_separator else None
    for raw in sys.stdin.buffer:
        line = raw.rstrip(b"\r\n")
        key: bytes | None = None
        if separator is not None and separator in line:
            key, line = line.split(separator, 1)
        kwargs: dict[str, Any] = {
            "key": key,
            "value": line,
            "headers": headers,
            "on_delivery": delivered,
        }
        if partition is not None:
            kwargs["partition"] = partition
        while True:
            try:
                producer.produce(topic, **kwargs)
                break
            except BufferError:
                producer.poll(_POLL_S)
        producer.poll(0)
        sent += 1
    remaining = producer.flush(60)
    if remaining:
        failures.append(f"{remaining} records not acknowledged in time")
    for failure in sorted(set(failures)):
        typer.echo(f"error: {failure}", err=True)
    typer.echo(f"produced {sent - len(failures)} of {sent} records to {topic}", err=True)
    if failures:
        raise typer.Exit(1)


def _start_offset(start: str) -> int:
    if start == "beginning":
        return int(OFFSET_BEGINNING)
    if start == "end":
        return int(OFFSET_END)
    try:
        return int(start)
    except ValueError:
        raise typer.BadParameter("--from takes beginning, end or an offset") from None


def format_record(fmt: str, message: Any) -> bytes:
    """kcat's format tokens: %t %p %o %k %s %K %S %T %h, and \\n \\t escapes."""
    key = message.key() or b""
    value = message.value() or b""
    _, timestamp = message.timestamp()
    headers = ",".join(
        f"{k}={(v or b'').decode(errors='replace')}" for k, v in message.headers() or []
    )
    fields = {
        "t": message.topic().encode(),
        "p": str(message.partition()).encode(),
        "o": str(message.offset()).encode(),
        "k": key,
        "s": value,
        "K": str(len(key)).encode(),
        "S": str(len(value)).encode(),
        "T": str(timestamp).encode(),
        "h": headers.encode(),
        "%": b"%",
    }
    for escape, char in _ESCAPES.items():
        fmt = fmt.replace(escape, char)
    out = bytearray()
    i = 0
    while i < len(fmt):
        if fmt[i] == "%" and i + 1 < len(fmt) and fmt[i + 1] in fields:
            out += fields[fmt[i + 1]]
            i += 2
        else:
            out += fmt[i].encode()
            i += 1
    return bytes(out)


def consume(
    topic: str,
    start: Annotated[
        str, typer.Option("--from", help="beginning, end, or an offset.")
    ] = "beginning",
    partition: Annotated[
        list[int] | None, typer.Option("--partition", "-p", help="Partition(s) (default: all).")
    ] = None,
    count: Annotated[
        int | None, typer.Option("--count", "-c", help="Stop after this many records.")
    ] = None,
    exit_at_end: Annotated[
        bool, typer.Option("--exit", "-e", help="Stop at the end of every partition.")
    ] = False,
    fmt: Annotated[
        str, typer.Option("--format", "-f", help="kcat-style format: %k key, %s value, ...")
    ] = "%s\\n",
    bootstrap: BootstrapOption = None,
    config_file: ConfigFileOption = None,
    properties: PropertyOption = None,
) -> None:
    """Print a topic's records, one line each, following new ones until Ctrl-C."""
    config = client_config(bootstrap, config_file, properties)
    # librdkafka insists on a group id, even for a consumer that assigns
    # partitions itself and commits nothing, as this one does.
    config.setdefault("group.id", f"shoal-cli-{uuid.uuid4().hex[:8]}")
    config.update({"enable.auto.commit": "false", "enable.partition.eof": "true"})
    consumer = Consumer(config)
    try:
        try:
            metadata = consumer.list_topics(topic, timeout=_METADATA_TIMEOUT_S)
        except KafkaException as exc:
            raise fail(exc) from exc
        described = metadata.topics.get(topic)
        if described is None or described.error is not None:
            reason = described.error.str() if described and described.error else "unknown topic"
            typer.echo(f"error: {topic}: {reason}", err=True)
            raise typer.Exit(1)
        partitions = partition if partition else sorted(described.partitions)
        offset = _start_offset(start)
        consumer.assign([TopicPartition(topic, p, offset) for p in partitions])
        _print_records(consumer, fmt, count, set(partitions) if exit_at_end else None)
    except KeyboardInterrupt:
        pass
    finally:
        consumer.close()


def _print_records(
    consumer: Consumer, fmt: str, count: int | None, open_partitions: set[int] | None
) -> None:
    printed = 0
    out = sys.stdout.buffer
    while count is None or printed < count:
        message = consumer.poll(_POLL_S)
        if message is None:
            continue
        error = message.error()
        if error is not None:
            if error.code() == KafkaError._PARTITION_EOF:
                if open_partitions is not None:
                    open_partitions.discard(message.partition())
                    if not open_partitions:
                        return
                continue
            typer.echo(f"error: {error.str()}", err=True)
            if error.fatal():
                raise typer.Exit(1)
            continue
        out.write(format_record(fmt, message))
        out.flush()
        printed += 1
