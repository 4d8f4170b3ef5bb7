"""``shoal dev``: a local cluster on loopback, for development and for trying Shoal.

Starts a real etcd, three brokers and the gateway as child processes with
their data under ``--data-dir`` (kept across runs), waits until all of them
answer, makes sure tenant ``demo`` exists with an API key, and writes two
files for clients:

* ``<data-dir>/client.properties``: librdkafka settings for tenant ``demo``
  through the gateway, SASL included (``kcat -F``, ``shoal topic -F``, any
  librdkafka client);
* ``<data-dir>/dev.env``: ``SHOAL_BOOTSTRAP`` (the gateway), ``SHOAL_BROKERS``
  (the brokers' internal listeners, for platform commands such as ``shoal
  tenant delete``) and ``SHOAL_ETCD``, for ``source``.

The gateway's bootstrap port is ``--port`` and broker ``n`` is reached through
it at ``--port`` + 1 + n. The brokers listen on loopback only, on
``--broker-port`` and the two ports after it: tenants never reach them. Topics
default to replication factor 3 and ``min.insync.replicas=2``, as a
production cluster would run: one broker can stop without stopping acks=all
writes. The demo key is made once and kept in ``<data-dir>/demo-key.json``
(mode 0600) for the next runs.

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
import time
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Final

import typer
from rich.console import Console
from rich.panel import Panel

from shoal.cli.running import run_until_signalled
from shoal.etcd_process import EtcdProcess
from shoal.locking import DirectoryLock, DirectoryLockedError
from shoal.tenancy.acl import default_bindings
from shoal.tenancy.keys import key_record
from shoal.tenancy.model import Tenant
from shoal.tenancy.scram import derive_all
from shoal.tenancy.secrets import new_key_id, new_secret
from shoal.tenancy.store import TenancyStore

_READY_EVENTS: Final = (b"event=broker_ready", b"event=gateway_ready")
DEMO_TENANT: Final = "demo"
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
            help="The gateway's Kafka bootstrap port; broker n is reached at port + 1 + n.",
        ),
    ] = 9092,
    broker_port: Annotated[
        int,
        typer.Option(
            envvar="SHOAL_DEV_BROKER_PORT",
            help="Internal (loopback) port of broker 0; brokers 1 and 2 take the next two.",
        ),
    ] = 19092,
    etcd_port: Annotated[
        int, typer.Option(envvar="SHOAL_DEV_ETCD_PORT", help="etcd client port (peer: +1).")
    ] = 2379,
    http_port: Annotated[
        int, typer.Option(envvar="SHOAL_DEV_HTTP_PORT", help="The gateway's HTTP API port.")
    ] = 8080,
    metrics_port: Annotated[
        int,
        typer.Option(
            envvar="SHOAL_DEV_METRICS_PORT",
            help="Broker 0's Prometheus /metrics port; brokers 1 and 2 take the next two,"
            " the gateway the one after (port + 3).",
        ),
    ] = 19192,
) -> None:
    """Run etcd, three brokers and the gateway on loopback until Ctrl-C."""
    data_dir = data_dir.resolve()
    try:
        lock = DirectoryLock(data_dir)
    except DirectoryLockedError as exc:
        typer.echo(f"shoal dev: {exc}", err=True)
        raise typer.Exit(1) from exc
    try:
        wanted = [(broker_port + i, f"broker {i}") for i in range(BROKERS)]
        wanted += [(port, "gateway bootstrap")]
        wanted += [(port + 1 + i, f"gateway, broker {i}") for i in range(BROKERS)]
        wanted += [(etcd_port, "etcd"), (etcd_port + 1, "etcd peer")]
        wanted += [(http_port, "gateway HTTP API")]
        wanted += [(metrics_port + i, f"broker {i} metrics") for i in range(BROKERS)]
        wanted += [(metrics_port + BROKERS, "gateway metrics")]
        for number, what in wanted:
            _check_port_free(number, what)
        cluster = DevCluster(data_dir, port, broker_port, etcd_port, http_port, metrics_port)
        run_until_signalled(cluster.run)
        if cluster.failure:
            typer.echo(f"shoal dev: {cluster.failure}", err=True)
            raise typer.Exit(1)
    finally:
        lock.release()


class DevCluster:
    def __init__(
        self,
        data_dir: Path,
        port: int,
        broker_port: int,
        etcd_port: int,
        http_port: int,
        metrics_port: int,
    ) -> None:
        self.data_dir = data_dir
        self.metrics_port = metrics_port
        self.port = port
        self.http_port = http_port
        self.broker_port = broker_port
        self.etcd_port = etcd_port
        self.failure: str | None = None

    @property
    def bootstrap(self) -> str:
        """The gateway: where tenants connect."""
        return f"127.0.0.1:{self.port}"

    @property
    def gateway_metrics_port(self) -> int:
        """After the brokers' metrics ports; never the HTTP port, which tenants reach."""
        return self.metrics_port + BROKERS

    @property
    def brokers(self) -> str:
        """The brokers' internal listeners: the platform's, never a tenant's."""
        return ",".join(f"127.0.0.1:{self.broker_port + i}" for i in range(BROKERS))

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
            gateway: asyncio.subprocess.Process | None = None
            pumps: list[asyncio.Task[None]] = []
            try:
                readiness = []
                for node in range(BROKERS):
                    broker = await self._start_broker(node, etcd.url)
                    ready = asyncio.Event()
                    brokers.append(broker)
                    readiness.append(ready)
                    pumps.append(asyncio.create_task(_pump(broker, f"broker-{node}", ready)))
                serving = await self._until_ready(brokers, readiness, stop)
                if serving:
                    # After the brokers, so that the gateway opens a port for each at once.
                    gateway = await self._start_gateway(etcd.url)
                    gateway_ready = asyncio.Event()
                    pumps.append(asyncio.create_task(_pump(gateway, "gateway", gateway_ready)))
                    serving = await self._until_ready([*brokers, gateway], [gateway_ready], stop)
                if serving and gateway is not None:
                    key_id, secret = await self._demo_key(etcd.url)
                    self._write_client_files(etcd.url, key_id, secret)
                    self._announce(etcd.url, key_id)
                    # A broker that dies is reported, and the others carry on: that is
                    # what replication is for, and how to try a failover here.
                    await _first_of(stop.wait(), _all_exited(brokers), gateway.wait())
                    if not stop.is_set():
                        self.failure = (
                            f"the gateway exited with status {gateway.returncode}"
                            if gateway.returncode is not None
                            else "every broker exited"
                        )
                # The gateway first (clients stop), then brokers one at a time, last
                # first: each hands its leaderships to the others.
                if gateway is not None:
                    await _terminate(gateway)
                for broker in reversed(brokers):
                    await _terminate(broker)
                await asyncio.gather(*pumps)
            finally:
                if gateway is not None:
                    await _terminate(gateway)
                for broker in brokers:
                    await _terminate(broker)
                await etcd.stop()

    async def _start_broker(self, node: int, etcd_url: str) -> asyncio.subprocess.Process:
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **_BROKER_ENV}
        return await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "shoal",
            "broker",
            f"--node-id={node}",
            f"--data-dir={self.data_dir / f'broker-{node}'}",
            f"--listen=127.0.0.1:{self.broker_port + node}",
            f"--metrics-listen=127.0.0.1:{self.metrics_port + node}",
            f"--etcd={etcd_url}",
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
            env=env,
        )

    async def _start_gateway(self, etcd_url: str) -> asyncio.subprocess.Process:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        return await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "shoal",
            "gateway",
            f"--listen=127.0.0.1:{self.port}",
            f"--http-listen=127.0.0.1:{self.http_port}",
            f"--metrics-listen=127.0.0.1:{self.gateway_metrics_port}",
            f"--upstream={self.brokers}",
            f"--etcd={etcd_url}",
            "--gateway-id=dev",
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
            env=env,
        )

    async def _demo_key(self, etcd_url: str) -> tuple[str, str]:
        """Tenant ``demo`` and a key for it: made on the first run, reused after."""
        saved = self.data_dir / "demo-key.json"
        async with TenancyStore(etcd_url) as store:
            if await store.get_tenant(DEMO_TENANT) is None:
                await store.create_tenant(Tenant(DEMO_TENANT, _now_ms()))
            if saved.exists():
                known = json.loads(saved.read_text())
                key = await store.get_key(known["key_id"])
                if key is not None and not key.revoked and key.tenant == DEMO_TENANT:
                    if not key.scram:
                        # Made before SCRAM sign-in: the secret is at hand here, so
                        # the demo key gains its SCRAM credentials instead of a rotation.
                        await store.add_key(replace(key, scram=derive_all(known["secret"])), [])
                    return known["key_id"], known["secret"]
            key_id, secret = new_key_id(), new_secret()
            await store.add_key(
                key_record(key_id, DEMO_TENANT, secret, _now_ms(), "shoal dev"),
                default_bindings(DEMO_TENANT, key_id),
            )
        saved.touch(mode=0o600)
        saved.write_text(json.dumps({"key_id": key_id, "secret": secret}))
        return key_id, secret

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
            self.failure = f"the cluster was not ready after {_READY_TIMEOUT_S:.0f}s"
            return False
        for node, child in enumerate(brokers):
            if child.returncode is not None:
                what = f"broker {node}" if node < BROKERS else "the gateway"
                self.failure = f"{what} exited with status {child.returncode} while starting"
                return False
        return all(ready.is_set() for ready in readiness)

    def _write_client_files(self, etcd_url: str, key_id: str, secret: str) -> None:
        properties = self.data_dir / "client.properties"
        properties.touch(mode=0o600)
        properties.write_text(
            "# Written by `shoal dev`: librdkafka settings for tenant demo, through the gateway.\n"
            "# Use with kcat -F, shoal topic -F, or any librdkafka client.\n"
            f"bootstrap.servers={self.bootstrap}\n"
            "security.protocol=SASL_PLAINTEXT\n"
            "sasl.mechanism=PLAIN\n"
            f"sasl.username={key_id}\n"
            f"sasl.password={secret}\n"
        )
        (self.data_dir / "dev.env").write_text(
            "# Written by `shoal dev`: source it to point the shoal CLI at this cluster.\n"
            f"export SHOAL_BOOTSTRAP={self.bootstrap}\n"
            f"export SHOAL_HTTP=http://127.0.0.1:{self.http_port}\n"
            f"export SHOAL_BROKERS={self.brokers}\n"
            f"export SHOAL_ETCD={etcd_url}\n"
            f"export SHOAL_CLIENT_CONFIG={properties}\n"
        )

    def _announce(self, etcd_url: str, key_id: str) -> None:
        text = (
            f"bootstrap   {self.bootstrap}  (gateway, SASL PLAIN or SCRAM; 3 brokers, RF 3)\n"
            f"http        http://127.0.0.1:{self.http_port}  (API docs at /docs)\n"
            f"oauth       http://127.0.0.1:{self.http_port}/oauth2/token  (client credentials)\n"
            f"tenant      {DEMO_TENANT}, key {key_id} (secret in client.properties)\n"
            f"brokers     {self.brokers}  (internal, loopback only)\n"
            f"metrics     http://127.0.0.1:{self.gateway_metrics_port}/metrics (gateway),"
            f" http://127.0.0.1:{self.metrics_port}-{self.metrics_port + BROKERS - 1}/metrics"
            " (brokers)\n"
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


def _now_ms() -> int:
    return int(time.time() * 1000)


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
        if any(event in line for event in _READY_EVENTS):
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
