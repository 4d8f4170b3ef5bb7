"""The load generator's pure parts: the send schedule, percentiles, stamps and results.

The pacing tests drive :class:`Pacer` with a simulated clock whose sleeps
oversleep and whose sends take time, as real ones do, and check that the
schedule neither drifts nor stays behind after a stall.
"""

from __future__ import annotations

import math
import zlib

import pytest

from shoal.cli.loadgen import (
    CDF_QUANTILES,
    STAMP_SIZE,
    LatencyRecorder,
    LatencyResult,
    Pacer,
    ProduceResult,
    Throughput,
    make_payload,
    percentile,
    read_stamp,
    stamp,
)

# -- pacing ---------------------------------------------------------------------------------


def simulate(
    pacer: Pacer,
    records: int,
    send_s: float,
    oversleep_s: float,
    stall: tuple[int, float] | None = None,
) -> list[float]:
    """When each record is sent by a loop that waits for ``pacer`` on a simulated clock.

    Each wait sleeps ``oversleep_s`` longer than asked, each send takes
    ``send_s``; ``stall`` = (index, seconds) freezes the sender before that record.
    """
    now = pacer.start
    sent = []
    for index in range(records):
        if stall is not None and index == stall[0]:
            now += stall[1]
        wait = pacer.delay(index, now)
        if wait > 0:
            now += wait + oversleep_s
        sent.append(now)
        now += send_s
    return sent


def test_record_i_is_due_i_over_rate_after_the_start() -> None:
    pacer = Pacer(250, start=100.0)
    assert [pacer.due(i) for i in (0, 1, 250, 500)] == [100.0, 100.004, 101.0, 102.0]
    assert pacer.delay(250, now=100.5) == pytest.approx(0.5)


def test_a_late_record_is_due_at_once() -> None:
    pacer = Pacer(10, start=0.0)
    assert pacer.delay(1, now=5.0) == 0.0


def test_no_limit_never_waits() -> None:
    pacer = Pacer(None, start=0.0)
    assert all(pacer.delay(i, now=0.0) == 0.0 for i in range(1000))


@pytest.mark.parametrize("rate", [0, -5])
def test_a_rate_must_be_positive(rate: float) -> None:
    with pytest.raises(ValueError, match="positive"):
        Pacer(rate, start=0.0)


def test_oversleeping_and_slow_sends_do_not_drift() -> None:
    # Sleeping 1/rate per record would take 1000 * (4 + 0.3 + 0.2) ms = 4.5 s.
    pacer = Pacer(250, start=0.0)
    sent = simulate(pacer, 1000, send_s=0.0002, oversleep_s=0.0003)
    assert sent[-1] == pytest.approx(999 / 250, abs=0.001)
    assert all(t >= pacer.due(i) for i, t in enumerate(sent))


def test_after_a_stall_it_catches_up_then_keeps_the_schedule() -> None:
    pacer = Pacer(100, start=0.0)
    sent = simulate(pacer, 1000, send_s=0.001, oversleep_s=0.0, stall=(100, 2.0))
    # 200 records were due during the stall: sent back to back (1 ms each) ...
    burst = sent[100:300]
    assert burst[-1] - burst[0] == pytest.approx(0.199)
    # ... then the schedule is kept as if there had been no stall.
    assert sent[400] == pytest.approx(pacer.due(400))
    assert sent[-1] == pytest.approx(999 / 100)


# -- percentiles ----------------------------------------------------------------------------


def test_percentiles_are_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 0.50) == 50
    assert percentile(values, 0.95) == 95
    assert percentile(values, 0.99) == 99
    assert percentile(values, 0.999) == 100
    assert percentile(values, 1.0) == 100


def test_percentiles_of_few_values() -> None:
    assert percentile([7.0], 0.5) == 7.0
    assert percentile([1.0, 2.0], 0.5) == 1.0
    assert percentile([1.0, 2.0], 0.51) == 2.0
    assert math.isnan(percentile([], 0.5))


def test_latency_summary_in_milliseconds() -> None:
    recorder = LatencyRecorder(expected=1000)
    for ms in reversed(range(1, 1001)):
        recorder.add(ms / 1000)
    summary = recorder.summary()
    assert summary is not None
    assert summary.count == 1000
    assert summary.avg_ms == pytest.approx(500.5)
    assert summary.p50_ms == pytest.approx(500)
    assert summary.p95_ms == pytest.approx(950)
    assert summary.p99_ms == pytest.approx(990)
    assert summary.p99_9_ms == pytest.approx(999)
    assert summary.max_ms == pytest.approx(1000)


def test_latency_cdf_samples_each_quantile_then_the_maximum() -> None:
    recorder = LatencyRecorder(expected=10_000)
    for ms in range(1, 10_001):
        recorder.add(ms / 1000)
    summary = recorder.summary()
    assert summary is not None
    assert len(summary.cdf_ms) == len(CDF_QUANTILES) + 1
    assert list(summary.cdf_ms) == sorted(summary.cdf_ms)
    by_quantile = dict(zip(CDF_QUANTILES, summary.cdf_ms, strict=False))
    assert by_quantile[0.5] == pytest.approx(summary.p50_ms)
    assert by_quantile[0.99] == pytest.approx(summary.p99_ms)
    assert by_quantile[0.9999] == pytest.approx(9999)
    assert summary.cdf_ms[-1] == summary.max_ms == pytest.approx(10_000)


def test_long_runs_sample_for_percentiles_but_count_everything() -> None:
    recorder = LatencyRecorder(expected=10_000, max_samples=1000)
    for i in range(10_000):
        recorder.add(i / 1e6)
    assert len(recorder.samples) == 1000
    summary = recorder.summary()
    assert summary is not None
    assert summary.count == 10_000
    assert summary.max_ms == pytest.approx(9.999)
    assert summary.avg_ms == pytest.approx(4.9995)
    assert summary.p50_ms == pytest.approx(5.0, abs=0.02)
    assert summary.p99_ms == pytest.approx(9.9, abs=0.02)


def test_no_latencies_no_summary() -> None:
    assert LatencyRecorder(expected=None).summary() is None


# -- values and results ---------------------------------------------------------------------


def test_payload_is_the_size_asked_and_does_not_compress() -> None:
    payload = make_payload(4096)
    assert len(payload) == 4096
    assert len(zlib.compress(payload)) > 4000


def test_a_stamp_keeps_the_size_and_reads_back() -> None:
    payload = make_payload(100)
    value = stamp(b"run-0001", 123_456_789, payload)
    assert len(value) == 100
    assert value[STAMP_SIZE:] == payload[STAMP_SIZE:]
    assert read_stamp(value) == (b"run-0001", 123_456_789)


@pytest.mark.parametrize("value", [None, b"", b"short"])
def test_a_value_too_short_has_no_stamp(value: bytes | None) -> None:
    assert read_stamp(value) is None


def test_rates_use_mb_of_a_million_bytes() -> None:
    result = Throughput(records=1000, bytes=4_000_000, seconds=2.0)
    assert result.records_per_s == 500
    assert result.mb_per_s == 2.0
    assert Throughput(records=0, bytes=0, seconds=0.0).records_per_s == 0.0


def test_results_as_dict_carry_rates_nested() -> None:
    produced = ProduceResult(records=10, bytes=100, seconds=1.0)
    result = LatencyResult(records=10, bytes=100, seconds=2.0, produce=produced)
    out = result.as_dict()
    assert out["records_per_s"] == 5.0
    assert out["produce"]["records_per_s"] == 10.0
    assert out["latency"] is None
