"""README's first command, as a newcomer runs it: `make dev` in a fresh copy of the checkout.

    python3 .ci/dev_smoke.py

`make test` installs every extra, so it cannot tell whether `make dev` alone
installs what `shoal dev` imports. This copies the checkout's files (no
.venv, no build/) to a temporary folder, runs `make dev` there on free
loopback ports (through the SHOAL_DEV_* variables every flag reads), and
once `.shoal/client.properties` is written:

* checks that the venv `make dev` made has no test tools in it, and that a
  Python started in the copy's root, the venv's and the system's, imports
  the standard library's `operator`;
* creates a topic with `.venv/bin/shoal`, writes three records through the
  gateway with kcat and the written client.properties, and reads them back;
* stops it as Ctrl-C does (SIGINT to make's process group) and checks that
  every broker shut down cleanly and no process is left behind.

Standard library only: it runs before any venv exists.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
READY_TIMEOUT_S = 900  # a cold pip install of shoal[dev] included
PORTS = 14  # gateway 4, brokers 3, etcd 2, HTTP 1, metrics 4


def copy_checkout(destination: Path) -> None:
    """The files git knows (tracked or new, not ignored), as a fresh clone has them."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        check=True,
        capture_output=True,
    ).stdout.split(b"\0")
    for name in filter(None, listed):
        source = ROOT / os.fsdecode(name)
        if source.is_file():
            target = destination / os.fsdecode(name)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)


def free_port_block(size: int) -> int:
    """A run of free loopback ports below the ephemeral range (see tests/harness.py)."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    for _ in range(500):
        base = random.randrange(10_000, low - size)  # noqa: S311 - not a secret
        sockets = []
        try:
            for port in range(base, base + size):
                listener = socket.socket()
                sockets.append(listener)
                listener.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for listener in sockets:
                listener.close()
    raise RuntimeError("no free block of ports")


def wait_until(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.5)


def run(argv: list[str], cwd: Path, stdin: bytes | None = None) -> bytes:
    result = subprocess.run(
        argv, cwd=cwd, input=stdin, capture_output=True, timeout=120, check=False
    )
    if result.returncode != 0:
        raise AssertionError(f"{' '.join(argv)} failed:\n{result.stderr.decode()}")
    return result.stdout


def check(copy: Path, properties: Path) -> None:
    venv_python = copy / ".venv" / "bin" / "python"
    has_pytest = subprocess.run(
        [str(venv_python), "-c", "import pytest"], cwd="/", capture_output=True, check=False
    )
    assert has_pytest.returncode != 0, "make dev installed pytest: more than the dev extra"

    stdlib = Path(sysconfig.get_paths()["stdlib"]).resolve()
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONSAFEPATH", "PYTHONPATH"}}
    for python in (str(venv_python), sys.executable):
        printed = subprocess.run(
            [python, "-c", "import operator, dataclasses, json; print(operator.__file__)"],
            cwd=copy,
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        assert printed.returncode == 0, f"{python} in the checkout root: {printed.stderr}"
        assert Path(printed.stdout.strip()).resolve().parent == stdlib, printed.stdout

    shoal = str(copy / ".venv" / "bin" / "shoal")
    run([shoal, "topic", "create", "smoke", "--partitions", "3", "-F", str(properties)], copy)
    lines = b"first\nsecond\nthird\n"
    kcat = ["kcat", "-F", str(properties)]
    run([*kcat, "-P", "-t", "smoke", "-X", "acks=all"], copy, stdin=lines)
    read = run([*kcat, "-C", "-t", "smoke", "-o", "beginning", "-e", "-q"], copy)
    assert sorted(read.splitlines()) == sorted(lines.splitlines()), read


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="shoal-dev-smoke-") as tmp:
        copy = Path(tmp) / "shoal"
        copy_checkout(copy)
        base = free_port_block(PORTS)
        env = {
            **os.environ,
            "SHOAL_DEV_PORT": str(base),
            "SHOAL_DEV_BROKER_PORT": str(base + 4),
            "SHOAL_DEV_ETCD_PORT": str(base + 7),
            "SHOAL_DEV_HTTP_PORT": str(base + 9),
            "SHOAL_DEV_METRICS_PORT": str(base + 10),
        }
        log_path = Path(tmp) / "make-dev.log"
        started = time.monotonic()
        with open(log_path, "wb") as log:
            # Its own process group, which is what a terminal's Ctrl-C signals.
            make = subprocess.Popen(
                ["make", "dev"], cwd=copy, env=env, stdout=log, stderr=log, start_new_session=True
            )
        try:
            properties = copy / ".shoal" / "client.properties"
            wait_until(
                lambda: properties.exists() or make.poll() is not None,
                READY_TIMEOUT_S,
                "client.properties",
            )
            assert make.poll() is None, f"make dev exited with {make.returncode}"
            print(f"make dev ready in {time.monotonic() - started:.0f} s", flush=True)
            check(copy, properties)
            os.killpg(make.pid, signal.SIGINT)
            # make re-raises the SIGINT it got once its recipe has stopped.
            status = make.wait(90)
            assert status in {0, -signal.SIGINT}, f"make dev exited with {status} on Ctrl-C"
            for node in range(3):
                marker = copy / ".shoal" / f"broker-{node}" / ".kafka_cleanshutdown"
                assert marker.exists(), f"broker {node} did not shut down cleanly"
            # etcd, the brokers and the gateway run in sessions of their own.
            left = subprocess.run(
                ["pgrep", "-f", str(copy)], capture_output=True, text=True, check=False
            )
            assert not left.stdout.split(), f"left running: {left.stdout.split()}"
        except BaseException:
            print(log_path.read_text(errors="replace")[-6000:], file=sys.stderr)
            raise
        finally:
            if make.poll() is None:
                os.killpg(make.pid, signal.SIGKILL)
                make.wait()
    print("make dev: a produce and a consume through the gateway, then a clean Ctrl-C")


if __name__ == "__main__":
    main()
