"""Reserving a server's descriptor table before it serves (shoal.descriptor_table):
the table is as large as asked afterwards, and nothing is left open or closed."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import textwrap

from shoal.descriptor_table import reserve_descriptor_table

TABLE_SIZE = """
def table_size():
    # The process's descriptor table, as Linux reports it.
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("FDSize:"))
"""


def run_alone(code: str) -> str:
    """``code`` in a fresh interpreter (this one's table has grown already), with
    ``table_size()``."""
    program = TABLE_SIZE + textwrap.dedent(code)
    return subprocess.run(
        [sys.executable, "-c", program], check=True, capture_output=True, text=True
    ).stdout


def test_the_table_holds_what_was_reserved_and_no_descriptor_stays_open() -> None:
    out = run_alone(
        """
        import os
        from shoal.descriptor_table import reserve_descriptor_table
        before, open_before = table_size(), sorted(os.listdir("/proc/self/fd"))
        reserved = reserve_descriptor_table(4096)
        print(before, reserved, table_size(), sorted(os.listdir("/proc/self/fd")) == open_before)
        """
    )
    before, reserved, after, same_open = out.split()
    assert int(before) < 4096
    assert int(reserved) == 4096
    assert int(after) >= 4096
    assert same_open == "True"


def test_descriptors_in_use_at_the_top_are_left_open() -> None:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    top = min(64, soft) - 1
    with open(os.devnull) as held:
        os.dup2(held.fileno(), top)
        try:
            reserve_descriptor_table(64)
            os.fstat(top)  # still open: raises if it was closed
        finally:
            os.close(top)


def test_an_open_files_limit_below_the_reservation_caps_it() -> None:
    out = run_alone(
        """
        import resource
        from shoal.descriptor_table import reserve_descriptor_table
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        resource.setrlimit(resource.RLIMIT_NOFILE, (200, hard))
        print(reserve_descriptor_table(16384), table_size())
        """
    )
    reserved, size = out.split()
    assert int(reserved) == 200
    assert 200 <= int(size) < 16384
