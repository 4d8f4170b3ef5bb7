"""``shoal dev``: a local cluster on loopback, for development and for trying Shoal.

Starts a real etcd and three brokers as child processes with their data
under ``--data-dir`` (kept across runs), waits until every broker answers,
and writes two files for clients:

* ``<data-dir>/client.properties``: librdkafka settings (``kcat -F``,
  ``shoal topic -F``, any librdkafka client);
* ``<data-dir>/dev.env``: ``SHOAL_BOOTSTRAP`` and ``SHOAL_ETCD`` for ``source``.

Brokers listen on ``--port`` and the two ports after it. Topics default to
replication factor 3 and ``min.insync.replicas=2``, as a production cluster
would run: one broker can stop without stopping acks=all writes.

The data directory is locked while it runs, so a second ``shoal dev`` on
it says so and stops. Children run in their own sessions: Ctrl-C or
SIGTERM reaches ``shoal dev`` alone, which stops the brokers one at a time
(each hands its leaderships to the others, deregisters and checkpoints)
and etcd last.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
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
_STOP_TIMEOUT_S: Final = 60.0
BROKERS: Final = 3
_BROKER_ENV: Final = {
    "SHOAL_DEFAULT_REPLICATION_FACTOR": str(BROKERS),
    "SHOAL_OFFSETS_TOPIC_REPLICATION_FACTOR": str(BROKERS),
    "SHOAL_TOPIC_DEFAULTS": json.dumps({"min.insync.replicas": "2"}),
}


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
        int,
        typer.Option(
            envvar="SHOAL_DEV_PORT",
            help="Kafka port of broker 0; brokers 1 and 2 take the next two.",
        ),
    ] = 9092,
    etcd_port: Annotated[
        int, typer.Option(envvar="SHOAL_DEV_ETCD_PORT", help="etcd client port (peer: +1).")
    ] = 2379,
) -> None:
    """Run etcd and three brokers on loopback until Ctrl-C."""
    data_dir = data_dir.resolve()
    try:
        lock = DirectoryLock(data_dir)
    except DirectoryLockedError as exc:
        typer.echo(f"shoal dev: {exc}", err=True)
        raise typer.Exit(1) from exc
    try:
        wanted = [(port + i, f"Kafka, broker {i}") for i in range(BROKERS)]
        wanted += [(etcd_port, "etcd"), (etcd_port + 1, "etcd peer")]
        for number, what in wanted:
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
        return ",".join(f"127.0.0.1:{self.port + i}" for i in range(BROKERS))

    async def run(self, stop: asyncio.Event) -> None:
        with open(self.data_dir / "etcd.log", "ab") as etcd_log:  # noqa: ASYNC230 - once, at start
            etcd = EtcdProcess(self.data_dir / "etcd", self.etcd_port, self.etcd_port + 1, etcd_log)
            try:
                await etcd.start()
            except RuntimeError as exc:
                self.failure = f"{exc} (see {self.data_dir / 'etcd.log'})"
                await etcd.stop()
                return
            brokers: list[asyncio.subprocess.Process] = []
            pumps: list[asyncio.Task[None]] = []
            try:
                readiness = []
                for node in range(BROKERS):
                    broker = await self._start_broker(node, etcd.url)
                    ready = asyncio.Event()
                    brokers.append(broker)
                    readiness.append(ready)
                    pumps.append(asyncio.create_task(_pump(broker, f"broker-{node}", ready)))
                if await self._until_ready(brokers, readiness, stop):
                    self._write_client_files(etcd.url)
                    self._announce(etcd.url)
                    # A broker that dies is reported, and the others carry on: that is
                    # what replication is for, and how to try a failover here.
                    await _first_of(stop.wait(), _all_exited(brokers))
                    if not stop.is_set():
                        self.failure = "every broker exited"
                # One at a time, last first: each hands its leaderships to the others.
                for broker in reversed(brokers):
                    await _terminate(broker)
                await asyncio.gather(*pumps)
            finally:
                for broker in brokers:
                    await _terminate(broker)
                await etcd.stop()

    async def _start_broker(self, node: int, etcd_url: str) -> asyncio.subprocess.Process:
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **_BROKER_ENV}
        return await asyncio.create_subprocess_exec(
            sys.executable,
            "-P",
            "-m",
            "shoal",
            "broker",
            f"--node-id={node}",
            f"--data-dir={self.data_dir / f'broker-{node}'}",
            f"--listen=127.0.0.1:{self.port + node}",
            f"--etcd={etcd_url}",
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
            env=env,
        )

    async def _until_ready(
        self,
        brokers: list[asyncio.subprocess.Process],
        readiness: list[asyncio.Event],
        stop: asyncio.Event,
    ) -> bool:
        async def all_ready() -> None:
            for ready in readiness:
                await ready.wait()

        try:
            await asyncio.wait_for(
                _first_of(all_ready(), stop.wait(), *(b.wait() for b in brokers)),
                _READY_TIMEOUT_S,
            )
        except TimeoutError:
            self.failure = f"the brokers were not ready after {_READY_TIMEOUT_S:.0f}s"
            return False
        for node, broker in enumerate(brokers):
            if broker.returncode is not None:
                self.failure = (
                    f"broker {node} exited with status {broker.returncode} while starting"
                )
                return False
        return all(ready.is_set() for ready in readiness)

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
            f"bootstrap   {self.bootstrap}  (3 brokers, replication factor 3)\n"
            f"etcd        {etcd_url}\n"
            f"data        {self.data_dir}\n"
            f"client      {self.data_dir / 'client.properties'}\n"
            f"env         source {self.data_dir / 'dev.env'}\n\n"
            f"kcat -F {self.data_dir / 'client.properties'} -L\n"
            f"{_shoal_command()} topic create demo --partitions 3"
            f" -F {self.data_dir / 'client.properties'}\n"
            "A broker that dies is reported and the others carry on.\n"
            "Ctrl-C stops everything; data stays for the next run."
        )
        Console(stderr=True).print(Panel(text, title="shoal dev is ready", expand=False))


def _shoal_command() -> str:
    """How the user can run `shoal` again: as on PATH if it is, else by its path."""
    argv0 = Path(sys.argv[0])
    if argv0.name == "shoal" and shutil.which("shoal") != str(argv0.resolve()):
        return os.path.relpath(argv0) if argv0.is_absolute() else str(argv0)
    return "shoal"


async def _all_exited(brokers: list[asyncio.subprocess.Process]) -> None:
    async def watch(node: int, broker: asyncio.subprocess.Process) -> None:
        status = await broker.wait()
        Console(stderr=True).print(
            f"[yellow]broker {node} exited with status {status}; the others carry on[/yellow]"
        )

    await asyncio.gather(*(watch(node, broker) for node, broker in enumerate(brokers)))


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
