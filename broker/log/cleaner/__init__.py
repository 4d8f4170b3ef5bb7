"""The log cleaner: log compaction for ``cleanup.policy=compact``, as Kafka's LogCleaner.

Modules, each with one job:

* :mod:`.cleanable` which part of a log is dirty and cleanable, its dirty ratio
* :mod:`.offset_map` the key -> last offset map over the dirty part
* :mod:`.batches`   rewriting one batch: the records compaction keeps
* :mod:`.transactions` aborted transactions' batches, and markers that may go
* :mod:`.source`    a non-active segment as a worker thread reads it
* :mod:`.writer`    the ``.cleaned`` segment being written
* :mod:`.swap`      the ``.cleaned`` -> ``.swap`` -> live rename protocol
* :mod:`.cleaner`   one clean of one log, thread work and loop work apart
* :mod:`.checkpoint` ``cleaner-offset-checkpoint``: first dirty offsets per log dir
* :mod:`.throttler` ``log.cleaner.io.max.bytes.per.second``
* :mod:`.faults`    fault injection for the crash tests (off in production)
* :mod:`.manager`   the background workers that pick the dirtiest log

Invariants: offsets never change; the active segment is never cleaned;
nothing at or above the last stable offset is cleaned; a marker stays while
its transaction has data in the log; a crash at any step leaves a
log that recovery (:func:`shoal.broker.log.recovery.complete_swaps`) turns
into either the log before the clean or the log after it, group by group.
"""
