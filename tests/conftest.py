"""Shared fixtures: one real etcd per session, real broker processes per test or module.

Every cluster gets its own etcd chroot, so tests never see each other's
topics. When a test fails, the tail of each broker's log is printed.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from harness import SHORT_LIVED_SPARK_JVM, BrokerProcess, EtcdServer, start_all


def pytest_configure(config: pytest.Config) -> None:
    """The property tests check decisions, not speed, and run beside the integration
    tests on two cores: Hypothesis's 200 ms deadline per example then measures the
    machine's load (one ACL example took 602 ms in a rehearsal, 0.8 ms when rerun).

    Imported here, in pytest's processes only: the tests' child processes import this
    module too (``from conftest import ...``) and have no Hypothesis."""
    from hypothesis import settings

    settings.register_profile("shoal", deadline=None)
    settings.load_profile("shoal")


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: Any) -> Any:
    report = yield
    setattr(item, f"report_{report.when}", report)
    return report


WITHOUT_HYPOTHESIS = Path(__file__).parent / "without_hypothesis"


@pytest.fixture(scope="session", autouse=True)
def children_without_hypothesis() -> Iterator[None]:
    """Every Python process a test starts (and inherits our environment) imports
    no Hypothesis: see ``without_hypothesis/hypothesis/__init__.py``.

    A fixture, not a hook at configure time: under pytest-xdist fixtures run
    only in the workers, which are already started and keep their Hypothesis
    for the property tests; the controller, which starts the workers, never
    changes its environment.
    """
    saved = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(WITHOUT_HYPOTHESIS), saved]))
    yield
    if saved is None:
        del os.environ["PYTHONPATH"]
    else:
        os.environ["PYTHONPATH"] = saved


@pytest.fixture(scope="session")
def etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdServer]:
    server = EtcdServer(tmp_path_factory.mktemp("etcd"))
    server.start()
    yield server
    server.stop()


BrokerFactory = Callable[..., BrokerProcess]


def _factory(etcd: EtcdServer, root: Path, started: list[BrokerProcess]) -> BrokerFactory:
    chroot = etcd.chroot_url()

    def start(
        node_id: int = 0, extra_args: tuple[str, ...] = (), wait: bool = True, **kwargs: Any
    ) -> BrokerProcess:
        """A started broker; with ``wait=False`` only launched, and the caller
        calls ``wait_ready()`` (to start several side by side)."""
        broker = BrokerProcess(
            chroot, root / f"broker-{node_id}", node_id, extra_args=extra_args, **kwargs
        )
        started.append(broker)
        broker.launch()
        return broker.wait_ready() if wait else broker

    return start


def _teardown(started: list[BrokerProcess], failed: bool) -> None:
    for broker in started:
        if broker.running:
            broker.kill()
        if failed:
            print(f"\n----- broker {broker.node_id} log ({broker.log_path}) -----")
            print(broker.log_tail())


@pytest.fixture
def broker_factory(
    etcd: EtcdServer, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[BrokerFactory]:
    """Start brokers of a fresh cluster; they are killed after the test."""
    started: list[BrokerProcess] = []
    yield _factory(etcd, tmp_path, started)
    report = getattr(request.node, "report_call", None)
    _teardown(started, bool(report and report.failed))


@pytest.fixture(scope="module")
def broker(
    etcd: EtcdServer, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[BrokerProcess]:
    """One broker shared by a module's tests (which use their own topics)."""
    root = tmp_path_factory.mktemp("module-broker")
    started: list[BrokerProcess] = []
    process = _factory(etcd, root, started)()
    yield process
    failed = any(
        getattr(item, "report_call", None) is not None and item.report_call.failed
        for item in request.session.items
        if item.module is request.module
    )
    _teardown(started, failed)
    shutil.rmtree(root, ignore_errors=True)


