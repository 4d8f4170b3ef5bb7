"""The aborted transaction index (``.txnindex``) and the markers' record format."""

from __future__ import annotations

import struct
from pathlib import Path

from shoal.broker.log.markers import build_marker, read_marker
from shoal.broker.log.txn_index import ENTRY_SIZE, AbortedTxn, TransactionIndex

from shoal.records import iter_records, validate_batch


def _index(tmp_path: Path, *entries: AbortedTxn) -> TransactionIndex:
    index = TransactionIndex(tmp_path / "00000000000000000000.txnindex")
    for entry in entries:
        index.append(entry)
    return index


def test_entries_are_kafkas_34_byte_layout(tmp_path) -> None:
    index = _index(tmp_path, AbortedTxn(7, 10, 20, 21))
    data = index.path.read_bytes()
    assert ENTRY_SIZE == 34
    assert struct.unpack(">hqqqq", data) == (0, 7, 10, 20, 21)


def test_entries_survive_reopening_and_a_torn_tail_is_dropped(tmp_path) -> None:
    index = _index(tmp_path, AbortedTxn(7, 10, 20, 21), AbortedTxn(8, 15, 30, 31))
    with index.path.open("ab") as file:
        file.write(b"\x00\x00\x01")  # a crash in the middle of a third entry
    reopened = TransactionIndex(index.path)
    assert reopened.entries == [AbortedTxn(7, 10, 20, 21), AbortedTxn(8, 15, 30, 31)]
    assert index.path.stat().st_size == 2 * ENTRY_SIZE


def test_a_missing_file_is_an_empty_index(tmp_path) -> None:
    index = TransactionIndex(tmp_path / "00000000000000000100.txnindex")
    assert index.entries == []
    assert not index.path.exists()


def test_an_entry_already_there_is_not_appended_twice(tmp_path) -> None:
    index = _index(tmp_path, AbortedTxn(7, 10, 20, 21))
    index.append(AbortedTxn(7, 10, 20, 21))
    assert len(index) == 1
    assert len(TransactionIndex(index.path)) == 1


def test_collect_returns_aborts_overlapping_the_range(tmp_path) -> None:
    index = _index(
        tmp_path,
        AbortedTxn(1, 0, 5, 6),
        AbortedTxn(2, 3, 12, 13),
        AbortedTxn(3, 20, 25, 26),
    )
    found, complete = index.collect(6, 20)
    assert [t.producer_id for t in found] == [2]
    # The third abort was written when everything below 26 was resolved: no
    # later segment can hold an abort of a transaction starting below 20.
    assert complete
    found, _ = index.collect(0, 100)
    assert [t.producer_id for t in found] == [1, 2, 3]


def test_collect_is_incomplete_while_a_later_marker_may_abort_an_earlier_start(tmp_path) -> None:
    # LSO 4 when producer 1 aborted: a transaction from offset 4 was still open.
    index = _index(tmp_path, AbortedTxn(1, 0, 5, 4))
    found, complete = index.collect(0, 10)
    assert [t.producer_id for t in found] == [1]
    assert not complete


def test_truncate_drops_entries_whose_marker_is_cut(tmp_path) -> None:
    index = _index(tmp_path, AbortedTxn(1, 0, 5, 6), AbortedTxn(2, 3, 12, 13))
    index.truncate_to(12)
    assert [t.producer_id for t in index.entries] == [1]
    assert [t.producer_id for t in TransactionIndex(index.path).entries] == [1]


def test_markers_are_kafkas_end_transaction_control_records() -> None:
    batch = build_marker(42, 3, False, 9, 1_000, base_offset=17, leader_epoch=2)
    header = validate_batch(batch)
    assert (header.is_control, header.is_transactional) == (True, True)
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (42, 3, -1)
    assert (header.base_offset, header.partition_leader_epoch) == (17, 2)
    (record,) = iter_records(batch)
    assert record.key == struct.pack(">hh", 0, 0)
    assert record.value == struct.pack(">hi", 0, 9)
    marker = read_marker(batch)
    assert marker is not None
    assert (marker.commit, marker.coordinator_epoch) == (False, 9)
    commit = read_marker(build_marker(42, 3, True, 9, 1_000))
    assert commit is not None and commit.commit
