"""A bounded, seeded run of each fuzz target (tests/fuzz/targets.py), as CI's share of it.

Each target must get through its runs letting only its parser's promised
error out; a finding prints the input that caused it (libFuzzer writes it
as crash-*), to be turned into a regression test. ``make fuzz`` runs the
targets for longer.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

TARGETS = Path(__file__).parents[1] / "fuzz" / "targets.py"
RUNS = {"request": 100_000, "records": 200_000, "sasl": 200_000}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("target", sorted(RUNS))
def test_a_bounded_fuzz_run_finds_nothing(target: str, tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(TARGETS), target, f"-runs={RUNS[target]}", "-seed=1"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-6000:]
    assert f"Done {RUNS[target]} runs" in done.stderr
