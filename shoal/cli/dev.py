"""``shoal dev``: a local cluster on loopback, for development and for trying Shoal.

Starts a real etcd and a broker as child processes with their data under
``--data-dir`` (kept across runs), waits until the broker answers, and writes
two files for clients:

* ``<data-dir>/client.properties``: librdkafka settings (``kcat -F``,
  ``shoal topic -F``, any librdkafka client);
* ``<data-dir>/dev.env``: ``SHOAL_BOOTSTRAP`` and ``SHOAL_ETCD`` for ``source``.

The data directory is locked while it runs, so a second ``shoal dev`` on
it says so and stops. Children run in their own sessions: Ctrl-C or
SIGTERM reaches ``shoal dev`` alone, which stops the broker first (so it
can deregister and checkpoint) and etcd last.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import socket
import sys
from pathlib import Path
from typing import Annotated, Final

import typer
from rich.console import Console
from rich.panel import Panel

from shoal.cli.running import run_until_signalled
from shoal.etcd_process import EtcdProcess
from shoal.locking import DirectoryLock, DirectoryLockedError

_READY_EVENT: Final = b"event=broker_ready"
_READY_TIMEOUT_S: Final = 120.0
_STOP_TIMEOUT_S: Final = 30.0


def _check_port_free(port: int, what: str) -> None:
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            typer.echo(f"shoal dev: port {port} ({what}) is taken by another program", err=True)
            raise typer.Exit(1) from None


def dev(
    data_dir: Annotated[
        Path, typer.Option(envvar="SHOAL_DEV_DATA_DIR", help="Where etcd and broker data live.")
    ] = Path(".shoal"),
    port: Annotated[
        int, typer.Option(envvar="SHOAL_DEV_PORT", help="The broker's Kafka port.")
    ] = 9092,
    etcd_port: Annotated[
        int, typer.Option(envvar="SHOAL_DEV_ETCD_PORT", help="etcd client port (peer: +1).")
    ] = 2379,
) -> None:
    """Run etcd and a broker on loopback until Ctrl-C."""
    data_dir = data_dir.resolve()
    try:
        lock = DirectoryLock(data_dir)
    except DirectoryLockedError as exc:
        typer.echo(f"shoal dev: {exc}", err=True)
        raise typer.Exit(1) from exc
    try:
        for number, what in ((port, "Kafka"), (etcd_port, "etcd"), (etcd_port + 1, "etcd peer")):
            _check_port_free(number, what)
        cluster = DevCluster(data_dir, port, etcd_port)
        run_until_signalled(cluster.run)
        if cluster.failure:
            typer.echo(f"shoal dev: {cluster.failure}", err=True)
            raise typer.Exit(1)
    finally:
        lock.release()


class DevCluster:
    def __init__(self, data_dir: Path, port: int, etcd_port: int) -> None:
        self.data_dir = data_dir
        self.port = port
        self.etcd_port = etcd_port
        self.failure: str | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def run(self, stop: asyncio.Event) -> None:
        with open(self.data_dir / "etcd.log", "ab") as etcd_log:  # noqa: ASYNC230 - once, at start
            etcd = EtcdProcess(self.data_dir / "etcd", self.etcd_port, self.etcd_port + 1, etcd_log)
            try:
                await etcd.start()
            except RuntimeError as exc:
                self.failure = f"{exc} (see {self.data_dir / 'etcd.log'})"
                await etcd.stop()
                return
            broker: asyncio.subprocess.Process | None = None
            try:
                broker = await self._start_broker(etcd.url)
                ready = asyncio.Event()
                pump = asyncio.create_task(_pump(broker, "broker-0", ready))
                if await self._until_ready(broker, ready, stop):
                    self._write_client_files(etcd.url)
                    self._announce(etcd.url)
                    await _first_of(stop.wait(), broker.wait())
                    if broker.returncode is not None and not stop.is_set():
                        self.failure = f"the broker exited with status {broker.returncode}"
                await _terminate(broker)
                await pump
            finally:
                if broker is not None:
                    await _terminate(broker)
                await etcd.stop()

    async def _start_broker(self, etcd_url: str) -> asyncio.subprocess.Process:
        # One broker: the offsets topic cannot have Kafka's default three replicas.
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "SHOAL_OFFSETS_TOPIC_REPLICATION_FACTOR": "1"}
        return await asyncio.create_subprocess_exec(
            sys.executable,
            "-P",
            "-m",
            "shoal",
            "broker",
            "--node-id=0",
            f"--data-dir={self.data_dir / 'broker-0'}",
            f"--listen={self.bootstrap}",
            f"--etcd={etcd_url}",
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
            env=env,
        )

    async def _until_ready(
        self, broker: asyncio.subprocess.Process, ready: asyncio.Event, stop: asyncio.Event
    ) -> bool:
        try:
            await asyncio.wait_for(
                _first_of(ready.wait(), broker.wait(), stop.wait()), _READY_TIMEOUT_S
            )
        except TimeoutError:
            self.failure = f"the broker was not ready after {_READY_TIMEOUT_S:.0f}s"
            return False
        if broker.returncode is not None:
            self.failure = f"the broker exited with status {broker.returncode} while starting"
            return False
        return ready.is_set()

    def _write_client_files(self, etcd_url: str) -> None:
        (self.data_dir / "client.properties").write_text(
            "# Written by `shoal dev`: librdkafka settings for this local cluster.\n"
            "# Use with kcat -F, shoal topic -F, or any librdkafka client.\n"
            f"bootstrap.servers={self.bootstrap}\n"
        )
        (self.data_dir / "dev.env").write_text(
            "# Written by `shoal dev`: source it to point the shoal CLI at this cluster.\n"
            f"export SHOAL_BOOTSTRAP={self.bootstrap}\n"
            f"export SHOAL_ETCD={etcd_url}\n"
            f"export SHOAL_CLIENT_CONFIG={self.data_dir / 'client.properties'}\n"
        )

    def _announce(self, etcd_url: str) -> None:
        text = (
            f"bootstrap   {self.bootstrap}\n"
            f"etcd        {etcd_url}\n"
            f"data        {self.data_dir}\n"
            f"client      {self.data_dir / 'client.properties'}\n"
            f"env         source {self.data_dir / 'dev.env'}\n\n"
            f"kcat -F {self.data_dir / 'client.properties'} -L\n"
            f"{_shoal_command()} topic create demo --partitions 3"
            f" -F {self.data_dir / 'client.properties'}\n"
            "Ctrl-C stops everything; data stays for the next run."
        )
        Console(stderr=True).print(Panel(text, title="shoal dev is ready", expand=False))


def _shoal_command() -> str:
    """How the user can run `shoal` again: as on PATH if it is, else by its path."""
    argv0 = Path(sys.argv[0])
    if argv0.name == "shoal" and shutil.which("shoal") != str(argv0.resolve()):
        return os.path.relpath(argv0) if argv0.is_absolute() else str(argv0)
    return "shoal"


async def _first_of(*aws: object) -> None:
    tasks = [asyncio.ensure_future(a) for a in aws]  # type: ignore[call-overload]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()


async def _pump(process: asyncio.subprocess.Process, name: str, ready: asyncio.Event) -> None:
    """Copy a child's output to ours, line by line, prefixed with its name."""
    assert process.stdout is not None
    prefix = f"[{name}] ".encode()
    while line := await process.stdout.readline():
        sys.stderr.buffer.write(prefix + line)
        sys.stderr.buffer.flush()
        if _READY_EVENT in line:
            ready.set()


async def _terminate(process: asyncio.subprocess.Process) -> None:
    if process.returncode is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(process.pid, signal.SIGTERM)
    try:
        await asyncio.wait_for(process.wait(), _STOP_TIMEOUT_S)
    except TimeoutError:
        process.kill()
        await process.wait()
