"""Coverage-guided fuzz targets (atheris) for the code that reads bytes from strangers.

Each target feeds arbitrary bytes to one parser and lets through only the
error that parser promises for bad input; anything else (an IndexError, a
struct.error, a hang, a crash) is a finding. Findings become regression
tests at the level where the bug lives.

    python tests/fuzz/targets.py request -runs=20000 -seed=1     # bounded, as CI
    python tests/fuzz/targets.py records -max_total_time=600      # long, as the soak

Targets:

- ``request``: a Kafka request frame, as the brokers and the gateway decode
  it (``shoal.wire.decode_request``): only ``WireError``.
- ``records``: a record batch, validated, decompressed and walked record by
  record (``shoal.records``): only ``InvalidBatchError`` / ``CompressionError``.
- ``sasl``: SASL/PLAIN and SASL/OAUTHBEARER client messages as the gateway
  parses them: only ``SaslError``.

A seed corpus of valid inputs is written next to each run, so mutations start
from the shapes real clients send.
"""

from __future__ import annotations

import contextlib
import struct
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import atheris

# Only our own parsers are instrumented: kio has hundreds of schema modules, and
# instrumenting them all costs a minute before the first input.
with atheris.instrument_imports(include=["shoal"]):
    from shoal.gateway.sasl import SaslError, parse_oauthbearer, parse_plain

    from shoal.records.batch import (
        CRC_START,
        HEADER_SIZE,
        LOG_OVERHEAD,
        Compression,
        InvalidBatchError,
        compute_crc,
    )
    from shoal.records.compression import CompressionError
    from shoal.records.records import BatchOptions, NewRecord, build_batch, iter_records
    from shoal.wire import WireError, decode_request, encode_request, known_api_keys, schema

MAX_RECORDS_BYTES = 1 << 20
"""What a batch may decompress to here: a zip bomb must be refused, not inflated."""


def _served_versions() -> dict[int, tuple[int, int]]:
    """Every (api key, version range) kio has schemas for."""
    served = {}
    for key in sorted(known_api_keys()):
        versions = []
        for version in range(32):
            try:
                schema(key, version)
            except (KeyError, ValueError, LookupError):
                continue
            versions.append(version)
        if versions:
            served[key] = (min(versions), max(versions))
    return served


SERVED = _served_versions()
KEYS = sorted(SERVED)


def fuzz_request(data: bytes) -> None:
    provider = atheris.FuzzedDataProvider(data)
    key = KEYS[provider.ConsumeIntInRange(0, len(KEYS) - 1)]
    low, high = SERVED[key]
    version = provider.ConsumeIntInRange(low, high)
    frame = struct.pack(">hhi", key, version, 7) + provider.ConsumeBytes(provider.remaining_bytes())
    with contextlib.suppress(WireError):
        decode_request(frame, SERVED, trace_context=True)


def fuzz_records(data: bytes) -> None:
    # Half the inputs get a true length and CRC, or no mutation would ever get past
    # the CRC check into the record, varint and codec parsing behind it.
    batch = bytearray(data)
    if len(batch) >= HEADER_SIZE and batch[0] & 1:
        struct.pack_into(">i", batch, 8, len(batch) - LOG_OVERHEAD)
        struct.pack_into(">I", batch, CRC_START - 4, compute_crc(batch, 0, len(batch)))
    try:
        for _ in iter_records(bytes(batch), max_size=MAX_RECORDS_BYTES):
            pass
    except (InvalidBatchError, CompressionError):
        pass


def fuzz_sasl(data: bytes) -> None:
    for parse in (parse_plain, parse_oauthbearer):
        with contextlib.suppress(SaslError):
            parse(data)


def _request_seeds() -> list[bytes]:
    def request(key: int, version: int, **fields: object) -> bytes:
        api = schema(key, version)
        frame = encode_request(api, 7, "fuzz", api.request(**fields))
        # The fuzz target chooses key and version from two leading integers; keep the body.
        return b"\0\0" + frame[4 + 8 :]

    return [
        request(18, 3, client_software_name="fuzz", client_software_version="1"),
        request(
            3,
            12,
            topics=None,
            allow_auto_topic_creation=False,
            include_topic_authorized_operations=False,
        ),
    ]


def _record_seeds() -> list[bytes]:
    records = [NewRecord(b"k", b"v" * 40, (("h", b"x"),)), NewRecord(None, b"second")]
    return [build_batch(records, options=BatchOptions(compression=codec)) for codec in Compression]


TARGETS: dict[str, tuple[Callable[[bytes], None], Callable[[], list[bytes]]]] = {
    "request": (fuzz_request, _request_seeds),
    "records": (fuzz_records, _record_seeds),
    "sasl": (
        fuzz_sasl,
        lambda: [b"\0user\0secret", b"n,,\x01auth=Bearer abc.def.ghi\x01\x01"],
    ),
}


def main() -> None:
    name, *libfuzzer_args = sys.argv[1:]
    target, seeds = TARGETS[name]
    corpus = Path(tempfile.mkdtemp(prefix=f"fuzz-{name}-"))
    for number, seed in enumerate(seeds()):
        (corpus / f"seed-{number}").write_bytes(seed)
    atheris.Setup([sys.argv[0], *libfuzzer_args, str(corpus)], target)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
