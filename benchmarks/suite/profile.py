"""Where a server's time goes during one workload: py-spy on each of its processes.

``python -m shoal.benchmarks.compare --profile WORKLOAD`` wraps that workload of
every Shoal target in :func:`profiled`: ``py-spy record`` attaches to each
broker and the gateway, samples until the workload ends, and writes the collapsed stacks
(``<target>-<workload>-<process>.folded``, for flame graph tools) and a
summary of the functions with the most samples, by themselves and with what
they call. Profiling slows the processes it samples, so a profiled run's
figures are not the suite's figures.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

RATE = 200
"""Samples per second."""
TOP = 20


def py_spy() -> str:
    found = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(found).exists():
        raise RuntimeError("py-spy not found: pip install py-spy (the bench extra has it)")
    return found


@contextmanager
def profiled(pids: dict[str, int], directory: Path, label: str) -> Iterator[None]:
    directory.mkdir(parents=True, exist_ok=True)
    spies = {name: _record(pid, directory, f"{label}-{name}") for name, pid in pids.items()}
    try:
        yield
    finally:
        for spy in spies.values():
            spy.send_signal(signal.SIGINT)  # py-spy writes its output on SIGINT
        for spy in spies.values():
            spy.wait(60)
        summary = [summarize(directory / f"{label}-{name}.folded", name) for name in spies]
        (directory / f"{label}.txt").write_text("\n".join(summary))


def _record(pid: int, directory: Path, stem: str) -> subprocess.Popen[bytes]:
    argv = [py_spy(), "record", "--pid", str(pid), "--rate", str(RATE), "--format", "raw",
            "--output", str(directory / f"{stem}.folded"), "--nonblocking"]  # fmt: skip
    with open(directory / f"{stem}.py-spy.log", "wb") as log:
        return subprocess.Popen(argv, stdout=log, stderr=log)


def summarize(folded: Path, name: str) -> str:
    """The most sampled functions of one process: self samples and inclusive samples."""
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    total = 0
    for line in folded.read_text().splitlines() if folded.exists() else []:
        stack, _, count = line.rpartition(" ")
        frames = [f for f in stack.split(";") if not f.startswith("process ")]
        if not frames or not count.isdigit():
            continue
        samples = int(count)
        total += samples
        own[frames[-1]] += samples
        for frame in set(frames):
            inclusive[frame] += samples
    if not total:
        return f"{name}: no samples\n"

    def table(counter: Counter[str]) -> list[str]:
        return [f"  {n / total:6.1%}  {frame}" for frame, n in counter.most_common(TOP)]

    return "\n".join(
        [f"{name}: {total} samples at {RATE}/s", " by itself:", *table(own),
         " with what it calls:", *table(inclusive), ""]
    )  # fmt: skip
