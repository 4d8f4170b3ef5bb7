"""Child process of test_log_cleaner_crash.py: open a log, clean it, die where told.

Usage: python log_cleaner_crash_child.py <log dir> <LogConfig fields as JSON>
<now ms> <first dirty offset or -1>. ``SHOAL_CLEANER_FAULT`` names the step at
which the cleaner ends the process (``os._exit``, as a SIGKILL would). After
the clean it writes the cleaner checkpoint beside the log, as the broker's
cleaner does. Exit code 0: the clean finished without reaching the step.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

from shoal.broker.log.cleaner.checkpoint import write_cleaner_checkpoint
from shoal.broker.log.cleaner.cleanable import log_to_clean
from shoal.broker.log.cleaner.cleaner import Cleaner
from shoal.broker.log.cleaner.faults import Faults
from shoal.broker.log.config import LogConfig
from shoal.broker.log.log import Log


async def main(directory: Path, fields: dict[str, object], now: int, checkpoint: int) -> None:
    config = LogConfig(**fields)  # type: ignore[arg-type]
    log = Log(directory, config, 0, False, lambda: now)
    log.high_watermark = log.log_end_offset
    target = log_to_clean(log, checkpoint if checkpoint >= 0 else None, now)
    faults = Faults.from_env()
    result = await Cleaner(max_map_entries=1 << 20, faults=faults).clean(log, target)
    write_cleaner_checkpoint(directory.parent, {("orders", 0): result.end_offset})
    faults.hit("checkpoint_written")


if __name__ == "__main__":
    fields = json.loads(sys.argv[2])
    if "cleanup_policy" in fields:
        fields["cleanup_policy"] = tuple(fields["cleanup_policy"])
    asyncio.run(main(Path(sys.argv[1]), fields, int(sys.argv[3]), int(sys.argv[4])))