@dataclass
class GatewayCluster:
    """Brokers, and a gateway in front of them with a plain and a TLS listener."""

    etcd_url: str
    brokers: list[BrokerProcess]
    gateway: Any
    root: Path

    @property
    def internal_bootstrap(self) -> str:
        return ",".join(b.bootstrap for b in self.brokers)

    def tenant(self, name: str, **kwargs: Any) -> Any:
        from gateway_env import make_tenant

        return make_tenant(self.etcd_url, self.gateway, name, **kwargs)


def start_gateway_cluster(
    etcd: EtcdServer,
    root: Path,
    brokers: int,
    gateway_env: dict[str, str] | None = None,
    broker_env: dict[str, str] | None = None,
) -> tuple[GatewayCluster, list[BrokerProcess]]:
    from gateway_env import GatewayProcess, TlsFiles

    started: list[BrokerProcess] = []
    chroot = etcd.chroot_url()
    env = {
        "SHOAL_DEFAULT_REPLICATION_FACTOR": str(brokers),
        "SHOAL_OFFSETS_TOPIC_REPLICATION_FACTOR": str(brokers),
        "SHOAL_OFFSETS_TOPIC_NUM_PARTITIONS": "6",
        "SHOAL_GROUP_INITIAL_REBALANCE_DELAY_MS": "0",
        **(broker_env or {}),
    }
    processes = []
    for node in range(brokers):
        broker = BrokerProcess(chroot, root / f"broker-{node}", node, env=env)
        started.append(broker)
        processes.append(broker)
    start_all(processes)
    upstream = ",".join(b.bootstrap for b in processes)
    gateway = GatewayProcess(
        chroot, upstream, root, tls=TlsFiles.make(root / "tls"), env=gateway_env, brokers=brokers
    )
    try:
        gateway.start()
    except BaseException:
        # The caller never gets these processes to stop.
        if gateway.running:
            gateway.stop()
        for broker in processes:
            broker.kill()
        raise
    return GatewayCluster(chroot, processes, gateway, root), started


def module_gateway_cluster(
    etcd: EtcdServer,
    tmp_path_factory: pytest.TempPathFactory,
    request: pytest.FixtureRequest,
    name: str,
    broker_env: dict[str, str] | None = None,
    brokers: int = 3,
) -> Iterator[GatewayCluster]:
    """The body of a module-scoped fixture: ``brokers`` brokers behind one gateway, stopped
    after the module's tests, with the gateway's log printed if one of them failed."""
    root = tmp_path_factory.mktemp(name)
    cluster, started = start_gateway_cluster(etcd, root, brokers=brokers, broker_env=broker_env)
    yield cluster
    failed = any(
        getattr(item, "report_call", None) is not None and item.report_call.failed
        for item in request.session.items
        if item.module is request.module
    )
    if cluster.gateway.running:
        cluster.gateway.stop()
    if failed:
        print(f"\n----- gateway log ({cluster.gateway.log_path}) -----")
        print(cluster.gateway.log_tail())
    _teardown(started, failed)
    if not failed:  # else the logs and data stay for a post-mortem
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def gateway_cluster(
    etcd: EtcdServer, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[GatewayCluster]:
    """Three brokers behind one gateway, shared by a module's tests (own tenants each)."""
    yield from module_gateway_cluster(etcd, tmp_path_factory, request, "gateway-cluster")


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One local SparkSession for the whole run (each takes seconds and a GiB to start),
    with the ``shoal`` data source registered."""
    import os
    import sys

    # Spark's Python workers must run this interpreter, which has shoal installed.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession
    from shoal.connector import ShoalDataSource

    session = (
        SparkSession.builder.master("local[2]")
        .appName("shoal-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.local.dir", str(tmp_path_factory.mktemp("spark-local")))
        .config("spark.driver.extraJavaOptions", SHORT_LIVED_SPARK_JVM)
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    session.dataSource.register(ShoalDataSource)
    yield session
    session.stop()
