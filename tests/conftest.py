"""Shared fixtures: one real etcd per session, real broker processes per test or module.

Every cluster gets its own etcd chroot, so tests never see each other's
topics. When a test fails, the tail of each broker's log is printed.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from harness import BrokerProcess, EtcdServer


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: Any) -> Any:
    report = yield
    setattr(item, f"report_{report.when}", report)
    return report


@pytest.fixture(scope="session")
def etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdServer]:
    server = EtcdServer(tmp_path_factory.mktemp("etcd"))
    server.start()
    yield server
    server.stop()


BrokerFactory = Callable[..., BrokerProcess]


def _factory(etcd: EtcdServer, root: Path, started: list[BrokerProcess]) -> BrokerFactory:
    chroot = etcd.chroot_url()

    def start(node_id: int = 0, extra_args: tuple[str, ...] = (), **kwargs: Any) -> BrokerProcess:
        broker = BrokerProcess(
            chroot, root / f"broker-{node_id}", node_id, extra_args=extra_args, **kwargs
        )
        started.append(broker)
        return broker.start()

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
